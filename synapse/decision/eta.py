"""The ETA model: what the run could do next (``build_options``), each option priced in seconds
of wall time.

* ``OptionKind``       KEEP, REPLAN, DEGRADE, REPLACE.
* ``RunningPartition`` the placement running now, measured: what KEEP keeps and what puts
                       the planner's predictions on the measured scale (``calibration``).
* ``Option``           one option: its placement, predicted step time and restart cost, and
                       ``eta_s(remaining_steps) = restart_cost_s + remaining_steps * predicted_step_s``.
* ``EtaModelError`` and the checks every part of the ETA model applies to its numbers.

    ETA(option) = restart_cost_s + remaining_steps * predicted_step_s

Options (``OptionKind``):

* KEEP    carry on as is; predicted step = the *measured* current step, no restart.
* REPLAN  same devices, partition re-planned for the current alphas/betas.
* DEGRADE the failed or slowest device dropped, K-1 devices, re-planned.
* REPLACE the bad device swapped for a spare (only when spares exist), re-planned. Across nodes
          (``node_of``) a spare on the bad device's node first; the devices then in node order.

With R > 1 replicas (``replica_options``) every replica keeps the same cuts, and:

* REPLAN    every replica re-cut for the slowest device of each stage across replicas.
* DEGRADE   the replica that holds the bad device dropped; the others share its images.
* REBALANCE the same devices, the batch shared out so that all replicas finish a step together
            (the global batch unchanged): shares by speed, then moved a micro-batch's worth at a time
            while the planner, pricing each share at its own micro-batch, says the step gets shorter.
* REPLACE   the bad device swapped for a spare (across nodes only where the swap keeps node order).
* SHRINK    the replica that holds the bad device re-cut over its survivors (K - 1 stages there), with the
            share at which the replicas finish a step together (the REBALANCE search); the others keep
            their cuts. Replicas then differ in stage count (``Placement.replica_stages``).

Calibration: the planner's cost model is never exact. Its compute per block is
corrected where it matters for the cuts, per block, by the measured stages
(``synapse.calibration.blocks``: the caller's ``plan_fn`` and prediction
come from the calibrated planner). What that leaves (framework overhead,
communication and waiting it does not model, ...) is one residual factor: KEEP
is measured, the others are predicted, so comparing them raw would compare two
different scales. We therefore ask the caller for the (calibrated) planner's
prediction of the partition that is running *now* (under the current
alphas/betas) and multiply every re-planned prediction by ``measured_step_s /
predicted_step_s`` of that partition. It is not the block factors again: the
prediction it divides by already holds them, so with a model that is right it
is 1. This assumes the remaining error is a common factor across partitions of
the same models, which is the best a single measurement can tell us.

Everything here is pure: numbers and dataclasses in, numbers and dataclasses
out. The partitioner enters as an injected ``plan_fn``; what a restart costs is
``synapse.decision.restart_cost``'s.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from synapse.partitioning import Placement

DeviceId = int


class EtaModelError(ValueError):
    """Bad input to the ETA model (the message names the value and the fix)."""


class OptionKind(str, Enum):
    KEEP = "keep"
    REPLAN = "replan"
    DEGRADE = "degrade"
    REPLACE = "replace"
    REBALANCE = "rebalance"  # replicas: the same devices and cuts, the batch shared out by speed
    SHRINK = "shrink"  # replicas: the bad device's replica re-cut over its survivors, its share rebalanced

    @classmethod
    def parse(cls, value: OptionKind | str) -> OptionKind:
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(k.value for k in cls)
            raise EtaModelError(f"unknown option kind {value!r}; valid kinds: {valid}") from None


RESTARTING_KINDS = (OptionKind.REPLAN, OptionKind.DEGRADE, OptionKind.REPLACE, OptionKind.REBALANCE,
                    OptionKind.SHRINK)
# Options that leave a device out, so that they survive its loss.
WITHOUT_A_DEVICE = (OptionKind.DEGRADE, OptionKind.REPLACE, OptionKind.SHRINK)


def check_seconds(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise EtaModelError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def check_positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise EtaModelError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_steps(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EtaModelError(f"{name} must be an integer >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class RunningPartition:
    """The placement running now, measured: what KEEP keeps and what calibrates the planner.

    ``predicted_step_s`` is the planner's cost model evaluated on *this*
    placement under the current alphas/betas (not the prediction made when it
    was planned); ``measured_step_s`` is the step time actually measured.
    """

    placement: Placement
    measured_step_s: float
    predicted_step_s: float

    def __post_init__(self) -> None:
        _check_placement(self.placement, "running partition")
        check_positive("measured_step_s", self.measured_step_s)
        check_positive("predicted_step_s", self.predicted_step_s)

    @property
    def devices(self) -> tuple[DeviceId, ...]:
        return self.placement.devices

    @property
    def calibration(self) -> float:
        """Factor that puts the planner's predictions on the measured scale (the residual of a
        block-calibrated planner; see ``synapse.decision.eta``)."""
        return self.measured_step_s / self.predicted_step_s


def _check_placement(placement: Placement, what: str) -> None:
    """What a placement must be to be priced here (``Placement`` checks the counts themselves)."""
    if not isinstance(placement, Placement):
        raise EtaModelError(f"{what}: needs a Placement, got {type(placement).__name__}")
    if len(set(placement.devices)) != len(placement.devices):
        raise EtaModelError(f"{what}: devices {placement.devices} contain duplicates")


@dataclass(frozen=True)
class Option:
    """One thing the run could do next: where it would run, and its predicted wall-time cost."""

    kind: OptionKind
    placement: Placement
    predicted_step_s: float
    restart_cost_s: float
    inputs: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OptionKind.parse(self.kind))
        _check_placement(self.placement, f"{self.kind.value} option")
        check_positive("predicted_step_s", self.predicted_step_s)
        check_seconds("restart_cost_s", self.restart_cost_s)
        if self.kind is OptionKind.KEEP and self.restart_cost_s != 0:
            raise EtaModelError(f"KEEP does not restart, so its restart_cost_s must be 0, got {self.restart_cost_s}")

    @property
    def devices(self) -> tuple[DeviceId, ...]:
        return self.placement.devices

    @property
    def teacher_counts(self) -> tuple[int, ...]:
        return self.placement.teacher_counts

    @property
    def student_counts(self) -> tuple[int, ...]:
        return self.placement.student_counts

    def eta_s(self, remaining_steps: int) -> float:
        """Seconds of wall time to finish the run if this option is taken now."""
        check_steps("remaining_steps", remaining_steps)
        return self.restart_cost_s + remaining_steps * self.predicted_step_s

    def to_dict(self, remaining_steps: int | None = None) -> dict[str, Any]:
        record = {
            "kind": self.kind.value,
            "devices": list(self.devices),
            "teacher_counts": list(self.teacher_counts),
            "student_counts": list(self.student_counts),
            **({"replica_stages": list(self.placement.replica_stages)} if self.placement.replica_stages else {}),
            "predicted_step_s": self.predicted_step_s,
            "restart_cost_s": self.restart_cost_s,
            "inputs": dict(self.inputs),
        }
        if remaining_steps is not None:
            record["eta_s"] = self.eta_s(remaining_steps)
        return record


# plan_fn(device_ids, alphas aligned with device_ids, betas as given)
#   -> (teacher_counts, student_counts, predicted_step_s)
PlanFn = Callable[
    [tuple[DeviceId, ...], tuple[float, ...], Any],
    tuple[Sequence[int], Sequence[int], float],
]

# A device that has never run (a spare) is assumed to run at nominal speed.
SPARE_DEFAULT_ALPHA = 1.0

# The node of a run-wide device id (``synapse.partitioning.NodeTopology.node_of``); None: the run is on one node.
NodeOf = Callable[[DeviceId], int]


def build_options(current: RunningPartition, alphas: Mapping[DeviceId, float], betas: Any,
                  bad_device: DeviceId | None, plan_fn: PlanFn, restart_costs: Mapping[OptionKind, float],
                  spare_devices: Sequence[DeviceId] = (), lost_devices: Sequence[DeviceId] = (),
                  node_of: NodeOf | None = None) -> list[Option]:
    """All options open to the run now: KEEP, REPLAN, DEGRADE (K > 1), REPLACE (spares).

    ``alphas`` maps device id -> slowdown factor (1.0 = nominal); it must cover
    the running devices, spares missing from it are assumed nominal.
    ``betas`` is passed through to ``plan_fn`` untouched: its shape belongs to
    the partitioner. ``bad_device`` is the failed or slowest device (None: the
    device with the largest alpha). Re-planned step predictions are multiplied
    by ``current.calibration`` (see module docstring). ``lost_devices``: devices gone with the bad
    one (a node lost with all its devices): DEGRADE drops them too, and no REPLACE is offered.
    ``node_of``: across nodes, each device's node (REPLACE keeps the launch's ranks node-ordered: ``_replacement``).
    """
    running_alphas = {d: _alpha_of(alphas, d, required=True) for d in current.devices}
    bad = _resolve_bad_device(current.devices, running_alphas, bad_device)
    spares = _check_spares(spare_devices, current.devices)
    options = [_keep_option(current)]
    candidates: list[tuple[OptionKind, tuple[DeviceId, ...], dict[str, Any]]] = [
        (OptionKind.REPLAN, current.devices, {})
    ]
    survivors = tuple(d for d in current.devices if d != bad and d not in lost_devices)
    if survivors:
        dropped = {"dropped_devices": [d for d in current.devices if d not in survivors]} if lost_devices else {}
        candidates.append((OptionKind.DEGRADE, survivors, {"dropped_device": bad, **dropped}))
    replacement = _replacement(current.devices, bad, spares, alphas, node_of, reorder=True)
    if replacement is not None and not lost_devices:
        spare, swapped = replacement
        candidates.append((OptionKind.REPLACE, swapped, {"replaced_device": bad, "spare_device": spare}))
    for kind, devices, extra in candidates:
        restart_s = _restart_seconds(restart_costs, kind)
        options.append(_replanned_option(kind, devices, current, alphas, betas, plan_fn, restart_s, extra))
    return options


class LayoutPricer(Protocol):
    """What ``replica_options`` needs of the planner (``synapse.partitioning.StagePlanner``)."""

    @property
    def step(self) -> Any:
        """Its StepSpec: ``microbatches`` per step."""

    def layout_cost(self, placement: Placement, alphas: Any = None, betas: Any = None) -> Any: ...

    def plan(self, devices: Sequence[int], alphas: Sequence[float], betas: Any = None
             ) -> tuple[tuple[int, ...], tuple[int, ...], float]: ...


def replica_options(current: RunningPartition, alphas: Mapping[DeviceId, float], betas: Any,
                    bad_device: DeviceId | None, pricer: LayoutPricer, restart_costs: Mapping[OptionKind, float],
                    spare_devices: Sequence[DeviceId] = (), lost_devices: Sequence[DeviceId] = (),
                    excluded: Collection[OptionKind] = (), node_of: NodeOf | None = None) -> list[Option]:
    """The options of a layout of R > 1 replicas: KEEP, REPLAN, DEGRADE (drop a replica), SHRINK (re-cut
    a replica over its survivors), REBALANCE and REPLACE, each priced by the planner's ``layout_cost`` at
    the current alphas (x the calibration). ``excluded``: kinds not to offer (one that fell short of its
    prediction in this slowdown). ``node_of``: as for ``build_options``."""
    running = current.placement
    running_alphas = {d: _alpha_of(alphas, d, required=True) for d in running.devices}
    bad = _resolve_bad_device(running.devices, running_alphas, bad_device)
    spares = _check_spares(spare_devices, running.devices)
    batch = sum(running.shares) if running.shares else None
    microbatches = int(pricer.step.microbatches)
    candidates: list[tuple[OptionKind, Placement, dict[str, Any]]] = []
    candidates.append((OptionKind.REPLAN, _replanned(running, running_alphas, pricer, betas), {}))
    gone = {running.replica_of(running.devices.index(d)) for d in (bad, *lost_devices) if d in running.devices}
    if batch is not None and len(gone) < running.replicas:
        survivors = running
        for replica in sorted(gone, reverse=True):  # highest first: the others keep their numbers
            survivors = survivors.without_replica(replica, batch, microbatches)
        candidates.append((OptionKind.DEGRADE, survivors, {"dropped_device": bad, "dropped_replicas": sorted(gone),
                                                           "dropped_devices": [d for d in running.devices
                                                                               if d not in survivors.devices]}))
    if batch is not None:  # every replica that lost a device keeps its survivors (None if one has none)
        shrunk = _shrunk(running, gone, {bad, *lost_devices}, pricer, alphas, betas, batch, microbatches)
        if shrunk is not None:
            candidates.append((OptionKind.SHRINK, shrunk, {
                "dropped_device": bad, "shrunk_replicas": sorted(gone), "shares": list(shrunk.shares),
                "dropped_devices": [d for d in running.devices if d not in shrunk.devices]}))
    if batch is not None and not lost_devices and OptionKind.REBALANCE not in excluded:
        rebalanced = _finish_together(running, pricer, alphas, betas, batch, microbatches)
        if rebalanced.shares != running.shares:
            candidates.append((OptionKind.REBALANCE, rebalanced, {"shares": list(rebalanced.shares)}))
    replacement = _replacement(running.devices, bad, spares, alphas, node_of, reorder=False)
    if replacement is not None and not lost_devices:
        spare, swapped = replacement
        candidates.append((OptionKind.REPLACE, running.on(swapped), {"replaced_device": bad, "spare_device": spare}))
    options = [_keep_option(current)]
    for kind, placement, extra in candidates:
        priced = {d: _alpha_of(alphas, d, required=False) for d in placement.devices}
        planner_step_s = float(pricer.layout_cost(placement, priced, betas).step_time_s)
        check_positive(f"{kind.value} option: predicted step", planner_step_s)
        options.append(Option(kind=kind, placement=placement, predicted_step_s=planner_step_s * current.calibration,
                              restart_cost_s=_restart_seconds(restart_costs, kind),
                              inputs={"alphas": [priced[d] for d in placement.devices],
                                      "planner_step_s": planner_step_s, "calibration": current.calibration,
                                      **extra}))
    return options


def _replanned(running: Placement, alphas: Mapping[DeviceId, float], pricer: LayoutPricer, betas: Any) -> Placement:
    """REPLAN: replicas cut alike are re-cut alike, for the slowest device of each stage across replicas
    (they finish a step together); replicas cut differently are each re-cut on their own devices."""
    if not running.cut_alike:
        pipelines = [Placement(p.devices, *pricer.plan(p.devices, tuple(alphas[d] for d in p.devices), betas)[:2])
                     for p in running.pipelines()]
        return Placement.of_pipelines(pipelines, running.shares)
    k = running.num_stages
    worst = [max(alphas[running.replica_devices(r)[stage]] for r in range(running.replicas)) for stage in range(k)]
    teacher, student, _ = pricer.plan(running.replica_devices(0), tuple(worst), betas)
    return Placement(running.devices, tuple(teacher), tuple(student), running.replicas, running.shares)


def _shrunk(running: Placement, replicas: Collection[int], lost: Collection[DeviceId], pricer: LayoutPricer,
            alphas: Mapping[DeviceId, float], betas: Any, batch: int, microbatches: int) -> Placement | None:
    """SHRINK: each of ``replicas`` that keeps a device re-cut over its devices not in ``lost`` (the
    planner's best cut of them at their alphas), those with none left dropped (a lost node may take one
    replica whole and part of another), then the shares at which all replicas finish a step together.
    None when no replica keeps a device (that is DEGRADE) or a pipeline of the survivors cannot be planned."""
    shrunk, emptied = running, []
    for replica in sorted(replicas):
        survivors = tuple(d for d in running.replica_devices(replica) if d not in lost)
        if not survivors:
            emptied.append(replica)
            continue
        teacher, student, _ = pricer.plan(survivors, tuple(_alpha_of(alphas, d, required=True) for d in survivors),
                                          betas)
        shrunk = shrunk.with_replica(replica, Placement(survivors, tuple(teacher), tuple(student)))
    if len(emptied) == len(replicas):
        return None
    for replica in sorted(emptied, reverse=True):  # from the last, so the indices still to drop stay valid
        shrunk = shrunk.without_replica(replica, batch, microbatches)
    if shrunk.replicas == 1:
        return shrunk  # one pipeline left: the whole batch is its share
    return _finish_together(shrunk, pricer, alphas, betas, batch, microbatches)


def _finish_together(running: Placement, pricer: LayoutPricer, alphas: Mapping[DeviceId, float], betas: Any,
                     batch: int, microbatches: int) -> Placement:
    """The shares that finish a step soonest on the same devices and cuts.

    First each replica's share in proportion to its speed now (images per second at its current share).
    That assumes a replica's time follows its share, which per-call costs do not (the planner prices a
    share at its own micro-batch when it has profiles at several sizes), so then one micro-batch's
    worth of images at a time moves from the replica that finishes last to the one where it shortens
    the priced step most, while the step gets shorter."""
    priced = {d: _alpha_of(alphas, d, required=True) for d in running.devices}
    best = running.shared_by_speed(pricer.layout_cost(running, priced, betas).replica_step_s, batch, microbatches)
    best_step = pricer.layout_cost(best, priced, betas)
    while True:
        steps = list(best_step.replica_step_s)
        slowest = steps.index(max(steps))
        if best.shares[slowest] <= microbatches:
            break
        moves = []
        for receiver in range(running.replicas):
            if receiver != slowest:
                shares = list(best.shares)
                shares[slowest] -= microbatches
                shares[receiver] += microbatches
                trial = dataclasses.replace(best, shares=tuple(shares))
                moves.append((pricer.layout_cost(trial, priced, betas), trial))
        trial_step, trial = min(moves, key=lambda move: move[0].step_time_s)
        if trial_step.step_time_s >= best_step.step_time_s:
            break
        best, best_step = trial, trial_step
    return best


def _replacement(devices: tuple[DeviceId, ...], bad: DeviceId, spares: Sequence[DeviceId],
                 alphas: Mapping[DeviceId, float], node_of: NodeOf | None, *, reorder: bool
                 ) -> tuple[DeviceId, tuple[DeviceId, ...]] | None:
    """REPLACE: the spare that takes ``bad``'s place and the devices after the swap; None when no spare fits.

    A launch across nodes numbers node 0's ranks first and rank r runs on devices[r]
    (``NodeTopology.check_node_ordered``), so a placement must list each node's devices together, nodes
    ascending. The spare: one on the bad device's own node first (its neighbours keep their links; the
    swap in place keeps node order), the fastest of them; else the fastest of another node's. With
    ``reorder`` (one pipeline: REPLACE re-plans its cuts, so the order of its devices is free) the swapped
    devices are put in node order, a stable sort (each node's devices keep their order; a spare of
    another node sits where the bad device was among its node's devices); without it (replicas keep their
    cuts, and with them each device's place) another node's spare is offered only where the swap in place
    is node-ordered. Ties: the first spare listed."""
    def node(device: DeviceId) -> int:
        return 0 if node_of is None else node_of(device)

    fitting = []
    for order, spare in enumerate(spares):
        swapped = tuple(spare if d == bad else d for d in devices)
        if reorder:
            swapped = tuple(sorted(swapped, key=node))
        nodes = [node(d) for d in swapped]
        if nodes == sorted(nodes):
            fitting.append(((node(spare) != node(bad), _alpha_of(alphas, spare, required=False), order),
                            spare, swapped))
    if not fitting:
        return None
    _, spare, swapped = min(fitting)
    return spare, swapped


def _alpha_of(alphas: Mapping[DeviceId, float], device: DeviceId, *, required: bool) -> float:
    if device not in alphas:
        if required:
            raise EtaModelError(f"alphas has no entry for running device {device!r}; got alphas for {sorted(alphas)}")
        return SPARE_DEFAULT_ALPHA
    return check_positive(f"alpha of device {device!r}", alphas[device])


def _resolve_bad_device(devices: tuple[DeviceId, ...], alphas: Mapping[DeviceId, float],
                        bad_device: DeviceId | None) -> DeviceId:
    if bad_device is None:
        return max(devices, key=lambda d: alphas[d])  # ties: the first listed
    if bad_device not in devices:
        raise EtaModelError(f"bad_device {bad_device!r} is not one of the running devices {devices}")
    return bad_device


def _check_spares(spares: Sequence[DeviceId], running: tuple[DeviceId, ...]) -> tuple[DeviceId, ...]:
    spares = tuple(spares)
    overlap = sorted(set(spares) & set(running))
    if overlap:
        raise EtaModelError(f"spare devices {overlap} are already running {running}; spares must be idle devices")
    if len(set(spares)) != len(spares):
        raise EtaModelError(f"spare_devices {spares} contain duplicates")
    return spares


def _restart_seconds(restart_costs: Mapping[OptionKind, float], kind: OptionKind) -> float:
    if kind not in restart_costs:
        raise EtaModelError(f"restart_costs has no entry for {kind.value!r}; pass RestartCostModel.costs_by_kind()")
    return check_seconds(f"restart cost of {kind.value}", restart_costs[kind])


def _keep_option(current: RunningPartition) -> Option:
    return Option(
        kind=OptionKind.KEEP,
        placement=current.placement,
        predicted_step_s=current.measured_step_s,
        restart_cost_s=0.0,
        inputs={"measured_step_s": current.measured_step_s, "planner_step_s": current.predicted_step_s},
    )


def _replanned_option(kind: OptionKind, devices: tuple[DeviceId, ...], current: RunningPartition,
                      alphas: Mapping[DeviceId, float], betas: Any, plan_fn: PlanFn, restart_s: float,
                      extra: dict[str, Any]) -> Option:
    device_alphas = tuple(_alpha_of(alphas, d, required=False) for d in devices)
    teacher, student, planner_step_s = plan_fn(devices, device_alphas, betas)
    teacher, student = tuple(teacher), tuple(student)
    _check_plan_output(kind, devices, teacher, student, planner_step_s, current)
    return Option(
        kind=kind,
        placement=Placement(devices, teacher, student),
        predicted_step_s=planner_step_s * current.calibration,
        restart_cost_s=restart_s,
        inputs={"alphas": list(device_alphas), "planner_step_s": planner_step_s,
                "calibration": current.calibration, **extra},
    )


def _check_plan_output(kind: OptionKind, devices: tuple[int, ...], teacher: tuple[int, ...], student: tuple[int, ...],
                       step_s: float, current: RunningPartition) -> None:
    what = f"plan_fn for {kind.value} on devices {devices}"
    if len(teacher) != len(devices) or len(student) != len(devices):
        raise EtaModelError(f"{what}: {len(devices)} devices but {len(teacher)} teacher counts {teacher} and "
                            f"{len(student)} student counts {student}; need one count per device")
    check_positive(f"{what}: predicted step", step_s)
    running = current.placement
    if sum(teacher) != sum(running.teacher_counts) or sum(student) != sum(running.student_counts):
        raise EtaModelError(
            f"{what} placed {sum(teacher)} teacher / {sum(student)} student blocks, but the running "
            f"partition has {sum(running.teacher_counts)} / {sum(running.student_counts)}; "
            "a re-plan must place every block exactly once"
        )
