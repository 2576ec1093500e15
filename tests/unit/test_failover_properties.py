"""Random fault sequences through the failover controller (issue #15, property-based).

A pure simulation of the supervisor around the real controller, detector, estimator, planner
(the shared ViT-L / ResNet-152 profiles) and every policy: seeded sequences of 1-3 faults
(compute slowdowns of 1.2-5x from any step including 0, intermittent, ramps, and kills) on the
3 devices. A decision is carried out as the supervisor would: a live REPLAN continues in place,
any other action and every kill resume from the last checkpoint (every 10 steps), so the steps
after it come again. Properties: the controller never hits an error of its own (bookkeeping
included, e.g. a resume behind its last action), every decision leaves the failed device out,
the run reaches its last step unless no device is left, and the state survives JSON.

This is the controller half of the issue's property test; the multi-process half (bit-identical
weights after random faults on 3 CPU ranks) is not written yet.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from synapse.decision import POLICY_NAMES, NoViableOptionError, OptionKind, RestartCost, RestartCostModel, make_policy
from synapse.detection import SlowdownDetector
from synapse.failover import FailoverController
from synapse.partitioning import Placement, StagePlanner, StepSpec, load_profile_csv

PROFILES = Path(__file__).resolve().parents[1] / "data" / "synapse_profiles"
DEVICES, TOTAL, CHECKPOINT_EVERY = (0, 1, 2), 160, 10
PLANNER = StagePlanner(load_profile_csv(PROFILES / "tnet_vit_large.csv"),
                       load_profile_csv(PROFILES / "snet_resnet152.csv"), StepSpec(4))


@dataclass(frozen=True)
class Fault:
    kind: str  # "slow", "intermittent", "ramp", "kill"
    device: int
    start: int
    factor: float = 1.0
    length: int = 0  # slow: duration (0: to the end); intermittent: on/off steps; ramp: ramp steps

    def factor_at(self, step: int) -> float:
        if self.kind == "kill" or step < self.start:
            return 1.0
        since = step - self.start
        if self.kind == "slow":
            return self.factor if not self.length or since < self.length else 1.0
        if self.kind == "intermittent":
            return self.factor if (since // self.length) % 2 == 0 else 1.0
        return 1.0 + (self.factor - 1.0) * min(1.0, since / self.length)  # ramp


faults = st.builds(Fault, kind=st.sampled_from(["slow", "intermittent", "ramp", "kill"]),
                   device=st.sampled_from(DEVICES), start=st.integers(0, TOTAL - 10),
                   factor=st.floats(1.2, 5.0), length=st.integers(5, 60))


class Simulation:
    """The supervisor's part: records in, decisions carried out, resumes from checkpoints."""

    def __init__(self, policy: str, sequence: list[Fault], seed: int):
        self.events: list[dict] = []
        restart = RestartCostModel(RestartCost(checkpoint_save_s=1, launch_s=3, warmup_s=1))
        self.controller = FailoverController(
            policy=make_policy(policy), planner=PLANNER, restart_costs=restart, detector=SlowdownDetector(),
            log_event=lambda event, **fields: self.events.append({"event": event, **fields}))
        teacher, student, _ = PLANNER.plan(DEVICES, [1.0] * 3)
        self.placement = Placement(DEVICES, tuple(teacher), tuple(student))
        self.controller.begin_segment(self.placement)
        self.faults, self.rng, self.clock, self.killed = sequence, random.Random(seed), 1000.0, set()

    def record(self, step: int) -> dict:
        alphas = {d: 1.0 for d in self.placement.devices}
        for fault in self.faults:
            if fault.device in alphas:
                alphas[fault.device] *= fault.factor_at(step)
        cost = PLANNER.predict(self.placement.devices, self.placement.teacher_counts, self.placement.student_counts,
                               alphas)

        def noise() -> float:
            return 1.0 + self.rng.uniform(-0.1, 0.1)

        step_s = cost.step_time_s * noise()
        self.clock += step_s
        return {"step": step, "time": self.clock, "step_seconds": step_s, "total_steps": TOTAL,
                "compute_s": [4 * c * noise() for c in cost.stage_compute_s],
                "comm_s": [0.001 * noise() for _ in self.placement.devices]}

    def resume(self, placement: Placement, step: int) -> int:
        checkpoint = step - step % CHECKPOINT_EVERY
        self.placement = placement
        self.controller.begin_segment(placement, start_step=checkpoint)
        return checkpoint

    def run(self) -> int:
        """Steps until the end (or until no device is left); returns the last step reached."""
        step = 0
        while step < TOTAL:
            step += 1
            kill = next((f for f in self.faults if f.kind == "kill" and f.start == step
                         and f.device in self.placement.devices and id(f) not in self.killed), None)
            if kill is not None:
                self.killed.add(id(kill))
                try:
                    decision = self.controller.on_hard_failure(kill.device, step - 1, TOTAL, "killed by SIGKILL")
                except NoViableOptionError:
                    assert len(self.placement.devices) == 1, "no option although devices survive"
                    return step - 1
                assert kill.device not in decision.chosen.devices
                step = self.resume(decision.chosen.placement, step - 1)
                continue
            decision = self.controller.observe(self.record(step))
            if decision is None:
                continue
            assert set(decision.chosen.devices) <= set(DEVICES)
            if decision.action is OptionKind.REPLAN:  # live: the workers carry on from the next step
                self.placement = decision.chosen.placement
                self.controller.begin_segment(self.placement)
            else:
                step = self.resume(decision.chosen.placement, step)
        return step


def check(policy: str, sequence: list[Fault], seed: int) -> None:
    simulation = Simulation(policy, sequence, seed)
    last = simulation.run()
    errors = [e for e in simulation.events if e["event"] == "controller_error"]
    assert not errors, errors[0]
    assert simulation.controller.errors == 0
    assert last == TOTAL or len(simulation.placement.devices) == 1
    state = json.loads(json.dumps(simulation.controller.state_dict(), default=float))
    restored = FailoverController(policy=make_policy(policy), planner=PLANNER,
                                  restart_costs=simulation.controller.restart_costs)
    restored.load_state_dict(state)
    assert restored.placement == simulation.controller.placement


SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "derandomize": True}


# The held-out cascade of the issue, under every policy: device 0 slow from step 30, device 1
# killed at step 85, so the next placement resumes from step 80, behind the DEGRADE decided at 84.
CASCADE = [Fault("slow", 0, 30, 3.0), Fault("kill", 1, 85)]


def with_cascades(test):
    for policy in POLICY_NAMES:
        test = example(policy=policy, sequence=CASCADE, seed=1)(test)
    return test


@pytest.mark.slow  # 15 whole controller runs (10 drawn, the 5 cascades)
@settings(max_examples=10, **SETTINGS)
@given(policy=st.sampled_from(POLICY_NAMES), sequence=st.lists(faults, min_size=1, max_size=3),
       seed=st.integers(0, 2**16))
@with_cascades
def test_random_fault_sequences_never_break_the_controller(policy, sequence, seed):
    check(policy, sequence, seed)


@pytest.mark.long
@settings(max_examples=200, **SETTINGS)
@given(policy=st.sampled_from(POLICY_NAMES), sequence=st.lists(faults, min_size=1, max_size=3),
       seed=st.integers(0, 2**16))
def test_random_fault_sequences_never_break_the_controller_200(policy, sequence, seed):
    check(policy, sequence, seed)
