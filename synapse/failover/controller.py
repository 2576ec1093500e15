"""The failover controller: step timings in, KEEP / REPLAN / DEGRADE / REPLACE decisions out.

It lives in the supervisor (the process that launches the workers, and survives their
restarts) and is fed one ``performance.jsonl`` record per optimizer step. Per record:

1. the slowdown detector (per-rank baselines, sustained windows) updates, and its
   slowdown/recovery events go to the event log with their detection latency;
2. the alpha/beta estimator compares each rank's measured compute and comm with the cost
   model's prediction for the partition that runs, giving per-*device* factors;
3. the first steady steps of each placement calibrate the block profiles
   (`synapse.calibration.blocks`): a stage measured 2x its prediction makes its
   blocks 2x dearer, the device's alpha divided out; the estimator's predictions follow, so
   the same error is not read as a slow device too. Every option below is planned (its cuts)
   and priced by the calibrated planner (``priced``);
4. while a slowdown is detected, every ``decide_every`` steps: the options are built
   (KEEP measured; REPLAN/DEGRADE/REPLACE re-planned under the current alphas and scaled
   by the running partition's measured/predicted ratio, what the calibrated model still
   misses), the policy decides, and the decision, with every option's inputs and ETA and
   the block factors, is logged.

A non-KEEP decision is returned to the supervisor, which stops the workers at a step
boundary and restarts them; ``begin_segment`` then carries the detector's baselines over to
the new partition (scaled by the cost model, so a slow device is not re-learnt as normal).
Episode bookkeeping (detections in a row, time lost, actions taken) is what the stateless
policies need; it survives restarts with the controller and is saved in ``state_dict``.
"""
from __future__ import annotations

import re
import statistics
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synapse.calibration import AlphaBetaEstimator, OnlineCalibration
from synapse.config import FailoverConfig
from synapse.decision import (
    Decision,
    DecisionContext,
    DegradePolicy,
    NoViableOptionError,
    OptionKind,
    Policy,
    RestartCostModel,
    RunningPartition,
    build_options,
    replica_options,
)
from synapse.detection import (
    COMM,
    COMPUTE,
    SLOWDOWN,
    Detection,
    SlowdownDetector,
    StepTiming,
    carry_over,
    link_send_seconds,
)
from synapse.failover.live import LIVE_KINDS, live_kinds, taken_live
from synapse.partitioning import Placement, StagePlanner
from synapse.rundir import EVENTS

STEP_WINDOW = 10  # steps whose median is "the current step time"
BASELINE_STEPS = 50  # healthy steps whose median is the step time a slowdown is measured against
KEEP_LOG_EVERY = 10  # a KEEP with an unchanged reason is logged once every this many decisions
ERROR_LOG_LIMIT, ERROR_LOG_EVERY = 5, 100  # a controller error repeating every step: log the first few
# A REBALANCE is priced from profiles at each share's micro-batch (``StagePlanner.size_profiles``),
# which keep a step's per-call costs (a CPU rank 4x slow kept ~0.13 s of compute from 8 images down to
# 2); a planner without them scales a replica's time with its share, and each rebalance then looked as
# good as the last. Its outcome is still checked once this many steps have run after it: a realised
# gain under half the predicted one takes REBALANCE off the options for the rest of the slowdown.
OUTCOME_STEPS = 8

FALLBACK_POLICY = DegradePolicy()  # decides a hard failure when the configured policy fails


@dataclass
class Episode:
    """One slowdown, from its detection until it is gone (recovered, or its device dropped)."""

    consecutive_detections: int = 0
    time_lost_s: float = 0.0
    actions: int = 0
    onset_step: int | None = None
    detected_at: float | None = None
    fell_short: set[OptionKind] = field(default_factory=set)  # acted on, gained under half the prediction


@dataclass
class AwaitedOutcome:
    """An action whose realised gain is checked once ``OUTCOME_STEPS`` steps ran on its placement, on the
    devices it was taken for (found slow, their compute to be cut): their slowest compute a step, measured,
    against the gain the cost model predicts for them. Judged on the whole step, a device
    slowing after the action (at scale, fail-slows overlap) read as the action falling short, and took
    REBALANCE away for the rest of a slowdown that then never ended."""

    kind: OptionKind
    placement: Placement  # the action's
    devices: tuple[int, ...]
    before_s: float  # their slowest compute a step before it, measured (the median of the recent steps)
    predicted_s: float  # ... under the action: before_s times the cost model's ratio of action to KEEP
    measured: list[float] = field(default_factory=list)  # ... measured, a step at a time on the action's placement


@dataclass
class FailoverController:
    policy: Policy
    planner: StagePlanner
    restart_costs: RestartCostModel
    detector: SlowdownDetector = field(default_factory=SlowdownDetector)
    estimator: AlphaBetaEstimator = field(default_factory=AlphaBetaEstimator)
    spare_devices: tuple[int, ...] = ()  # run-wide ids (every node's spares across nodes)
    node_of: Callable[[int], int] | None = None  # across nodes: a run-wide device's node (None: one node)
    prior_alphas: Mapping[int, float] = field(default_factory=dict)  # slowdowns the first plan was made for
    decide_every: int = 1
    log_event: Callable[..., Any] = lambda event, **fields: None
    say: Callable[[str], None] = lambda line: None  # one line for the person watching the console
    placement: Placement | None = None  # the running segment's
    episode: Episode = field(default_factory=Episode)
    last_action_step: int | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    drills: list[dict[str, Any]] = field(default_factory=list)  # forced actions: [{step, action, device?}]
    # What the running workers take live (``failover.live``: the run's replan_mode and the replica engine of
    # the running launch); the kinds of ``LIVE_KINDS`` they do not are priced at the restart path. None:
    # nothing is taken live, every kind priced on its configured path (``restart_costs``' kind_paths).
    failover: FailoverConfig | None = None
    replica_engine: str = "restart"  # of the running launch (begin_segment), kept through its live changes
    time_lost_total_s: float = 0.0  # slow steps over the healthy step time, whole run
    errors: int = 0  # controller errors survived (each read as KEEP; see observe)
    # the last steps of this segment: (step, step_seconds, each rank's compute_s)
    _recent: deque = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    _awaiting: AwaitedOutcome | None = None  # an action whose outcome is to be checked
    _healthy: deque = field(default_factory=lambda: deque(maxlen=BASELINE_STEPS))
    _last_step: int = 0
    _last_keep_reason: str | None = None
    _nominal: tuple[list[float], list[float], list[float]] | None = None  # predicted compute, comm, transfer
    _calibration: OnlineCalibration | None = None  # built on first use (a controller may have no planner)

    # ---------------------------------------------------------------- the running segment
    @property
    def running_placement(self) -> Placement:
        """The running segment's placement; records and decisions only come once a segment began."""
        if self.placement is None:
            raise RuntimeError("the failover controller has no running placement: call begin_segment first")
        return self.placement

    @property
    def nominal_s(self) -> tuple[list[float], list[float], list[float]]:
        """The running partition's predicted compute, comm and transfer per rank (set with the placement)."""
        if self._nominal is None:
            raise RuntimeError("the failover controller has no running placement: call begin_segment first")
        return self._nominal

    # ---------------------------------------------------------------- calibration
    @property
    def calibration(self) -> OnlineCalibration:
        """The run's block calibration; its windows are the detector's warm-up and baseline
        lengths, held for its latency (a slowdown that began inside one is flagged later)."""
        if self._calibration is None:
            config = self.detector.config
            self._calibration = OnlineCalibration(self.planner, config.warmup_steps, config.baseline_window,
                                                  hold_steps=config.window + config.sustain)
        return self._calibration

    @property
    def priced(self) -> StagePlanner:
        """The planner every prediction and re-plan of this controller uses: the run's planner on
        block profiles calibrated by what the running stages measured (itself until then)."""
        return self.calibration.priced

    def _calibrate(self, timing: StepTiming) -> None:
        """New block factors when a rank's window closes: the running placement's predictions
        follow, and the estimator's ratios are re-expressed against them (its alphas measure the
        device, not the profile: one error, counted once)."""
        flagged = {d.rank for d in self.detector.active if d.kind == COMPUTE}
        k = self.running_placement.stages_in(0)  # replica 0's pipeline teaches the blocks (the others repeat it)
        measured = self.calibration.observe(timing.compute_s[:k], [r in flagged for r in range(k)])
        if not measured:
            return
        old_compute = self.nominal_s[0]
        self._nominal = self._nominal_of(self.running_placement)
        self.estimator.rescale_compute({d: new / old for d, new, old in zip(self.running_placement.devices,
                                                                             self._nominal[0], old_compute)
                                        if old > 0 and new > 0})
        self.log_event("block_calibration", step=timing.step, stages=self.calibration.describe(measured),
                       factors=self.calibration.factors.to_dict())

    # ---------------------------------------------------------------- segments
    def begin_segment(self, placement: Placement, start_step: int | None = None, engine: str | None = None) -> None:
        """A new segment (from ``start_step``: resumed from a checkpoint): carry the detector over from the
        previous partition. ``engine``: the replica engine of a new launch (None: the segment continues the
        running launch, changed live)."""
        if engine is not None:
            self.replica_engine = engine
        if start_step is not None:
            self.rewind(start_step)
        previous, self.placement = self.placement, placement
        if self._awaiting is not None and self._awaiting.placement != placement:
            self._awaiting = None  # another placement than the awaited action's: nothing left to judge it on
        self.spare_devices = tuple(d for d in self.spare_devices if d not in placement.devices)
        self._recent.clear()
        planner = self.priced
        self._nominal = self._nominal_of(placement)
        self.detector.set_replicas(placement.stage_peers(),
                                   placement.pipeline_ranks() if placement.replicas > 1 else None)
        if previous is None or self.detector.num_ranks is None:
            self.detector.set_expected(self._nominal[0])
            self.calibration.begin(placement, [self.alphas()[d] for d in placement.devices])
            return
        slow = {d.rank for d in self.detector.active if d.kind == COMPUTE}
        carried = carry_over(previous.devices, planner.layout_cost(previous).compute_s,
                             placement.devices, self._nominal[0], slow_old_ranks=slow)
        dropped = self.detector.rebase(carried.compute_scale, None, previous_rank=carried.previous_rank,
                                       relearn=carried.relearn, fresh=carried.fresh)
        if carried.relearn:  # the log says who is blind for the first steps of the new segment
            self.log_event("baselines_relearnt", ranks=carried.relearn,
                           devices=[placement.devices[r] for r in carried.relearn])
        self.detector.set_expected(self._nominal[0])
        # The healthy step time of the new partition: the old one scaled as the cost model says.
        ratio = planner.layout_cost(placement).step_time_s / planner.layout_cost(previous).step_time_s
        self._rescale_healthy(ratio)
        if not self.detector.active:  # its device is gone: the episode is over
            self.episode = Episode()
        for detection in dropped:
            self.log_event("slowdown_dropped", rank=detection.rank, device=previous.devices[detection.rank],
                           reason="device left the pipeline or baseline re-learnt")
        self.estimator.load_state_dict(self.estimator.state_dict())  # new processes: warm up again
        self.calibration.begin(placement, [self.alphas()[d] for d in placement.devices])  # alphas known before it runs

    def rewind(self, step: int) -> None:
        """A launch resumes from a checkpoint at ``step``: the steps after it come again.

        An action decided after that checkpoint (e.g. a live REPLAN, which saves none, or the
        DEGRADE of a hard failure, decided at the last step seen) now lies in the future of
        the run; the steps since it are counted from the resume point instead."""
        self.detector.rewind(step)
        if self.last_action_step is not None and self.last_action_step > step:
            self.last_action_step = step

    # ---------------------------------------------------------------- per step
    def observe(self, record: Mapping[str, Any]) -> Decision | None:
        """Feed one performance record; return a decision to act on (None: keep going).

        Never raises on a record: an error of the controller's own (a bug, a planner that
        finds no plan) is logged as a ``controller_error`` event and read as KEEP, since
        the workers are fine and a failover system must not end a run it could finish."""
        try:
            return self._observe(record)
        except Exception as error:  # noqa: BLE001  (any bug here must not stop training)
            self._report_error("observe", error, step=record.get("step"))
            return None

    def _report_error(self, where: str, error: Exception, **fields: Any) -> None:
        self.errors += 1
        text = f"{type(error).__name__}: {error}"
        if where != "observe" or self.errors <= ERROR_LOG_LIMIT or self.errors % ERROR_LOG_EVERY == 0:
            self.log_event("controller_error", where=where, error=text, errors_so_far=self.errors,
                           traceback=traceback.format_exc(limit=8), **fields)
        if self.errors == 1:
            self.say(f"failover: controller error in {where} ({text}); keeping the current plan "
                     f"(logged as controller_error in {EVENTS.template})")

    def _observe(self, record: Mapping[str, Any]) -> Decision | None:
        timing = StepTiming.from_dict(record)
        self._last_step = timing.step
        for detection in self.detector.update(timing):
            self._log_detection(detection, timing)
            if detection.kind == COMPUTE and detection.rank in self.detector.prior_replaced:
                self._assume_reference(detection.rank)
            if detection.kind == COMPUTE and timing.step > detection.onset_step:  # the estimator reads the new level
                self.estimator.mark_shift(self.running_placement.devices[detection.rank],
                                          timing.step - detection.onset_step)
        self._update_estimator(timing, link_send_seconds(record.get("ranks")))
        self._calibrate(timing)
        self._recent.append((timing.step, timing.step_seconds, timing.compute_s))
        self._check_outcome(timing)
        drill = self._due_drill(timing.step)
        if drill is not None:
            return self.run_drill(drill, timing.step, int(record["total_steps"]))
        if not self.detector.active:
            if self.episode.onset_step is None:  # not while recovering from a slowdown
                self._healthy.append(timing.step_seconds)
            if self.episode.onset_step is not None or self.episode.actions:
                self.episode = Episode()
            return None
        if self.episode.onset_step is None:  # detected now: the steps since the onset were lost too
            self.episode.onset_step = min(d.onset_step for d in self.detector.active)
            self.episode.detected_at = timing.wall_time
            slow = [s for step, s, _ in self._recent if step >= self.episode.onset_step]
        else:
            slow = [timing.step_seconds]
        lost = sum(max(0.0, s - self.baseline_step_s) for s in slow)
        self.episode.time_lost_s += lost
        self.time_lost_total_s += lost
        if (timing.step - self.episode.onset_step) % self.decide_every:
            return None
        self.episode.consecutive_detections += 1
        decision = self.decide(timing.step, int(record["total_steps"]))
        return None if decision.action is OptionKind.KEEP else decision

    def _assume_reference(self, rank: int) -> None:
        """A rank slow from the start: the estimator takes the reference the detector's verdict
        implies (its own would hold the slowdown; alone, all of it)."""
        expected = self.nominal_s[0][rank]
        if not expected > 0:
            return  # no prediction to take the reference against
        baseline = self.detector.baseline(COMPUTE)
        if baseline is None:  # the detector's plan check sets the compute baselines when it finds a rank slow
            raise RuntimeError(f"rank {rank} was found slow from the start but the detector has no compute baseline")
        reference = baseline[rank] / expected
        if self.estimator.assume_compute_reference(reference):
            self.log_event("estimator_reference", rank=rank, device=self.running_placement.devices[rank],
                           reference=reference, reason="slow from the start (the detector's start check)")
            # The steps taken for healthy so far were slow too (time lost, restart downtime): at nominal speed
            running = self.running_placement
            self._rescale_healthy(self.priced.layout_cost(running).step_time_s
                                  / self.priced.layout_cost(running, self.alphas(), self.betas()).step_time_s)

    def _rescale_healthy(self, ratio: float) -> None:
        healthy = [s * ratio for s in self._healthy]
        self._healthy.clear()
        self._healthy.extend(healthy)

    @property
    def baseline_step_s(self) -> float:
        if self._healthy:
            return statistics.median(self._healthy)
        return self.measured_step_s if self._recent else 0.0

    @property
    def measured_step_s(self) -> float:
        return statistics.median(s for _, s, _ in self._recent)

    def _check_outcome(self, timing: StepTiming) -> None:
        """The awaited action's realised gain, once ``OUTCOME_STEPS`` steps ran on its placement."""
        awaited = self._awaiting
        if awaited is None or self.placement != awaited.placement:
            return
        ranks = [awaited.placement.devices.index(d) for d in awaited.devices]
        awaited.measured.append(max(timing.compute_s[r] for r in ranks))
        if len(awaited.measured) < OUTCOME_STEPS:
            return
        self._awaiting = None
        after_s = statistics.median(awaited.measured)
        if awaited.before_s - after_s < 0.5 * (awaited.before_s - awaited.predicted_s):
            self.episode.fell_short.add(awaited.kind)
            self.log_event("action_fell_short", action=awaited.kind.value, step=timing.step,
                           devices=list(awaited.devices), measured_before_s=awaited.before_s,
                           predicted_s=awaited.predicted_s, measured_after_s=after_s)

    def _awaited_outcome(self, decision: Decision) -> AwaitedOutcome | None:
        """What ``decision`` is to be judged on: the devices the detector finds slow whose compute it is
        predicted to cut by a tenth or more (a REBALANCE: whose share it cut), their slowest compute measured
        over the recent steps, and the cost model's ratio of it under the action to under KEEP (a ratio, so
        that the model's units need not be the clock's). A device not yet found slow is left out: the
        estimate its share was cut by still lags its slowdown. None: nothing to judge on."""
        running, chosen = self.running_placement, decision.chosen.placement
        alphas, betas = self.alphas(), self.betas()
        now = dict(zip(running.devices, self.priced.layout_cost(running, alphas, betas).compute_s))
        then = dict(zip(chosen.devices, self.priced.layout_cost(chosen, alphas, betas).compute_s))
        slow = {running.devices[d.rank] for d in self.detector.active if d.kind == COMPUTE}
        devices = tuple(d for d in running.devices if d in slow and d in then and then[d] <= 0.9 * now[d])
        if not devices or not self._recent:
            return None
        ranks = [running.devices.index(d) for d in devices]
        before_s = statistics.median(max(compute[r] for r in ranks) for _, _, compute in self._recent)
        ratio = max(then[d] for d in devices) / max(now[d] for d in devices)
        return AwaitedOutcome(decision.action, chosen, devices, before_s, before_s * ratio)

    def _nominal_of(self, placement: Placement) -> tuple[list[float], list[float], list[float]]:
        """Each rank's compute, comm and own-link time in one step at nominal speed."""
        cost = self.priced.layout_cost(placement)
        return list(cost.compute_s), list(cost.comm_s), list(cost.transfer_s)

    def _update_estimator(self, timing: StepTiming, link_s: list[float] | None) -> None:
        """Beta (comm) is measured on each link's own send time when the records carry it: the
        cost model prices link r's transfers on stage r, and waiting is no link's slowness.
        Older records only have comm = step - compute, waiting included."""
        compute, comm, transfer = self.nominal_s
        own = link_s is not None and len(link_s) == timing.num_ranks
        measured_comm_s = link_s if own and link_s is not None else timing.comm_s  # own implies link_s is a list
        self.estimator.update(devices=self.running_placement.devices, measured_compute_s=timing.compute_s,
                              measured_comm_s=measured_comm_s, predicted_compute_s=compute,
                              predicted_comm_s=transfer if own else comm, comm_is_transfer=own)

    def _log_detection(self, detection: Detection, timing: StepTiming) -> None:
        event = "slowdown_detected" if detection.event == SLOWDOWN else "slowdown_recovered"
        fields = {k: v for k, v in detection.to_dict().items() if k != "event"}
        device = self.running_placement.devices[detection.rank]
        self.log_event(event, **fields, device=device, step=timing.step)
        what = "slower" if detection.event == SLOWDOWN else "back to normal"
        what_part = "link (its own sends)" if detection.kind == COMM else detection.kind
        self.say(f"failover: rank {detection.rank} (device {device}) {what_part} {detection.ratio:.1f}x its "
                 f"baseline since step {detection.onset_step}: {what}, seen at step {timing.step} "
                 f"({detection.latency_steps} steps, {detection.latency_s:.1f} s after the onset)")

    # ---------------------------------------------------------------- deciding
    def alphas(self) -> dict[int, float]:
        """Each device's slowdown: the estimator's once it has a reference, the planned one
        (``prior_alphas``, 1.0 when none) before that and for devices it never measured."""
        known = self.estimator.alphas() if self.estimator.ready else {}
        return {d: known.get(d, self.prior_alphas.get(d, 1.0))
                for d in (*self.running_placement.devices, *self.spare_devices)}

    def betas(self) -> dict[int, float]:
        # Betas stand on their own reference: a link's healthy level is known after 15 measured steps,
        # before the compute reference (30), and a slow link must be priced as soon as it is blamed.
        known = self.estimator.betas() if self.estimator.reference(COMM) is not None else {}
        return {d: known.get(d, 1.0) for d in (*self.running_placement.devices, *self.spare_devices)}

    def _options(self, bad_device: int | None, measured_step_s: float | None = None, lost: Sequence[int] = ()):
        placement, alphas, betas = self.running_placement, self.alphas(), self.betas()
        predicted = self.priced.layout_cost(placement, alphas, betas).step_time_s
        current = RunningPartition(placement, measured_step_s or predicted, predicted)
        restarting = () if self.failover is None else tuple(LIVE_KINDS - live_kinds(self.failover,
                                                                                     self.replica_engine))
        costs = self.restart_costs.costs_by_kind(restarting=restarting)
        if placement.replicas > 1:
            return replica_options(current, alphas, betas, bad_device, self.priced, costs, self.spare_devices,
                                   lost_devices=lost, excluded=self.episode.fell_short, node_of=self.node_of)
        return build_options(current, alphas, betas, bad_device, self.priced.plan, costs, self.spare_devices,
                             lost_devices=lost, node_of=self.node_of)

    def takes_live(self, kind: OptionKind, chosen: Placement) -> bool:
        """Whether the running workers carry a decision of ``kind`` to ``chosen`` out in place (as priced)."""
        return self.failover is not None and taken_live(self.failover, self.replica_engine, kind,
                                                        self.running_placement, chosen)

    def _slowest_device(self) -> int | None:
        """The device of the strongest active slowdown (compute first: it is the device's own)."""
        active = sorted(self.detector.active, key=lambda d: (d.kind != COMPUTE, -d.ratio))
        return self.running_placement.devices[active[0].rank] if active else None

    def _estimated_factor(self) -> float | None:
        """The estimator's alpha (compute) or beta (comm) of the device the detector blames most."""
        active = sorted(self.detector.active, key=lambda d: (d.kind != COMPUTE, -d.ratio))
        if not active or self.estimator.reference(active[0].kind) is None:
            return None
        device = self.running_placement.devices[active[0].rank]
        return (self.alphas() if active[0].kind == COMPUTE else self.betas())[device]

    def decide(self, step: int, total_steps: int) -> Decision:
        options = self._options(self._slowest_device(), self.measured_step_s)
        since = None if self.last_action_step is None else step - self.last_action_step
        ctx = DecisionContext(step=step, remaining_steps=max(0, total_steps - step), options=options,
                              slowdown_detected=True, consecutive_detections=self.episode.consecutive_detections,
                              time_lost_s=self.episode.time_lost_s, steps_since_last_action=since,
                              actions_in_episode=self.episode.actions, estimated_factor=self._estimated_factor())
        return self._record(self.policy.decide(ctx), step)

    def _due_drill(self, step: int) -> dict[str, Any] | None:
        due = [d for d in self.drills if d["step"] <= step and not d.get("done")]
        return due[0] if due else None

    def run_drill(self, drill: dict[str, Any], step: int, total_steps: int) -> Decision:
        """A forced action (failover.drills): exercise and measure a restart without a real fault."""
        drill["done"] = True
        kind = OptionKind(drill["action"])
        device = drill.get("device")
        options = self._options(self._slowest_device() if device is None else device, self.measured_step_s)
        chosen = next((o for o in options if o.kind is kind), None)
        if chosen is None:
            raise ValueError(f"failover.drills asks for {kind.value} at step {step}, which is not possible here "
                             f"(options: {[o.kind.value for o in options]}); e.g. replace needs trainer.spare_devices")
        decision = Decision(action=kind, chosen=chosen, options=tuple(options), reason=f"drill at step {drill['step']}",
                            step=step, remaining_steps=max(0, total_steps - step), inputs={"policy": "drill"})
        return self._record(decision, step)

    def on_hard_failure(self, failed_device: int, step: int, total_steps: int, cause: str,
                        lost_with_it: Sequence[int] = ()) -> Decision:
        """A device died: the policy picks among the options that avoid it (DEGRADE/REPLACE).
        ``lost_with_it``: devices that went with it (its node was lost), dropped by DEGRADE too.

        If the policy itself fails (anything but "no option avoids the device", which the
        supervisor reports), the error is logged and the baseline rule decides: DEGRADE to the
        survivors, REPLACE if DEGRADE is impossible. The run resumes either way."""
        measured = self.measured_step_s if self._recent else None
        if lost_with_it and self.node_of is not None:
            self._drop_spares_of_lost_nodes((failed_device, *lost_with_it), step)
        options = self._options(failed_device, measured, lost_with_it)
        ctx = DecisionContext(step=step, remaining_steps=max(0, total_steps - step), options=options,
                              hard_failure=True, failed_device=failed_device)
        try:
            decision = self.policy.decide(ctx)
        except NoViableOptionError:
            raise
        except Exception as error:  # noqa: BLE001
            self._report_error("on_hard_failure", error, step=step, failed_device=failed_device)
            decision = FALLBACK_POLICY.decide(ctx)
        return self._record(decision, step, cause=cause,
                            **({"lost_devices": list(lost_with_it)} if lost_with_it else {}))

    def _drop_spares_of_lost_nodes(self, lost: Sequence[int], step: int) -> None:
        """A node lost takes its spares with it: no later REPLACE may launch on a node whose agent is gone
        (they come back with its devices if it rejoins: the decider's ``on_spares``)."""
        assert self.node_of is not None
        nodes = {self.node_of(d) for d in lost}
        gone = [d for d in self.spare_devices if self.node_of(d) in nodes]
        if gone:
            self.spare_devices = tuple(d for d in self.spare_devices if d not in gone)
            self.log_event("spares_lost", step=step, nodes=sorted(nodes), spares=gone)

    def _record(self, decision: Decision, step: int, **extra: Any) -> Decision:
        record = {"time": time.time(), **decision.to_dict(), **extra, "alphas": self.alphas(), "betas": self.betas(),
                  "baseline_step_s": self.baseline_step_s, "measured_step_s": self.measured_step_s
                  if self._recent else None, "block_calibration": self.calibration.factors.to_dict()}
        # Every action is logged; a KEEP only when its reason changes or every KEEP_LOG_EVERY
        # decisions, so that a long slowdown ridden out does not flood the log.
        reason_kind = re.sub(r"[-+]?\d[\d.]*", "#", decision.reason)  # "only 9 steps left" ~ "only 8 ..."
        if (decision.action is not OptionKind.KEEP or reason_kind != self._last_keep_reason
                or self.episode.consecutive_detections % KEEP_LOG_EVERY == 1):
            self.log_event("decision", **record)
        self._last_keep_reason = reason_kind if decision.action is OptionKind.KEEP else None
        if decision.action is OptionKind.REBALANCE:  # its outcome is checked (OUTCOME_STEPS)
            self._awaiting = self._awaited_outcome(decision)
        if decision.action is not OptionKind.KEEP:
            self.episode.actions += 1
            self.episode.time_lost_s = 0.0  # the policies count time lost since the last action
            self.last_action_step = step
            self.decisions.append(record)
        return decision

    def decided_at(self, decision: Decision) -> float | None:
        """Wall time the controller took ``decision`` (an action: every action is kept)."""
        for record in reversed(self.decisions):
            if record.get("step") == decision.step and record.get("action") == decision.action.value:
                return record.get("time")
        return None

    # ---------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {"detector": self.detector.state_dict(), "estimator": self.estimator.state_dict(),
                "restart_costs": self.restart_costs.state_dict(),
                "episode": {**vars(self.episode), "fell_short": sorted(k.value for k in self.episode.fell_short)},
                "last_action_step": self.last_action_step, "healthy_steps_s": list(self._healthy),
                "decisions": self.decisions, "drills": self.drills, "time_lost_total_s": self.time_lost_total_s,
                "placement": None if self.placement is None else vars(self.placement).copy(),
                "block_calibration": None if self._calibration is None else self.calibration.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.detector.load_state_dict(state["detector"])
        self.estimator.load_state_dict(state["estimator"])
        self.restart_costs.load_state_dict(state["restart_costs"])
        episode = dict(state["episode"])  # states saved before layouts have no fell_short
        self.episode = Episode(**{**episode, "fell_short": {OptionKind(k) for k in episode.get("fell_short", ())}})
        self.last_action_step = state["last_action_step"]
        self._healthy.extend(state["healthy_steps_s"])
        self.decisions = list(state["decisions"])
        self.drills = [dict(d) for d in state["drills"]]
        self.time_lost_total_s = float(state["time_lost_total_s"])
        if state.get("block_calibration") is not None:  # states saved before calibration have none
            self.calibration.load_state_dict(state["block_calibration"])
        if state["placement"] is not None:
            self.placement = None  # begin_segment sets it (and this segment's predictions) without a rebase
            saved = state["placement"]  # vars() of a Placement; states saved before layouts lack replicas
            self.begin_segment(Placement(tuple(saved["devices"]), tuple(saved["teacher_counts"]),
                                         tuple(saved["student_counts"]), int(saved.get("replicas", 1)),
                                         tuple(saved.get("shares", ())), tuple(saved.get("replica_stages", ()))))
