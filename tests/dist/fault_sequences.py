"""Random fault sequences for real runs (issue #15): a hypothesis strategy and its injection config.

A sequence is 1-3 faults on a 3-rank run of ``STEPS`` steps, each drawn from the issue's list:
a compute slowdown (factor 1.2-5x, any start, any duration), an intermittent one, a ramp, a slow
link, and a kill, hang or CUDA-style error in any phase the injector knows. The faults hit at most
two of the three devices (``spared`` is never hit): a policy may drop every device a fault touches
(DEGRADE on a slowdown, on a hard failure), and a run with no device left cannot finish by
definition. A drawn sequence becomes ``injection.faults`` with ``injection_faults``; pure, so its
unit test (every drawn sequence is a valid injection config) runs in milliseconds.

Starts are drawn as "steps finished before the fault begins" (0: from the first step). A factor
slowdown scales the task time the rank measured in the step before, so it cannot act in step 1;
one drawn to start at 0 starts at step 2 (a ramp, which is at level 0 in its first step, keeps 1).
"""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from synapse.injection import PHASES

STEPS = 8
CHECKPOINT_EVERY = 2
RANKS = (0, 1, 2)
KINDS = ("slow", "intermittent", "ramp", "slow_link", "kill", "hang", "cuda_error")
HARD_KINDS = ("kill", "hang", "cuda_error")
CHECKPOINT_STEPS = tuple(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))


@dataclass(frozen=True)
class Fault:
    kind: str  # one of KINDS
    rank: int
    start: int  # steps finished before it begins (hard faults: fires in step start + 1)
    phase: str = "forward"  # hard faults
    factor: float = 1.0  # compute slowdowns
    seconds: float = 0.0  # slow link: extra seconds before each send
    length: int | None = None  # slow/slow_link: steps it lasts (None: to the end); intermittent: on/off; ramp: steps

    @property
    def hard(self) -> bool:
        return self.kind in HARD_KINDS

    @property
    def first_step(self) -> int:
        """The 1-based step it first acts in, as configured."""
        spec = injection_fault(self)
        return spec["step"] if self.hard else spec["start"]


@dataclass(frozen=True)
class Sequence:
    faults: tuple[Fault, ...]
    spared: int  # the rank no fault hits
    replan_mode: str  # live | restart

    def overrides(self) -> list[str]:
        return [f"injection.faults={hydra_list(injection_faults(self))}", f"failover.replan_mode={self.replan_mode}"]


def _round(values: st.SearchStrategy[float], digits: int = 2) -> st.SearchStrategy[float]:
    return values.map(lambda v: round(v, digits))


@st.composite
def faults(draw, ranks: tuple[int, ...], kinds: tuple[str, ...] = KINDS) -> Fault:
    kind, rank = draw(st.sampled_from(kinds)), draw(st.sampled_from(ranks))
    if kind in HARD_KINDS:
        phase = draw(st.sampled_from(PHASES))
        # A checkpoint is written every CHECKPOINT_EVERY steps: a fault in that phase fires only there.
        steps = CHECKPOINT_STEPS if phase == "checkpoint_write" else tuple(range(1, STEPS + 1))
        return Fault(kind, rank, draw(st.sampled_from(steps)) - 1, phase=phase)
    start = draw(st.integers(0, STEPS - 1))
    if kind == "slow_link":
        return Fault(kind, rank, start, seconds=draw(_round(st.floats(0.002, 0.03), 3)),
                     length=draw(st.none() | st.integers(1, STEPS)))
    factor = draw(_round(st.floats(1.2, 5.0)))
    length = draw(st.integers(1, 3) if kind == "intermittent" else
                  st.integers(1, STEPS) if kind == "ramp" else st.none() | st.integers(1, STEPS))
    return Fault(kind, rank, start, factor=factor, length=length)


@st.composite
def sequences(draw, rotation: int = 0) -> Sequence:
    """1-3 faults on two of the three ranks. ``rotation`` shifts the kind list and the spared rank,
    so that each policy's simplest sequence (hypothesis tries it first) is a different fault."""
    kinds = KINDS[rotation % len(KINDS):] + KINDS[:rotation % len(KINDS)]
    order = RANKS[rotation % 3:] + RANKS[:rotation % 3]
    spared = draw(st.sampled_from(order[::-1]))
    hit = tuple(r for r in order if r != spared)
    drawn = draw(st.lists(faults(hit, kinds), min_size=1, max_size=3))
    return Sequence(tuple(drawn), spared, draw(st.sampled_from(("live", "restart"))))


# ---------------------------------------------------------------- as injection config
def injection_fault(fault: Fault) -> dict:
    """One fault as an ``injection.faults`` entry (synapse/injection/spec.py)."""
    if fault.hard:
        return {"kind": fault.kind, "rank": fault.rank, "step": fault.start + 1, "phase": fault.phase}
    if fault.kind == "slow_link":
        spec = {"kind": "slow_comm", "rank": fault.rank, "start": fault.start + 1, "seconds": fault.seconds}
        return _with_end(spec, fault.length)
    spec = {"kind": "slow_compute", "rank": fault.rank, "factor": fault.factor}
    if fault.kind == "ramp":
        return {**spec, "start": fault.start + 1, "ramp_steps": fault.length}
    spec["start"] = max(2, fault.start + 1)  # a factor needs the step before's measured time
    if fault.kind == "intermittent":
        return {**spec, "on_steps": fault.length, "off_steps": fault.length}
    return _with_end(spec, fault.length)


def _with_end(spec: dict, length: int | None) -> dict:
    return spec if length is None else {**spec, "end": spec["start"] + length - 1}


def injection_faults(sequence: Sequence) -> list[dict]:
    return [injection_fault(f) for f in sequence.faults]


def hydra_list(entries: list[dict]) -> str:
    """``[{kind:kill,rank:1,...},...]`` in Hydra's override grammar."""
    return "[" + ",".join("{" + ",".join(f"{k}:{v}" for k, v in e.items()) + "}" for e in entries) + "]"
