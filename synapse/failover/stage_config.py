"""What makes stage n of a run stage n: its settings on top of the user's config, and its config.

Apart from the supervisor's loop because a stage's config is a function of plain inputs alone
(the run's config, the user's overrides, the stage's devices, partition and resume checkpoint,
and which faults already fired), and a stage saved under ``stages/<n>/`` must compose again to
exactly what ran. `synapse.failover.stages` composes and saves; this module decides what goes in.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from synapse.config import run_topology, validate
from synapse.monitor.injection import fired_fault_indices
from synapse.failover.faults import faults_for_stage
from synapse.failover.multinode import stage_node_settings
from synapse.failover.stages import StageSpec, compose_stage_config, merge_overrides, setting

# The run's event log so far (read only for stages after the first: which faults already fired).
WorkerEvents = Callable[[], list[dict[str, Any]]]


def stage_settings(cfg: DictConfig, run_dir: Path, spec: StageSpec, worker_events: WorkerEvents) -> dict[str, Any]:
    """What makes this stage this stage, on top of the user's config (key -> value)."""
    settings: dict[str, Any] = {"run_dir": str(run_dir), "cache_dir": cfg.cache_dir,
                                # chosen once (pipeline.microbatches=auto): every stage keeps it
                                "pipeline.microbatches": cfg.pipeline.microbatches}
    if spec.index == 0:
        return settings
    faults = OmegaConf.to_container(cfg.injection.faults, resolve=True)
    fired = fired_fault_indices(worker_events())
    topology = run_topology(cfg.trainer)  # run-wide device ids across nodes (planner/topology.py)
    return {**settings, **stage_node_settings(topology, spec.devices, cfg.trainer.rdzv_endpoint),
            "trainer.strategy": "pipeline",
            "partition.mode": "manual", "partition.teacher": spec.teacher_counts,
            "partition.student": spec.student_counts, "partition.alphas": None,
            "injection.faults": faults_for_stage(faults, topology.devices, spec.devices, fired),
            # a spare swapped in is no longer spare (the device it replaced is bad, not spare)
            "trainer.spare_devices": [d for d in cfg.trainer.spare_devices if d not in spec.devices],
            "resume": spec.resume}


def stage_overrides(cfg: DictConfig, run_dir: Path, user_overrides: list[str] | None, spec: StageSpec,
                    worker_events: WorkerEvents) -> list[str]:
    """The override list that composes this stage: the user's, then the stage's own."""
    stage = [setting(key, value) for key, value in stage_settings(cfg, run_dir, spec, worker_events).items()]
    return merge_overrides(user_overrides or [], stage)


def compose_stage(cfg: DictConfig, run_dir: Path, user_overrides: list[str] | None, spec: StageSpec,
                  worker_events: WorkerEvents) -> tuple[DictConfig, list[str]]:
    """The stage's validated config and the overrides that compose it."""
    overrides = stage_overrides(cfg, run_dir, user_overrides, spec, worker_events)
    if user_overrides is None:
        # Called with a config but not the overrides that made it (a program, not train.py):
        # the stage is the same config with the stage's settings merged in.
        stage_cfg = OmegaConf.merge(cfg, {})
        for key, value in stage_settings(cfg, run_dir, spec, worker_events).items():
            OmegaConf.update(stage_cfg, key, value, merge=False)
    else:
        stage_cfg = compose_stage_config(overrides)
    validate(stage_cfg)
    return stage_cfg, overrides
