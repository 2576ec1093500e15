"""Per-rank slowdown detector: which rank got slower, at compute or at communication.

Pure: one `StepTiming` per optimizer step in, `Detection` events out.

1. Warm-up: the first ``warmup_steps`` records are ignored (compilation, allocator
   and autotuner warm-up); again after `load_state_dict` and `rebase` (a new process).
2. Baseline: the next ``baseline_window`` records give each rank a robust first
   baseline (medians), so a slowdown from step ~15 on is seen. Two things keep a
   device that is slow *from the start* from becoming its own normal: the plan's
   expected per-rank compute (`set_expected`, the cost model's prediction for the
   running partition) judged against the rank's peers (`synapse.monitor.baseline`:
   ``prior_threshold`` times its peers' measured/expected ratio = slow from the
   start; a rank without peers, ``alone_threshold`` times the plan), and later
   quiet steps (no compute slowdown anywhere, this rank's step below ``threshold``)
   refining each compute baseline as the median of the last ``refine_window`` such
   steps.
3. Evaluation, every later step, on medians over the last ``window`` steps (a
   single-step spike cannot move a median). A rank's per-step compute ratio is net of
   what its peers' compute fell more than ``threshold - 1`` below theirs (time that
   moved between ranks' clocks is not a slower device). A (rank, kind) is *in excess*
   when its ratio to the baseline is >= ``threshold``, beyond its own noise (`NOISE_Z`
   sd of a window median, sd from its baseline samples) and, step by step, it is
   >= ``peer_threshold`` times the median ratio of the other ranks (window median;
   skipped for K = 1 or ``peer_threshold=None``: a slowdown that hits every rank
   alike does not change the best partition), and further above its peers than its own
   wander against them has been (``peer_wander_z``, `synapse.monitor.wander`: CPU ranks on
   a virtual machine change speed by themselves). Compute is also read as where the window
   stands now (``trend``: `synapse.monitor.trend`), so a gradual slowdown is seen as it
   crosses the threshold; that reading must clear the rank's own noise too, and counts only
   once the window median is halfway (a burst of a few slow steps is not a slowdown).
4. ``sustain`` evaluations in a row in excess: ``Detection(event='slowdown')``.
   While active, ``window`` evaluations in a row below `DetectorConfig.recover_below`
   (halfway between 1 and ``threshold``): ``event='recovery'``. Recovery is
   cautious on purpose: a false one would make the controller forget a real slowdown.

Communication (who is blamed for it): records with ``send_s`` carry each rank's own send
work apart from its waiting and are judged on it (`synapse.monitor.link`); waiting, however
long, is never blamed. Older records are judged by the waiting rule (`synapse.monitor.waiting`).

Onset: at an event, the start of the run of recent steps whose per-step excess is
past the midpoint between the level before and now. ``latency_s`` runs from the
start of the onset step to the end of the detecting one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from itertools import islice
from statistics import median
from typing import Any

from synapse.monitor.baseline import ComputeBaseline, net_compute_ratios, robust_sd
from synapse.monitor.detection import (  # noqa: F401  (the detector's public names, re-exported)
    COMM, COMPUTE, KINDS, RECOVERY, SLOWDOWN, Detection, DetectorConfig, DetectorConfigError, DetectorInputError,
    _check_kind, _check_scales, check_next_step, check_rebase)
from synapse.monitor.detector_state import (
    STATE_VERSION, HistoryEntry, Tracker, carried_trackers, encode_state, parse_samples, parse_state)
from synapse.monitor.link import LinkBaseline
from synapse.monitor.onset import onset_index
from synapse.monitor.timing import StepTiming
from synapse.monitor.trend import current_level
from synapse.monitor.waiting import CommBaseline, peer_ratios
from synapse.monitor.wander import PeerWander

NOISE_Z = 5.0  # own comm excess must exceed this many sd of its window median
_TINY_S = 1e-9  # a zero baseline must not divide by zero


class SlowdownDetector:
    """Feed `update` one `StepTiming` per step; it returns that step's events."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config if config is not None else DetectorConfig()
        self._num_ranks: int | None = None
        self._last_step: int | None = None
        self._steps_since_start = 0
        self._compute = ComputeBaseline(self.config.refine_window, self.config.prior_threshold,
                                        self.config.alone_threshold)
        self._comm_baseline: CommBaseline | None = None
        self._learning: list[tuple[tuple[float, ...], tuple[float, ...]]] = []  # (compute, comm) per step
        self._comm_own: list[deque[float]] = []  # per rank: own comm excess of quiet steps (its spread)
        self._history: deque[HistoryEntry] = deque(maxlen=self.config.history_len)
        self._trackers: dict[tuple[str, int], Tracker] = {}
        self._latest_ratios: dict[str, tuple[float, ...]] = {}
        cfg = self.config
        self._link = LinkBaseline(cfg.baseline_window, cfg.refine_window, cfg.min_comm_s, cfg.prior_threshold)
        self._wander = PeerWander(cfg.window, cfg.refine_window, cfg.peer_wander_z or 0.0)

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
        """Per-rank baseline seconds of `kind`; None while it is being learnt."""
        if _check_kind(kind) == COMPUTE:
            return None if self._compute.values is None else tuple(self._compute.values)
        return None if self._comm_baseline is None else tuple(self._comm_baseline.comm_s)

    def set_expected(self, compute_s: Sequence[float]) -> None:
        """The plan's per-step compute seconds of each rank at nominal speed (the cost model's
        prediction for the running partition), before the first step of a launch. When the
        baseline is learnt, a rank ``prior_threshold`` times slower than its peers relative to
        this is slow from the start (`synapse.monitor.baseline`)."""
        values = _check_scales("expected compute_s", compute_s, len(compute_s))
        if self._num_ranks is not None and len(values) != self._num_ranks:
            raise DetectorInputError(f"expected compute_s has {len(values)} ranks, the detector tracks "
                                     f"{self._num_ranks}; call set_expected after rebase()")
        self._compute.expected = values

    # ------------------------------------------------------------------ update
    def update(self, timing: StepTiming) -> list[Detection]:
        self._accept(timing)
        self._steps_since_start += 1
        if self._steps_since_start <= self.config.warmup_steps:
            return []
        self._learn_baselines(timing)
        if self._compute.pending and self._compute.learn_pending(timing.compute_s, self.config.baseline_window):
            self._forget_compute_signals()  # the cached ratios were against the placeholder
        if timing.send_s is not None:
            self._link.learn(timing.send_s)
        self._history.append(HistoryEntry(timing.step, timing.start_time, timing.compute_s, timing.comm_s,
                                    timing.step_seconds, timing.send_s))
        if self._compute.values is None or len(self._history) < self.config.window:
            return []
        return self._evaluate(timing)

    def _accept(self, timing: StepTiming) -> None:
        check_next_step(timing, self._last_step, self._num_ranks)
        self._num_ranks, self._last_step = timing.num_ranks, timing.step

    def _learn_baselines(self, timing: StepTiming) -> None:
        if self._compute.values is not None and self._comm_baseline is not None:
            return
        self._learning.append((timing.compute_s, timing.comm_s))
        if len(self._learning) < self.config.baseline_window:
            return
        compute_steps, comm_steps = zip(*self._learning)
        compute_median = [median(per_rank) for per_rank in zip(*compute_steps)]
        if self._compute.values is None:
            self._compute.learn(compute_median, compute_steps)
            self._wander.reset(len(compute_median))
        if self._comm_baseline is None and len(self._learning) >= self.config.comm_baseline_window:
            self._comm_baseline, own = CommBaseline.learned(compute_steps, comm_steps, compute_median)
            self._comm_own = [deque(per_rank, maxlen=self.config.refine_window) for per_rank in zip(*own)]
        if self._comm_baseline is not None:
            self._learning = []

    # -------------------------------------------------------------- evaluation
    def _signal(self, entry: HistoryEntry, name: str) -> list[float]:
        signals = entry.signals
        if name in signals:
            return signals[name]
        if name.startswith("link"):
            excess = self._link.excess(entry.send_s)
            ratios = self._link.ratios(excess)
            signals.update(link_excess=excess, link_ratio=ratios, link_peer=peer_ratios(ratios))
        elif name.startswith(COMPUTE):
            # a rank still re-learning its baseline is not judged (ratio 1)
            raw = [1.0 if r in self._compute.pending else c / max(b, _TINY_S)
                   for r, (c, b) in enumerate(zip(entry.compute_s, self._compute.values))]
            ratios = net_compute_ratios(raw, self._compute.values, self._margin)
            signals.update(compute_raw=raw, compute_ratio=ratios, compute_peer=peer_ratios(ratios))
        else:
            beyond_comm, beyond_step = self._comm_baseline.beyond_peers(entry.compute_s, entry.comm_s)
            ratios = [1.0 + max(0.0, min(a, b)) / self._denominator(COMM, r)
                      for r, (a, b) in enumerate(zip(beyond_comm, beyond_step))]
            signals.update(comm_beyond_comm=beyond_comm, comm_beyond_step=beyond_step,
                           comm_ratio=ratios, comm_peer=peer_ratios(ratios))
        return signals[name]

    def _evaluate(self, timing: StepTiming) -> list[Detection]:
        recent = list(islice(self._history, len(self._history) - self.config.window, None))

        def window_median(name: str, reading=median) -> list[float]:
            return [reading(per_rank) for per_rank in zip(*(self._signal(e, name) for e in recent))]

        ratios = window_median("compute_ratio")
        cfg = self.config
        floor, trend_floors = self._compute.noise_floors(cfg.window, cfg.compute_noise_z)
        beyond_noise = [ratio >= floor for ratio in ratios]
        trend = None
        if cfg.trend:  # a device degrading gradually: where its ratio stands now, not half a window ago
            levels = window_median("compute_ratio", current_level)
            # ... and only once the window median is halfway there: a burst of a few slow steps
            # (on an H200, an asynchronous checkpoint write slowed the next 5 steps 1.25-1.5x) is not
            trend = (levels, window_median("compute_peer", current_level),
                     [level >= least and ratio >= cfg.recover_below
                      for level, least, ratio in zip(levels, trend_floors, ratios)])
        peer_floors = self._wander.floors(cfg.peer_threshold) if cfg.peer_threshold and cfg.peer_wander_z else None
        events = self._judge(COMPUTE, ratios, window_median("compute_peer"), beyond_noise, timing, trend, peer_floors)
        self._wander.observe(self._signal(self._history[-1], "compute_ratio"), self._calm_ranks())
        self._refine(ratios)
        if self._link_mode:
            own = window_median("link_excess")
            above_floor = [x >= self._link.floor(r, self.config.window, NOISE_Z) for r, x in enumerate(own)]
            return events + self._judge(COMM, self._link.ratios(own), window_median("link_peer"), above_floor, timing)
        if self._comm_baseline is None:
            return events
        slow = [(ratio - 1.0) * self._denominator(COMPUTE, r) for r, ratio in enumerate(ratios)
                if ratio >= self.config.threshold]
        comm_ratios, above_floor = self._comm_baseline.own_ratios(
            window_median("comm_beyond_comm"), window_median("comm_beyond_step"),
            cfg.wait_explain_factor * max(slow, default=0.0), cfg.window, cfg.min_comm_s, NOISE_Z)
        return events + self._judge(COMM, comm_ratios, window_median("comm_peer"), above_floor, timing)

    def _calm_ranks(self) -> list[int]:
        """Ranks judged on compute that are neither in excess nor slow now."""
        trackers = [self._trackers.get((COMPUTE, rank), Tracker()) for rank in range(self._num_ranks)]
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
            quiet = [r for r, ratio in enumerate(self._signal(latest, "link_ratio")) if ratio < self.config.recover_below]
            self._link.refine(latest.send_s, quiet)
            for entry in self._history:
                for name in ("link_excess", "link_ratio", "link_peer"):
                    entry.signals.pop(name, None)
        if self._comm_own and self._comm_baseline is not None:  # a better estimate of comm's noise
            own = self._signal(latest, "comm_beyond_comm")
            for rank, samples in enumerate(self._comm_own):
                samples.append(own[rank])
                self._comm_baseline.spread_s[rank] = robust_sd(samples)
        quiet = [rank for rank in range(len(self._compute.samples)) if rank not in self._compute.pending
                 and not (step_ratios[rank] >= self.config.threshold or net_ratios[rank] >= self.config.recover_below)]
        if self._compute.refine(latest.compute_s, quiet):  # cached per-step compute signals were relative to the old baseline
            self._forget_compute_signals()

    def _forget_compute_signals(self) -> None:
        for entry in self._history:
            for name in ("compute_raw", "compute_ratio", "compute_peer"):
                entry.signals.pop(name, None)

    def _denominator(self, kind: str, rank: int) -> float:
        if kind == COMM and self._link_mode:
            return self._link.denominator(rank)
        if kind == COMM:
            return max(self._comm_baseline.comm_s[rank], self.config.min_comm_s, _TINY_S)
        return max(self._compute.values[rank], _TINY_S)

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

        for rank, ratio in enumerate(ratios):
            least_peer = cfg.peer_threshold if peer_floors is None else peer_floors[rank]
            in_excess = excess(ratio, peers[rank], above_floor[rank], least_peer)
            if trend is not None and excess(*(reading[rank] for reading in trend), least_peer):
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
            series = [e.compute_s[rank] - self._compute.values[rank] for e in self._history]
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
        return encode_state(num_ranks=self._num_ranks, last_step=self._last_step,
                            compute_baseline=self._compute.values, comm_baseline=self._comm_baseline,
                            learning=self._learning, compute_samples=self._compute.samples,
                            compute_pending=self._compute.pending,
                            comm_own_samples=self._comm_own, peer_wander=self._wander.state_dict(),
                            history=self._history, link=self._link.state_dict(), trackers=self._trackers)

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
        self._wander.load_state_dict(wander)
        self._link.load_state_dict(state.get("link"))
        self._latest_ratios, self._steps_since_start = {}, 0

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
        scale is not to be trusted (`synapse.failover.carry_over`); their compute slowdowns drop.
        ``fresh``: new ranks on another device (a spare): none of the old rank's slowdowns follow.
        """
        if self._num_ranks is None:
            raise DetectorInputError("rebase() before any update(): there is no baseline to carry over yet")
        mapping, compute_scale, comm_scale, relearn, fresh = check_rebase(
            self._num_ranks, previous_rank, compute_scale, comm_scale, relearn, fresh)
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
        self._compute.expected = None  # the plan of the new partition comes with set_expected
        self._comm_baseline = self._comm_baseline.carried(mapping, comm_scale, compute_scale) if comm_carried else None
        self._comm_own = [deque((x * s for x in self._comm_own[old]), maxlen=self.config.refine_window)
                          for old, s in zip(mapping, comm_scale)] if comm_carried and self._comm_own else []
        self._num_ranks, self._learning, self._trackers = len(mapping), [], trackers
        self._latest_ratios, self._steps_since_start = {}, 0
        self._history.clear()
        return dropped
