"""Ctrl-C, SIGTERM and SIGHUP: stop at the next step boundary with a checkpoint; a second one aborts.

A terminal's Ctrl-C reaches the whole process group: the workers ignore SIGINT (pipeline/
worker.py), so only the supervisor hears it, and it asks every rank, through the usual stop
request, to stop after the step in flight and write a checkpoint. The segment's record then ends at
that step and ``resume=auto`` continues from it. A second SIGINT/SIGTERM aborts at once: torch's
agent tears the workers down (the checkpoint of the step before is what remains).

SIGHUP is a closed terminal (or a lost ssh connection): the shell forwards it to every process of
the job and the kernel sends it again to the foreground group when the shell exits, so one closed
terminal is often two SIGHUPs. It is a SIGTERM that never counts toward an abort: a hangup repeated
by the terminal's machinery must not abort the checkpoint the first one asked for, and only a
second SIGINT/SIGTERM aborts (a SIGTERM after a hangup is the first of those). The workers ignore
it like SIGINT. The decider passes on other nodes' interrupts the same way (``relay``): a
``scancel`` signals every node at once, and their reports must not add up to an abort.

torch's elastic agent installs its own SIGINT/SIGTERM/SIGHUP handlers whenever it starts workers
(they abort the launch); ``elastic.launch_config`` leaves those signals to this module while it
is active (``active()``), and to torch otherwise.
"""
from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from torch.distributed.elastic.multiprocessing.api import SignalException

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
REPEATS_HARMLESSLY = (signal.SIGHUP,)  # sent again by the terminal itself: never the "abort now" of a second one
# What signal.signal returns and accepts: a handler, SIG_DFL/SIG_IGN, or None (set outside Python).
SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class RunInterrupted(RuntimeError):
    """The run stopped on a user's interrupt, after writing a checkpoint; the message says how to continue."""


class InterruptToStop:
    """While active (a ``with`` block in the main thread), the first SIGINT/SIGTERM/SIGHUP calls
    ``on_first(signal_name)``; the second SIGINT or SIGTERM raises torch's ``SignalException`` (abort);
    a SIGHUP never counts toward that."""

    def __init__(self, on_first: Callable[[str], None]):
        self.on_first = on_first
        self.signal_name: str | None = None  # set by the first signal
        self._aborting_signals = 0  # SIGINT/SIGTERM received: the second aborts
        self._previous: dict[int, SignalHandler] = {}  # restored on exit

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP and _relayed:
            name = _relayed.pop(0)  # another process's interrupt, passed on by ``relay``
        if signum not in REPEATS_HARMLESSLY:
            self._aborting_signals += 1
            if self._aborting_signals > 1:
                raise SignalException(f"second interrupt ({name}): aborting without a further checkpoint", signum)
        if self.signal_name is None:
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


_relayed: list[str] = []  # names of interrupts ``relay`` passed on, told as the SIGHUPs that carry them arrive


def relay(name: str) -> None:
    """Stop this process's run as for an interrupt another process got (``name``, e.g. "SIGINT on node 1"): a
    SIGHUP to this process, so the handler runs in its main thread and it never counts toward an abort. A
    ``scancel`` signals every node at once; their reports, each passed on, must not add up to one."""
    _relayed.append(name)
    os.kill(os.getpid(), signal.SIGHUP)


def active() -> bool:
    """Whether an ``InterruptToStop`` handles SIGINT now."""
    handler = signal.getsignal(signal.SIGINT)
    return isinstance(getattr(handler, "__self__", None), InterruptToStop)


TORCH_HANDLES = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")  # torch's agent: each aborts the launch


def signals_for_torch() -> str:
    """The signals torch's elastic agent may handle in this process (``LaunchConfig.signals_to_handle``):
    none of ours while an ``InterruptToStop`` is active, and never one this process ignores (node 0's
    agent beside the decider ignores a terminal's SIGINT and SIGHUP: the decider, in the same process
    group, stops the run with a checkpoint, and an agent that aborted its launch on them would kill its
    workers before they could write it)."""
    if active():
        return "SIGQUIT"
    return ",".join(name for name in TORCH_HANDLES if signal.getsignal(getattr(signal, name)) != signal.SIG_IGN)
