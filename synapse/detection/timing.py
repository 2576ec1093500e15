"""One optimizer step's per-rank timings: what the detector and estimator read of performance.jsonl.

The last pipeline rank writes one record per optimizer step (one JSON object per line, see
``PipelineRunner.write_performance_record``): ``step``, ``segment``, ``devices``, ``total_steps``,
``step_seconds``, ``compute_s``, ``comm_s``, ``send_s``, ``ranks`` (each rank's clock parts),
``images_per_s`` and ``time`` (added by the writer). ``StepTiming`` is the part of it the
slowdown detector and the alpha/beta estimator use; both are pure and never see a process group.

What the fields mean (the detector's rules depend on it):

* ``step``: the optimizer step (1-based in the runtime's records; strictly increasing within a log).
* ``wall_time``: seconds since the epoch at the *end* of the step (the record's ``time``).
* ``step_seconds``: duration of the step (so the step began at
  ``wall_time - step_seconds``).
* ``compute_s[r]``: rank r's own work in the step: teacher forward, student
  forward and backward, optimizer; measured locally, so it does not include
  time spent waiting for other ranks.
* ``comm_s[r]``: time rank r spent in communication, *including* time blocked
  waiting for a peer that is not ready yet. A slow stage therefore makes its
  neighbours' ``comm_s`` grow (see `synapse.detection.detector` for how that is
  told apart from a slow link).
* ``probe_s[r]`` (optional; a launch's first record, where the start probe ran): rank r's seconds
  on the start probe's fixed work, timed before the launch's first step (`synapse.health.speed_probe`):
  the same work on every rank, so a device slow from the start reads slow there whatever its stage.
* ``send_s[r]`` (optional; records before it lack it): the part of ``comm_s[r]`` that is rank
  r's *own* transfer work, handing its sends over (``synapse.pipeline.clock``). Waiting for a
  peer is not in it, so a link slowed on one rank raises that rank's ``send_s`` alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synapse.rundir import RecordFileError, iter_jsonl

_REQUIRED_KEYS = ("step", "wall_time", "step_seconds", "compute_s", "comm_s")


class TimingRecordError(RecordFileError):
    """A step-timing record is malformed (the message names the field and the fix)."""


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TimingRecordError(f"{name}={value!r} must be a number of seconds")
    if not math.isfinite(value) or value < 0:
        raise TimingRecordError(f"{name}={value!r} must be finite and >= 0 seconds")
    return float(value)


def _check_per_rank(name: str, values: Any) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TimingRecordError(f"{name}={values!r} must be a list with one number of seconds per rank")
    if len(values) == 0:
        raise TimingRecordError(f"{name} is empty; give one value per rank (at least one rank)")
    # Plain finite floats >= 0 (every record a run or a simulation writes) pass as they are, checked in C:
    # the check value by value was a twentieth of a simulated 64-rank step. Anything else is checked
    # one value at a time, for the error naming it.
    if set(map(type, values)) == {float} and all(map(math.isfinite, values)) and min(values) >= 0:
        return tuple(values)
    return tuple(_check_seconds(f"{name}[{rank}]", v) for rank, v in enumerate(values))


@dataclass(frozen=True)
class StepTiming:
    """Per-rank timings of one optimizer step (see the module docstring)."""

    step: int
    wall_time: float
    step_seconds: float
    compute_s: tuple[float, ...]
    comm_s: tuple[float, ...]
    send_s: tuple[float, ...] | None = None  # own transfer time per rank; None: not measured
    probe_s: tuple[float, ...] | None = None  # the launch's start probe per rank; None: not in this record

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise TimingRecordError(f"step={self.step!r} must be an integer >= 0")
        # Lists are accepted (JSON gives lists) and frozen into tuples.
        object.__setattr__(self, "wall_time", _check_seconds("wall_time", self.wall_time))
        object.__setattr__(self, "step_seconds", _check_seconds("step_seconds", self.step_seconds))
        object.__setattr__(self, "compute_s", _check_per_rank("compute_s", self.compute_s))
        object.__setattr__(self, "comm_s", _check_per_rank("comm_s", self.comm_s))
        if len(self.compute_s) != len(self.comm_s):
            raise TimingRecordError(
                f"step {self.step}: compute_s has {len(self.compute_s)} ranks but comm_s has "
                f"{len(self.comm_s)}; give both one value per rank"
            )
        if self.send_s is not None:
            object.__setattr__(self, "send_s", _check_per_rank("send_s", self.send_s))
            if len(self.send_s) != len(self.comm_s):
                raise TimingRecordError(f"step {self.step}: send_s has {len(self.send_s)} ranks but comm_s has "
                                        f"{len(self.comm_s)}; give one value per rank (or leave send_s out)")
        if self.probe_s is not None:
            object.__setattr__(self, "probe_s", _check_per_rank("probe_s", self.probe_s))
            if len(self.probe_s) != len(self.compute_s) or min(self.probe_s) <= 0:
                raise TimingRecordError(f"step {self.step}: probe_s={list(self.probe_s)} must give one number of "
                                        f"seconds > 0 per rank ({len(self.compute_s)}), or be left out")

    @property
    def num_ranks(self) -> int:
        return len(self.compute_s)

    @property
    def start_time(self) -> float:
        """Seconds since the epoch at the start of the step."""
        return self.wall_time - self.step_seconds

    def to_dict(self) -> dict[str, Any]:
        data = {
            "step": self.step,
            "wall_time": self.wall_time,
            "step_seconds": self.step_seconds,
            "compute_s": list(self.compute_s),
            "comm_s": list(self.comm_s),
        }
        if self.send_s is not None:
            data["send_s"] = list(self.send_s)
        if self.probe_s is not None:
            data["probe_s"] = list(self.probe_s)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepTiming:
        """Inverse of `to_dict`, and the reader of the runtime's records (``time`` is the wall time).
        Unknown keys are ignored so that the runtime may add fields without breaking readers."""
        if not isinstance(data, Mapping):
            raise TimingRecordError(f"a step-timing record must be a JSON object, got {type(data).__name__}")
        if "wall_time" not in data and "time" in data:  # a record as the runtime writes it
            data = {**data, "wall_time": data["time"]}
        missing = [key for key in _REQUIRED_KEYS if key not in data]
        if missing:
            raise TimingRecordError(f"step-timing record lacks {missing}; required keys: {list(_REQUIRED_KEYS)}")
        return cls(**{key: data[key] for key in _REQUIRED_KEYS}, send_s=data.get("send_s"), probe_s=data.get("probe_s"))

    def to_json_line(self) -> str:
        """One line of performance.jsonl (no trailing newline)."""
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json_line(cls, line: str) -> StepTiming:
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise TimingRecordError(f"not a JSON object: {line[:80]!r} ({error})") from None
        return cls.from_dict(data)


def read_step_timings(path: str | Path) -> list[StepTiming]:
    """All records of a performance.jsonl file (``synapse.rundir.records``' policy for torn lines)."""
    timings = []
    for number, record in enumerate(iter_jsonl(path, TimingRecordError), start=1):
        try:
            timings.append(StepTiming.from_dict(record))
        except TimingRecordError as error:
            raise TimingRecordError(f"{path}:{number}: {error}") from None
    return timings


def link_send_seconds(ranks: Sequence[Mapping[str, Any]] | None) -> list[float] | None:
    """Own send seconds on each link of one step: link r (between ranks r and r + 1) carries rank
    r's forward sends and rank r + 1's backward sends, which is the traffic the cost model charges
    to stage r (`synapse.partitioning.cost_model`); the last rank has no link (0). None when the
    record's per-rank parts lack ``send_fwd``/``send_bwd`` (records before own send timing)."""
    if not ranks or not all(isinstance(r, Mapping) and "send_fwd" in r and "send_bwd" in r for r in ranks):
        return None
    fwd = [_check_seconds(f"ranks[{r}].send_fwd", part["send_fwd"]) for r, part in enumerate(ranks)]
    bwd = [_check_seconds(f"ranks[{r}].send_bwd", part["send_bwd"]) for r, part in enumerate(ranks)]
    return [fwd[r] + bwd[r + 1] for r in range(len(ranks) - 1)] + [0.0]
