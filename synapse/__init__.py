"""Synapse: fault-tolerant, pipeline-parallel knowledge distillation."""
__version__ = "0.1.0"
