"""The planner as the failover controller needs it: predictions and plans on device *ids*.

``StagePlanner`` holds the two block profiles and the step's shape; given device ids and
their current alphas/betas it predicts a partition's per-stage and step times, and plans a
new partition (the ``plan_fn`` of ``synapse.planner.eta.build_options``). Pure once built.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ..planner.cost_model import CostModel, DeviceSpec, PlanCost, StepSpec
from ..planner.partitioner import plan_with_cost_model
from ..planner.profile import ModelProfile


@dataclass(frozen=True, eq=False)  # hashed by identity: the plan cache is per planner
class StagePlanner:
    teacher: ModelProfile
    student: ModelProfile
    step: StepSpec
    device_name: Callable[[int], str] = "cpu:{}".format
    memory_bytes: Callable[[int], float] = lambda device: math.inf
    link_bandwidth_bytes_per_s: float = math.inf

    def specs(self, devices: Sequence[int], alphas: Mapping[int, float] | Sequence[float] | None = None,
              betas: Mapping[int, float] | None = None) -> list[DeviceSpec]:
        """DeviceSpecs in pipeline order; alphas by device id (or aligned with ``devices``), missing: 1.0."""
        if alphas is not None and not isinstance(alphas, Mapping):
            alphas = dict(zip(devices, alphas))
        alphas, betas = alphas or {}, betas or {}
        return [DeviceSpec(self.device_name(d), alpha=float(alphas.get(d, 1.0)), beta=float(betas.get(d, 1.0)),
                           memory_bytes=self.memory_bytes(d), link_bandwidth_bytes_per_s=self.link_bandwidth_bytes_per_s)
                for d in devices]

    def cost_model(self, devices: Sequence[int], alphas=None, betas=None) -> CostModel:
        return CostModel(self.teacher, self.student, self.specs(devices, alphas, betas), self.step)

    def predict(self, devices: Sequence[int], teacher_counts: Sequence[int], student_counts: Sequence[int],
                alphas=None, betas=None) -> PlanCost:
        """Per micro-batch stage times and the step time of a given partition."""
        return self.cost_model(devices, alphas, betas).evaluate(teacher_counts, student_counts)

    def per_step_compute_s(self, devices: Sequence[int], teacher_counts: Sequence[int],
                           student_counts: Sequence[int]) -> list[float]:
        """Each rank's compute in one optimizer step at nominal speed (M micro-batches)."""
        cost = self.predict(devices, teacher_counts, student_counts)
        return [self.step.microbatches * c for c in cost.stage_compute_s]

    def per_step_comm_s(self, devices: Sequence[int], teacher_counts: Sequence[int],
                        student_counts: Sequence[int]) -> list[float]:
        cost = self.predict(devices, teacher_counts, student_counts)
        return [self.step.microbatches * c for c in cost.stage_comm_s]

    def plan(self, devices: Sequence[int], alphas: Sequence[float], betas=None
             ) -> tuple[tuple[int, ...], tuple[int, ...], float]:
        """``plan_fn`` of ``build_options``: the best partition of ``devices`` and its step time.

        Factors are rounded to 1% first: estimates move a little every step, and a plan for
        alphas 1% apart is the same plan, so it is computed once and reused (the controller
        may ask every step, and a K=8 plan of a 57-block student takes tens of ms)."""
        alphas = tuple(round(float(a), 2) for a in alphas)
        betas = tuple(sorted((d, round(float(b), 2)) for d, b in (betas or {}).items()))
        return self._plan_cached(tuple(devices), alphas, betas)

    @functools.lru_cache(maxsize=256)
    def _plan_cached(self, devices: tuple[int, ...], alphas: tuple[float, ...], betas: tuple
                     ) -> tuple[tuple[int, ...], tuple[int, ...], float]:
        plan = plan_with_cost_model(self.cost_model(devices, alphas, dict(betas)))
        return plan.teacher_counts, plan.student_counts, plan.step_time_s
