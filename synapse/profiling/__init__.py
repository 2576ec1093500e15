"""Block-wise profiler: measure a model block by block and write the Synapse profile CSV.

Measurement lives here; the planner (``synapse.planner``) only reads the CSVs it writes.
Modules: ``request`` (what to measure, cache key), ``sweeps`` (how blocks are run and timed),
``measure`` (timer, saved-tensor and memory counters), ``profiler`` (one profile), ``result``
(files on disk), ``cache`` (get-or-measure, and the entry point for ``train.py mode=profile``).
Only torch, timm and the package's models/planner are needed: no Hydra, so a bare GPU
machine can profile.

"""
from synapse.profiling.cache import (
    PROFILES_SUBDIR,
    ProfilePaths,
    ProfileTaker,
    cached_profile_path,
    get_or_profile,
    profile_for_config,
    profiles_taken_by,
)
from synapse.profiling.context import ComputeSetup, MeasureContext, loss_gradient
from synapse.profiling.measure import MarkTimer, SavedTensorBytes, storage_keys
from synapse.profiling.profiler import measurement_count, profile_model, run_profile
from synapse.profiling.request import (
    DTYPES,
    ROLES,
    ProfileRequest,
    ProfilerError,
    cache_key,
    device_name,
    resolve_device,
    resolve_precision,
)
from synapse.profiling.result import ProfileDetails, ProfileResult, details_path, load_result, save_result
from synapse.profiling.sweeps import parameter_bytes, timed_sweep

__all__ = ["ComputeSetup", "DTYPES", "MarkTimer", "MeasureContext", "PROFILES_SUBDIR", "ProfileDetails",
           "ProfilePaths", "ProfileRequest", "ProfileResult", "ProfileTaker", "ProfilerError", "ROLES",
           "SavedTensorBytes", "cache_key", "cached_profile_path", "details_path", "device_name", "get_or_profile",
           "load_result", "loss_gradient", "measurement_count", "parameter_bytes", "profile_for_config",
           "profile_model", "profiles_taken_by", "resolve_device", "resolve_precision", "run_profile", "save_result",
           "storage_keys", "timed_sweep"]
