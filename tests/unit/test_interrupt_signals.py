"""Which signals torch's elastic agent may handle in a process (``LaunchConfig.signals_to_handle``): torch's
agent aborts its launch on each, killing the workers before they can checkpoint. Node 0's agent beside the
decider ignores a terminal's SIGINT and SIGHUP (the decider stops the run with a checkpoint), so torch must
not take them back; the two-launcher test is ``tests/dist/test_decider_restart.py::...[ctrl_c]``."""
from __future__ import annotations

import signal

import pytest

from synapse.launch import InterruptToStop
from synapse.launch.interrupt import signals_for_torch


@pytest.fixture
def restored_signals():
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)}
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)


def test_torch_handles_every_signal_a_plain_process_receives(restored_signals):
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    assert signals_for_torch() == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def test_signals_this_process_ignores_are_never_handed_to_torch(restored_signals):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what node 0's agent under trainer.role=auto does
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert signals_for_torch() == "SIGTERM,SIGQUIT"


def test_under_the_supervisors_interrupt_handling_torch_keeps_only_sigquit(restored_signals):
    with InterruptToStop(lambda name: None):
        assert signals_for_torch() == "SIGQUIT"
