"""``failover.replica_engine=torchft``: a segment of R replicas as R elastic launches under torchft's lighthouse.

The supervisor runs the lighthouse (torchft's quorum server) for the segment and one elastic launch per
replica, each on its own rendezvous with its own restart budget (``failover.replica_respawns``): a
replica's dead worker is respawned by its agent and heals from a peer (``synapse.pipeline.quorum``) while
the other replicas go on; nothing of theirs restarts. Inside a replica the K stages are a launch as
``launch_pipeline`` makes them (its pipeline, its control exchange). A replica whose budget is spent
is gone for the segment; the segment fails only when every replica has (then the supervisor's restart
path takes over from the newest checkpoint).

No health monitor tears these launches down: a dead worker is its agent's to respawn, and a rank that
hangs fails its replica's collectives (``trainer.collective_timeout_s``).
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.launcher.api import elastic_launch

from synapse.launch.elastic import launch_config, launch_pipeline, preload_worker_modules, start_fork_server
from synapse.launch.root_cause import WorkerFailure
from synapse.pipeline import LaunchTask, ReplicaGroupSpec, worker_main
from synapse.rundir import FAILURES


def replica_attempt(attempt: str, replica: int) -> str:
    """The launch name (logs/launch_<name>/) of one replica's launch in segment ``attempt``."""
    return f"{attempt}_replica{replica}"


def launch_replica_groups(task: LaunchTask, run_dir: Path, attempt: str = "0", log: Callable[[str], None] = print,
                          store_hosted: bool = False) -> dict[str, Any]:
    """Run ``task``'s replicas, each a launch of its own under one lighthouse, to the end of the segment;
    return replica 0's summary (or a surviving replica's). One pipeline is ``launch_pipeline``'s."""
    placement, cfg = task.placement, task.config
    if cfg.failover.replica_engine != "torchft" or placement.replicas == 1:
        return launch_pipeline(task, run_dir, attempt, log, store_hosted)
    from torchft._torchft import LighthouseServer  # type: ignore[import-untyped]

    preload_worker_modules(cfg.data.name)
    start_fork_server()
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=1000,
                                  heartbeat_timeout_ms=int(cfg.failover.replica_heartbeat_timeout_s * 1000))
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]  # it names the host; one node: loopback
    meeting = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the first quorum's (quorum.py)
    summaries: dict[int, dict[str, Any]] = {}
    failures: dict[int, BaseException] = {}

    def run_replica(replica: int) -> None:
        pipeline = placement.pipeline(replica)
        # the console shows replica 0's ranks (trainer.local_ranks_filter); every replica's are in its logs
        trainer = dataclasses.replace(cfg.trainer, devices=list(pipeline.devices),
                                      local_ranks_filter=cfg.trainer.local_ranks_filter if replica == 0 else ())
        spec = ReplicaGroupSpec(replica, placement.replicas, address, float(cfg.trainer.collective_timeout_s),
                                tuple(placement.devices), f"127.0.0.1:{meeting.port}")
        replica_task = dataclasses.replace(task, config=dataclasses.replace(cfg, trainer=trainer),
                                           placement=pipeline, replica_group=spec)
        name = replica_attempt(attempt, replica)
        config = launch_config(trainer, run_dir, name)
        config.max_restarts = cfg.failover.replica_respawns  # the replica's agent respawns its dead workers
        try:
            results = elastic_launch(config, worker_main)(replica_task, str(run_dir),
                                                          str(FAILURES.path(run_dir, attempt=name)))
            summaries[replica] = next((r for r in results.values() if r), {})
        except Exception as exc:  # noqa: BLE001 - told below, with the other replicas' (ChildFailedError too)
            failures[replica] = exc

    threads = [threading.Thread(target=run_replica, args=(r,), name=f"synapse-replica-{r}", daemon=True)
               for r in range(placement.replicas)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        lighthouse.shutdown()
    for replica, exc in sorted(failures.items()):
        log(f"replica {replica}: its launch ended after failover.replica_respawns={cfg.failover.replica_respawns} "
            f"respawns: {type(exc).__name__}: {str(exc)[:300]}")
    if not summaries:
        kinds = ", ".join(sorted({type(e).__name__ for e in failures.values()}))
        raise WorkerFailure(f"every replica's launch failed ({kinds}); the segment goes on from the newest "
                            f"checkpoint", None, "replicas_lost", retry_same_devices=True)
    written = [summaries[r] for r in sorted(summaries) if summaries[r]]  # replica 0's last rank writes it
    return written[0] if written else {}
