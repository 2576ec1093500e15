"""Which blocks of which model run on which device, and what that costs: block profiles, the
cost model, the exact partitioner, the run's planner on device ids, micro-batch counts and the
nodes of a run. Pure: plain numbers and dataclasses, no torch.
"""
from synapse.partitioning.cost_model import (
    MESSAGES_PER_MICROBATCH,
    OPTIMIZER_STATE_MULTIPLIERS,
    CostModel,
    CostModelError,
    DeviceSpec,
    Schedule,
    StepSpec,
    cpu_contention,
    require,
)
from synapse.partitioning.layouts import LayoutCandidate, LayoutChoice, LayoutChoiceError, choose_layout, layout_shapes
from synapse.partitioning.microbatches import MicrobatchChoiceError, candidate_counts, choose_microbatches
from synapse.partitioning.partitioner import (
    PartitionPlan,
    PlanError,
    even_partition,
    plan_partition,
    plan_with_cost_model,
)
from synapse.partitioning.placement import PartitionError, Placement, equal_shares, even_counts, shares_for_speeds
from synapse.partitioning.planner import DeviceFacts, LayoutCost, StagePlanner, ring_allreduce_s
from synapse.partitioning.profile import (
    BYTES_PER_KB,
    PROFILE_COLUMNS,
    SHARED_PROFILE_MICRO_BATCH,
    BlockProfile,
    ModelProfile,
    ProfileError,
    load_profile_csv,
    metadata_path,
    scale_to_micro_batch,
    write_profile_csv,
)
from synapse.partitioning.topology import NodeTopology, TopologyError

__all__ = ["BYTES_PER_KB", "BlockProfile", "CostModel", "CostModelError", "DeviceFacts", "DeviceSpec",
           "LayoutCandidate", "LayoutChoice", "LayoutChoiceError", "LayoutCost", "choose_layout", "layout_shapes",
           "ring_allreduce_s",
           "MESSAGES_PER_MICROBATCH", "MicrobatchChoiceError", "ModelProfile", "NodeTopology",
           "OPTIMIZER_STATE_MULTIPLIERS", "PROFILE_COLUMNS", "PartitionError", "PartitionPlan", "Placement",
           "PlanError", "ProfileError", "SHARED_PROFILE_MICRO_BATCH", "Schedule", "StagePlanner", "StepSpec",
           "TopologyError", "candidate_counts", "choose_microbatches", "cpu_contention", "equal_shares", "even_counts",
           "even_partition", "load_profile_csv", "metadata_path", "plan_partition", "plan_with_cost_model",
           "require", "scale_to_micro_batch", "shares_for_speeds", "write_profile_csv"]
