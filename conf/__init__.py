"""Synapse's Hydra config groups: the repository's top-level conf/, installed as the package
``synapse.conf`` (``pkg://synapse.conf``), so that an installed Synapse composes its own segment configs
without a source checkout beside it. In a checkout, ``synapse/__init__.py`` loads this folder as
``synapse.conf``.
"""
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent

__all__ = ["CONF_DIR"]
