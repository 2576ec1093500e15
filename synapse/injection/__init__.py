"""Deterministic fault injection ("fail at rank r, step s", "slow down rank r from step s"):
what a configured fault is, when it acts, and the injector each worker runs.
"""
from synapse.injection.background_load import BackgroundLoad, LoadTarget, cpu_core_for_rank
from synapse.injection.injector import (
    CUDA_ERROR_MESSAGE,
    FaultInjector,
    InjectedFault,
    build_fault_injector,
    fired_fault_indices,
)
from synapse.injection.slowdown import DeviceDelay, TaskBaseline, split_extra
from synapse.injection.spec import (
    PHASES,
    PROBE_PHASE,
    FaultSpec,
    InjectionError,
    faults_for_segment,
    instant_fault_steps,
    parse_faults,
)

__all__ = ["BackgroundLoad", "CUDA_ERROR_MESSAGE", "DeviceDelay", "FaultInjector", "FaultSpec", "InjectedFault",
           "InjectionError", "LoadTarget", "PHASES", "PROBE_PHASE", "TaskBaseline", "build_fault_injector",
           "cpu_core_for_rank", "faults_for_segment", "fired_fault_indices", "instant_fault_steps", "parse_faults",
           "split_extra"]
