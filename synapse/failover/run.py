"""Build the failover machinery from a config and run a pipeline under the supervisor."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from synapse import checkpoint as ckpt
from synapse.calibration import AlphaBetaEstimator
from synapse.config import (
    FailoverConfig,
    SynapseConfig,
    TrainerConfig,
    resolve_accelerator,
    resolve_devices,
    run_topology,
)
from synapse.decision import OptionKind, RestartCost, RestartCostModel, make_policy
from synapse.detection import SlowdownDetector
from synapse.failover.controller import FailoverController
from synapse.failover.live import LIVE_KINDS
from synapse.failover.segments import Segment, SegmentComposer, read_segments, user_overrides
from synapse.failover.supervisor import Supervisor, first_segment
from synapse.launch import launch_pipeline, launch_replica_groups
from synapse.partitioning import NodeTopology, Placement, StagePlanner
from synapse.planning import RunPlan, configured_alphas
from synapse.rundir import CONTROLLER_STATE, EXPERIMENT_SUMMARY, EventLog, events_path
from synapse.trackers import open_tracker

# Measured restart and live re-plan costs, shipped with the package (experiments/bench_restart_cost.py and
# bench_live_replan.py write them here); a run's own restarts correct them.
PRIORS_DIR = Path(__file__).resolve().parent / "priors"
# Used only when no restart-cost benchmark result exists: the order of magnitude of a CPU restart
# of small models on 2 cores; the first real restart of the run replaces most of it.
FALLBACK_RESTART = RestartCost(checkpoint_save_s=0.2, teardown_s=0.5, launch_s=6.0, checkpoint_load_s=0.3,
                               warmup_s=0.5)
FALLBACK_LIVE = RestartCost(launch_s=0.2, warmup_s=0.1)


def restart_cost_model(trainer: TrainerConfig, failover: FailoverConfig, log: Callable[[str], None]
                       ) -> RestartCostModel:
    """Priors per restart path from the benchmarks (failover.restart_cost_file, else this repository's
    results for the accelerator), corrected later by the run's own restarts."""
    accelerator = resolve_accelerator(trainer)
    restart = _benchmark_cost(failover.restart_cost_file, PRIORS_DIR / f"restart_cost_{accelerator}.json",
                              "restart", FALLBACK_RESTART, "experiments/bench_restart_cost.py", log)
    live = _benchmark_cost(None, PRIORS_DIR / f"live_replan_{accelerator}.json", "live", FALLBACK_LIVE,
                           "experiments/bench_live_replan.py", log)
    # The path each kind takes when the workers take it live; where they do not (replan_mode=restart, a torchft
    # launch: failover.live), the controller prices it at the restart path. A live REBALANCE moves no block:
    # priced at the live REPLAN's cost until the run has measured its own (both are corrected on the one
    # "live" path), an upper bound.
    kind_paths: dict[OptionKind | str, str] = {kind: "live" for kind in LIVE_KINDS}
    return RestartCostModel({"restart": restart, "live": live}, kind_paths=kind_paths)


def _benchmark_cost(path: str | None, default: Path, name: str, fallback: RestartCost, script: str,
                    log: Callable[[str], None]) -> RestartCost:
    source = Path(path) if path else (default if default.is_file() else None)
    if source is None:
        log(f"failover: no {name} cost measured yet ({script}); assuming {fallback.total_s:.1f} s until this run "
            f"has done one")
        return fallback
    return RestartCostModel.from_benchmark(json.loads(source.read_text())).estimate(name)


def build_controller(cfg: SynapseConfig, planner: StagePlanner, run_dir: Path, log: Callable[[str], None],
                     first: Placement | None = None, topology: NodeTopology | None = None) -> FailoverController:
    """The controller of a run whose first placement is ``first``: with ``partition.alphas`` the
    first plan was made for slow devices, a slowdown known before the first step (not slow blocks).
    ``topology``: a run across nodes (its spares are every node's, run-wide ids; a REPLACE keeps the
    ranks node-ordered); None: trainer.spare_devices are the run's ids as they stand (one node, or simulated)."""
    prior = (dict(zip(first.devices, configured_alphas(cfg.partition, len(first.devices))))
             if first and cfg.partition.alphas else {})
    return FailoverController(
        policy=make_policy(str(cfg.policy.name), **dataclasses.asdict(cfg.policy.params)),
        planner=planner,
        restart_costs=restart_cost_model(cfg.trainer, cfg.failover, log),
        detector=SlowdownDetector(cfg.failover.detector),
        estimator=AlphaBetaEstimator(cfg.failover.estimator),
        spare_devices=tuple(cfg.trainer.spare_devices) if topology is None else tuple(topology.spares),
        node_of=None if topology is None else topology.node_of,
        prior_alphas=prior,
        decide_every=cfg.failover.decide_every,
        log_event=EventLog(events_path(run_dir), source="controller").append,
        drills=[{"step": d.step, "action": str(d.action), "device": d.device} for d in cfg.failover.drills],
        failover=cfg.failover,
        say=log,
    )


def run_with_failover(cfg: SynapseConfig, run_dir: Path, planner: StagePlanner, plan: RunPlan,
                      teacher_weights: str, resume: str | None, overrides: Sequence[str] | None,
                      log: Callable[[str], None] = print, launch: Callable[..., dict] = launch_pipeline
                      ) -> dict[str, Any]:
    """The supervisor's segment loop; ``planner`` is the run's one planner (it made the first plan);
    ``launch`` runs one segment (across nodes: the decider's ``failover.multinode.NodeDecider``)."""
    if str(cfg.failover.replica_engine) == "torchft" and cfg.trainer.nodes == 1:  # across nodes: the NodeDecider's
        launch = launch_replica_groups
    across_nodes = run_topology(cfg.trainer) if cfg.trainer.nodes > 1 else None
    controller = build_controller(cfg, planner, run_dir, log, first=plan.placement, topology=across_nodes)
    lost_nodes = set(getattr(launch, "lost", ()))  # a restarted decider's: nodes declared lost, with their spares
    if across_nodes is not None and lost_nodes:
        controller.spare_devices = tuple(d for d in controller.spare_devices
                                         if across_nodes.node_of(d) not in lost_nodes)
    if hasattr(launch, "on_spares"):  # across nodes: a node declared lost that comes back is a spare
        def add_spares(devices: list[int]) -> None:
            controller.spare_devices = tuple(sorted({*controller.spare_devices, *devices}))
        launch.on_spares = add_spares
    composer = SegmentComposer(cfg, run_dir, user_overrides(overrides))
    supervisor = Supervisor(cfg.failover, cfg.trainer, composer, run_dir, controller, teacher_weights,
                            policy=cfg.policy.name, injection=cfg.injection.name, log=log,
                            tracker=open_tracker(cfg.logger.name, run_dir, "supervisor"), launch=launch)
    history = read_segments(run_dir) if cfg.resume is not None else []
    start = ckpt.read_manifest(Path(resume))["step"] if resume else 0
    if not history:  # a fresh run, or one resumed by path into a new directory: its record starts at `start`
        spec = first_segment(plan.placement, plan.microbatches, resume)
        spec.start_step = start
        return supervisor.run(spec)
    supervisor.earlier_restarts = earlier_restarts(run_dir, log)
    if not same_command(plan, history[0]):  # resumed with other devices, another partition or micro-batch count
        supervisor.segments = history
        log(f"failover: resuming at step {start} as segment {len(history)} on the configured devices "
            f"{resolve_devices(cfg.trainer)}")
        spec = first_segment(plan.placement, plan.microbatches, resume)
        spec.index, spec.reason, spec.start_step = len(history), "resume", start
        return supervisor.run(spec)
    # The supervisor itself was restarted (resume=auto): continue the segment history on the
    # devices and partition the last segment ran on, with what the controller had learnt.
    state = CONTROLLER_STATE.path(run_dir)
    if state.is_file():
        load_controller_state(controller, state)
    last = history[-1]
    adopts = getattr(launch, "adopts", None)  # a restarted decider across nodes (failover/decider.py)
    if not last.outcome and adopts is not None and adopts(last.index, last.devices):
        # its workers still run on every node of it: watched to their end, not relaunched
        supervisor.segments = history[:-1]
        log(f"failover: adopting segment {last.index} on devices {last.devices}, still running since step "
            f"{last.start_step}")
        return supervisor.run(last, compose=True, adopted=True)
    supervisor.segments = history
    log(f"failover: continuing after segment {last.index} ({last.outcome or 'interrupted'}) on devices {last.devices} "
        f"from step {start}")
    return supervisor.run(Segment(last.index + 1, last.placement, last.microbatches, reason="supervisor_restart",
                                  resume=resume, start_step=start), compose=True)


def earlier_restarts(run_dir: Path, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The restarts an earlier supervisor of this run recorded, so a resumed run's summary keeps them."""
    path = EXPERIMENT_SUMMARY.path(run_dir)
    try:
        return list(json.loads(path.read_text())["restarts"]) if path.is_file() else []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log(f"failover: {path} is unreadable ({type(exc).__name__}: {exc}); the summary of this resumed run "
            f"lists only its own restarts")
        return []


class ControllerStateError(ValueError):
    """``failover/controller_state.json`` cannot be read back; the message names it and the fix."""


def load_controller_state(controller: FailoverController, path: Path) -> None:
    """What the controller had learnt (baselines, restart costs), saved after every segment."""
    try:
        controller.load_state_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ControllerStateError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); it holds only what the failover controller learnt "
            f"during the run (step-time baselines, measured restart costs), no training state. Fix: delete it and "
            f"rerun with resume=auto: the run continues from its newest checkpoint and the controller learns "
            f"again") from exc


def same_command(plan: RunPlan, first: Segment) -> bool:
    """Whether this run asks for what the run's first segment ran: then a resume continues its history."""
    return (plan.placement, plan.microbatches) == (first.placement, first.microbatches)
