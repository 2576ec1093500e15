"""Step-to-step noise drawn from recorded fault-free runs.

A recorded ``performance.jsonl`` gives, after its warm-up steps, each step's time over the
stream's median (how much a step wanders on that hardware) and each rank's compute over its own
median. A simulated step draws one step ratio (the whole pipeline's wander) and one compute ratio
per rank (a rank's own), with replacement: the distribution is the recorded one, its order is not
(a recorded stream is one run; bootstrapping it gives every simulated run its own sequence).
The same streams give the host's time between two steps (``host_gaps_s``): a record's time less the
previous record's and its own step's seconds (the records, the loader, the supervisor's reads), which
no step's time has. A gap over ``PAUSE_FACTOR`` times the stream's median is a pause between epochs
(evaluation, checkpoint save: the simulator prices those itself) and is left out, as is a negative one
(a stream whose ``time`` is not taken at the step's end). Shipped distributions
(``step_noise/<accelerator>.json``) were cut from tests/data's streams by experiments/extract_step_noise.py.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from synapse.config import ConfigError
from synapse.rundir import PERFORMANCE, RecordFileError, read_jsonl

SHIPPED = Path(__file__).resolve().parent / "step_noise"
WARMUP_STEPS = 5  # first steps of a launch: allocation, caches, graph capture; not the steady wander
# A gap this many times the median one is an epoch end's evaluation and save (0.30-0.62 s against a
# median of 0.015-0.020 s on the CPU demo's streams; their largest other gap is 0.136 s)
PAUSE_FACTOR = 10.0


@dataclass(frozen=True)
class StepNoise:
    """Multiplicative ratios around 1: the step's, and a rank's compute."""

    step_ratios: tuple[float, ...] = (1.0,)
    compute_ratios: tuple[float, ...] = (1.0,)
    source: str = "none"
    host_gaps_s: tuple[float, ...] = (0.0,)  # the host's seconds between a step's record and the next step

    def draw_gaps(self, rng: np.random.Generator, steps: int) -> np.ndarray:
        """The host's time before each of ``steps`` steps (drawn from its own generator: the ratios a seed
        draws stay as they were)."""
        return rng.choice(np.asarray(self.host_gaps_s), size=steps)

    def draw(self, rng: np.random.Generator, steps: int, ranks: int) -> tuple[np.ndarray, np.ndarray]:
        """Ratios for ``steps`` steps: (steps,) for the step, (steps, ranks) for each rank's compute."""
        step = rng.choice(np.asarray(self.step_ratios), size=steps)
        compute = rng.choice(np.asarray(self.compute_ratios), size=(steps, ranks))
        return step, compute

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "step_ratios": list(self.step_ratios),
                "compute_ratios": list(self.compute_ratios), "host_gaps_s": list(self.host_gaps_s)}

    def spread(self) -> dict[str, float]:
        """Quantiles of the step ratio (what a reader checks the noise by)."""
        q = np.quantile(np.asarray(self.step_ratios), [0.05, 0.5, 0.95])
        return {"p05": float(q[0]), "p50": float(q[1]), "p95": float(q[2]), "n": len(self.step_ratios),
                "host_gap_median_s": float(np.median(np.asarray(self.host_gaps_s)))}


def noise_from_stream(path: str | Path, warmup_steps: int = WARMUP_STEPS) -> StepNoise:
    """The ratios of a fault-free ``performance.jsonl`` (or a stream in its format)."""
    try:
        records = [r for r in read_jsonl(Path(path)) if int(r.get("step", 0)) > warmup_steps]
    except (RecordFileError, OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"simulate.step_noise: {path} cannot be read as step records ({exc}). Fix: give a "
                          f"{PERFORMANCE.shown} of a fault-free run, auto or none") from None
    steps = [float(r["step_seconds"]) for r in records if "step_seconds" in r]
    if len(steps) < 10:
        raise ConfigError(f"simulate.step_noise: {path} has {len(steps)} steady steps (after {warmup_steps} warm-up "
                          f"steps); at least 10 are needed. Fix: give a longer fault-free run, auto or none")
    median = statistics.median(steps)
    compute: list[float] = []
    per_rank = [r["compute_s"] for r in records if isinstance(r.get("compute_s"), list)]
    for rank in range(min(len(c) for c in per_rank) if per_rank else 0):
        values = [float(c[rank]) for c in per_rank]
        rank_median = statistics.median(values)
        compute += [v / rank_median for v in values if rank_median > 0]
    return StepNoise(tuple(s / median for s in steps), tuple(compute) or (1.0,), str(path),
                     host_gaps(records) or (0.0,))


def host_gaps(records: list[dict[str, Any]]) -> tuple[float, ...]:
    """The host's seconds between consecutive steps' records (module docstring): epoch-end pauses and
    negative gaps left out; none from a stream without ``time``."""
    gaps = [float(b["time"]) - float(a["time"]) - float(b["step_seconds"]) for a, b in zip(records, records[1:])
            if int(b["step"]) == int(a["step"]) + 1 and all("time" in r and "step_seconds" in r for r in (a, b))]
    gaps = [g for g in gaps if g >= 0]
    if not gaps:
        return ()
    pause = PAUSE_FACTOR * statistics.median(gaps)
    return tuple(g for g in gaps if g <= pause)


def load_noise(setting: str, accelerator: str) -> StepNoise:
    """``simulate.step_noise``: auto (the shipped distribution of ``accelerator``), none, or a stream's path."""
    if setting == "none":
        return StepNoise()
    if setting == "auto":
        data = json.loads((SHIPPED / f"{accelerator}.json").read_text())
        return StepNoise(tuple(data["step_ratios"]), tuple(data["compute_ratios"]), data["source"],
                         tuple(data.get("host_gaps_s") or (0.0,)))
    return noise_from_stream(setting)
