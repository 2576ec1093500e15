"""A run's first launch, as measured: the supervisor's start to the end of the first step.

A relaunch forks its workers from the launcher's forkserver, which has torch and the worker modules
imported already (``synapse.launch.elastic``): the restart priors' ``launch_s`` (0.59 s on the CPU
demo) is that. The first launch starts the forkserver itself, with those imports, before any worker
exists (3.8-4.4 s on the CPU demo's quiet runs), then builds the stages and runs the start probe and
the first step. A simulated run pays the first launch measured here, split as a restart's components
are (``Restart.measure``, with the supervisor's start where a restart has its relaunch):

* ``launch_s``: the supervisor's start (segment 0's ``started_at``) -> the workers built (rank 0's
  ``launch_ready``: ``process_started + build_s``);
* ``warmup_s``: ``launch_ready`` -> the end of the first step, less one steady step (the start probe and
  the first step's own extra time).

Shipped values (``first_launch/<accelerator>.json``) were measured from run directories with
``first_launch_of``; where none is shipped (CUDA: no run directory of a GPU run is kept), the restart
prior's launch and warm-up stand in for it, as they did before this was measured.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from synapse.rundir import EVENTS, PERFORMANCE, SEGMENT_RECORD, read_jsonl

SHIPPED = Path(__file__).resolve().parent / "first_launch"


class FirstLaunchError(ValueError):
    """A run directory that does not hold what a first launch is measured from."""


@dataclass(frozen=True)
class FirstLaunch:
    """Seconds from a run's start to its first step's end, besides the first step's steady time."""

    launch_s: float
    warmup_s: float
    source: str = "restart prior"

    @property
    def total_s(self) -> float:
        return self.launch_s + self.warmup_s


def first_launch_of(run_dir: str | Path) -> FirstLaunch:
    """The first launch of a finished run in ``run_dir`` (module docstring: what each part counts)."""
    run_dir = Path(run_dir)
    segment_file = SEGMENT_RECORD.path(run_dir, segment=0)
    events_file = EVENTS.path(run_dir)
    if not segment_file.is_file() or not events_file.is_file() or not PERFORMANCE.path(run_dir).is_file():
        raise FirstLaunchError(f"{run_dir} has no {segment_file.relative_to(run_dir)}, {EVENTS.shown} or "
                               f"{PERFORMANCE.shown}: give the directory of a finished train.py run")
    started_at = float(json.loads(segment_file.read_text())["started_at"])
    ready = [e for e in read_jsonl(events_file) if e.get("event") == "launch_ready" and e.get("segment", 0) == 0]
    records = [r for r in read_jsonl(PERFORMANCE.path(run_dir)) if r.get("segment", 0) == 0]
    if not ready or len(records) < 2:
        raise FirstLaunchError(f"{run_dir}: its first launch wrote no launch_ready event or fewer than 2 steps: "
                               f"give a run that trained at least 2 steps on its first launch")
    first = ready[0]
    steady_s = statistics.median(float(r["step_seconds"]) for r in records[1:])
    return FirstLaunch(launch_s=max(0.0, first["process_started"] + first["build_s"] - started_at),
                       warmup_s=max(0.0, float(records[0]["time"]) - first["time"] - steady_s),
                       source=str(run_dir))


def measured_first_launch(run_dirs: Sequence[str | Path]) -> FirstLaunch:
    """The medians of several runs' first launches."""
    launches = [first_launch_of(d) for d in run_dirs]
    return FirstLaunch(statistics.median(f.launch_s for f in launches), statistics.median(f.warmup_s for f in launches),
                       f"median of {len(launches)} runs")


def load_first_launch(accelerator: str, restart_launch_s: float, restart_warmup_s: float) -> FirstLaunch:
    """The shipped first launch of ``accelerator``; without one, the restart prior's launch and warm-up."""
    shipped = SHIPPED / f"{accelerator}.json"
    if not shipped.is_file():
        return FirstLaunch(restart_launch_s, restart_warmup_s)
    data = json.loads(shipped.read_text())
    return FirstLaunch(float(data["launch_s"]), float(data["warmup_s"]), str(data["source"]))
