"""Build the failover machinery from a config and run a pipeline under the supervisor."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

from omegaconf import DictConfig, OmegaConf

from .. import checkpoint as ckpt
from ..config import resolve_accelerator, resolve_devices
from ..launch.planning import profile_models
from ..monitor.detector import DetectorConfig, SlowdownDetector
from ..monitor.events import EventLog, events_path
from ..pipeline.partition import StagePartition
from ..planner.cost_model import StepSpec
from ..planner.estimator import AlphaBetaEstimator, EstimatorConfig
from ..planner.eta import OptionKind, RestartCost, RestartCostModel
from ..planner.policy import make_policy
from ..planner.profile import load_profile_csv
from .controller import FailoverController
from .planning import StagePlanner
from .stages import StageSpec, read_stages
from .supervisor import STATE_FILE, Supervisor, first_stage, user_overrides

REPO_RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
# Used only when no restart-cost benchmark result exists: the order of magnitude of a CPU restart
# of small models on 2 cores; the first real restart of the run replaces most of it.
FALLBACK_RESTART = RestartCost(checkpoint_save_s=0.2, teardown_s=0.5, launch_s=6.0, checkpoint_load_s=0.3,
                               warmup_s=0.5)
FALLBACK_LIVE = RestartCost(launch_s=0.2, warmup_s=0.1)


def restart_cost_model(cfg: DictConfig, log: Callable[[str], None]) -> RestartCostModel:
    """Priors per restart path from the benchmarks (failover.restart_cost_file, else this repository's
    results for the accelerator), corrected later by the run's own restarts."""
    accelerator = resolve_accelerator(cfg.trainer)
    restart = _benchmark_cost(cfg.failover.restart_cost_file, REPO_RESULTS / f"restart_cost_{accelerator}.json",
                              "restart", FALLBACK_RESTART, "experiments/bench_restart_cost.py", log)
    live = _benchmark_cost(None, REPO_RESULTS / f"live_replan_{accelerator}.json", "live", FALLBACK_LIVE,
                           "experiments/bench_live_replan.py", log)
    kind_paths = {OptionKind.REPLAN: "live"} if cfg.failover.replan_mode == "live" else {}
    return RestartCostModel({"restart": restart, "live": live}, kind_paths=kind_paths)


def _benchmark_cost(path: str | None, default: Path, name: str, fallback: RestartCost, script: str,
                    log: Callable[[str], None]) -> RestartCost:
    path = Path(path) if path else (default if default.is_file() else None)
    if path is None:
        log(f"failover: no {name} cost measured yet ({script}); assuming {fallback.total_s:.1f} s until this run "
            f"has done one")
        return fallback
    return RestartCostModel.from_benchmark(json.loads(path.read_text())).estimate(name)


def build_stage_planner(cfg: DictConfig, info, log: Callable[[str], None]) -> StagePlanner:
    from ..launch.planning import _OPTIMIZER_STATE

    paths = profile_models(cfg, info, log)
    gbps = cfg.partition.link_bandwidth_gbps
    cuda = resolve_accelerator(cfg.trainer) == "cuda"
    return StagePlanner(load_profile_csv(paths.teacher), load_profile_csv(paths.student),
                        StepSpec(cfg.pipeline.microbatches, cfg.pipeline.schedule,
                                 optimizer_state_multiplier=_OPTIMIZER_STATE[cfg.optim.name]),
                        device_name=("cuda:{}" if cuda else "cpu:{}").format,
                        memory_bytes=_gpu_memory if cuda else (lambda device: math.inf),
                        link_bandwidth_bytes_per_s=gbps * 1e9 if gbps else math.inf)


def _gpu_memory(device: int) -> float:
    import torch

    return float(torch.cuda.get_device_properties(device).total_memory)


def build_controller(cfg: DictConfig, info, run_dir: Path, log: Callable[[str], None]) -> FailoverController:
    settings = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731
    return FailoverController(
        policy=make_policy(cfg.policy.name, **settings(cfg.policy.params)),
        planner=build_stage_planner(cfg, info, log),
        restart_costs=restart_cost_model(cfg, log),
        detector=SlowdownDetector(DetectorConfig(**settings(cfg.failover.detector))),
        estimator=AlphaBetaEstimator(EstimatorConfig(**settings(cfg.failover.estimator))),
        spare_devices=tuple(int(d) for d in cfg.trainer.spare_devices),
        decide_every=cfg.failover.decide_every,
        log_event=EventLog(events_path(run_dir), source="controller").append,
        drills=[dict(d) for d in settings(cfg.failover.drills)],
        # a line of its own: the last rank's progress bar (another process) ends without a newline
        say=(lambda line: log("\n" + line)) if cfg.trainer.progress else log,
    )


def run_with_failover(cfg: DictConfig, run_dir: Path, info, partition: StagePartition, teacher_weights: str,
                      resume: str | None, overrides: Sequence[str] | None,
                      log: Callable[[str], None] = print) -> dict[str, Any]:
    controller = build_controller(cfg, info, run_dir, log)
    supervisor = Supervisor(cfg, run_dir, user_overrides(overrides), controller, teacher_weights, log=log)
    history = read_stages(run_dir) if cfg.resume is not None else []
    if not history:
        return supervisor.run(first_stage(cfg, partition, resume))
    start = ckpt.read_manifest(Path(resume))["step"] if resume else 0
    if not same_command(cfg, partition, history[0]):  # resumed with other devices or another partition
        supervisor.stages = history
        log(f"failover: resuming at step {start} as stage {len(history)} on the configured devices "
            f"{resolve_devices(cfg.trainer)}")
        spec = first_stage(cfg, partition, resume)
        spec.index, spec.reason, spec.start_step = len(history), "resume", start
        return supervisor.run(spec)
    # The supervisor itself was restarted (resume=auto): continue the stage history on the
    # devices and partition the last stage ran on, with what the controller had learnt.
    state = run_dir / STATE_FILE
    if state.is_file():
        controller.load_state_dict(json.loads(state.read_text()))
    last = history[-1]
    supervisor.stages = history
    log(f"failover: continuing after stage {last.index} ({last.outcome or 'interrupted'}) on devices {last.devices} "
        f"from step {start}")
    return supervisor.run(StageSpec(last.index + 1, last.devices, last.teacher_counts, last.student_counts,
                                    reason="supervisor_restart", resume=resume, start_step=start), compose=True)


def same_command(cfg: DictConfig, partition: StagePartition, first: StageSpec) -> bool:
    """Whether this run asks for what the run's first stage ran: then a resume continues its history."""
    return (resolve_devices(cfg.trainer) == first.devices and list(partition.teacher) == first.teacher_counts
            and list(partition.student) == first.student_counts)
