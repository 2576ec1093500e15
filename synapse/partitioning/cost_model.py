"""Predicted time and memory of a teacher+student pipeline partition.

Stage r (on device r) holds teacher blocks [a_r, a_{r+1}) and student blocks
[b_r, b_{r+1}). Per micro-batch, in seconds::

    compute_r  = c_r * alpha_r * (teacher fwd + student fwd + student bwd of its blocks [+ loss_s if last])
    overhead_r = c_r * per_microbatch_overhead_s
    comm_r     = beta_r * (teacher_out(a_{r+1}) + 2 * student_out(b_{r+1})) / link_bandwidth_r
                 + MESSAGES_PER_MICROBATCH * link_latency_r
    t_r        = compute_r + overhead_r + comm_r      (comm_{K-1} = 0: the KD loss is local)

Both nets share the device, so their times add. Stage r sends the teacher and
student boundary activations forward and receives the student gradient (same
size as the student activation) back; that traffic, three messages, is charged
to the sender r, serially with compute (no overlap: a conservative bound). beta_r
is a slower link in the sense of bandwidth (fewer bytes per second): it prices the
bytes at the cut, so a re-plan under a slow link moves the cut to where the
activations are small; the per-message latency is the link's, unscaled.

The terms that matter on CPU (all default to "absent", which is the GPU model):

* ``c_r = DeviceSpec.contention`` >= 1: the device shares its cores with other
  ranks (K ranks of `threads` threads on fewer cores), so everything it computes
  takes c_r times longer; ``cpu_contention`` gives the fair-share value.
* ``StepSpec.per_microbatch_overhead_s``: host time every stage spends per
  micro-batch outside its blocks (schedule bookkeeping, posting the P2P ops,
  input copies). It is host work, so contention scales it; alpha does not.
* ``StepSpec.loss_s``: the KD loss per micro-batch, computed on the last stage.
* ``DeviceSpec.link_latency_s``: fixed cost per message (gloo over loopback:
  tens of microseconds; measured by experiments/bench_gloo_p2p.py).

`TermCalibration` (`synapse.calibration.cost_fit`) measures the per-step terms on a
K = 1 run.

Step time of GPipe and 1F1B with heterogeneous stages (M micro-batches)::

    step = sum_r t_r + (M - 1) * max_r t_r + optimizer_step_s

(fill/drain through every stage once, then M - 1 micro-batches paced by the
slowest stage). The optimizer step is a fixed per-step time (default 0): for SGD
on ResNet-152 it is well under 1% of a step, and `Calibration.overhead_s`
(`synapse.calibration.cost_fit`) absorbs it together with the rest of the per-step overhead.

Memory of stage r, in bytes::

    teacher params + student params * (1 + 1 [grads] + optimizer_state_multiplier)
    + in_flight_r * (student accum activations + teacher boundary activation)

in_flight_r = M for GPipe, min(K - r, M) for 1F1B. The teacher runs under
no_grad, so of it only the output activation at its cut is held per micro-batch.

Stage times and memory are computed by one canonical expression each
(`stage_time_s`, `stage_memory_bytes`), shared by the partitioner and by
`evaluate`, so the two agree bit for bit. Both are non-increasing in the start
indices (a_r, b_r), which the partitioner's binary searches rely on: every new
term is a per-stage constant or a non-negative multiple of the block prefix sums.

What the model is told: the devices (``DeviceSpec``) and the step (``StepSpec``,
``Schedule``), plain validated facts the callers build from the config and from measured
terms; ``cpu_contention`` (the fair-share slowdown of CPU ranks sharing cores); and its one
error type, ``CostModelError``, with ``require``, the check that raises it. Pure.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from synapse.partitioning.profile import BYTES_PER_KB, ModelProfile

# Optimizer state per byte of student parameters.
OPTIMIZER_STATE_MULTIPLIERS = {"sgd": 0.0, "sgd_momentum": 1.0, "adamw": 2.0}


class CostModelError(ValueError):
    """Invalid device, schedule or calibration input."""


class Schedule(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"

    @classmethod
    def parse(cls, value: Schedule | str) -> Schedule:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(s.value for s in cls)
            raise CostModelError(f"unknown schedule {value!r}; use one of: {allowed}") from None


def require(condition: bool, message: str) -> None:
    """Raise ``CostModelError(message)`` unless ``condition``: every input check of the cost model."""
    if not condition:
        raise CostModelError(message)


@dataclass(frozen=True)
class DeviceSpec:
    """One pipeline device. alpha/beta: compute/comm slowdown (1.0 = as profiled).

    memory_bytes = inf means unconstrained; link_bandwidth_bytes_per_s = inf and
    link_latency_s = 0 mean free communication to the next device. contention >= 1:
    how much slower everything this device computes runs because it shares its cores
    with other ranks (1.0: the cores are its own; see `cpu_contention`).
    """

    name: str
    alpha: float = 1.0
    beta: float = 1.0
    memory_bytes: float = math.inf
    link_bandwidth_bytes_per_s: float = math.inf
    contention: float = 1.0
    link_latency_s: float = 0.0

    def __post_init__(self) -> None:
        require(bool(self.name), "DeviceSpec.name is empty; name devices e.g. 'cuda:0'")
        for field in ("alpha", "beta"):
            value = getattr(self, field)
            require(math.isfinite(value) and value > 0,
                    f"device {self.name!r}: {field}={value!r} must be finite and > 0 (1.0 = as profiled)")
        for field in ("memory_bytes", "link_bandwidth_bytes_per_s"):
            value = getattr(self, field)
            require(not math.isnan(value) and value > 0,
                    f"device {self.name!r}: {field}={value!r} must be > 0 (inf = unlimited)")
        require(math.isfinite(self.contention) and self.contention >= 1.0,
                f"device {self.name!r}: contention={self.contention!r} must be finite and >= 1 "
                f"(1.0 = cores of its own; ranks * threads / cores when they share)")
        require(math.isfinite(self.link_latency_s) and self.link_latency_s >= 0,
                f"device {self.name!r}: link_latency_s={self.link_latency_s!r} must be >= 0 seconds per message")


def cpu_contention(ranks: int, threads_per_rank: int, cores: int) -> float:
    """Fair-share slowdown of each of `ranks` CPU processes of `threads_per_rank` threads on `cores` cores.

    When the ranks want more threads than there are cores, the scheduler time-slices
    them: each runs ranks * threads / cores times slower than alone; otherwise 1.
    """
    for name, value in (("ranks", ranks), ("threads_per_rank", threads_per_rank), ("cores", cores)):
        require(isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1,
                f"cpu_contention: {name}={value!r} must be an integer >= 1")
    return max(1.0, ranks * threads_per_rank / cores)


@dataclass(frozen=True)
class StepSpec:
    """What one optimizer step looks like, as far as cost is concerned."""

    microbatches: int
    schedule: Schedule = Schedule.ONE_F_ONE_B
    optimizer_state_multiplier: float = OPTIMIZER_STATE_MULTIPLIERS["sgd_momentum"]
    optimizer_step_s: float = 0.0
    per_microbatch_overhead_s: float = 0.0  # host time per micro-batch on every stage, outside the blocks
    loss_s: float = 0.0  # KD loss per micro-batch on the last stage, profile seconds

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", Schedule.parse(self.schedule))
        m = self.microbatches
        require(isinstance(m, numbers.Integral) and not isinstance(m, bool) and m >= 1,
                f"microbatches={m!r} must be an integer >= 1")
        object.__setattr__(self, "microbatches", int(m))
        multiplier = self.optimizer_state_multiplier
        require(math.isfinite(multiplier) and multiplier >= 0,
                f"optimizer_state_multiplier={multiplier!r} must be >= 0 (SGD 0, momentum 1, AdamW 2)")
        for field in ("optimizer_step_s", "per_microbatch_overhead_s", "loss_s"):
            value = getattr(self, field)
            require(math.isfinite(value) and value >= 0, f"{field}={value!r} must be >= 0 seconds")


MS_TO_S = 1e-3
# A cut (a block index), or an array of cuts: the partitioner's search evaluates whole grids of cuts
# at once, and the stage terms below then return arrays of the cuts' broadcast shape. (numpy's stubs
# type indexing by such cuts, and arithmetic on the result, as Any: the terms' annotated locals say
# what comes back.)
Cuts = int | np.ndarray
# Per micro-batch, stage r sends the teacher and the student activation and receives the student gradient.
MESSAGES_PER_MICROBATCH = 3


@dataclass(frozen=True)
class PlanCost:
    """Predicted per-stage and per-step cost of one partition (seconds, bytes)."""

    stage_compute_s: tuple[float, ...]
    stage_comm_s: tuple[float, ...]
    stage_times_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    step_time_s: float
    stage_overhead_s: tuple[float, ...] = ()  # per micro-batch; stage time = compute + overhead + comm


# The canonical expressions of a stage's time, on scalars or on arrays alike (the cost model's tables and
# the planner's all-replica pricing, ``partitioning.pipelines``, both go through them, so the two agree
# bit for bit: the same IEEE operations in the same order).
def link_time_s(beta: Any, cut_bytes: Any, bandwidth_bytes_per_s: Any, link_latency_s: Any) -> Any:
    """Per-micro-batch link time of a stage sending ``cut_bytes`` (its messages' latency included)."""
    return beta * cut_bytes / bandwidth_bytes_per_s + MESSAGES_PER_MICROBATCH * link_latency_s


def overhead_time_s(contention: Any, per_microbatch_overhead_s: float) -> Any:
    """Per-micro-batch host time outside the blocks (grows with contention, not alpha)."""
    return contention * per_microbatch_overhead_s


def fixed_time_s(compute_scale: Any, loss_s: Any, overhead_s: Any) -> Any:
    """The part of a stage time that does not depend on its blocks: the loss (last stage) and overhead."""
    return compute_scale * loss_s + overhead_s


def stage_time_of(compute_scale: Any, work_s: Any, fixed_s: Any, comm_s: Any) -> Any:
    """A stage's per-micro-batch time from its block work (profile seconds) and the parts above."""
    return compute_scale * work_s + fixed_s + comm_s


def pipeline_step_time_s(step: StepSpec, stage_times_s: Sequence[float]) -> float:
    """GPipe / 1F1B: fill and drain through every stage once, then M - 1 micro-batches at the slowest."""
    waiting = (step.microbatches - 1) * max(stage_times_s)
    return math.fsum(stage_times_s) + waiting + step.optimizer_step_s


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))


def _shifted(values: np.ndarray) -> np.ndarray:
    """Index k -> value of block k-1 (the block just before cut k); 0 at k = 0."""
    return np.concatenate(([0.0], values))


class _ProfileTables:
    """What a `CostModel` derives from its two profiles, the step and the number of stages alone, kept
    for the next cost model on them: the planner builds one per priced pipeline and per partition search
    (thousands in a simulated slowdown), and these tables were most of that. The same numpy expressions
    on the same inputs, so every cost model reads exactly the numbers it computed before; read-only, as
    they are shared. Keyed by the profiles' identity (the objects are kept, so an id is never reused)."""

    _kept: dict[tuple[int, int, StepSpec, int], _ProfileTables] = {}
    _KEEP = 64  # profile pairs x stage counts; a run meets a few (calibrated profiles, share sizes)

    def __init__(self, teacher: ModelProfile, student: ModelProfile, step: StepSpec, num_stages: int):
        self.teacher, self.student = teacher, student
        self.teacher_fwd_prefix_s = _prefix(teacher.column("forward_time_ms") * MS_TO_S)
        student_work = student.column("forward_time_ms") + student.column("backward_time_ms")
        self.student_work_prefix_s = _prefix(student_work * MS_TO_S)
        self.teacher_param_prefix_bytes = _prefix(teacher.column("parameter_size_kb") * BYTES_PER_KB)
        self.teacher_out_bytes = _shifted(teacher.column("output_activation_size_kb") * BYTES_PER_KB)
        self.student_out_bytes = _shifted(student.column("output_activation_size_kb") * BYTES_PER_KB)
        self.cut_bytes = (self.teacher_out_bytes[np.arange(len(teacher) + 1)[:, None]]
                          + 2.0 * self.student_out_bytes[np.arange(len(student) + 1)[None, :]])
        self.no_comm = np.zeros(self.cut_bytes.shape)  # the last stage sends nothing
        in_flight = [in_flight_microbatches(step, num_stages, r) for r in range(num_stages)]
        self.teacher_held_bytes = [held * self.teacher_out_bytes for held in in_flight]
        state_per_param_byte = 2.0 + step.optimizer_state_multiplier  # params + grads + optimizer state
        student_params = student.column("parameter_size_kb") * BYTES_PER_KB
        student_accum = student.column("accum_activation_size_kb") * BYTES_PER_KB
        self.student_memory_prefix = [_prefix(student_params * state_per_param_byte + held * student_accum)
                                      for held in in_flight]
        self._comm_tables: dict[tuple[float, float, float], np.ndarray] = {}
        for array in (self.teacher_fwd_prefix_s, self.student_work_prefix_s, self.teacher_param_prefix_bytes,
                      self.teacher_out_bytes, self.student_out_bytes, self.cut_bytes, self.no_comm,
                      *self.teacher_held_bytes, *self.student_memory_prefix):
            array.setflags(write=False)

    @classmethod
    def of(cls, teacher: ModelProfile, student: ModelProfile, step: StepSpec, num_stages: int) -> _ProfileTables:
        key = (id(teacher), id(student), step, num_stages)
        tables = cls._kept.get(key)
        if tables is None or tables.teacher is not teacher or tables.student is not student:
            if len(cls._kept) >= cls._KEEP:
                cls._kept.clear()
            tables = cls._kept[key] = cls(teacher, student, step, num_stages)
        return tables

    def comm_table(self, device: DeviceSpec) -> np.ndarray:
        """Per-micro-batch link time of a (not last) stage on ``device`` for every pair of end cuts."""
        key = (device.beta, device.link_bandwidth_bytes_per_s, device.link_latency_s)
        table = self._comm_tables.get(key)
        if table is None:
            if len(self._comm_tables) >= 4 * self._KEEP:  # betas wander during a comm slowdown
                self._comm_tables.clear()
            table = link_time_s(*key[:1], self.cut_bytes, *key[1:])
            table.setflags(write=False)
            self._comm_tables[key] = table
        return table


def in_flight_microbatches(step: StepSpec, num_stages: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` of ``num_stages`` holds at its peak."""
    return step.microbatches if step.schedule is Schedule.GPIPE else min(num_stages - stage, step.microbatches)


class CostModel:
    """Prefix-sum tables of two profiles on K devices; cheap vectorised stage costs.

    Indices i0 <= i1 are teacher cut positions and j0 <= j1 student cut positions
    (block k lies between cuts k and k + 1). All methods broadcast numpy arrays.
    """

    def __init__(self, teacher: ModelProfile, student: ModelProfile, devices: Sequence[DeviceSpec], step: StepSpec):
        require(len(devices) >= 1, "no devices given; pass at least one DeviceSpec")
        self.teacher, self.student, self.step = teacher, student, step
        self.devices = tuple(devices)
        self.num_teacher_blocks, self.num_student_blocks = len(teacher), len(student)
        tables = _ProfileTables.of(teacher, student, step, len(self.devices))
        self.teacher_fwd_prefix_s = tables.teacher_fwd_prefix_s
        self.student_work_prefix_s = tables.student_work_prefix_s
        self.teacher_param_prefix_bytes = tables.teacher_param_prefix_bytes
        self._teacher_out_bytes, self._student_out_bytes = tables.teacher_out_bytes, tables.student_out_bytes
        self._comm_s = [tables.comm_table(device) if r < self.num_stages - 1 else tables.no_comm
                        for r, device in enumerate(self.devices)]
        self._teacher_held_bytes = tables.teacher_held_bytes
        self._student_memory_prefix = tables.student_memory_prefix

    @property
    def num_stages(self) -> int:
        return len(self.devices)

    def in_flight(self, stage: int) -> int:
        """Micro-batches whose activations stage `stage` holds at its peak."""
        return in_flight_microbatches(self.step, self.num_stages, stage)

    def cut_bytes(self, i1: Cuts, j1: Cuts) -> np.ndarray:
        """Bytes a stage whose cuts end at teacher i1, student j1 sends per micro-batch: the teacher's and
        the student's activation forward, the student's gradient (as large) back."""
        nbytes: np.ndarray = self._teacher_out_bytes[i1] + 2.0 * self._student_out_bytes[j1]
        return nbytes

    def compute_scale(self, stage: int) -> float:
        """Wall seconds per profiled second of block work on `stage`: its alpha times its contention."""
        device = self.devices[stage]
        return device.alpha * device.contention

    def stage_overhead_s(self, stage: int) -> float:
        """Per-micro-batch host time of `stage` outside its blocks (grows with contention, not alpha)."""
        overhead_s: float = overhead_time_s(self.devices[stage].contention, self.step.per_microbatch_overhead_s)
        return overhead_s

    def stage_loss_s(self, stage: int) -> float:
        """The KD loss's profile seconds per micro-batch on `stage`: on the last stage only."""
        return self.step.loss_s if stage == self.num_stages - 1 else 0.0

    def stage_fixed_s(self, stage: int) -> float:
        """The part of a stage time that does not depend on its blocks: overhead, and the loss on the last stage."""
        fixed_s: float = fixed_time_s(self.compute_scale(stage), self.stage_loss_s(stage), self.stage_overhead_s(stage))
        return fixed_s

    def stage_time_s(self, stage: int, i0: Cuts, i1: Cuts, j0: Cuts, j1: Cuts) -> np.ndarray:
        """Per-micro-batch time of `stage` holding teacher [i0, i1) and student [j0, j1)."""
        parts = self.teacher_work_s(i0, i1), self.student_work_s(j0, j1), self.comm_time_s(stage, i1, j1)
        return self.combine_stage_time(stage, *parts)

    def teacher_work_s(self, i0: Cuts, i1: Cuts) -> np.ndarray:
        work_s: np.ndarray = self.teacher_fwd_prefix_s[i1] - self.teacher_fwd_prefix_s[i0]
        return work_s

    def student_work_s(self, j0: Cuts, j1: Cuts) -> np.ndarray:
        work_s: np.ndarray = self.student_work_prefix_s[j1] - self.student_work_prefix_s[j0]
        return work_s

    def combine_stage_time(self, stage: int, teacher_work_s: np.ndarray, student_work_s: np.ndarray,
                           comm_s: np.ndarray) -> np.ndarray:
        """The one place where a stage time is assembled; callers may cache the parts."""
        time_s: np.ndarray = stage_time_of(self.compute_scale(stage), teacher_work_s + student_work_s,
                                           self.stage_fixed_s(stage), comm_s)
        return time_s

    def comm_time_s(self, stage: int, i1: Cuts, j1: Cuts) -> np.ndarray:
        """Per-micro-batch communication time of `stage` whose cuts end at teacher i1, student j1."""
        comm_s: np.ndarray = self._comm_s[stage][i1, j1]
        return comm_s

    def stage_memory_bytes(self, stage: int, i0: Cuts, i1: Cuts, j0: Cuts, j1: Cuts) -> np.ndarray:
        """Peak memory of `stage` holding teacher [i0, i1) and student [j0, j1)."""
        memory: np.ndarray = self.teacher_memory_bytes(stage, i0, i1) + self.student_memory_bytes(stage, j0, j1)
        return memory

    def teacher_memory_bytes(self, stage: int, i0: Cuts, i1: Cuts) -> np.ndarray:
        """Teacher params plus the in-flight boundary activations at cut i1 (no_grad: nothing else)."""
        tp = self.teacher_param_prefix_bytes
        memory: np.ndarray = (tp[i1] - tp[i0]) + self._teacher_held_bytes[stage][i1]
        return memory

    def student_memory_bytes(self, stage: int, j0: Cuts, j1: Cuts) -> np.ndarray:
        prefix = self.student_memory_prefix_bytes(stage)
        memory: np.ndarray = prefix[j1] - prefix[j0]
        return memory

    def student_memory_prefix_bytes(self, stage: int) -> np.ndarray:
        """Prefix sums over student blocks of params, grads, optimizer state and held activations."""
        return self._student_memory_prefix[stage]

    def step_time_s(self, stage_times_s: Sequence[float]) -> float:
        return pipeline_step_time_s(self.step, stage_times_s)

    def stage_cuts(self, teacher_counts: Sequence[int], student_counts: Sequence[int]) -> tuple[list[int], list[int]]:
        """The cut positions of a partition given as blocks per stage (K + 1 each, from 0 to the model size)."""
        return (_cuts(teacher_counts, self.num_teacher_blocks, self.num_stages, "teacher"),
                _cuts(student_counts, self.num_student_blocks, self.num_stages, "student"))

    def evaluate(self, teacher_counts: Sequence[int], student_counts: Sequence[int]) -> PlanCost:
        """Cost of a partition given as blocks per stage (each >= 1, summing to the model size)."""
        t_cuts, s_cuts = self.stage_cuts(teacher_counts, student_counts)
        stages = range(self.num_stages)
        times = [float(self.stage_time_s(r, t_cuts[r], t_cuts[r + 1], s_cuts[r], s_cuts[r + 1])) for r in stages]
        comm = [float(self.comm_time_s(r, t_cuts[r + 1], s_cuts[r + 1])) for r in stages]
        overhead = [self.stage_overhead_s(r) for r in stages]
        memory = [float(self.stage_memory_bytes(r, t_cuts[r], t_cuts[r + 1], s_cuts[r], s_cuts[r + 1])) for r in stages]
        return PlanCost(
            stage_compute_s=tuple(t - c - o for t, c, o in zip(times, comm, overhead)),
            stage_comm_s=tuple(comm),
            stage_times_s=tuple(times),
            stage_memory_bytes=tuple(memory),
            step_time_s=self.step_time_s(times),
            stage_overhead_s=tuple(overhead),
        )


def _cuts(counts: Sequence[int], num_blocks: int, num_stages: int, which: str) -> list[int]:
    counts = list(counts)
    require(len(counts) == num_stages,
            f"{which} counts {counts} have {len(counts)} entries for {num_stages} stages; give one count per device")
    require(all(isinstance(c, numbers.Integral) and c >= 1 for c in counts),
            f"{which} counts {counts} must all be integers >= 1")
    require(sum(counts) == num_blocks,
            f"{which} counts {counts} sum to {sum(counts)}, but the model has {num_blocks} blocks")
    return [0, *np.cumsum(counts).tolist()]
