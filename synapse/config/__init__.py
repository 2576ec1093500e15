"""Structured configuration: one dataclass per component, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` merge onto these dataclasses, so a misspelt key or a value of
the wrong type fails while Hydra composes the config. ``validate`` then checks what types
cannot express (a temperature <= 0, a model name we do not know, a GPU id that does not exist)
and raises ``ConfigError`` naming the offending override and a fix, before any work starts.
Only the entry point sees the whole tree; each component receives its own slice.

"""
from synapse.config.devices import num_stages, resolve_accelerator, resolve_devices, run_topology
from synapse.config.errors import ConfigError
from synapse.config.schema import (
    ACCELERATORS,
    MODES,
    NONFINITE_CHECKS,
    NONFINITE_POLICIES,
    OPTIMIZERS,
    PARTITION_MODES,
    PIPELINE_SCHEDULES,
    PRECISIONS,
    SCHEDULES,
    CheckpointConfig,
    DataConfig,
    ExperimentConfig,
    FailoverConfig,
    InjectionConfig,
    KDConfig,
    MonitorConfig,
    OptimConfig,
    PartitionConfig,
    PipelineConfig,
    PolicyConfig,
    StudentConfig,
    SynapseConfig,
    TeacherConfig,
    TrainerConfig,
    default_cache_dir,
    register_configs,
    to_container,
)
from synapse.config.supported_torch import (
    OLDEST_SUPPORTED,
    UnsupportedTorchError,
    require_supported_torch,
    torch_version,
)
from synapse.config.validation import validate

__all__ = ["ACCELERATORS", "CheckpointConfig", "ConfigError", "DataConfig", "ExperimentConfig", "FailoverConfig",
           "InjectionConfig", "KDConfig", "MODES", "MonitorConfig", "NONFINITE_CHECKS", "NONFINITE_POLICIES",
           "OLDEST_SUPPORTED", "OPTIMIZERS", "OptimConfig", "PARTITION_MODES", "PIPELINE_SCHEDULES", "PRECISIONS",
           "PartitionConfig", "PipelineConfig", "PolicyConfig", "SCHEDULES", "StudentConfig",
           "SynapseConfig", "TeacherConfig", "TrainerConfig", "UnsupportedTorchError", "default_cache_dir",
           "num_stages", "register_configs", "require_supported_torch", "resolve_accelerator", "resolve_devices",
           "run_topology", "to_container", "torch_version", "validate"]
