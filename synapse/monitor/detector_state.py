"""What the slowdown detector holds between steps, and its one writer and reader for restarts.

Pure, a part of the slowdown detector (`synapse.monitor.detector`). A restarted stage goes
on from the detector state saved with the checkpoint, so a device that is still slow is
still reported instead of being learnt as normal. The format (`STATE_VERSION`) is read back
by a later process, possibly of a later version of this code: its writer and its reader live
here side by side so that they cannot drift apart, apart from the rules that use the state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from synapse.monitor.detection import COMPUTE, Detection, _check_kind
from synapse.monitor.waiting import COMM_BASELINE_FIELDS, CommBaseline

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


@dataclass
class Tracker:
    """One (kind, rank)'s progress towards a slowdown or a recovery."""

    above: int = 0  # evaluations in a row in excess (while inactive)
    below: int = 0  # evaluations in a row cleared (while active)
    active: Detection | None = None


def carried_trackers(trackers: Mapping[tuple[str, int], Tracker], mapping: Sequence[int], carried: Mapping[str, bool],
                     relearn: Sequence[int], fresh: Sequence[int]) -> tuple[dict[tuple[str, int], Tracker], list[Detection]]:
    """Active slowdowns over a re-partition (new rank i was old rank ``mapping[i]``): each follows
    its device where that kind's baseline was ``carried``, unless the device is gone, the new rank
    is ``fresh`` (another device) or re-learns its compute. Returns (trackers, dropped detections)."""
    kept_trackers, dropped = {}, []
    for (kind, old_rank), tracker in sorted(trackers.items()):
        if tracker.active is None:
            continue
        new_rank = mapping.index(old_rank) if old_rank in mapping else None
        kept = new_rank is not None and new_rank not in fresh and not (kind == COMPUTE and new_rank in relearn)
        if kept and carried[kind]:
            kept_trackers[(kind, new_rank)] = Tracker(active=replace(tracker.active, rank=new_rank))
        else:
            dropped.append(tracker.active)
    return kept_trackers, dropped


def encode_state(*, num_ranks: int | None, last_step: int | None, compute_baseline: Sequence[float] | None,
                 comm_baseline: CommBaseline | None, learning: Sequence[tuple[Sequence[float], Sequence[float]]],
                 compute_samples: Sequence[Sequence[float]], comm_own_samples: Sequence[Sequence[float]],
                 peer_wander: Sequence[Sequence[float]], compute_pending: Mapping[int, Sequence[float]],
                 history: Sequence[HistoryEntry], link: dict[str, Any],
                 trackers: Mapping[tuple[str, int], Tracker]) -> dict[str, Any]:
    """JSON-friendly: baselines, partial baseline samples, history, counters."""
    return {
        "version": STATE_VERSION,
        "num_ranks": num_ranks,
        "last_step": last_step,
        "compute_baseline": None if compute_baseline is None else list(compute_baseline),
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


def parse_state(state: Mapping[str, Any], history_len: int) -> tuple:
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


def parse_samples(state: Mapping[str, Any], num_ranks: int | None, keep: int) -> tuple:
    """(compute samples, compute pending, comm own samples, peer wander) of an `encode_state` dict,
    each per rank; a state saved before one existed has none of it. ValueError when malformed."""
    compute = [deque(map(float, s), maxlen=keep) for s in state.get("compute_samples", [])]
    pending = {int(rank): [float(x) for x in seen] for rank, seen in state.get("compute_pending", {}).items()}
    comm_own = [deque(map(float, s), maxlen=keep) for s in state.get("comm_own_samples", [])]
    wander = state.get("peer_wander") or [[] for _ in range(num_ranks or 0)]
    if len(wander) != (num_ranks or 0):
        raise ValueError(f"peer_wander has {len(wander)} ranks, num_ranks is {num_ranks}")
    return compute, pending, comm_own, [[float(x) for x in steps] for steps in wander]
