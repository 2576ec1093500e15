"""Starting and ending a launch of the K workers with torch's elastic launcher: the
rendezvous, the fork server, interrupts, worker logs, and which rank failed first and why.
"""
from synapse.launch.elastic import RendezvousSetupError, free_port, launch_pipeline
from synapse.launch.interrupt import InterruptToStop, RunInterrupted, relay
from synapse.launch.rendezvous import NODE_RANK_KEY, node_ordered_rank, rendezvous_bind_address, store_on
from synapse.launch.replica_groups import (
    REPLICAS_LOST,
    ReplicaLayoutError,
    UnreachableNodeError,
    carried_by_torchft,
    launch_replica_groups,
    node_address,
    replica_attempt,
    replicas_by_node,
    serve_replica_meeting,
)
from synapse.launch.root_cause import DISK_FULL, WorkerFailure, newest_checkpoint
from synapse.launch.worker_logs import failed_rank_tail, last_lines, rank_log_files

__all__ = ["DISK_FULL", "InterruptToStop", "NODE_RANK_KEY", "RendezvousSetupError", "RunInterrupted", "relay",
           "WorkerFailure", "failed_rank_tail", "free_port", "last_lines", "launch_pipeline", "launch_replica_groups",
           "newest_checkpoint", "replica_attempt", "REPLICAS_LOST", "ReplicaLayoutError", "UnreachableNodeError",
           "carried_by_torchft", "node_address", "replicas_by_node", "serve_replica_meeting",
           "node_ordered_rank", "rank_log_files", "rendezvous_bind_address", "store_on"]
