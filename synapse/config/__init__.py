"""The configuration: typed, frozen dataclasses, one per component, checked before any work starts.

Hydra composes ``conf/`` onto the schema's nodes, so a misspelt key, a value of the wrong type or
a choice outside its set fails while the config is composed. ``validate`` then checks what types
cannot express (a temperature <= 0, a model name we do not know, a GPU id that does not exist)
and raises ``ConfigError`` naming the offending override and a fix. ``typed_config`` turns the
composed config into the frozen ``SynapseConfig`` once, at the root; each component receives its
own slice of it, and nothing changes it after validation.
"""
from synapse.config.devices import (
    NodeDevices,
    cuda_index,
    decides_elsewhere,
    fixed_replicas,
    local_devices,
    num_ranks,
    num_stages,
    resolve_accelerator,
    resolve_devices,
    run_topology,
    shares_a_gpu,
)
from synapse.config.errors import ConfigError
from synapse.config.resume import MAY_CHANGE, check_resume_settings
from synapse.config.schema import (
    MODES,
    NONFINITE_POLICIES,
    Accelerator,
    CheckpointConfig,
    Choice,
    DataConfig,
    DataName,
    Decode,
    DrillAction,
    DrillConfig,
    ExperimentConfig,
    FailoverConfig,
    FaultSettings,
    HostRead,
    InjectionConfig,
    KDConfig,
    KDMode,
    LoggerConfig,
    LRSchedule,
    Mode,
    MonitorConfig,
    NonFinitePolicy,
    NoParams,
    OptimConfig,
    OptimizerName,
    PartitionConfig,
    PartitionMode,
    PipelineConfig,
    PipelineSchedule,
    PolicyConfig,
    PolicyName,
    Precision,
    ReplanMode,
    SimulateConfig,
    StageCompiler,
    StudentConfig,
    SynapseConfig,
    TeacherConfig,
    TrackerName,
    TrainerConfig,
    as_node,
    config_dict,
    config_from_yaml,
    config_yaml,
    default_cache_dir,
    hydra_node,
    register_configs,
    typed_config,
    with_settings,
)
from synapse.config.supported_torch import (
    OLDEST_SUPPORTED,
    UnsupportedTorchError,
    require_supported_torch,
    torch_version,
)
from synapse.config.validation import validate

__all__ = ["Accelerator", "CheckpointConfig", "Choice", "ConfigError", "DataConfig", "DataName", "Decode",
           "DrillAction", "DrillConfig", "ExperimentConfig", "FailoverConfig", "FaultSettings", "HostRead",
           "InjectionConfig", "KDConfig", "KDMode", "LRSchedule", "LoggerConfig", "MAY_CHANGE", "MODES", "Mode",
           "MonitorConfig", "NONFINITE_POLICIES", "NodeDevices", "NoParams", "NonFinitePolicy", "OLDEST_SUPPORTED",
           "OptimConfig",
           "OptimizerName", "PartitionConfig", "PartitionMode", "PipelineConfig", "PipelineSchedule", "PolicyConfig",
           "PolicyName", "Precision", "ReplanMode", "SimulateConfig", "StageCompiler", "StudentConfig",
           "SynapseConfig", "TeacherConfig",
           "TrackerName", "TrainerConfig", "UnsupportedTorchError", "as_node", "check_resume_settings", "config_dict",
           "config_from_yaml", "config_yaml", "cuda_index", "decides_elsewhere", "default_cache_dir", "fixed_replicas",
           "hydra_node", "local_devices", "num_ranks", "num_stages", "register_configs", "require_supported_torch",
           "resolve_accelerator",
           "resolve_devices", "run_topology", "shares_a_gpu", "torch_version", "typed_config", "validate",
           "with_settings"]
