"""Terminal progress of a training run: a bar on a terminal, a few plain lines anywhere else.

A bar redraws its line many times a second; written to a file or a pipe (a Slurm or submitit
``.err`` file, ``| tee``) every refresh would become text of its own. So off a terminal the
progress is a handful of plain lines, one per quarter of the run (``Milestones``).
``progress_text`` is the one format of a progress line, shared with the supervisor's bar
(``synapse.failover.progress``), which draws a pipelined run's progress from its records.

``ConsoleBar`` keeps the status line at the bottom of a terminal and prints every other console
line above it: a line written while a bar is on it (a log line, a warning, a worker's output)
would otherwise land inside the bar and be overwritten at its next redraw.
"""
from __future__ import annotations

import contextlib
import io
import logging
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TextIO

CLEAR_LINE = "\r\x1b[K"


class ConsoleBar:
    """One status line at the bottom of a terminal; ``write_line`` prints above it (thread-safe)."""

    def __init__(self, stream: TextIO):
        self.stream, self.text = stream, ""
        self._lock = threading.RLock()

    def show(self, text: str) -> None:
        with self._lock:
            self.text = text
            self._draw()

    def write_line(self, line: str) -> None:
        with self._lock:
            self.stream.write(CLEAR_LINE + line.rstrip("\n") + "\n")
            self._draw()

    def close(self) -> None:
        """Leave the last state of the bar on the screen as an ordinary line."""
        with self._lock:
            if self.text:
                self.stream.write(CLEAR_LINE + self.text + "\n")
                self.stream.flush()
            self.text = ""

    def _draw(self) -> None:
        if self.text:
            width = shutil.get_terminal_size((100, 24)).columns
            self.stream.write(CLEAR_LINE + self.text[:max(10, width - 1)])
        self.stream.flush()


class _LinesAboveBar(io.TextIOBase):
    """A text stream whose complete lines go through the bar (a partial line waits for its end)."""

    def __init__(self, bar: ConsoleBar, original: TextIO):
        self._bar, self._original, self._pending = bar, original, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._bar.write_line(line)
        return len(text)

    def flush(self) -> None:
        self._original.flush()

    def isatty(self) -> bool:
        return False  # so that nothing else draws in place through it

    def fileno(self) -> int:
        return self._original.fileno()


@contextlib.contextmanager
def lines_above(bar: ConsoleBar) -> Iterator[None]:
    """While the bar is on screen, route sys.stdout, sys.stderr and the logging handlers that write
    to them through the bar (torch's agent copies the workers' lines to whatever sys.stdout is
    when a launch starts, so launches inside this block are routed too)."""
    originals = sys.stdout, sys.stderr
    routed = {id(s): _LinesAboveBar(bar, s) for s in originals}
    handlers = [h for h in _all_handlers() if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler) and id(h.stream) in routed]
    previous = [h.setStream(routed[id(h.stream)]) for h in handlers]
    sys.stdout, sys.stderr = routed[id(originals[0])], routed[id(originals[1])]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = originals
        for handler, stream in zip(handlers, previous):
            handler.setStream(stream)


def _all_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    return [h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers]


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
