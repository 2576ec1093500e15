"""Synapse's Hydra config groups, shipped inside the package (``pkg://synapse.conf``), so that an
installed Synapse composes its own segment configs without a source checkout beside it.
"""
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent

__all__ = ["CONF_DIR"]
