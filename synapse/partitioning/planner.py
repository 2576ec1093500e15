"""The planner on device *ids*: the one object that plans the first placement and prices and plans
every re-plan, so both are made by the same cost model.

``DeviceFacts`` says what is known of every device (name, memory, link bandwidth, how many
ranks share its cores); ``StagePlanner`` adds the two block profiles and the step's shape, and
given device ids and their current alphas/betas predicts a placement's per-stage and step times
and plans a new one (the ``plan_fn`` of ``synapse.decision.eta.build_options``). Pure: built by
``synapse.planning.build_stage_planner`` from a config and measured profiles.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from synapse.partitioning.cost_model import CostModel, DeviceSpec, PlanCost, StepSpec
from synapse.partitioning.partitioner import PartitionPlan, plan_with_cost_model
from synapse.partitioning.pipelines import PipelinePrices, PipelineTerms
from synapse.partitioning.placement import Placement
from synapse.partitioning.profile import BYTES_PER_KB, ModelProfile, profile_at_micro_batch

# Each device's speed factor (alpha): by device id, or aligned with the stages; None, or a device
# missing from the mapping: 1.0. Its link factor (beta), by device id in the same way.
Alphas = Mapping[int, float] | Sequence[float] | None
Betas = Mapping[int, float] | None


def alphas_by_stage(devices: Sequence[int], alphas: Alphas) -> tuple[float, ...]:
    """Each stage's alpha: by device id from a mapping (missing: 1.0), or already aligned with the stages (a
    node's device id can repeat across nodes)."""
    if alphas is None or isinstance(alphas, Mapping):
        return tuple(float((alphas or {}).get(d, 1.0)) for d in devices)
    return tuple(float(a) for a in alphas)


@dataclass(frozen=True)
class DeviceFacts:
    """What the planner knows of every device besides its current speed."""

    device_name: Callable[[int], str] = "cpu:{}".format
    memory_bytes: Callable[[int], float] = lambda device: math.inf
    link_bandwidth_bytes_per_s: float = math.inf
    contention: float = 1.0  # >= 1: ranks of one node sharing its cores (see cost_model.cpu_contention)
    link_latency_s: float = 0.0  # per message (see cost_model.DeviceSpec)
    # Across nodes (partitioning/topology.py): which node a device is on, and the price of a stage
    # boundary whose two sides are on different nodes (charged to the sending stage, like every link).
    node_of: Callable[[int], int] = lambda device: 0
    cross_node_bandwidth_bytes_per_s: float = math.inf
    cross_node_latency_s: float = 0.0

    def specs(self, devices: Sequence[int], alphas: Alphas = None, betas: Betas = None) -> list[DeviceSpec]:
        """DeviceSpecs in pipeline order; alphas by device id (or aligned with ``devices``), missing: 1.0."""
        by_stage = alphas_by_stage(devices, alphas)
        betas = betas or {}
        return [DeviceSpec(self.device_name(d), alpha=alpha, beta=float(betas.get(d, 1.0)),
                           memory_bytes=self.memory_bytes(d), contention=self.contention,
                           **self._link_to_next(devices, stage))
                for stage, (d, alpha) in enumerate(zip(devices, by_stage))]

    def _link_to_next(self, devices: Sequence[int], stage: int) -> dict[str, float]:
        """The link stage ``stage`` sends over: the node's own, or the slower one between nodes."""
        crosses = stage + 1 < len(devices) and self.node_of(devices[stage]) != self.node_of(devices[stage + 1])
        if crosses:
            return {"link_bandwidth_bytes_per_s": min(self.link_bandwidth_bytes_per_s,
                                                      self.cross_node_bandwidth_bytes_per_s),
                    "link_latency_s": max(self.link_latency_s, self.cross_node_latency_s)}
        return {"link_bandwidth_bytes_per_s": self.link_bandwidth_bytes_per_s, "link_latency_s": self.link_latency_s}

    def node_boundaries(self, devices: Sequence[int]) -> list[int]:
        """The stages whose link to the next stage crosses nodes."""
        return [r for r in range(len(devices) - 1) if self.node_of(devices[r]) != self.node_of(devices[r + 1])]


def ring_allreduce_s(nbytes: float, replicas: int, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """A ring all-reduce of ``nbytes`` over ``replicas`` ranks: each sends and receives
    2 (R - 1) / R of the bytes in 2 (R - 1) rounds (reduce-scatter, then all-gather)."""
    if replicas <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (replicas - 1) / replicas * nbytes / bandwidth_bytes_per_s + 2 * (replicas - 1) * latency_s


@dataclass(frozen=True)
class LayoutCost:
    """One optimizer step of an R x K placement: per global rank (replica-major, as ``Placement.devices``)
    and for the whole step. Each replica's pipeline is priced on its own devices at its share of the
    batch; replicas wait for the slowest, then average the student's gradients (``allreduce_s``)."""

    compute_s: tuple[float, ...]
    comm_s: tuple[float, ...]
    transfer_s: tuple[float, ...]  # link time for the bytes alone (what beta scales)
    replica_step_s: tuple[float, ...]
    allreduce_s: float

    @property
    def step_time_s(self) -> float:
        return max(self.replica_step_s) + self.allreduce_s


@dataclass(frozen=True, eq=False)  # hashed by identity: the plan cache is per planner
class StagePlanner:
    teacher: ModelProfile
    student: ModelProfile
    step: StepSpec
    facts: DeviceFacts = DeviceFacts()
    # The profiles' micro-batch is the global batch over replicas x micro-batches: a planner built for
    # R replicas prices a replica holding another share (after a replica left) by scaling its times.
    replicas: int = 1
    # The raw (teacher, student) profiles measured at several micro-batch sizes, the profiled one among
    # them: a replica whose share changes is priced at its new micro-batch from these
    # (``profile_at_micro_batch``), not by scaling its time with its share. Empty: scaled.
    size_profiles: tuple[tuple[ModelProfile, ModelProfile], ...] = ()

    def specs(self, devices: Sequence[int], alphas: Alphas = None, betas: Betas = None) -> list[DeviceSpec]:
        return self.facts.specs(devices, alphas, betas)

    def with_profiles(self, teacher: ModelProfile, student: ModelProfile) -> StagePlanner:
        """The same planner on other block profiles (a new plan cache): `BlockCalibration.calibrated`
        gives it the run's measured corrections, so its cuts, and not only its step times, follow them."""
        return dataclasses.replace(self, teacher=teacher, student=student)

    def full_plan(self, devices: Sequence[int], alphas: Alphas = None, betas: Betas = None) -> PartitionPlan:
        """The best placement on ``devices`` with every prediction of the cost model (the first plan)."""
        return plan_with_cost_model(self.cost_model(devices, alphas, betas))

    def cost_model(self, devices: Sequence[int], alphas: Alphas = None, betas: Betas = None) -> CostModel:
        return CostModel(self.teacher, self.student, self.specs(devices, alphas, betas), self.step)

    def predict(self, devices: Sequence[int], teacher_counts: Sequence[int], student_counts: Sequence[int],
                alphas: Alphas = None, betas: Betas = None) -> PlanCost:
        """Per micro-batch stage times and the step time of a given partition."""
        devices = tuple(devices)
        by_stage = alphas_by_stage(devices, alphas)
        betas_by_stage = tuple(float((betas or {}).get(d, 1.0)) for d in devices)
        return self._evaluate(devices, by_stage, betas_by_stage, tuple(teacher_counts), tuple(student_counts))

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - per planner; a prediction is a pure function of its inputs
    def _evaluate(self, devices: tuple[int, ...], alphas: tuple[float, ...], betas: tuple[float, ...],
                  teacher_counts: tuple[int, ...], student_counts: tuple[int, ...]) -> PlanCost:
        """The cost model's prediction, kept: the controller prices every replica of every option each
        step of a slowdown, mostly on factors it priced the step before (64 replicas: 128 cost models a
        layout, most of a simulated step's time before this cache). Keyed by the devices and their
        factors, which give the specs (the facts are the planner's): building the specs only to look the
        prediction up took more time than the hits saved."""
        specs = self.specs(devices, alphas, dict(zip(devices, betas)))
        return CostModel(self.teacher, self.student, specs, self.step).evaluate(teacher_counts, student_counts)

    @functools.cached_property
    def _bytes_only(self) -> StagePlanner:
        """This planner with no per-message latency: the link time of the bytes alone (what beta scales)."""
        return dataclasses.replace(self, facts=dataclasses.replace(self.facts, link_latency_s=0.0))

    def per_step_compute_s(self, devices: Sequence[int], teacher_counts: Sequence[int],
                           student_counts: Sequence[int]) -> list[float]:
        """Each rank's compute in one optimizer step at nominal speed (M micro-batches)."""
        cost = self.predict(devices, teacher_counts, student_counts)
        return [self.step.microbatches * c for c in cost.stage_compute_s]

    def per_step_comm_s(self, devices: Sequence[int], teacher_counts: Sequence[int],
                        student_counts: Sequence[int]) -> list[float]:
        cost = self.predict(devices, teacher_counts, student_counts)
        return [self.step.microbatches * c for c in cost.stage_comm_s]

    def per_step_transfer_s(self, devices: Sequence[int], teacher_counts: Sequence[int],
                            student_counts: Sequence[int]) -> list[float]:
        """Each rank's link time in one step for the bytes it carries alone (no per-message latency):
        what beta scales, and what the estimator measures a link's own send excess against."""
        return self._bytes_only.per_step_comm_s(devices, teacher_counts, student_counts)

    def layout_cost(self, placement: Placement, alphas: Alphas = None, betas: Betas = None) -> LayoutCost:
        """Every rank's and the step's predicted time on ``placement`` (R = 1: one pipeline, as ``predict``).

        ``alphas``: by device id, or aligned with ``placement.devices`` (every rank's). The replicas cut
        alike (all of an R x K mesh; all but the re-cut ones of a SHRINK's layout) are priced at once from
        terms kept per devices and cut (``partitioning.pipelines``), with the same numbers as
        ``layout_cost_by_replica``; factors the cost model refuses take that path, for its error."""
        by_rank = self._factor_rows(placement, alphas, betas)
        if by_rank is None:
            return self.layout_cost_by_replica(placement, alphas, betas)
        alpha_of_rank, beta_of_rank = by_rank
        scales = self.share_scales(placement)
        if placement.cut_alike:  # one group: the (R, K) grids are the ranks in order
            grid = (placement.replicas, placement.num_stages)
            key = (placement.devices, placement.teacher_counts, placement.student_counts, placement.replicas)
            compute_s, comm_s, transfer_s, step_s = self._cut_alike_cost(
                key, alpha_of_rank.reshape(grid), beta_of_rank.reshape(grid), scales)
            return LayoutCost(tuple(compute_s.ravel().tolist()), tuple(comm_s.ravel().tolist()),
                              tuple(transfer_s.ravel().tolist()), tuple(step_s.tolist()),
                              self.allreduce_s(placement, betas))
        compute: list[float] = [0.0] * placement.world_size
        comm, transfer, replica_steps = list(compute), list(compute), [0.0] * placement.replicas
        for cut, replicas in _replicas_by_cut(placement).items():
            ranks = [placement.replica_ranks(r) for r in replicas]
            devices = tuple(d for r in ranks for d in placement.devices[r.start:r.stop])
            grid = (len(replicas), len(cut[0]))
            alpha_grid = np.concatenate([alpha_of_rank[r.start:r.stop] for r in ranks]).reshape(grid)
            beta_grid = np.concatenate([beta_of_rank[r.start:r.stop] for r in ranks]).reshape(grid)
            priced = self._cut_alike_cost((devices, *cut, len(replicas)), alpha_grid, beta_grid,
                                          [scales[r] for r in replicas])
            for replica, rank_range, *rows in zip(replicas, ranks, *priced):
                compute[rank_range.start:rank_range.stop] = rows[0].tolist()
                comm[rank_range.start:rank_range.stop] = rows[1].tolist()
                transfer[rank_range.start:rank_range.stop] = rows[2].tolist()
                replica_steps[replica] = float(rows[3])
        return LayoutCost(tuple(compute), tuple(comm), tuple(transfer), tuple(replica_steps),
                          self.allreduce_s(placement, betas))

    def _cut_alike_cost(self, key: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int],
                        alpha_grid: np.ndarray, beta_grid: np.ndarray, scales: Sequence[float]
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Replicas cut alike (``key``: their devices, the one cut, how many) at their (R, K) factors and
        shares: per rank (R, K) compute, comm and bytes-alone link time in a step, per replica its step."""
        cost = self._pipelines(*key).price(alpha_grid, beta_grid)
        own = self._bytes_only._pipelines(*key).link_s(beta_grid)
        compute_scales, comm_scales, step_scales = self._share_responses(key, alpha_grid, beta_grid, scales)
        m = self.step.microbatches
        by_replica = np.array(scales)[:, None]
        return (compute_scales * m * cost.compute_s, comm_scales * m * cost.comm_s,
                by_replica * m * own,  # bytes: exactly in proportion to the images
                step_scales * cost.step_s)

    def layout_cost_by_replica(self, placement: Placement, alphas: Alphas = None, betas: Betas = None) -> LayoutCost:
        """``layout_cost`` the plain way: a cost model per replica's pipeline (``predict``). The reference
        the fast path is tested against, and the path that raises the cost model's error on bad factors."""
        if alphas is not None and not isinstance(alphas, Mapping):
            alphas = list(alphas)
        compute: list[float] = []
        comm: list[float] = []
        transfer: list[float] = []
        replica_steps = []
        bytes_only = self._bytes_only
        m = self.step.microbatches
        for replica, scale in enumerate(self.share_scales(placement)):
            # the replica's devices and cut, not a Placement of its own: validating one per replica per
            # priced trial was a tenth of a simulated SHRINK's share search
            devices, ranks = placement.replica_devices(replica), placement.replica_ranks(replica)
            teacher_counts, student_counts = placement.replica_cut(replica)
            mine: Alphas = (alphas if alphas is None or isinstance(alphas, Mapping)
                            else alphas[ranks.start:ranks.stop])
            cost = self.predict(devices, teacher_counts, student_counts, mine, betas)
            own = bytes_only.predict(devices, teacher_counts, student_counts, mine, betas)
            compute_scales, comm_scales, step_scale = self.share_response(teacher_counts, student_counts, devices,
                                                                          mine, betas, scale)
            compute += [f * m * c for f, c in zip(compute_scales, cost.stage_compute_s)]
            comm += [f * m * c for f, c in zip(comm_scales, cost.stage_comm_s)]
            transfer += [scale * m * c for c in own.stage_comm_s]  # bytes: exactly in proportion to the images
            replica_steps.append(step_scale * cost.step_time_s)
        return LayoutCost(tuple(compute), tuple(comm), tuple(transfer), tuple(replica_steps),
                          self.allreduce_s(placement, betas))

    def _factor_rows(self, placement: Placement, alphas: Alphas, betas: Betas
                     ) -> tuple[np.ndarray, np.ndarray] | None:
        """Every rank's alpha and beta (arrays, an entry a rank), read as ``specs`` reads them; None when
        one is not finite and positive (the cost model's error is then raised by the plain path) or an
        aligned sequence does not give every rank one."""
        devices = placement.devices
        if alphas is None or isinstance(alphas, Mapping):
            by_rank = [float((alphas or {}).get(d, 1.0)) for d in devices]
        else:
            by_rank = [float(a) for a in alphas]
            if len(by_rank) != len(devices):
                return None
        factors = np.array([by_rank, [float((betas or {}).get(d, 1.0)) for d in devices]])
        if not bool(np.all(np.isfinite(factors) & (factors > 0))):
            return None
        return factors[0], factors[1]

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - per planner; a run meets a few placements, a REBALANCE many shares
    def _pipelines(self, devices: tuple[int, ...], teacher_counts: tuple[int, ...], student_counts: tuple[int, ...],
                   replicas: int) -> PipelineTerms:
        """The factor-free terms of every replica's pipeline (shares do not enter: they scale the prices)."""
        k = len(devices) // replicas
        specs = [self.specs(devices[r * k:(r + 1) * k]) for r in range(replicas)]
        return PipelineTerms.of(self.teacher, self.student, self.step, specs, teacher_counts, student_counts)

    def _share_responses(self, key: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int],
                         alphas: np.ndarray, betas: np.ndarray, scales: Sequence[float]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``share_response`` of every replica at once ((R, K) compute and comm scales, (R,) step scales):
        each share that is not the profiled one priced on the profiles at its own micro-batch."""
        by_replica = np.array(scales)
        compute = np.repeat(by_replica[:, None], alphas.shape[1], axis=1)
        comm, step = compute.copy(), by_replica.copy()
        profiled = self.student.micro_batch
        if not self.size_profiles or profiled is None:
            return compute, comm, step
        before: PipelinePrices | None = None
        for scale in sorted(set(scales) - {1.0}):
            rows = by_replica == scale
            if before is None:
                before = self._at_micro_batch(float(profiled))._pipelines(*key).price(alphas, betas)
            at_share = self._at_micro_batch(round(profiled * scale, 6))._pipelines(*key)
            after = at_share.price(alphas[rows], betas[rows], rows)
            compute[rows] = _ratios(after.compute_s, before.compute_s[rows], scale)
            comm[rows] = _ratios(after.comm_s, before.comm_s[rows], scale)
            step[rows] = _ratios(after.step_s, before.step_s[rows], scale)
        return compute, comm, step

    def share_response(self, teacher_counts: Sequence[int], student_counts: Sequence[int], devices: Sequence[int],
                       alphas: Alphas, betas: Betas, scale: float) -> tuple[list[float], list[float], float]:
        """How a replica's per-stage compute, per-stage communication and step time change when it holds
        ``scale`` times the images the profiles were measured at: the ratio of the raw profiles'
        predictions at the two micro-batch sizes on its devices and cuts (``size_profiles``), so that
        per-call costs that do not shrink with the share are kept; without them, ``scale`` itself.
        A ratio, not the raw prediction: the planner's own profiles may be calibrated by what the
        running stages measured, and that correction applies at either size."""
        k = len(devices)
        profiled = self.student.micro_batch
        if scale == 1.0 or not self.size_profiles or profiled is None:
            return [scale] * k, [scale] * k, scale
        before = self._at_micro_batch(float(profiled)).predict(devices, teacher_counts, student_counts, alphas, betas)
        after = self._at_micro_batch(round(profiled * scale, 6)).predict(devices, teacher_counts, student_counts,
                                                                         alphas, betas)
        return ([_ratio(a, b, scale) for a, b in zip(after.stage_compute_s, before.stage_compute_s)],
                [_ratio(a, b, scale) for a, b in zip(after.stage_comm_s, before.stage_comm_s)],
                _ratio(after.step_time_s, before.step_time_s, scale))

    @functools.lru_cache(maxsize=64)  # noqa: B019 - per planner; a few share sizes a run
    def _at_micro_batch(self, micro_batch: float) -> StagePlanner:
        """This planner on the raw profiles at ``micro_batch`` images (read off ``size_profiles``)."""
        teacher = profile_at_micro_batch([t for t, _ in self.size_profiles], micro_batch)
        student = profile_at_micro_batch([s for _, s in self.size_profiles], micro_batch)
        return dataclasses.replace(self, teacher=teacher, student=student, size_profiles=())

    def share_scales(self, placement: Placement) -> list[float]:
        """Each replica's images per step relative to what the profiles price (the global batch over
        this planner's replicas): 1.0 for every replica of the layout the planner was built for."""
        if placement.shares:
            total = sum(placement.shares)
            return [share * self.replicas / total for share in placement.shares]
        return [self.replicas / placement.replicas] * placement.replicas

    def allreduce_s(self, placement: Placement, betas: Betas = None) -> float:
        """The student gradients' all-reduce across replicas, one per set of ranks that own the same
        blocks (``Placement.student_groups``; with every replica cut alike, a stage's ranks): the groups
        reduce at the same time, a rank in several (a replica cut into fewer stages) one after another,
        so the step waits for the rank with the most (each over the slowest link of its group: between
        nodes when its owners are on different nodes).

        ``betas`` (by device id) scale the bytes' time as they scale a pipeline link's: a ring moves at
        the pace of its slowest link, so a group's transfer takes its slowest member's beta."""
        if placement.replicas == 1:
            return 0.0
        rings, full_speed_s = self._allreduce_rings(placement.devices, placement.teacher_counts,
                                                    placement.student_counts, placement.replicas,
                                                    placement.replica_stages)
        slow = {d: float(b) for d, b in (betas or {}).items() if float(b) != 1.0}
        return _slowest_rank_s(rings, slow) if slow else full_speed_s

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - per planner; a REBALANCE's trials and a decision's
    def _allreduce_rings(self, devices: tuple[int, ...], teacher_counts: tuple[int, ...],  # options repeat cuts
                         student_counts: tuple[int, ...], replicas: int, replica_stages: tuple[int, ...]
                         ) -> tuple[tuple[_Ring, ...], float]:
        """The rings of a placement's devices and cut, and their wait with every link at full speed (shares
        and factors do not enter): the student groups of a 64-rank layout take thousands of Python steps to
        find, and the controller asks every option every step."""
        placement = Placement(devices, teacher_counts, student_counts, replicas, (), replica_stages)
        grad_bytes = self.student.column("parameter_size_kb") * BYTES_PER_KB
        rings = []
        for owners, blocks in placement.student_groups():
            members = tuple(placement.devices[r] for r in owners)
            crosses = len({self.facts.node_of(d) for d in members}) > 1
            bandwidth = (min(self.facts.link_bandwidth_bytes_per_s, self.facts.cross_node_bandwidth_bytes_per_s)
                         if crosses else self.facts.link_bandwidth_bytes_per_s)
            latency = max(self.facts.link_latency_s, self.facts.cross_node_latency_s) if crosses \
                else self.facts.link_latency_s
            rings.append(_Ring(members, float(grad_bytes[blocks.start:blocks.stop].sum()), bandwidth, latency))
        return tuple(rings), _slowest_rank_s(rings, {})

    def plan(self, devices: Sequence[int], alphas: Sequence[float], betas: Betas = None
             ) -> tuple[tuple[int, ...], tuple[int, ...], float]:
        """``plan_fn`` of ``build_options``: the best partition of ``devices`` and its step time.

        Factors are rounded to 1% first: estimates move a little every step, and a plan for
        alphas 1% apart is the same plan, so it is computed once and reused (the controller
        may ask every step, and a K=8 plan of a 57-block student takes tens of ms)."""
        rounded_alphas = tuple(round(float(a), 2) for a in alphas)
        rounded_betas = tuple(sorted((d, round(float(b), 2)) for d, b in (betas or {}).items()))
        return self._plan_cached(tuple(devices), rounded_alphas, rounded_betas)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - planners live as long as the run; at most 256 plans are kept
    def _plan_cached(self, devices: tuple[int, ...], alphas: tuple[float, ...], betas: tuple[tuple[int, float], ...]
                     ) -> tuple[tuple[int, ...], tuple[int, ...], float]:
        plan = plan_with_cost_model(self.cost_model(devices, alphas, dict(betas)))
        return plan.teacher_counts, plan.student_counts, plan.step_time_s


@dataclass(frozen=True)
class _Ring:
    """One group's all-reduce of a cut: its devices, the bytes of the student blocks they share, and the
    link it runs over (between nodes when its devices are on several)."""

    devices: tuple[int, ...]
    nbytes: float
    bandwidth_bytes_per_s: float
    latency_s: float

    def seconds(self, beta: float = 1.0) -> float:
        return ring_allreduce_s(self.nbytes, len(self.devices), self.bandwidth_bytes_per_s / beta, self.latency_s)


def _slowest_rank_s(rings: Sequence[_Ring], betas: Mapping[int, float]) -> float:
    """The step's wait for its all-reduces: the rings reduce at once, a device in several one after the
    other; each ring at its slowest member's beta."""
    by_device: dict[int, float] = {}
    for ring in rings:
        seconds = ring.seconds(max((betas.get(d, 1.0) for d in ring.devices), default=1.0) if betas else 1.0)
        for device in ring.devices:
            by_device[device] = by_device.get(device, 0.0) + seconds
    return max(by_device.values(), default=0.0)


def _ratios(after: np.ndarray, before: np.ndarray, scale: float) -> np.ndarray:
    """``_ratio`` of arrays, element by element (the same comparisons, the same quotient)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bounded = np.minimum(np.maximum(after / before, min(scale, 1.0)), max(scale, 1.0))
    ratios: np.ndarray = np.where(before <= 0, scale, bounded)
    return ratios


def _ratio(after: float, before: float, scale: float) -> float:
    """after / before, within what ``scale`` times the images can do: more images never take less time,
    and never more than in proportion (per-call costs only make a pass cheaper per image), nor fewer
    images more time or less than in proportion. Profiles measured on a loaded machine break both
    (the demo's teacher at 16 images measured 11.8 ms and 814 ms minutes apart); ``scale`` where
    nothing was priced before (a stage without links)."""
    if before <= 0:
        return scale
    return min(max(after / before, min(scale, 1.0)), max(scale, 1.0))


def _replicas_by_cut(placement: Placement) -> dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]]:
    """The replicas of each (teacher, student) cut, in replica order: one group for an R x K mesh."""
    groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for replica in range(placement.replicas):
        groups.setdefault(placement.replica_cut(replica), []).append(replica)
    return groups
