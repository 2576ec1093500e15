"""Model factory (timm by short name) and block decomposition (the unit of partitioning).
"""
from synapse.models.blocks import block_parameter_names, count_blocks, model_blocks, num_blocks, run_blocks
from synapse.models.factory import (
    MODEL_REGISTRY,
    ModelError,
    build_model,
    check_weights_file,
    count_parameters,
    load_weights,
    model_spec,
)

__all__ = ["MODEL_REGISTRY", "ModelError", "block_parameter_names", "build_model", "check_weights_file",
           "count_blocks", "count_parameters", "load_weights", "model_blocks", "model_spec", "num_blocks",
           "run_blocks"]
