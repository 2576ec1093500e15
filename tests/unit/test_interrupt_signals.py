"""Which signals torch's elastic agent may handle in a process (``LaunchConfig.signals_to_handle``): torch's
agent aborts its launch on each, killing the workers before they can checkpoint. Node 0's agent beside the
decider ignores a terminal's SIGINT and SIGHUP (the decider stops the run with a checkpoint), so torch must
not take them back; the two-launcher test is ``tests/dist/test_decider_restart.py::...[ctrl_c]``."""
from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException

from synapse.failover.decider import NodeDecider
from synapse.failover.node_channel import NodeInterrupt
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


def _send(signum) -> None:
    os.kill(os.getpid(), signum)  # delivered to this (the main) thread before os.kill returns to Python code


def test_a_second_sigint_or_sigterm_aborts_and_a_hangup_never_counts_toward_it(restored_signals):
    stops: list[str] = []
    with InterruptToStop(stops.append):
        _send(signal.SIGHUP)
        _send(signal.SIGHUP)
        _send(signal.SIGTERM)  # the first that may abort: the stop under way goes on
        assert stops == ["SIGHUP"]
        with pytest.raises(SignalException, match="second interrupt"):
            _send(signal.SIGINT)
    with InterruptToStop(stops.append):
        _send(signal.SIGINT)
        with pytest.raises(SignalException):
            _send(signal.SIGTERM)
    assert stops == ["SIGHUP", "SIGINT"]


def test_a_scancel_reported_by_every_node_stops_the_run_with_its_checkpoint(restored_signals):
    """scancel signals every node's launcher, each agent reports it, and the decider's own host gets a SIGTERM
    too: one stop with a checkpoint, never the abort of a 'second interrupt' (which it was, when the decider
    passed each node's report on as that node's own signal)."""
    decider = SimpleNamespace(interrupts_seen={}, log=lambda message: None, epoch=3,
                              events=SimpleNamespace(append=lambda *args, **fields: None))
    stops: list[str] = []
    with InterruptToStop(stops.append):
        for node in (1, 2, 3):
            NodeDecider.interrupted(decider, NodeInterrupt(node, "SIGTERM", epoch=3))
        NodeDecider.interrupted(decider, NodeInterrupt(1, "SIGTERM", epoch=3))  # a report read twice
        _send(signal.SIGTERM)  # the batch host's own
    assert stops == ["SIGTERM on node 1"]  # told as the node's signal
