"""Terminal progress of a training run: a bar on a terminal, a few plain lines anywhere else.

A bar redraws its line many times a second; written to a file or a pipe (a Slurm or submitit
``.err`` file, ``| tee``) every refresh would become text of its own. So off a terminal the
progress is a handful of plain lines, one per quarter of the run (``Milestones``).
``progress_text`` is the one format of a progress line, shared with the supervisor's bar
(``synapse.failover.progress``), which draws a pipelined run's progress from its records.
"""
from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from synapse.engine.console_bar import ConsoleBar, lines_above

MILESTONE_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
RATE_WINDOW = 20  # recent steps the time left is extrapolated from


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stream-like object without a terminal
        return False


def format_seconds(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def progress_text(step: int, total: int, *, loss: float | None = None, images_per_s: float | None = None,
                  eta_s: float | None = None, val_top1: float | None = None, prefix: str = "") -> str:
    """``[prefix | ]step 57/264 (22%) | loss 0.9394 | 629 img/s | val 97.8% | ETA 0:23``."""
    parts = [prefix] if prefix else []
    parts.append(f"step {step}/{total} ({step / total:.0%})" if total else f"step {step}")
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if images_per_s is not None:
        parts.append(f"{images_per_s:,.0f} img/s")
    if val_top1 is not None:
        parts.append(f"val {val_top1:.1f}%")
    if eta_s is not None:
        parts.append(f"ETA {format_seconds(eta_s)}")
    return " | ".join(parts)


class Milestones:
    """Which steps get a plain progress line: the first step at or past each quarter of the run."""

    def __init__(self, total_steps: int, start_step: int = 0, fractions=MILESTONE_FRACTIONS):
        self._marks = sorted({max(1, round(total_steps * f)) for f in fractions} if total_steps else set())
        self._marks = [m for m in self._marks if m > start_step]

    def reached(self, step: int) -> bool:
        """True once per mark, at the first step that reaches it."""
        hit = False
        while self._marks and step >= self._marks[0]:
            self._marks.pop(0)
            hit = True
        return hit


class StepRate:
    """The time left, from the wall time of the last ``RATE_WINDOW`` steps (evaluations and restarts included)."""

    def __init__(self) -> None:
        self._recent: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW)

    def add(self, step: int, at: float) -> None:
        self._recent.append((step, at))

    def eta_s(self, step: int, total: int) -> float | None:
        if len(self._recent) < 2 or not total:
            return None
        (first_step, first_at), (last_step, last_at) = self._recent[0], self._recent[-1]
        if last_step <= first_step:
            return None
        return max(0, total - step) * (last_at - first_at) / (last_step - first_step)


class Progress:
    """Progress of the single-process trainer (the pipeline's bar is the supervisor's).

    On a terminal: one ``ConsoleBar`` line, with the run's log lines and warnings printed above
    it while it is shown (through ``lines_above``), never over it. Elsewhere: ``Milestones`` lines."""

    def __init__(self, total_steps: int, start_step: int, enabled: bool = True,
                 log: Callable[[str], None] = print, stream: TextIO | None = None):
        stream = stream or sys.stderr
        self._bar = ConsoleBar(stream) if enabled and is_terminal(stream) else None
        self._lines = Milestones(total_steps, start_step) if enabled and self._bar is None else None
        self._total, self._log = total_steps, log
        self._rate = StepRate()
        self._routing = contextlib.ExitStack()
        if self._bar is not None:
            self._routing.enter_context(lines_above(self._bar))

    def update(self, step: int, loss: float, images_per_s: float) -> None:
        self._rate.add(step, time.monotonic())
        if self._bar is not None:
            self._bar.show(progress_text(step, self._total, loss=loss, images_per_s=images_per_s,
                                         eta_s=self._rate.eta_s(step, self._total)))
        elif self._lines is not None and self._lines.reached(step):
            self._log(progress_text(step, self._total, loss=loss, images_per_s=images_per_s))

    def close(self) -> None:
        self._routing.close()
        if self._bar is not None:
            self._bar.close()
