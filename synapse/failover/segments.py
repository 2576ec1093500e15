"""A run's segments as composed Hydra configs: ``<run_dir>/segments/<n>/``.

A run is a sequence of segments; each runs one placement (devices and partition) from one step
to another. A segment begins at the first launch of the workers, at every restart, and at every
live re-partition (the workers keep running; the segment changes). Segment 0 is what the user
asked for; segment n > 0 is composed with Hydra's compose API from the user's overrides plus the
segment's own (devices, partition, resume path, the faults still to come), so that every
segment is an ordinary config:

    segments/<n>/config.yaml     the composed config (resolved)
    segments/<n>/overrides.yaml  the override list that composes it (rerun: python train.py <those>)
    segments/<n>/segment.json    why the segment exists, its devices and partition, start/end

Overrides are merged by key (a later ``trainer.devices=...`` replaces an earlier one), so the
list stays a valid command line however many segments came before.

What goes into segment n's config (`segment_settings`) is a function of plain inputs alone (the
run's config, the user's overrides, the segment's devices, partition and resume checkpoint, and
which faults already fired): a segment saved under ``segments/<n>/`` must compose again to exactly
what ran.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from synapse.conf import CONF_DIR
from synapse.config import SynapseConfig, as_node, config_yaml, run_topology, typed_config, validate, with_settings
from synapse.failover.decider import segment_node_settings
from synapse.failover.live import replica_engine
from synapse.injection import faults_for_segment, fired_fault_indices
from synapse.launch import ReplicaLayoutError, replicas_by_node
from synapse.partitioning import Placement
from synapse.rundir import SEGMENT, SEGMENT_CONFIG, SEGMENT_OVERRIDES, SEGMENT_RECORD, SEGMENTS


class SegmentRecordError(RuntimeError):
    """A segment record that cannot be read or a segment config that cannot be composed."""


# ---------------------------------------------------------------- override strings
def override_key(override: str) -> str:
    """``trainer.devices`` of ``trainer.devices=[0,2]`` (also for ``+key=...`` and ``~key``)."""
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def merge_overrides(base: Sequence[str], later: Sequence[str]) -> list[str]:
    """``base`` then ``later``; a key set in ``later`` removes its earlier settings (and those of
    its sub-keys: a new ``injection.faults`` replaces every earlier ``injection.faults.*``)."""
    replaced = {override_key(o) for o in later}
    kept = [o for o in base if not any(override_key(o) == k or override_key(o).startswith(k + ".")
                                       for k in replaced)]
    return [*kept, *later]


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar: lists, dicts, numbers, booleans, null, quoted strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SegmentRecordError(f"{value!r} cannot be written as a Hydra override")
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    raise SegmentRecordError(f"cannot write {type(value).__name__} {value!r} as a Hydra override")


def setting(key: str, value: Any) -> str:
    return f"{key}={hydra_value(value)}"


# ---------------------------------------------------------------- composing
def compose_segment_config(overrides: Sequence[str]) -> DictConfig:
    """The config ``python train.py <overrides>`` would run (``run_dir`` must be among them)."""
    try:
        if GlobalHydra.instance().is_initialized():  # inside @hydra.main: its search path is conf/
            return compose(config_name="config", overrides=list(overrides))
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="segment"):
            return compose(config_name="config", overrides=list(overrides))
    except Exception as exc:  # Hydra raises several types; all mean the same thing here
        raise SegmentRecordError(f"cannot compose a segment config from overrides {list(overrides)}: {exc}") from exc


# ---------------------------------------------------------------- records
@dataclass
class Segment:
    """Where and how one segment runs, and why it exists."""

    index: int
    placement: Placement
    microbatches: int  # per step: the run's plan (pipeline.microbatches, or what auto chose)
    reason: str  # "start", "replan", "degrade", "replace", "failure: ..."
    resume: str | None = None
    start_step: int = 0
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    end_step: int | None = None
    outcome: str | None = None  # finished | stopped | failed

    @property
    def devices(self) -> list[int]:
        return list(self.placement.devices)

    @property
    def teacher_counts(self) -> list[int]:
        return list(self.placement.teacher_counts)

    @property
    def student_counts(self) -> list[int]:
        return list(self.placement.student_counts)

    @property
    def partition(self) -> dict[str, list[int]]:
        """What the workers are launched with (``Placement.to_dict``)."""
        return self.placement.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """segment.json's form: the placement's lists at the top level, beside the segment's facts
        (a layout with replicas adds their count and shares)."""
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "placement"}
        layout = {"replicas": self.placement.replicas, "shares": list(self.placement.shares)} \
            if self.placement.replicas > 1 else {}
        if self.placement.replica_stages:  # replicas cut differently: the counts list every replica's stages
            layout["replica_stages"] = list(self.placement.replica_stages)
        return {**record, "devices": self.devices, "teacher_counts": self.teacher_counts,
                "student_counts": self.student_counts, **layout}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Segment:
        data = dict(data)
        placement = Placement(tuple(data.pop("devices")), tuple(data.pop("teacher_counts")),
                              tuple(data.pop("student_counts")), int(data.pop("replicas", 1)),
                              tuple(data.pop("shares", ())), tuple(data.pop("replica_stages", ())))
        return cls(placement=placement, **data)


def segment_dir(run_dir: Path, index: int) -> Path:
    return SEGMENT.path(run_dir, segment=index)


def write_segment(run_dir: Path, spec: Segment, cfg: SynapseConfig | None = None,
                overrides: Sequence[str] | None = None) -> Path:
    """Write (or update) ``segments/<n>/``: segment.json always, the config and overrides when given."""
    folder = segment_dir(run_dir, spec.index)
    folder.mkdir(parents=True, exist_ok=True)
    if cfg is not None:
        (folder / SEGMENT_CONFIG.name()).write_text(config_yaml(cfg))
    if overrides is not None:
        (folder / SEGMENT_OVERRIDES.name()).write_text(yaml.safe_dump(list(overrides), default_flow_style=False))
    tmp = SEGMENT_RECORD.temp_path(folder / SEGMENT_RECORD.name())
    tmp.write_text(json.dumps(spec.to_dict(), indent=1))
    tmp.replace(folder / SEGMENT_RECORD.name())
    return folder


def read_segments(run_dir: Path) -> list[Segment]:
    """Every recorded segment, in order (empty for a run that has none)."""
    root = SEGMENTS.path(run_dir)
    if not root.is_dir():
        return []
    specs = []
    for folder in sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        try:
            specs.append(Segment.from_dict(json.loads((folder / SEGMENT_RECORD.name()).read_text())))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise SegmentRecordError(f"segment record {folder / SEGMENT_RECORD.name()} is unreadable ({exc}); "
                             f"remove {folder} to restart that segment from the last checkpoint") from exc
    return specs


def read_segment_overrides(run_dir: Path, index: int) -> list[str]:
    path = SEGMENT_OVERRIDES.path(run_dir, segment=index)
    overrides = yaml.safe_load(path.read_text())
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise SegmentRecordError(f"{path} must hold a list of override strings")
    return overrides


def pin_checkpoint(source: Path, target: Path) -> Path:
    """Keep the checkpoint a segment resumes from, whatever pruning does later: hard links (free),
    or a copy where links are impossible. The segment's config points at the pinned copy."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for file in Path(source).iterdir():
        try:
            os.link(file, target / file.name)
        except OSError:
            shutil.copy2(file, target / file.name)
    return target


def user_overrides(explicit: Sequence[str] | None) -> list[str] | None:
    """The command-line overrides of this run: given, or Hydra's (inside ``@hydra.main``); None if unknown."""
    if explicit is not None:
        return list(explicit)
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:  # not inside a Hydra run
        return None


# The run's event log so far (read only for segments after the first: which faults already fired).
WorkerEvents = Callable[[], list[dict[str, Any]]]


def segment_settings(cfg: SynapseConfig, run_dir: Path, spec: Segment, worker_events: WorkerEvents
                     ) -> dict[str, Any]:
    """What makes this segment this segment, on top of the user's config (key -> value)."""
    settings: dict[str, Any] = {"run_dir": str(run_dir), "cache_dir": cfg.cache_dir,
                                # the run's plan (pipeline.microbatches=auto chose it once): every segment keeps it
                                "pipeline.microbatches": spec.microbatches}
    if spec.index == 0:
        return settings
    faults = cfg.injection.fault_dicts()
    fired = fired_fault_indices(worker_events())
    topology = run_topology(cfg.trainer)  # run-wide device ids across nodes (partitioning/topology.py)
    return {**settings, **segment_node_settings(topology, spec.devices, cfg.trainer.rdzv_endpoint),
            "partition.mode": "manual", "partition.teacher": spec.teacher_counts,
            "partition.student": spec.student_counts, "partition.alphas": None,
            "partition.replica_stages": list(spec.placement.replica_stages) or None,
            "trainer.replicas": spec.placement.replicas,
            "trainer.replica_shares": list(spec.placement.shares) if spec.placement.replicas > 1 else None,
            "injection.faults": faults_for_segment(faults, topology.devices, spec.devices, fired),
            "resume": spec.resume,
            "failover.replica_engine": replica_engine_for(cfg, spec.placement)}


def replica_engine_for(cfg: SynapseConfig, placement: Placement) -> str:
    """The replica engine a segment on ``placement`` is launched on (``failover.live.replica_engine``), and
    across nodes the restart path for a layout with a replica on two nodes, which torchft does not carry."""
    engine = replica_engine(cfg.failover, placement)
    if engine == "torchft":
        try:
            replicas_by_node(run_topology(cfg.trainer), placement)
        except ReplicaLayoutError:
            return "restart"
    return engine


def segment_overrides(cfg: SynapseConfig, run_dir: Path, user_overrides: list[str] | None, spec: Segment,
                      worker_events: WorkerEvents) -> list[str]:
    """The override list that composes this segment: the user's, then the segment's own."""
    segment = [setting(key, value) for key, value in segment_settings(cfg, run_dir, spec, worker_events).items()]
    return merge_overrides(user_overrides or [], segment)


@dataclass(frozen=True)
class ComposedSegment:
    """What one segment's workers run: its whole config, and the override list that composes it."""

    config: SynapseConfig
    overrides: list[str]


@dataclass(frozen=True)
class SegmentComposer:
    """Composes each segment's config for the supervisor. Composing is a whole-config job, so this is
    the one part of the supervisor that holds the run's whole config and the user's overrides."""

    cfg: SynapseConfig  # the run's config, as segment 0 runs it
    run_dir: Path
    user_overrides: list[str] | None  # None: unknown (segment configs are then set on the config, not composed)

    def as_launched(self, spec: Segment, worker_events: WorkerEvents) -> ComposedSegment:
        """``spec`` runs the run's own config (not composed again), saved with the overrides that compose it."""
        return ComposedSegment(self.cfg, segment_overrides(self.cfg, self.run_dir, self.user_overrides, spec,
                                                           worker_events))

    def compose(self, spec: Segment, worker_events: WorkerEvents) -> ComposedSegment:
        """``spec``'s config composed from the user's overrides and the segment's own."""
        return ComposedSegment(*compose_segment(self.cfg, self.run_dir, self.user_overrides, spec, worker_events))


def compose_segment(cfg: SynapseConfig, run_dir: Path, user_overrides: list[str] | None, spec: Segment,
                    worker_events: WorkerEvents) -> tuple[SynapseConfig, list[str]]:
    """The segment's validated config and the overrides that compose it."""
    overrides = segment_overrides(cfg, run_dir, user_overrides, spec, worker_events)
    if user_overrides is None:
        # Called with a config but not the overrides that made it (a program, not train.py):
        # the segment is the same config with the segment's settings set.
        composed = as_node(with_settings(cfg, segment_settings(cfg, run_dir, spec, worker_events)))
    else:
        composed = compose_segment_config(overrides)
    validate(composed)
    return typed_config(composed), overrides
