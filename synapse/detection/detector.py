"""Per-rank slowdown detector: which rank got slower, at compute or at communication.

Pure: one `StepTiming` per optimizer step in, `Detection` events out.

1. Warm-up: the first ``warmup_steps`` records are ignored (compilation, allocator
   and autotuner warm-up); again after `load_state_dict` and `rebase` (a new process).
   The first step judged, J, is the next one (`synapse.detection.start` says why not earlier).
2. Baseline: the next ``baseline_window`` records give each rank a robust first
   baseline (medians), so a slowdown that begins in its second half (from step 19 of a
   run) is seen. Two things keep a
   device that is slow *from the start* from becoming its own normal: from J on, every
   step of that window judges each rank against the plan's expected per-rank compute
   (`set_expected`, the cost model's prediction for the running partition) on the scale of
   the ranks that run at nominal speed (`synapse.detection.start`: ``prior_threshold`` times
   theirs, K = 1: ``alone_threshold`` times the plan = slow from the start, found ~6 steps
   after J, its baseline then what they say it should be); and later quiet steps (no compute
   slowdown anywhere, this rank's step below ``threshold``) refining each compute baseline
   as the median of the last ``refine_window`` such steps. After a re-partition, the ranks
   that learn their baseline again are judged so from the new launch's J, their peers (learnt
   or carried over) among the witnesses.
3. Evaluation, every later step, on medians over the last ``window`` steps (a
   single-step spike cannot move a median). A rank's per-step compute ratio is net of
   what the other ranks of its pipeline fell more than ``threshold - 1`` below their
   baselines (time that moved between ranks' clocks is not a slower device; replicas,
   `set_replicas`, are pipelines apart). A (rank, kind) is *in excess*
   when its ratio to the baseline is >= ``threshold``, beyond its own noise (`NOISE_Z`
   sd of a window median, sd from its baseline samples) and, step by step, it is
   >= ``peer_threshold`` times the median ratio of the other ranks (window median;
   skipped for K = 1 or ``peer_threshold=None``: a slowdown that hits every rank
   alike does not change the best partition), and further above its peers than its own
   wander against them has been (``peer_wander_z``, `synapse.detection.wander`: CPU ranks on
   a virtual machine change speed by themselves). Compute is also read as where the window
   stands now (``trend``: `synapse.detection.window`), so a gradual slowdown is seen as it
   crosses the threshold; that reading must clear the rank's own noise too, and counts only
   once the window median is halfway (a burst of a few slow steps is not a slowdown).
4. ``sustain`` evaluations in a row in excess: ``Detection(event='slowdown')``.
   While active, ``window`` evaluations in a row below `DetectorConfig.recover_below`
   (halfway between 1 and ``threshold``): ``event='recovery'``. Recovery is
   cautious on purpose: a false one would make the controller forget a real slowdown.

Communication (who is blamed for it): records with ``send_s`` carry each rank's own send
work apart from its waiting and are judged on it (`synapse.detection.link`); waiting, however
long, is never blamed. Older records are judged by the waiting rule (`synapse.detection.waiting`).

Onset: at an event, the start of the run of recent steps whose per-step excess is
past the midpoint between the level before and now. ``latency_s`` runs from the
start of the onset step to the end of the detecting one.

State: a restarted launch goes on from the detector state saved with the checkpoint, so a
device that is still slow is still reported instead of being learnt as normal. The format
(`STATE_VERSION`) is read back by a later process, possibly of a later version of this code:
its writer and its reader (`detector_state`, `load_detector_state`) stand side by side so that
they cannot drift apart.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from itertools import islice
from statistics import median
from typing import Any, cast

import numpy as np

from synapse.detection.baseline import (
    ComputeBaseline,
    net_compute_ratio_rows,
    net_compute_ratios,
    peer_ratio_rows,
    pipelines_of,
    robust_sd,
)
from synapse.detection.link import LinkBaseline
from synapse.detection.rolling import SortedWindow
from synapse.detection.start import StartCheck, StartReading
from synapse.detection.timing import StepTiming
from synapse.detection.waiting import COMM_BASELINE_FIELDS, CommBaseline, peer_ratios
from synapse.detection.wander import PeerWander
from synapse.detection.window import VECTOR_FROM_RANKS, column_medians, current_levels, onset_index

COMPUTE, COMM = "compute", "comm"
KINDS = (COMPUTE, COMM)
SLOWDOWN, RECOVERY = "slowdown", "recovery"


class DetectorConfigError(ValueError):
    """A detector setting is out of range (the message names it and the fix)."""


class DetectorInputError(ValueError):
    """A record, state dict or rebase argument does not fit the detector's state."""


def _check_number(name: str, value: Any, minimum: float, *, integer: bool = False,
                  strict: bool = False, hint: str = "") -> None:
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (strict and value == minimum):
        what = "an integer" if integer else "a finite number"
        raise DetectorConfigError(f"{name}={value!r} must be {what} {'>' if strict else '>='} {minimum}{hint}")


@dataclass(frozen=True)
class DetectorConfig:
    """Settings of `SlowdownDetector` (roles: see the module docstring)."""

    warmup_steps: int = 10
    baseline_window: int = 15
    refine_window: int = 200
    compute_noise_z: float = 5.0  # a compute ratio must be this many sd of a window median above 1
    comm_baseline_window: int = 30  # comm's noise (spread) needs more samples than compute's level
    # A rank this many times the ranks at nominal speed against the plan, from the first step after
    # the warm-up, is slow from the start (synapse/detection/start.py: 2 H200s read 3.7x without a
    # fault; trainer=demo sets 2.5). None: no such check.
    prior_threshold: float | None = 4.0
    # A rank with no peers (K = 1): compute this many times the plan's = slow from the start.
    # Off by default: on CPU the plan's absolute error is large (the demo's K = 1 stage measured
    # 1.58x its profile, no fault); trainer=gpu sets it (synapse/detection/start.py says why).
    alone_threshold: float | None = None
    # Replicas (R > 1): a rank this many times the other replicas of its stage, which do the same work
    # on as many images, is slow from the start; no plan in between, so far tighter than
    # prior_threshold (synapse/detection/start.py). None: no such check.
    replica_threshold: float | None = 2.0
    # A device whose start probe (the same fixed work on every rank before a launch's first step,
    # `synapse.health.speed_probe`) reads this many times its peers' is slow from the start, whatever
    # its stage: no plan in between. Healthy CPU ranks on the loaded 2-core machine read up to 1.14x
    # (210 probes, two busy-loops beside in 150), ranks 1.5x slow 1.49x or more; synapse/detection/start.py.
    # None: the probe's readings are not judged.
    probe_threshold: float | None = 1.3
    window: int = 10
    threshold: float = 1.25
    peer_threshold: float | None = 1.15
    # A rank must also be further above its peers than its own wander has been: this many sd of
    # its window median's ratio to its peers over its calm steps (`synapse.detection.wander`;
    # CPU ranks drift). None: peer_threshold alone.
    peer_wander_z: float | None = 5.0
    sustain: int = 3
    # Also judge compute on where the window stands now (its Theil-Sen projection to the latest
    # step, `synapse.detection.window`), so a device degrading gradually is seen as it crosses the
    # threshold, not half a window later. False: the window median alone.
    trend: bool = True
    min_comm_s: float = 0.005
    wait_explain_factor: float = 2.0

    def __post_init__(self) -> None:
        _check_number("warmup_steps", self.warmup_steps, 0, integer=True)
        for name in ("baseline_window", "comm_baseline_window", "window", "sustain"):
            _check_number(name, getattr(self, name), 1, integer=True)
        _check_number("refine_window", self.refine_window, 0, integer=True, hint=" (0: never refine)")
        _check_number("compute_noise_z", self.compute_noise_z, 0.0, hint=" (e.g. 5; 0: no noise floor)")
        if self.prior_threshold is not None:
            _check_number("prior_threshold", self.prior_threshold, 1.0, strict=True,
                          hint=" (e.g. 4.0: 4x its peers against the plan; None: no prior)")
        if self.alone_threshold is not None:
            _check_number("alone_threshold", self.alone_threshold, 1.0, strict=True,
                          hint=" (e.g. 1.5: a lone device 1.5x the plan; None: no check)")
        if self.probe_threshold is not None:
            _check_number("probe_threshold", self.probe_threshold, 1.0, strict=True,
                          hint=" (e.g. 1.3: 1.3x its peers on the start probe's work; None: no check)")
        if self.replica_threshold is not None:
            _check_number("replica_threshold", self.replica_threshold, 1.0, strict=True,
                          hint=" (e.g. 2.0: 2x the other replicas of its stage; None: no check)")
        _check_number("threshold", self.threshold, 1.0, strict=True, hint=" (e.g. 1.25: 25% slower)")
        if self.peer_threshold is not None:
            _check_number("peer_threshold", self.peer_threshold, 1.0, hint=" (e.g. 1.15; None: no peer check)")
        if self.peer_wander_z is not None:
            _check_number("peer_wander_z", self.peer_wander_z, 0.0, hint=" (e.g. 3; None: peer_threshold alone)")
        if not isinstance(self.trend, bool):
            raise DetectorConfigError(f"trend={self.trend!r} must be true or false")
        if self.trend and self.window < 2:
            raise DetectorConfigError(f"window={self.window} is too short for trend=true (a line needs >= 2 "
                                      "steps); raise window or set trend=false")
        _check_number("min_comm_s", self.min_comm_s, 0.0, hint=" seconds (e.g. 0.005)")
        _check_number("wait_explain_factor", self.wait_explain_factor, 0.0, hint=" (e.g. 2.0; 0 disables)")

    @property
    def recover_below(self) -> float:
        return 1.0 + (self.threshold - 1.0) / 2.0

    @property
    def history_len(self) -> int:
        """Steps kept for evaluation and onset estimation."""
        return 4 * self.window + self.sustain


@dataclass(frozen=True)
class Detection:
    """A slowdown, or the recovery from one, of one rank's compute or comm."""

    rank: int
    kind: str  # COMPUTE or COMM
    event: str  # SLOWDOWN or RECOVERY
    ratio: float  # windowed ratio to the baseline when the event fired
    onset_step: int  # first step of the sustained change (estimated)
    detected_step: int
    latency_steps: int
    latency_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Detection:
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise DetectorInputError(f"detection record lacks {missing}; required keys: {names}")
        return cls(**{name: data[name] for name in names})


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise DetectorInputError(f"kind={kind!r}; use one of {KINDS}")
    return kind


def check_next_step(timing: StepTiming, last_step: int | None, num_ranks: int | None) -> None:
    """``timing`` may follow ``last_step`` of a detector tracking ``num_ranks`` (None: none yet)."""
    if not isinstance(timing, StepTiming):
        raise DetectorInputError(f"update() takes a StepTiming, got {type(timing).__name__}")
    if last_step is not None and timing.step <= last_step:
        raise DetectorInputError(
            f"step {timing.step} arrived after step {last_step}; records must come in "
            "increasing step order (after a restart, load the detector state saved with the checkpoint)")
    if num_ranks is not None and timing.num_ranks != num_ranks:
        raise DetectorInputError(
            f"step {timing.step} has {timing.num_ranks} ranks but the detector tracks "
            f"{num_ranks}; after a re-partition call rebase(..., previous_rank=...)")


def check_rebase(old_ranks: int, previous_rank: Sequence[int] | None, compute_scale: Sequence[float],
                 comm_scale: Sequence[float] | None, relearn: Sequence[int], fresh: Sequence[int]
                 ) -> tuple[list[int], list[float], list[float] | None, tuple[int, ...], tuple[int, ...]]:
    """`SlowdownDetector.rebase`'s arguments, checked: (mapping, compute_scale, comm_scale, relearn, fresh)."""
    mapping = _check_mapping(previous_rank, old_ranks)
    new = len(mapping)
    return (mapping, _check_scales("compute_scale", compute_scale, new),
            None if comm_scale is None else _check_scales("comm_scale", comm_scale, new),
            _check_relearn(relearn, new), _check_relearn(fresh, new, "fresh"))


def _check_mapping(previous_rank: Sequence[int] | None, old_ranks: int) -> list[int]:
    if previous_rank is None:
        return list(range(old_ranks))
    mapping = list(previous_rank)
    valid = all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < old_ranks for r in mapping)
    if not mapping or not valid or len(set(mapping)) != len(mapping):
        raise DetectorInputError(
            f"previous_rank={mapping!r} must give each new rank a distinct old rank in 0..{old_ranks - 1}")
    return mapping


def _check_scales(name: str, scales: Sequence[float], num_ranks: int) -> list[float]:
    values = list(scales)
    if len(values) != num_ranks:
        raise DetectorInputError(f"{name} has {len(values)} entries; give one per new rank ({num_ranks})")
    for rank, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise DetectorInputError(f"{name}[{rank}]={value!r} must be a finite number > 0 (new / old predicted time)")
    return [float(v) for v in values]


def _check_relearn(ranks: Sequence[int], num_ranks: int, name: str = "relearn") -> tuple[int, ...]:
    ranks = tuple(ranks)
    if any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < num_ranks for r in ranks):
        raise DetectorInputError(f"{name}={list(ranks)!r} must list new ranks in 0..{num_ranks - 1}")
    return ranks


STATE_VERSION = 1


@dataclass
class HistoryEntry:
    """One step as the detector remembers it."""

    step: int
    start_time: float
    compute_s: tuple[float, ...]
    comm_s: tuple[float, ...]
    step_s: float = 0.0
    send_s: tuple[float, ...] | None = None  # own send seconds per rank (None: not measured)
    signals: dict[str, list[float]] = field(default_factory=dict)  # per-step signals, computed lazily
    # the same signals as numpy rows, where all ranks' were computed at once (8 ranks up); a list in
    # ``signals`` is made from its row when first read
    rows: dict[str, np.ndarray] = field(default_factory=dict)

    def forget(self, names: Sequence[str]) -> None:
        """Drop these signals (computed against a baseline that has moved)."""
        for name in names:
            self.signals.pop(name, None)
            self.rows.pop(name, None)


@dataclass
class Tracker:
    """One (kind, rank)'s progress towards a slowdown or a recovery."""

    above: int = 0  # evaluations in a row in excess (while inactive)
    below: int = 0  # evaluations in a row cleared (while active)
    active: Detection | None = None


def carried_trackers(trackers: Mapping[tuple[str, int], Tracker], mapping: Sequence[int], carried: Mapping[str, bool],
                     relearn: Sequence[int], fresh: Sequence[int]
                     ) -> tuple[dict[tuple[str, int], Tracker], list[Detection]]:
    """Active slowdowns over a re-partition (new rank i was old rank ``mapping[i]``): each follows
    its device where that kind's baseline was ``carried``, unless the device is gone, the new rank
    is ``fresh`` (another device) or re-learns its compute. Returns (trackers, dropped detections)."""
    kept_trackers: dict[tuple[str, int], Tracker] = {}
    dropped: list[Detection] = []
    for (kind, old_rank), tracker in sorted(trackers.items()):
        if tracker.active is None:
            continue
        new_rank = mapping.index(old_rank) if old_rank in mapping else None
        kept = new_rank is not None and new_rank not in fresh and not (kind == COMPUTE and new_rank in relearn)
        if new_rank is not None and kept and carried[kind]:  # kept implies a new rank (for the type checker)
            kept_trackers[(kind, new_rank)] = Tracker(active=replace(tracker.active, rank=new_rank))
        else:
            dropped.append(tracker.active)
    return kept_trackers, dropped


def encode_state(*, num_ranks: int | None, last_step: int | None, compute_baseline: Sequence[float] | None,
                 comm_baseline: CommBaseline | None, learning: Sequence[tuple[Sequence[float], Sequence[float]]],
                 compute_samples: Sequence[Collection[float]], comm_own_samples: Sequence[Collection[float]],
                 peer_wander: Sequence[Sequence[float]], compute_pending: Mapping[int, Sequence[float]],
                 history: Sequence[HistoryEntry], link: dict[str, Any],
                 trackers: Mapping[tuple[str, int], Tracker], compute_provisional: bool = False,
                 launch_steps: Sequence[Sequence[float]] = ()) -> dict[str, Any]:
    """JSON-friendly: baselines, partial baseline samples, history, counters."""
    return {
        "version": STATE_VERSION,
        "num_ranks": num_ranks,
        "last_step": last_step,
        "compute_baseline": None if compute_baseline is None else list(compute_baseline),
        "compute_provisional": compute_provisional,
        "launch_steps": [list(s) for s in launch_steps],
        "comm_baseline": None if comm_baseline is None else asdict(comm_baseline),
        "learning": [[list(c), list(m)] for c, m in learning],
        "compute_samples": [list(s) for s in compute_samples],
        "compute_pending": {str(rank): list(seen) for rank, seen in compute_pending.items()},
        "comm_own_samples": [list(s) for s in comm_own_samples],
        "peer_wander": [list(s) for s in peer_wander],
        "history": [[e.step, e.start_time, list(e.compute_s), list(e.comm_s)]
                    + ([list(e.send_s)] if e.send_s is not None else []) for e in history],
        "link": link,
        "trackers": [
            {"kind": kind, "rank": rank, "above": t.above, "below": t.below,
             "active": None if t.active is None else t.active.to_dict()}
            for (kind, rank), t in sorted(trackers.items())
        ],
    }


# (num_ranks, last_step, compute baseline, comm baseline, learning, history, trackers)
LearningSteps = list[tuple[tuple[float, ...], tuple[float, ...]]]  # (compute, comm) per learning step
ParsedState = tuple[Any, Any, list[float] | None, CommBaseline | None, LearningSteps, deque[HistoryEntry],
                    dict[tuple[str, int], Tracker]]
# (compute samples, compute pending, comm own samples, peer wander)
ParsedSamples = tuple[list[SortedWindow], dict[int, list[float]], list[SortedWindow], list[list[float]]]


def parse_state(state: Mapping[str, Any], history_len: int) -> ParsedState:
    """(num_ranks, last_step, compute baseline, comm baseline, learning, history, trackers) of an
    `encode_state` dict; KeyError, TypeError, ValueError or IndexError when it is not one."""
    if state["version"] != STATE_VERSION:
        raise ValueError(f"version {state['version']!r}, expected {STATE_VERSION}")
    num_ranks, width = state["num_ranks"], state["num_ranks"] or 0

    def per_rank(values: Sequence[float], what: str) -> list[float]:
        if len(values) != width:
            raise ValueError(f"{what} has {len(values)} ranks, num_ranks is {num_ranks}")
        return [float(v) for v in values]

    compute = None if state["compute_baseline"] is None else per_rank(state["compute_baseline"], "compute_baseline")
    comm = state["comm_baseline"]
    if comm is not None:
        comm = CommBaseline(*(per_rank(comm[k], f"comm_baseline.{k}") for k in COMM_BASELINE_FIELDS))
    learning = [(tuple(per_rank(c, "learning")), tuple(per_rank(m, "learning"))) for c, m in state["learning"]]
    history = deque((HistoryEntry(int(step), float(start), tuple(per_rank(c, "history")),
                                  tuple(per_rank(m, "history")),
                                  send_s=tuple(per_rank(rest[0], "history")) if rest else None)
                     for step, start, c, m, *rest in state["history"]), maxlen=history_len)
    trackers = {}
    for item in state["trackers"]:
        kind, rank = _check_kind(item["kind"]), int(item["rank"])
        if not 0 <= rank < width:
            raise ValueError(f"tracker rank {rank} is outside 0..{width - 1}")
        active = None if item["active"] is None else Detection.from_dict(item["active"])
        trackers[(kind, rank)] = Tracker(int(item["above"]), int(item["below"]), active)
    return num_ranks, state["last_step"], compute, comm, learning, history, trackers


def parse_samples(state: Mapping[str, Any], num_ranks: int | None, keep: int) -> ParsedSamples:
    """(compute samples, compute pending, comm own samples, peer wander) of an `encode_state` dict,
    each per rank; a state saved before one existed has none of it. ValueError when malformed."""
    compute = [SortedWindow(map(float, s), maxlen=keep) for s in state.get("compute_samples", [])]
    pending = {int(rank): [float(x) for x in seen] for rank, seen in state.get("compute_pending", {}).items()}
    comm_own = [SortedWindow(map(float, s), maxlen=keep) for s in state.get("comm_own_samples", [])]
    wander = state.get("peer_wander") or [[] for _ in range(num_ranks or 0)]
    if len(wander) != (num_ranks or 0):
        raise ValueError(f"peer_wander has {len(wander)} ranks, num_ranks is {num_ranks}")
    return compute, pending, comm_own, [[float(x) for x in steps] for steps in wander]


NOISE_Z = 5.0  # own comm excess must exceed this many sd of its window median
_TINY_S = 1e-9  # a zero baseline must not divide by zero


class SlowdownDetector:
    """Feed `update` one `StepTiming` per step; it returns that step's events."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config if config is not None else DetectorConfig()
        self._num_ranks: int | None = None
        self._last_step: int | None = None
        self._steps_since_start = 0
        self._compute = ComputeBaseline(self.config.refine_window)
        self._comm_baseline: CommBaseline | None = None
        self._learning: list[tuple[tuple[float, ...], tuple[float, ...]]] = []  # (compute, comm) per step
        self._comm_own: list[SortedWindow] = []  # per rank: own comm excess of quiet steps (its spread)
        self._comm_spread_due = False  # _comm_own took steps since the comm baseline's spread_s was set
        self._history: deque[HistoryEntry] = deque(maxlen=self.config.history_len)
        self._trackers: dict[tuple[str, int], Tracker] = {}
        self._latest_ratios: dict[str, tuple[float, ...]] = {}
        cfg = self.config
        self._link = LinkBaseline(cfg.baseline_window, cfg.refine_window, cfg.min_comm_s, cfg.prior_threshold)
        self._wander = PeerWander(cfg.window, cfg.refine_window, cfg.peer_wander_z or 0.0)
        self._start = StartCheck(cfg.prior_threshold, cfg.alone_threshold, cfg.sustain,
                                 replica_threshold=cfg.replica_threshold, probe_threshold=cfg.probe_threshold)
        # Every rank's compute per step since J of a launch after a re-partition, while ranks re-learn
        # their baselines: the start check's steps for them (at a run's start: ``_learning``)
        self._launch_steps: list[tuple[float, ...]] = []
        self._pipelines: list[list[int]] | None = None  # the ranks of each replica (None: one pipeline)

    @property
    def _link_mode(self) -> bool:
        """Whether comm is judged on own send time (the records carry it and its baseline is known)."""
        return self._link.ready and bool(self._history) and self._history[-1].send_s is not None

    @property
    def prior_replaced(self) -> tuple[int, ...]:
        """Ranks whose compute baseline came from their peers (slow from the start)."""
        return self._compute.replaced

    @property
    def num_ranks(self) -> int | None:
        return self._num_ranks

    @property
    def active(self) -> tuple[Detection, ...]:
        """Slowdowns detected and not yet recovered, by rank then kind."""
        found = [t.active for t in self._trackers.values() if t.active is not None]
        return tuple(sorted(found, key=lambda d: (d.rank, KINDS.index(d.kind))))

    @property
    def latest_ratios(self) -> dict[str, tuple[float, ...]]:
        """Per kind, each rank's ratio at the last evaluation (empty before any)."""
        return dict(self._latest_ratios)

    def baseline(self, kind: str) -> tuple[float, ...] | None:
        """Per-rank baseline seconds of `kind`; None while it is being learnt (compute: unless a rank
        was found slow from the start, when it is its reference and the others' so far)."""
        if _check_kind(kind) == COMPUTE:
            return None if self._compute.values is None else tuple(self._compute.values)
        return None if self._comm_baseline is None else tuple(self._comm_baseline.comm_s)

    def set_replicas(self, same_work: Sequence[Sequence[int]] | None,
                     pipelines: Sequence[Sequence[int]] | None = None) -> None:
        """Per rank, the ranks that do the same work (its stage in every replica, itself included), for
        the launch to come; None: one pipeline. A rank ``replica_threshold`` times the others of its
        group is slow from the start (`synapse.detection.start`). ``pipelines``: the ranks of each
        replica's pipeline; None: read from ``same_work``, which only replicas cut alike allow (a replica
        cut differently shares no stage with the others, so its ranks' places in their groups say nothing
        of which pipeline they are in)."""
        groups = None if same_work is None else [tuple(int(r) for r in g) for g in same_work]
        self._start.same_work = groups
        # compute moves between the clocks of one pipeline's ranks only (`net_compute_ratios`)
        if pipelines is not None:
            self._pipelines = [[int(r) for r in pipeline] for pipeline in pipelines]
        else:
            self._pipelines = None if groups is None else pipelines_of(groups)

    def set_expected(self, compute_s: Sequence[float]) -> None:
        """The plan's per-step compute seconds of each rank at nominal speed (the cost model's
        prediction for the running partition), before the first step of a launch. From the first
        step after the warm-up, a rank ``prior_threshold`` times slower than the ranks at nominal
        speed relative to this (K = 1: ``alone_threshold`` times it) is slow from the start
        (`synapse.detection.start`)."""
        values = _check_scales("expected compute_s", compute_s, len(compute_s))
        if self._num_ranks is not None and len(values) != self._num_ranks:
            raise DetectorInputError(f"expected compute_s has {len(values)} ranks, the detector tracks "
                                     f"{self._num_ranks}; call set_expected after rebase()")
        self._compute.expected = values

    # ------------------------------------------------------------------ update
    def update(self, timing: StepTiming) -> list[Detection]:
        self._accept(timing)
        if timing.probe_s is not None:  # a launch's first record carries its start probe
            self._start.probe_s = timing.probe_s
        self._steps_since_start += 1
        if self._steps_since_start <= self.config.warmup_steps:
            return []
        self._history.append(HistoryEntry(timing.step, timing.start_time, timing.compute_s, timing.comm_s,
                                          timing.step_seconds, timing.send_s))
        events = self._learn_baselines(timing)
        if self._compute.pending:
            events += self._judge_pending(timing)
        if self._compute.pending and self._compute.learn_pending(timing.compute_s, self.config.baseline_window):
            self._forget_compute_signals()  # the cached ratios were against the placeholder
        if timing.send_s is not None:
            self._link.learn(timing.send_s)
        # Evaluation waits for the whole window even where a rank was found slow earlier: the other
        # ranks' baselines are then still being learnt
        if self._compute.learning or len(self._history) < self.config.window:
            return events
        return events + self._evaluate(timing)

    def _accept(self, timing: StepTiming) -> None:
        check_next_step(timing, self._last_step, self._num_ranks)
        self._num_ranks, self._last_step = timing.num_ranks, timing.step

    def _learn_baselines(self, timing: StepTiming) -> list[Detection]:
        """One step of the baselines' windows; returns the ranks found slow from the start now."""
        if not self._compute.learning and self._comm_baseline is not None:
            return []
        self._learning.append((timing.compute_s, timing.comm_s))
        events = self._learn_compute(timing) if self._compute.learning else []
        if len(self._learning) < self.config.baseline_window:
            return events
        if self._comm_baseline is None and len(self._learning) >= self.config.comm_baseline_window:
            compute_steps, comm_steps = zip(*self._learning)
            compute_median = [median(per_rank) for per_rank in zip(*compute_steps)]
            self._comm_baseline, own = CommBaseline.learned(compute_steps, comm_steps, compute_median)
            self._comm_own = [SortedWindow(per_rank, maxlen=self.config.refine_window) for per_rank in zip(*own)]
        if self._comm_baseline is not None:
            self._learning = []
        return events

    def _learn_compute(self, timing: StepTiming) -> list[Detection]:
        """A step of the compute baseline's window: the start check (`synapse.detection.start`) judges
        it; the baseline is learnt when the window closes, or at once where a rank is found slow (the
        controller reads its reference then), and follows the window's further steps until it closes."""
        steps = [compute for compute, _ in self._learning]
        final = len(steps) >= self.config.baseline_window
        expected = self._compute.expected
        # While the window is open only the start check can have found a compute slowdown
        found = {rank for (kind, rank), t in self._trackers.items() if kind == COMPUTE and t.active is not None}
        newly, readings = self._start.judge(steps, expected, final, found)
        events = [self._start_event(rank, reading, len(steps), timing) for rank, reading in sorted(newly.items())]
        found |= set(newly)
        if not found and not final:
            return events
        references = {}
        for rank in found:
            reading = readings[rank]
            # a rank found slow keeps its reference while its witnesses cannot be told (every rank slow);
            # found before means learnt before
            previous = cast(list[float], self._compute.values)
            references[rank] = reading.reference_s if reading is not None else previous[rank]
        first = self._compute.values is None
        self._compute.learn(steps, references, provisional=not final)
        if first:
            self._wander.reset(len(steps[0]))
        self._forget_compute_signals()
        return events

    def _judge_pending(self, timing: StepTiming) -> list[Detection]:
        """The ranks re-learning their baseline after a re-partition, judged from the start as at a
        run's start (their peers, learnt or carried, are witnesses); one found slow has its baseline."""
        self._launch_steps.append(timing.compute_s)
        steps = self._launch_steps[-self.config.baseline_window:]
        found = {rank for (kind, rank), t in self._trackers.items() if kind == COMPUTE and t.active is not None}
        final = len(self._launch_steps) >= self.config.baseline_window
        newly, _ = self._start.judge(steps, self._compute.expected, final, found)
        events = []
        for rank, reading in sorted(newly.items()):
            if rank in self._compute.pending:  # the others are the evaluation's
                self._compute.settle(rank, reading.reference_s)
                events.append(self._start_event(rank, reading, len(steps), timing))
        if events:
            self._forget_compute_signals()
        return events

    def _start_event(self, rank: int, reading: StartReading, steps: int, timing: StepTiming) -> Detection:
        """A rank slow from the start: its slowdown dates from the first step judged (J)."""
        onset = self._history[max(0, len(self._history) - steps)]
        tracker = self._trackers.setdefault((COMPUTE, rank), Tracker())
        tracker.above, tracker.below = 0, 0
        tracker.active = Detection(rank=rank, kind=COMPUTE, event=SLOWDOWN, ratio=reading.ratio,
                                   onset_step=onset.step, detected_step=timing.step,
                                   latency_steps=timing.step - onset.step,
                                   latency_s=timing.wall_time - onset.start_time)
        return tracker.active

    # -------------------------------------------------------------- evaluation
    def _signal(self, entry: HistoryEntry, name: str) -> list[float]:
        signals = entry.signals
        if name in signals:
            return signals[name]
        if cast(int, self._num_ranks) >= VECTOR_FROM_RANKS:  # all ranks in one numpy pass: the same answers
            self._fill_signals((entry,), name)
            signals[name] = entry.rows[name].tolist()
            return signals[name]
        if name.startswith("link"):
            excess = self._link.excess(cast(tuple[float, ...], entry.send_s))  # link signals: records with send_s
            ratios = self._link.ratios(excess)
            signals.update(link_excess=excess, link_ratio=ratios, link_peer=peer_ratios(ratios))
        elif name.startswith(COMPUTE):
            # a rank still re-learning its baseline is not judged (ratio 1)
            baseline = cast(list[float], self._compute.values)  # evaluated only once learnt
            raw = [1.0 if r in self._compute.pending else c / max(b, _TINY_S)
                   for r, (c, b) in enumerate(zip(entry.compute_s, baseline))]
            ratios = net_compute_ratios(raw, baseline, self._margin, self._pipelines)
            signals.update(compute_raw=raw, compute_ratio=ratios, compute_peer=peer_ratios(ratios))
        else:
            comm = cast(CommBaseline, self._comm_baseline)  # comm signals: asked only once learnt
            beyond_comm, beyond_step = comm.beyond_peers(entry.compute_s, entry.comm_s)
            ratios = [1.0 + max(0.0, min(a, b)) / self._denominator(COMM, r)
                      for r, (a, b) in enumerate(zip(beyond_comm, beyond_step))]
            signals.update(comm_beyond_comm=beyond_comm, comm_beyond_step=beyond_step,
                           comm_ratio=ratios, comm_peer=peer_ratios(ratios))
        return signals[name]

    def _fill_signals(self, entries: Sequence[HistoryEntry], name: str) -> None:
        """``_signal`` of every entry lacking ``name`` (and the signals computed with it), all entries
        and ranks in one numpy pass from 8 ranks up (a baseline refined by a quiet step drops the
        compute and link signals from every entry of the window, so each step computed them again
        entry by entry, rank by rank). The same answers bit for bit: `net_compute_ratio_rows`,
        `peer_ratio_rows`, `LinkBaseline.excess_and_ratio_rows` and `CommBaseline.beyond_peer_rows`
        are their per-rank readings row by row (tests/unit/test_rolling.py)."""
        missing = [e for e in entries if name not in e.rows]
        if not missing or cast(int, self._num_ranks) < VECTOR_FROM_RANKS:
            return  # a few ranks: `_signal` entry by entry is as quick
        if name.startswith("link"):
            send = np.array([cast(tuple[float, ...], e.send_s) for e in missing], dtype=np.float64)
            excess, ratios = self._link.excess_and_ratio_rows(send)
            for entry, x, r, p in zip(missing, excess, ratios, peer_ratio_rows(ratios)):
                entry.rows.update(link_excess=x, link_ratio=r, link_peer=p)
        elif name.startswith(COMPUTE):
            baseline = cast(list[float], self._compute.values)  # evaluated only once learnt
            raw = np.array([e.compute_s for e in missing], dtype=np.float64) / np.maximum(baseline, _TINY_S)
            raw[:, list(self._compute.pending)] = 1.0  # a rank still re-learning its baseline is not judged
            net = net_compute_ratio_rows(raw, baseline, self._margin, self._pipelines)
            for entry, r, n, p in zip(missing, raw, net, peer_ratio_rows(net)):
                entry.rows.update(compute_raw=r, compute_ratio=n, compute_peer=p)
        else:
            comm = cast(CommBaseline, self._comm_baseline)  # comm signals: asked only once learnt
            beyond_comm, beyond_step = comm.beyond_peer_rows(
                np.array([e.compute_s for e in missing], dtype=np.float64),
                np.array([e.comm_s for e in missing], dtype=np.float64))
            # 1 + max(0, min(a, b)) / denominator, as `_signal` takes them: min(a, b) is b only where b < a
            least = np.where(beyond_step < beyond_comm, beyond_step, beyond_comm)
            ratios = 1.0 + np.where(least > 0.0, least, 0.0) / self._comm_denominators()
            for entry, a, b, r, p in zip(missing, beyond_comm, beyond_step, ratios, peer_ratio_rows(ratios)):
                entry.rows.update(comm_beyond_comm=a, comm_beyond_step=b, comm_ratio=r, comm_peer=p)

    def _comm_denominators(self) -> np.ndarray:
        """`_denominator` of comm for every rank (a maximum with _TINY_S > 0: a tie is one value)."""
        if self._link_mode:
            return self._link.denominators()
        comm_s = np.asarray(cast(CommBaseline, self._comm_baseline).comm_s, dtype=np.float64)
        return np.maximum(comm_s, max(self.config.min_comm_s, _TINY_S))

    def _evaluate(self, timing: StepTiming) -> list[Detection]:
        recent = list(islice(self._history, len(self._history) - self.config.window, None))
        windows: dict[str, Any] = {}  # a signal's window, one row per step (an array from 8 ranks up), once a step

        def window_median(name: str, reading: Callable[[Sequence[Sequence[float]]], list[float]] = column_medians
                          ) -> list[float]:
            """Each rank's ``reading`` of a signal over the window (all ranks at once: one row per step)."""
            if name not in windows:  # read twice (median and trend) before the baselines move, so kept
                self._fill_signals(recent, name)
                vector = cast(int, self._num_ranks) >= VECTOR_FROM_RANKS
                windows[name] = (np.array([e.rows[name] for e in recent]) if vector
                                 else [self._signal(e, name) for e in recent])
            return reading(windows[name])

        ratios = window_median("compute_ratio")
        cfg = self.config
        floor, trend_floors = self._compute.noise_floors(cfg.window, cfg.compute_noise_z)
        beyond_noise = [ratio >= floor for ratio in ratios]
        trend = None
        if cfg.trend:  # a device degrading gradually: where its ratio stands now, not half a window ago
            levels = window_median("compute_ratio", current_levels)
            # ... and only once the window median is halfway there: a burst of a few slow steps
            # (on an H200, an asynchronous checkpoint write slowed the next 5 steps 1.25-1.5x) is not
            trend = (levels, window_median("compute_peer", current_levels),
                     [level >= least and ratio >= cfg.recover_below
                      for level, least, ratio in zip(levels, trend_floors, ratios)])
        peer_floors = self._wander.floors(cfg.peer_threshold) if cfg.peer_threshold and cfg.peer_wander_z else None
        events = self._judge(COMPUTE, ratios, window_median("compute_peer"), beyond_noise, timing, trend, peer_floors)
        self._wander.observe(self._signal(self._history[-1], "compute_ratio"), self._calm_ranks())
        self._refine(ratios)
        if self._link_mode:
            own = window_median("link_excess")
            # the floor is never below min_comm_s: an excess under it is below the floor without its sd
            least = max(self._link.min_comm_s, _TINY_S)
            above_floor = [x >= least and x >= self._link.floor(r, self.config.window, NOISE_Z)
                           for r, x in enumerate(own)]
            return events + self._judge(COMM, self._link.ratios(own), window_median("link_peer"), above_floor, timing)
        if self._comm_baseline is None:
            return events
        slow = [(ratio - 1.0) * self._denominator(COMPUTE, r) for r, ratio in enumerate(ratios)
                if ratio >= self.config.threshold]
        self._comm_spread_set()
        comm_ratios, above_floor = self._comm_baseline.own_ratios(
            window_median("comm_beyond_comm"), window_median("comm_beyond_step"),
            cfg.wait_explain_factor * max(slow, default=0.0), cfg.window, cfg.min_comm_s, NOISE_Z)
        return events + self._judge(COMM, comm_ratios, window_median("comm_peer"), above_floor, timing)

    def _calm_ranks(self) -> list[int]:
        """Ranks judged on compute that are neither in excess nor slow now."""
        num_ranks = cast(int, self._num_ranks)  # evaluated only after a step
        trackers = [self._trackers.get((COMPUTE, rank), Tracker()) for rank in range(num_ranks)]
        return [rank for rank, t in enumerate(trackers)
                if rank not in self._compute.pending and t.above == 0 and t.active is None]

    def _refine(self, net_ratios: Sequence[float]) -> None:
        """Healthy steps refine each rank's compute baseline (the median of the last refine_window)."""
        if not self.config.refine_window or not self._compute.samples:
            return
        latest = self._history[-1]
        step_ratios = self._signal(latest, "compute_raw")
        # Only quiet steps: while any rank is slow, the others' compute is disturbed too (on GPUs,
        # time moves between ranks' clocks), and learning that would move their baselines.
        if any(t.active is not None or t.above > 0 for t in self._trackers.values()):
            return
        if self._link_mode:
            quiet = [r for r, ratio in enumerate(self._signal(latest, "link_ratio"))
                     if ratio < self.config.recover_below]
            self._link.refine(cast(tuple[float, ...], latest.send_s), quiet)  # link mode: the latest has send_s
            for entry in self._history:
                entry.forget(("link_excess", "link_ratio", "link_peer"))
        if self._comm_own and self._comm_baseline is not None:  # a better estimate of comm's noise
            own = self._signal(latest, "comm_beyond_comm")
            for rank, samples in enumerate(self._comm_own):
                samples.append(own[rank])
            self._comm_spread_due = True  # set when read (`_comm_spread_set`): judged on own sends, it is not
        quiet = [rank for rank in range(len(self._compute.samples)) if rank not in self._compute.pending
                 and not (step_ratios[rank] >= self.config.threshold or net_ratios[rank] >= self.config.recover_below)]
        if self._compute.refine(latest.compute_s, quiet):
            # cached per-step compute signals were relative to the old baseline
            self._forget_compute_signals()

    def _comm_spread_set(self) -> None:
        """The comm baseline's spread_s from its samples as they stand, before anything reads it: each
        rank's robust sd, as a quiet step used to set it at once (a detector judging comm on own send
        time never reads it but in its state, and 64 ranks' sds were a tenth of a simulated step)."""
        if self._comm_spread_due and self._comm_baseline is not None:
            for rank, samples in enumerate(self._comm_own):
                self._comm_baseline.spread_s[rank] = robust_sd(samples)
        self._comm_spread_due = False

    def _forget_compute_signals(self) -> None:
        for entry in self._history:
            entry.forget(("compute_raw", "compute_ratio", "compute_peer"))

    def _denominator(self, kind: str, rank: int) -> float:
        if kind == COMM and self._link_mode:
            return self._link.denominator(rank)
        if kind == COMM:  # judged only once learnt, as compute below
            return max(cast(CommBaseline, self._comm_baseline).comm_s[rank], self.config.min_comm_s, _TINY_S)
        return max(cast(list[float], self._compute.values)[rank], _TINY_S)

    @property
    def _margin(self) -> float:
        """A peer's compute this far below its baseline moved to another rank's clock (not noise)."""
        return self.config.threshold - 1.0

    def _judge(self, kind: str, ratios: list[float], peers: list[float], above_floor: list[bool],
               timing: StepTiming, trend: tuple[list[float], list[float], list[bool]] | None = None,
               peer_floors: list[float] | None = None) -> list[Detection]:
        """``trend``: the same three per rank read as where the window stands now (`current_level`);
        either reading in excess counts. Recovery is judged on the window median alone.
        ``peer_floors``: per rank, the ratio to its peers beyond its own wander (default: peer_threshold)."""
        self._latest_ratios[kind] = tuple(ratios)
        cfg, events = self.config, []
        skip_peers = cfg.peer_threshold is None or len(ratios) == 1

        def excess(ratio: float, peer: float, beyond_noise: bool, least_peer: float) -> bool:
            return ratio >= cfg.threshold and beyond_noise and (skip_peers or peer >= least_peer)

        levels, trackers = None if trend is None else trend[0], self._trackers
        for rank, ratio in enumerate(ratios):
            tracker = trackers.get((kind, rank))
            if (tracker is not None and tracker.active is None and tracker.above == 0 and ratio < cfg.threshold
                    and (levels is None or levels[rank] < cfg.threshold)):
                continue  # in excess needs a reading >= threshold: nothing to count, nothing changes
            # peer_threshold is None only where skip_peers holds, and then least_peer is not read
            least_peer = cast(float, cfg.peer_threshold) if peer_floors is None else peer_floors[rank]
            in_excess = excess(ratio, peers[rank], above_floor[rank], least_peer)
            if trend is not None and excess(trend[0][rank], trend[1][rank], trend[2][rank], least_peer):
                in_excess, ratio = True, max(ratio, trend[0][rank])
            # comm below its noise floor is no own comm excess; compute below its floor is a
            # slowdown too small to act on, but not a recovery (that needs the ratio itself down)
            cleared = ratios[rank] < cfg.recover_below or (kind == COMM and not above_floor[rank])
            event = self._advance(kind, rank, ratio, in_excess, cleared, timing)
            if event is not None:
                events.append(event)
        return events

    def _advance(self, kind: str, rank: int, ratio: float, in_excess: bool, cleared: bool,
                 timing: StepTiming) -> Detection | None:
        tracker = self._trackers.setdefault((kind, rank), Tracker())
        if tracker.active is None:
            tracker.above = tracker.above + 1 if in_excess else 0
            if tracker.above < self.config.sustain:
                return None
            tracker.above, tracker.below = 0, 0
            tracker.active = self._event(kind, rank, SLOWDOWN, ratio, timing, level_before=0.0)
            return tracker.active
        tracker.below = tracker.below + 1 if cleared else 0
        if tracker.below < max(self.config.sustain, self.config.window):
            return None
        slowed_excess = (tracker.active.ratio - 1.0) * self._denominator(kind, rank)
        tracker.above, tracker.below, tracker.active = 0, 0, None
        return self._event(kind, rank, RECOVERY, ratio, timing, level_before=slowed_excess)

    def _event(self, kind: str, rank: int, event: str, ratio: float, timing: StepTiming,
               level_before: float) -> Detection:
        if kind == COMPUTE:
            baseline = cast(list[float], self._compute.values)[rank]  # an event comes only once learnt
            series = [e.compute_s[rank] - baseline for e in self._history]
        elif self._link_mode:
            series = [self._signal(e, "link_excess")[rank] if e.send_s is not None else 0.0 for e in self._history]
        else:
            series = [min(self._signal(e, "comm_beyond_comm")[rank], self._signal(e, "comm_beyond_step")[rank])
                      for e in self._history]
        cut = (level_before + (ratio - 1.0) * self._denominator(kind, rank)) / 2.0
        onset = self._history[onset_index(series, cut, rising=event == SLOWDOWN)]
        return Detection(rank=rank, kind=kind, event=event, ratio=ratio, onset_step=onset.step,
                         detected_step=timing.step, latency_steps=timing.step - onset.step,
                         latency_s=timing.wall_time - onset.start_time)

    # -------------------------------------------------------- restart support
    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly: baselines, partial baseline samples, history, counters."""
        self._comm_spread_set()
        return encode_state(num_ranks=self._num_ranks, last_step=self._last_step,
                            compute_baseline=self._compute.values, comm_baseline=self._comm_baseline,
                            learning=self._learning, compute_samples=self._compute.samples,
                            compute_pending=self._compute.pending,
                            comm_own_samples=self._comm_own, peer_wander=self._wander.state_dict(),
                            history=self._history, link=self._link.state_dict(), trackers=self._trackers,
                            compute_provisional=self._compute.provisional, launch_steps=self._launch_steps)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`. The next ``warmup_steps`` records are the restarted
        process's warm-up and are ignored; baselines and active slowdowns carry on,
        so a device that is still slow is still reported, not learnt as normal."""
        try:
            restored = parse_state(state, self.config.history_len)
            samples = parse_samples(state, restored[0], self.config.refine_window)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise DetectorInputError(f"not a detector state_dict() of version {STATE_VERSION}: {error}") from None
        (self._num_ranks, self._last_step, self._compute.values, self._comm_baseline, self._learning,
         self._history, self._trackers) = restored
        self._compute.samples, self._compute.pending, self._comm_own, wander = samples
        self._comm_spread_due = False
        # a state saved before the flag existed was never provisional
        self._compute.provisional = self._compute.values is not None and bool(state.get("compute_provisional", False))
        self._wander.load_state_dict(wander)
        self._link.load_state_dict(state.get("link"))
        self._latest_ratios, self._steps_since_start = {}, 0
        self._start.reset()
        self._launch_steps = [tuple(float(x) for x in s) for s in state.get("launch_steps", [])]

    def rewind(self, step: int) -> None:
        """A restart resumed from a checkpoint at ``step``: the steps after it will come again."""
        if self._last_step is not None and step < self._last_step:
            self._last_step = step

    def rebase(self, compute_scale: Sequence[float], comm_scale: Sequence[float] | None = None,
               previous_rank: Sequence[int] | None = None, relearn: Sequence[int] = (),
               fresh: Sequence[int] = ()) -> list[Detection]:
        """Carry the baselines over a re-partition; re-learning would learn a slow device as normal.

        New rank i's baseline is ``old baseline[previous_rank[i]] * scale[i]`` (the cost model's
        new / old time of device i's stage at nominal speed); ``previous_rank`` (default: the same
        K ranks) maps new ranks to old ones when a device was dropped. ``comm_scale=None``
        re-learns comm (mostly waiting, which a cost model predicts poorly). Active slowdowns
        follow their device; returns those dropped. History is cleared, warm-up starts again.
        ``relearn``: new ranks whose compute baseline is learnt again, as at the start, where the
        scale is not to be trusted (`synapse.detection.rebase`); their compute slowdowns drop.
        ``fresh``: new ranks on another device (a spare): none of the old rank's slowdowns follow.
        """
        if self._num_ranks is None:
            raise DetectorInputError("rebase() before any update(): there is no baseline to carry over yet")
        mapping, compute_scale, comm_scale, relearn, fresh = check_rebase(
            self._num_ranks, previous_rank, compute_scale, comm_scale, relearn, fresh)
        self._comm_spread_set()
        carried = {COMPUTE: self._compute.values is not None}
        comm_carried = carried[COMPUTE] and self._comm_baseline is not None and comm_scale is not None
        # A device keeps its link over a re-partition: own send baselines carry over unscaled, and
        # with them the comm slowdowns they found.
        carried[COMM] = comm_carried or (carried[COMPUTE] and self._link.ready)
        self._link.carried(mapping)
        trackers, dropped = carried_trackers(self._trackers, mapping, carried, relearn, fresh)
        if carried[COMPUTE]:
            self._compute.carried(mapping, compute_scale, relearn)
            self._wander.carried(mapping, fresh)
        # a provisional baseline is carried as learnt: its healthy ranks re-learn anyway (relearn)
        self._compute.provisional = False
        probe = self._start.probe_s
        self._start.reset()
        # The probe measured the devices, not the stages: over a live re-partition (the same processes)
        # it follows them; a launch brings its own in its first record anyway
        self._start.probe_s = None if probe is None or fresh else tuple(probe[old] for old in mapping)
        self._launch_steps = []
        self._compute.expected = None  # the plan of the new partition comes with set_expected
        if comm_carried:  # so there is a comm baseline, and comm_scale is given
            comm_baseline, scales = cast(CommBaseline, self._comm_baseline), cast(list[float], comm_scale)
            self._comm_baseline = comm_baseline.carried(mapping, scales, compute_scale)
            self._comm_own = [SortedWindow((x * s for x in self._comm_own[old]), maxlen=self.config.refine_window)
                              for old, s in zip(mapping, scales)] if self._comm_own else []
        else:
            self._comm_baseline, self._comm_own = None, []
        self._num_ranks, self._learning, self._trackers = len(mapping), [], trackers
        self._latest_ratios, self._steps_since_start = {}, 0
        self._history.clear()
        return dropped
