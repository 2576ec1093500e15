"""Ctrl-C and SIGTERM: stop at the next step boundary with a checkpoint; a second one aborts.

A terminal's Ctrl-C reaches the whole process group: the workers ignore SIGINT (pipeline/
worker.py), so only the supervisor hears it, and it asks every rank, through the usual stop
request, to stop after the step in flight and write a checkpoint. The segment's record then ends at
that step and ``resume=auto`` continues from it. A second SIGINT/SIGTERM aborts at once: torch's
agent tears the workers down (the checkpoint of the step before is what remains).

torch's elastic agent installs its own SIGINT/SIGTERM handlers whenever it starts workers (they
abort the launch); ``elastic.launch_config`` leaves those two signals to this module while it
is active (``active()``), and to torch otherwise.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from torch.distributed.elastic.multiprocessing.api import SignalException

HANDLED = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(RuntimeError):
    """The run stopped on a user's interrupt, after writing a checkpoint; the message says how to continue."""


class InterruptToStop:
    """While active (a ``with`` block in the main thread), the first SIGINT/SIGTERM calls
    ``on_first(signal_name)``; the next raises torch's ``SignalException`` (abort)."""

    def __init__(self, on_first: Callable[[str], None]):
        self.on_first = on_first
        self.signal_name: str | None = None  # set by the first signal
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None:
            raise SignalException(f"second interrupt ({name}): aborting without a further checkpoint", signum)
        self.signal_name = name
        self.on_first(name)

    def __enter__(self) -> InterruptToStop:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def active() -> bool:
    """Whether an ``InterruptToStop`` handles SIGINT now."""
    handler = signal.getsignal(signal.SIGINT)
    return isinstance(getattr(handler, "__self__", None), InterruptToStop)
