"""What a resume may change: a run continued from its checkpoint must go on learning what it learned.

``resume=auto`` (or ``resume=<checkpoint>``) continues a run. A setting that changes what is
learned, changed on the command line of the resume, used to be taken silently: another teacher
or ``kd.T`` distilled from the resume step on, another ``data.batch_size`` trained a new teacher
and ended two steps short reported as finished, another ``optim.lr`` was overridden by the
checkpoint's optimizer while ``config.yaml`` recorded the new value, another ``seed`` failed only
after the launch. So before any work, the resumed config is compared, key by key, with the one
the run recorded (its ``config.yaml``, written at every start): a change is accepted only where
the key is in ``MAY_CHANGE`` (where and how the run executes, how it is watched, logged and
reported); every other key, a key added to the schema later included, refuses the resume naming
the keys, their recorded values and how to start a new run instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from synapse.config.errors import ConfigError, fail
from synapse.config.schema import config_dict
from synapse.rundir import CHECKPOINTS, CONFIG

# Keys (or whole groups) a resume may change, and why that changes nothing that is learned.
MAY_CHANGE: dict[str, str] = {
    "resume": "which checkpoint to continue from",
    "run_dir": "where the run's files go (resume=<checkpoint> into a new directory)",
    "cache_dir": "where trained teachers and profiles are cached",
    "report": "whether the report is drawn at the end",
    "trainer.accelerator": "the devices it runs on",
    "trainer.devices": "the devices it runs on (the pipeline's cuts are placement, not learning)",
    "trainer.spare_devices": "the devices it runs on",
    "trainer.nodes": "the machines it runs on",
    "trainer.node_rank": "the machines it runs on",
    "trainer.node_devices": "the machines it runs on",
    "trainer.rdzv_endpoint": "how its processes meet",
    "trainer.rdzv_id": "how its processes meet",
    "trainer.rdzv_timeout_s": "how long its processes wait for each other",
    "trainer.collective_timeout_s": "how long its processes wait for each other",
    "trainer.stop_after": "where this launch stops (the schedule is unchanged)",
    "trainer.channels_last": "memory layout",
    "trainer.cudnn_benchmark": "kernel choice",
    "trainer.threads": "threads per process",
    "trainer.deterministic": "kernel choice",
    "trainer.eval_every_epochs": "how often it is evaluated",
    "trainer.log_every": "logging",
    "trainer.progress": "the console",
    "trainer.start_probe": "how a device slow from the start is found",
    "trainer.local_ranks_filter": "the console",
    "trainer.nonfinite": "what a non-finite step does (the remedy a stopped run's message suggests)",
    "trainer.nonfinite_check": "when the loss is checked",
    "data.root": "where the same data set lies",
    "data.val_batch_size": "evaluation only",
    "data.synthetic_val_size": "evaluation only",
    "data.num_workers": "loader processes",
    "data.decode": "where JPEGs are decoded",
    "data.gpu_decode_share": "where JPEGs are decoded",
    "pipeline.schedule": "the order of the same micro-batches' work",
    "pipeline.cuda_graphs": "how the same kernels are launched",
    "pipeline.compiler": "how the same computation is turned into kernels",
    "pipeline.timing_read": "when timings are read",
    "partition": "which device holds which blocks",
    "checkpoint": "checkpoint cadence and retention",
    "monitor": "health monitoring",
    "failover": "how the run is supervised",
    "policy": "how the supervisor decides",
    "injection": "injected faults (drills; the supervisor itself rewrites them between segments)",
    "logger": "where scalars are logged",
    "experiment": "the run's label",
}


# Replicas and micro-batches may change together when every step's images still fall into the same
# micro-batches in the same order (e.g. 2 replicas x 2 micro-batches -> one pipeline of 4): a layout,
# like a partition, says where the same work runs.
LAYOUT_KEYS = ("trainer.replicas", "trainer.replica_shares", "pipeline.microbatches")


def same_grouping(recorded: dict[str, Any], current: dict[str, Any]) -> bool:
    before, after = _grouping(recorded), _grouping(current)
    return before is not None and before == after


def _grouping(config: dict[str, Any]) -> tuple[int, ...] | None:
    """The sizes of one step's micro-batches, replica after replica; None when the plan decides them (auto)."""
    from synapse.partitioning import PartitionError, equal_shares

    leaves = _leaves(config)
    batch, replicas = leaves.get("data.batch_size"), leaves.get("trainer.replicas", 1)
    microbatches, shares = leaves.get("pipeline.microbatches"), leaves.get("trainer.replica_shares")
    if not (isinstance(batch, int) and isinstance(replicas, int) and isinstance(microbatches, int)):
        return None  # auto: the plan decides
    m = microbatches
    try:
        sizes = tuple(shares) if shares else equal_shares(batch, replicas, m)
    except PartitionError:
        return None
    return tuple(size // m for size in sizes for _ in range(m))


def may_change(key: str) -> bool:
    return any(key == allowed or key.startswith(allowed + ".") for allowed in MAY_CHANGE)


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of a config's plain data (lists are values, as a user overrides them whole)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_leaves(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def shown(value: Any) -> str:
    """A value as an override writes it (``null``, ``true``, ``[2,5,4]``)."""
    dumped: str = yaml.safe_dump(value, default_flow_style=True, width=10_000)  # (yaml is untyped: Any)
    text = dumped.strip().removesuffix("\n...").strip()
    return text.replace(", ", ",") if isinstance(value, (list, dict)) else text


@dataclass(frozen=True)
class Change:
    key: str
    recorded: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.key}={shown(self.recorded)} (now {shown(self.now)})"


def changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[Change]:
    """Keys whose value differs; a key only one side has (another Synapse version) is not compared."""
    before, after = _leaves(recorded), _leaves(current)
    return [Change(key, before[key], after[key]) for key in after if key in before and before[key] != after[key]]


def recorded_config(resume: str, run_dir: Path) -> Path | None:
    """The config the continued run recorded: for resume=auto the run directory's, when it holds a
    checkpoint to continue from (else the run starts afresh); for a path, that of the run whose
    ``checkpoints/`` (or a segment's ``resume/``) holds it. None if there is none."""
    from synapse.checkpoint import ordered_checkpoints

    if resume == "auto":
        if not ordered_checkpoints(CHECKPOINTS.path(run_dir)):
            return None
        path = CONFIG.path(run_dir)
    else:
        path = CONFIG.path(Path(resume).resolve().parent.parent)
    return path if path.is_file() else None


def check_resume_settings(cfg: DictConfig) -> str | None:
    """Refuse a resume whose settings change what the run learns (ConfigError); else a line that
    says what was compared and which harmless settings changed (None: not a resume)."""
    if cfg.resume is None or cfg.mode != "kd":
        return None
    where = f"resume={cfg.resume}"
    path = recorded_config(str(cfg.resume), Path(cfg.run_dir))
    if path is None:
        if cfg.resume == "auto":
            return None  # nothing to continue: resolve_resume says it starts fresh
        return (f"{where}: no config recorded beside the checkpoint (no {CONFIG.template} two folders up), so its "
                f"settings could not be compared with this run's: make sure they are the same")
    try:
        recorded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"resume: {path}, the config recorded by the run it continues, cannot be read ({exc}). "
                          f"Fix: restore that file, or start a new run (resume=null in a new run directory)") from exc
    if not isinstance(recorded, dict):
        fail("resume", f"{path}, the config recorded by the run it continues, holds no settings",
             "restore that file, or start a new run (resume=null in a new run directory)")
    current = config_dict(cfg)
    found = changes(recorded, current)
    regrouped = same_grouping(recorded, current)
    refused = [c for c in found if not may_change(c.key) and not (regrouped and c.key in LAYOUT_KEYS)]
    if refused:
        fail("resume", f"this run would learn with other settings than the run it continues (recorded in {path}): "
             f"{', '.join(map(str, refused))}. A resumed run must learn what that run learned; only where and how "
             f"it runs may change (devices, nodes, logging, progress, report, checkpoint cadence, monitor, failover, "
             f"injection)",
             f"continue it with the recorded values ({' '.join(f'{c.key}={shown(c.recorded)}' for c in refused)}), "
             f"or start a new run with the new ones: resume=null in a new run directory (hydra.run.dir=<new dir>)")
    kept = [c for c in found if c.key not in ("resume", "run_dir")]
    changed = (f"changed, none of which alters what is learned: {', '.join(map(str, kept))}" if kept
               else "no setting changed")
    return f"{where}: continuing the run recorded in {path} with the same learning settings; {changed}"
