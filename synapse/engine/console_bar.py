"""One status line at the bottom of a terminal, with every other console line printed above it.

Both bars use it: the single-process trainer's (``synapse.engine.progress``) and the
supervisor's, drawn from a pipelined run's records (``synapse.failover.progress``). A line
written to the terminal while a bar is on it (a log line, a warning, a worker's output) would
otherwise land inside the bar and be overwritten at its next redraw.
"""
from __future__ import annotations

import contextlib
import io
import logging
import shutil
import sys
import threading
from collections.abc import Iterator
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
