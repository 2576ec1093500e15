"""``mode=simulate``: what a policy does on hardware that is not here. Step timings come from the
block profiles and the cost model (GPipe or 1F1B, replicas), with noise drawn from recorded
fault-free runs; faults from the injection group, a CSV trace or rates; and the records go to the
same ``FailoverController`` (detector, estimator, ETA, policy) and the same writers a real run uses.
"""
from synapse.simulation.engine import START_TIME, SimulatedRun, SimulationResult, SimulationSetup
from synapse.simulation.faults import (
    COMM,
    COMPUTE,
    STOP,
    DeviceFault,
    FaultRates,
    injected_faults,
    random_faults,
    trace_faults,
)
from synapse.simulation.noise import StepNoise, load_noise, noise_from_stream
from synapse.simulation.run import SimulatedPlanners, first_plan, result_dict, run_simulation

__all__ = ["COMM", "COMPUTE", "DeviceFault", "FaultRates", "START_TIME", "STOP", "SimulatedPlanners", "SimulatedRun",
           "SimulationResult", "SimulationSetup", "StepNoise", "first_plan", "injected_faults", "load_noise",
           "noise_from_stream", "random_faults", "result_dict", "run_simulation", "trace_faults"]
