"""The TSPipe-style KD pipeline on torch.distributed.pipelining: each rank's fused
teacher+student stage, its share of the training loop, CUDA-graphed stages, live re-partition,
and the worker entry point the elastic agent runs.
"""
from synapse.pipeline.clock import StageClock, reads_timing_late
from synapse.pipeline.graphs import StageGraphs, slots_for
from synapse.pipeline.quorum import ReplicaGroupSpec, ReplicaMeeting, quorum_share
from synapse.pipeline.repartition import BlockMove, exchange_blocks
from synapse.pipeline.runtime import WAIT_PHASES, PipelineRuntime, ProgressBoard, progress_path, read_progress
from synapse.pipeline.stage import FusedStage
from synapse.pipeline.wire import from_wire, to_wire
from synapse.pipeline.worker import LaunchTask, worker_main, write_failure

__all__ = ["BlockMove", "LaunchTask", "FusedStage", "PipelineRuntime", "ProgressBoard", "ReplicaGroupSpec",
           "ReplicaMeeting", "StageClock", "StageGraphs", "WAIT_PHASES", "exchange_blocks", "from_wire",
           "progress_path", "quorum_share", "read_progress", "reads_timing_late", "slots_for", "to_wire",
           "worker_main", "write_failure"]
