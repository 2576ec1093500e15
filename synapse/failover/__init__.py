"""The supervisor and its failover loop: launch after launch until the schedule is done;
the controller that turns step timings into KEEP / REPLAN / DEGRADE / REPLACE; every launch as a
composed Hydra config; the run's summary and console; and the decider and agents across nodes.
"""
from synapse.failover.controller import FailoverController
from synapse.failover.decider import NodeDecider
from synapse.failover.keeper import DeciderJob, DeciderLostError, keeps_the_decider, run_across_nodes
from synapse.failover.live import LIVE_OUTCOMES, replica_engine
from synapse.failover.node_channel import (
    ExitOrder,
    LaunchOrder,
    NodeChannel,
    NodeChannelError,
    NodeHello,
    NodeReport,
    NodeSetupError,
    StopOrder,
    Welcome,
)
from synapse.failover.progress import RunProgress, supervised_console
from synapse.failover.restarts import Restart
from synapse.failover.run import build_controller, run_with_failover
from synapse.failover.segments import (
    Segment,
    compose_segment_config,
    merge_overrides,
    read_segment_overrides,
    read_segments,
    user_overrides,
    write_segment,
)
from synapse.failover.summary import print_failover_story, write_experiment_summary
from synapse.failover.supervisor import FailoverError

__all__ = ["DeciderJob", "DeciderLostError", "ExitOrder", "FailoverController", "FailoverError",
           "LIVE_OUTCOMES", "LaunchOrder", "NodeChannel", "NodeChannelError", "NodeDecider", "NodeHello", "NodeReport",
           "NodeSetupError", "Restart", "RunProgress", "Segment", "StopOrder", "Welcome",
           "build_controller", "compose_segment_config", "merge_overrides", "print_failover_story",
           "keeps_the_decider", "replica_engine", "read_segment_overrides", "read_segments",
           "run_across_nodes",
           "run_with_failover", "supervised_console", "user_overrides", "write_experiment_summary",
           "write_segment"]
