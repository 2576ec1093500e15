"""The decider across nodes survives its own death (issue #36, items 1 and 3's epoch fence).

Two launchers on this machine act as 2 nodes x 2 CPU ranks. Node 0's launcher serves the run's
store and runs the decider and node 0's agent, each as a process of its own; the test SIGKILLs (or
freezes) the decider mid-run. The launcher starts a new decider under the next epoch, both agents
re-attach to it with the segment their workers still run, the new decider adopts that segment
instead of relaunching it, and no worker stops: the run finishes in its first segment with the
weights an uninterrupted run learns. An order of the replaced decider's epoch, sealed with the run's
key as that decider would write it, is refused and said by the agent; the checkpoints' manifests show
the epoch of the workers that committed them.

Three launchers (``test_a_decider_on_a_host_of_its_own_...``): a decider on a "host" with no device
(``trainer.role=decider``) and two nodes that run agents only; the decider is killed and adopted, then
node 0's agent is killed with its workers: an ordinary DEGRADE without node 0's devices.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synapse.app import run
from synapse.failover import ExitOrder, NodeChannel, read_segments
from synapse.launch import free_port
from synapse.rundir import read_events, read_jsonl

from .helpers import BASE_OVERRIDES, assert_identical_states, compose_config, final_student_state, outputs_of

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]
STEPS = 12


def start_nodes(run_dir: Path, teacher_file: Path, endpoint: str, *extra: str,
                launchers: tuple[tuple[str, ...], ...] = (("trainer.node_rank=0",), ("trainer.node_rank=1",)),
                devices: int = 2) -> list[subprocess.Popen]:
    """One ``python train.py`` per entry of ``launchers`` (its own settings), each in a session of its own;
    as many nodes as launchers with a node_rank, of ``devices`` CPU slots each."""
    node_count = sum(any(o.startswith("trainer.node_rank=") for o in own) for own in launchers)
    common = [*BASE_OVERRIDES, f"teacher.checkpoint={teacher_file}", f"cache_dir={run_dir.parent}/cache",
              f"run_dir={run_dir}", f"trainer.max_steps={STEPS}", f"trainer.devices={devices}",
              f"trainer.nodes={node_count}",
              f"trainer.rdzv_endpoint={endpoint}", "report=false", "logger=none", *extra]
    return [subprocess.Popen([sys.executable, "train.py", *common, *own], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            for own in launchers]


def last_step(run_dir: Path) -> int:
    records = read_jsonl(run_dir / "performance.jsonl") if (run_dir / "performance.jsonl").is_file() else []
    return max((r["step"] for r in records), default=0)


def decider_epoch(run_dir: Path) -> dict:
    path = run_dir / "failover" / "decider_epoch.json"
    return json.loads(path.read_text()) if path.is_file() else {"epoch": 0, "pid": 0}


def wait_for(condition, what: str, nodes: list[subprocess.Popen], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        ended = [node for node in nodes if node.poll() is not None]
        assert not ended, f"node {nodes.index(ended[0])} ended while waiting for {what}:\n" + \
            ended[0].communicate()[0][-4000:]
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, teacher_file):
    """The single-device trainer on the same data, steps and micro-batches."""
    run_dir = tmp_path_factory.mktemp("single_device")
    run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", "trainer.devices=1",
                                 f"trainer.max_steps={STEPS}"]), log=lambda m: None)
    return final_student_state(run_dir)


# Frozen (SIGSTOP): node 0's launcher kills the decider once it has not beaten for failover.node_timeout_s;
# meanwhile its workers train on, so they are slowed (a fault that changes no number; policy=keep acts on
# no slowdown) lest they finish the run before the decider is found frozen.
FROZEN = ("failover.node_timeout_s=3", "policy=keep",
          "injection.faults=[{kind:slow_compute,rank:0,start:1,seconds:0.4}]")


@pytest.mark.parametrize("end", [pytest.param(signal.SIGKILL, id="killed"), pytest.param(signal.SIGSTOP, id="frozen")])
def test_a_killed_decider_is_restarted_under_a_new_epoch_and_the_run_learns_exactly(tmp_path, teacher_file,
                                                                                    reference, end):
    run_dir, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    nodes = start_nodes(run_dir, teacher_file, endpoint, "checkpoint.every=2",
                        *(FROZEN if end == signal.SIGSTOP else ()))
    try:
        events = run_dir / "failover_events.jsonl"
        # mid-run, once a checkpoint is committed: the new decider must continue from it, not start over
        wait_for(lambda: events.is_file() and any(e["step"] >= 4 for e in read_events(events, "checkpoint_saved")),
                 "the checkpoint of step 4", nodes, timeout_s=300)
        first = decider_epoch(run_dir)
        assert first["epoch"] == 1 and first["pid"] not in (0, nodes[0].pid), \
            "the decider is a process of its own, beside node 0's launcher"
        os.kill(first["pid"], end)  # the decider alone: it owns no worker

        # Forged as soon as node 1 re-attaches, before the new decider can have given it any order: were
        # the forgery written only after the adoption, a run that had already trained to its end could take
        # that order number with its real exit order first, and node 1 would never read the forged one
        wait_for(lambda: any(e["node"] == 1 for e in read_events(events, "decider_reattached")),
                 "node 1 to re-attach to the new decider", nodes)
        # The replaced decider's epoch, sealed with the run's key exactly as that decider wrote its orders,
        # at the number node 1 reads next: were it followed, node 1 would leave the run with an error
        reattached = {e["node"]: e for e in read_events(events, "decider_reattached")}
        old = NodeChannel.connect(endpoint, node_rank=1, timeout_s=10, run_dir=run_dir)
        old.join("nodes")
        old.epoch = first["epoch"]
        old.continue_orders(1, reattached[1]["orders_seen"])
        old.order(1, ExitOrder("forged: an order of the replaced decider"))

        outputs = [node.communicate(timeout=400)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-4000:]

    second = decider_epoch(run_dir)
    assert second["epoch"] == 2 and second["pid"] != first["pid"]
    assert [e["epoch"] for e in read_events(events, "decider_started")] == [1, 2]
    [lost] = read_events(events, "decider_lost")
    assert lost["epoch"] == 1 and lost["pid"] == first["pid"] and lost["exitcode"] == -signal.SIGKILL
    hung = read_events(events, "decider_hung")
    assert [(e["epoch"], e["pid"]) for e in hung] == ([(1, first["pid"])] if end == signal.SIGSTOP else []), hung
    reattached = {e["node"]: e for e in read_events(events, "decider_reattached")}
    assert sorted(reattached) == [0, 1], "node 0's agent re-attaches like any other"
    assert all(e["epoch"] == 2 and e["previous_epoch"] == 1 for e in reattached.values()), reattached
    assert "attached to the decider of epoch 2" in outputs[1], outputs[1][-3000:]

    refused = [e for e in read_events(events, "stale_epoch_refused") if e["record"] == "order"]
    assert refused and all(e["record_epoch"] == 1 and e["epoch"] == 2 and e["node"] == 1 for e in refused), refused
    assert "(exit) of decider epoch 1: this node follows epoch 2" in outputs[1], outputs[1][-3000:]

    assert_adopted_without_a_stop(run_dir, outputs)
    from synapse.failover import read_segments
    assert len(read_segments(run_dir)) == 1 and read_segments(run_dir)[0].outcome == "finished"
    assert not read_events(events, "relaunch"), "no worker was stopped or relaunched"
    # No two writers: every manifest says epoch 1, the workers the new decider adopted
    commits = commit_epochs(run_dir)
    assert (STEPS, 1) in commits and {epoch for _, epoch in commits} == {1}, commits
    assert_identical_states(final_student_state(run_dir), reference)


def assert_adopted_without_a_stop(run_dir: Path, outputs: list[str], nodes: int = 2) -> None:
    """The new decider adopted segment 0, which every node started once."""
    from synapse.failover import read_segments
    events = run_dir / "failover_events.jsonl"
    [adopted] = read_events(events, "segment_adopted")
    assert adopted["segment"] == 0 and adopted["epoch"] == 2 and adopted["nodes"] == list(range(nodes)), adopted
    segments = read_segments(run_dir)
    assert segments[0].start_step == 0 and segments[0].devices == [0, 1, 2, 3], segments
    launched = [line for output in outputs for line in output.splitlines() if ": segment 0 on local devices" in line]
    assert len(launched) == nodes, launched  # each node started segment 0's workers once


def commit_epochs(run_dir: Path) -> list[tuple[int, int]]:
    """(step, epoch of the workers that committed it) of every checkpoint in the run directory."""
    from synapse import checkpoint as ckpt
    return sorted((ckpt.read_manifest(path)["step"], ckpt.read_manifest(path)["meta"]["epoch"])
                  for path in (run_dir / "checkpoints").glob("step_*"))


@pytest.mark.parametrize("interrupt", [
    pytest.param("sigterm", id="sigterm"),
    # Ctrl-C at node 0's terminal: SIGINT to its whole process group, the launcher, the decider, node 0's agent
    # and its workers (issue #36); -m extended, one more two-node run (~1 min)
    pytest.param("ctrl_c", id="ctrl_c", marks=pytest.mark.extended),
    # Ctrl-C at node 1's terminal: its agent says it to the decider, which stops the run as for its own (before:
    # torch's agent in node 1's launcher aborted its launch and killed its workers); -m extended (~1.5 min)
    pytest.param("ctrl_c_node_1", id="ctrl_c_node_1", marks=pytest.mark.extended)])
def test_sigterm_to_node_0s_launcher_reaches_the_decider_which_stops_the_run_with_a_checkpoint(tmp_path,
                                                                                                teacher_file,
                                                                                                interrupt):
    """The launcher passes SIGTERM (and SIGHUP) on to its decider: the run stops after the step in flight with
    a checkpoint, as on one node, instead of the launcher dying and taking the store from under the run.
    A Ctrl-C reaches the decider itself; node 0's agent leaves it to the decider (before: torch's agent in it
    aborted the launch on the SIGINT and killed node 0's workers, so no checkpoint was written)."""
    run_dir, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    nodes = start_nodes(run_dir, teacher_file, endpoint, "checkpoint.every=100", "failover.node_timeout_s=3",
                        "injection.faults=[{kind:slow_compute,rank:0,start:1,seconds:0.4}]", "policy=keep")
    try:
        wait_for(lambda: last_step(run_dir) >= 2, "step 2", nodes)
        if interrupt == "sigterm":
            nodes[0].send_signal(signal.SIGTERM)  # the launcher's pid alone, as a scheduler's preemption might
        else:  # what a terminal's Ctrl-C does to its foreground job
            os.killpg(nodes[1 if interrupt == "ctrl_c_node_1" else 0].pid, signal.SIGINT)
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    said = {"sigterm": "SIGTERM", "ctrl_c": "SIGINT", "ctrl_c_node_1": "SIGINT on node 1"}[interrupt]
    assert nodes[0].returncode == 1 and f"interrupted by {said}" in outputs[0], outputs[0][-3000:]
    assert "resume=auto" in outputs[0]
    if interrupt == "ctrl_c_node_1":
        assert "decider: node 1 got SIGINT" in outputs[0] and "agent: node 1: SIGINT: asking the decider" in \
            outputs[1], outputs[1][-3000:]
        assert read_events(run_dir / "failover_events.jsonl", "interrupt_from_node", node=1, signal="SIGINT")
    assert nodes[1].returncode != 0 and "the decider ended the run with an error: RunInterrupted" in outputs[1], \
        outputs[1][-3000:]
    from synapse import checkpoint as ckpt
    saved = ckpt.latest_valid_checkpoint(run_dir / "checkpoints")
    assert saved is not None and 2 <= saved.step < STEPS, "a checkpoint of the step the run stopped after"
    [segment] = read_segments(run_dir)
    assert segment.outcome == "interrupted" and segment.end_step == saved.step, segment
    assert not read_events(run_dir / "failover_events.jsonl", "decider_lost"), "an interrupt is not a death"


# The workers are slowed (a fault that changes no number; policy=keep acts on no slowdown) so that the run is
# still going when the new decider has adopted it and node 0 is then killed
APART = (("trainer.role=decider",), ("trainer.role=agent", "trainer.node_rank=0"),
         ("trainer.role=agent", "trainer.node_rank=1"))


def test_a_decider_on_a_host_of_its_own_is_replaced_without_a_stop_and_node_0_lost_is_a_degrade(
        tmp_path, teacher_file, reference):
    """Three launchers: the decider's (trainer.role=decider: the store and the decider, no device, no worker)
    and two nodes that run agents only. The decider is SIGKILLed: its launcher starts the next, which adopts
    the running segment. Then node 0's launcher is killed with its workers: node 0 is lost like any node, a
    DEGRADE onto node 1's devices, and the run learns what one device learns."""
    run_dir, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    nodes = start_nodes(run_dir, teacher_file, endpoint, "checkpoint.every=2", "failover.node_timeout_s=3",
                        "policy=keep", "injection.faults=[{kind:slow_compute,rank:0,start:1,seconds:0.8}]",
                        launchers=APART)
    decider_host, node0, node1 = nodes
    try:
        events = run_dir / "failover_events.jsonl"
        wait_for(lambda: events.is_file() and any(e["step"] >= 2 for e in read_events(events, "checkpoint_saved")),
                 "the checkpoint of step 2", nodes, timeout_s=300)
        first = decider_epoch(run_dir)
        assert first["epoch"] == 1 and first["pid"] not in (0, *(n.pid for n in nodes))
        os.kill(first["pid"], signal.SIGKILL)
        wait_for(lambda: read_events(events, "segment_adopted"), "the new decider to adopt the segment", nodes)
        os.killpg(node0.pid, signal.SIGKILL)  # node 0's agent and its workers; the store is elsewhere
        node0.wait(timeout=60)
        outputs = [node.communicate(timeout=400)[0] for node in (decider_host, node1)]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    for node, output in zip((decider_host, node1), outputs):
        assert node.returncode == 0, output[-4000:]
    assert "on local devices" not in outputs[0], "the decider's host runs no worker"
    [adopted] = read_events(events, "segment_adopted")
    assert adopted["segment"] == 0 and adopted["epoch"] == 2 and adopted["nodes"] == [0, 1], adopted

    [lost] = read_events(events, "node_lost")
    assert lost["node"] == 0, lost
    [decision] = [e for e in read_events(events, "decision") if e["action"] == "degrade"]
    assert decision["cause"] == "node_lost", decision
    from synapse.failover import read_segments
    segments = read_segments(run_dir)
    assert segments[0].start_step == 0 and segments[-1].devices == [2, 3] and segments[-1].outcome == "finished", \
        segments
    assert_identical_states(final_student_state(run_dir), reference)
    # No two writers: the adopted workers (epoch 1) committed up to the step the DEGRADE resumed from, the new
    # decider's (epoch 2) only after it
    resumed_at, commits = segments[-1].start_step, commit_epochs(run_dir)
    assert {epoch for _, epoch in commits} == {1, 2} and (STEPS, 2) in commits, commits
    assert all(step <= resumed_at for step, epoch in commits if epoch == 1), (commits, resumed_at)
    assert all(step > resumed_at for step, epoch in commits if epoch == 2), (commits, resumed_at)


@pytest.mark.extended  # three more interpreters on a 2-core machine (~2 min); [killed] covers two nodes by default
def test_three_launchers_as_three_nodes_keep_their_workers_when_the_decider_is_killed(tmp_path, teacher_file,
                                                                                      reference):
    """Three nodes of one CPU slot each (role=auto: node 0's launcher keeps the decider): the decider SIGKILLed
    after step 2's checkpoint; all three agents re-attach, the new decider adopts the segment, no worker stops,
    and the run learns what one device learns; every commit is epoch 1's."""
    run_dir, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    nodes = start_nodes(run_dir, teacher_file, endpoint, "checkpoint.every=2", devices=1,
                        launchers=tuple((f"trainer.node_rank={n}",) for n in range(3)))
    try:
        events = run_dir / "failover_events.jsonl"
        wait_for(lambda: events.is_file() and any(e["step"] >= 2 for e in read_events(events, "checkpoint_saved")),
                 "the checkpoint of step 2", nodes, timeout_s=300)
        os.kill(decider_epoch(run_dir)["pid"], signal.SIGKILL)
        outputs = [node.communicate(timeout=400)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-4000:]
    assert sorted(e["node"] for e in read_events(events, "decider_reattached")) == [0, 1, 2]
    [adopted] = read_events(events, "segment_adopted")
    assert adopted["segment"] == 0 and adopted["nodes"] == [0, 1, 2], adopted
    from synapse.failover import read_segments
    assert len(read_segments(run_dir)) == 1 and not read_events(events, "relaunch")
    commits = commit_epochs(run_dir)
    assert (STEPS, 1) in commits and {epoch for _, epoch in commits} == {1}, commits
    assert_identical_states(final_student_state(run_dir), reference)


def test_a_decider_on_a_host_of_its_own_plans_with_profiles_taken_by_node_0s_agent(tmp_path, teacher_file):
    """Issue #36: a decider host has none of the run's devices (or other ones), so with partition=auto it must
    not profile the models on its own host. Three launchers (role=decider and two agent nodes of one CPU slot
    each) with an empty profile cache: every profile the decider plans with is measured by node 0's agent, in
    its own process, and handed over the run's store; the decider's launcher measures nothing."""
    run_dir, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    nodes = start_nodes(run_dir, teacher_file, endpoint, "partition=auto", launchers=APART, devices=1)
    outputs = outputs_of(nodes, timeout=400)
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-4000:]
    decider_host, node0, node1 = outputs
    # the profiler's own lines: said by the process that measures (or finds in its cache) a profile
    assert "profile written to" not in decider_host and "cached profile" not in decider_host, decider_host[-4000:]
    assert "profile written to" in node0 and "profile written to" not in node1
    taken = read_events(run_dir / "failover_events.jsonl", "profile_taken")
    assert {(e["model"], e["role"]) for e in taken} >= {("resnet_micro", "teacher"), ("resnet_micro", "student")}
    assert {(e["node"], e["pid"]) for e in taken} == {(0, nodes[1].pid)}, taken  # node 0's launcher runs its agent
    assert "profiled by node 0's agent" in decider_host
    plan = json.loads((run_dir / "plan.json").read_text())
    for role in ("teacher", "student"):  # the planner read the profiles node 0 measured, kept in the cache
        source = Path(plan["profiles"][role])
        assert source.is_file() and source.name in {e["name"] for e in taken}, (source, taken)
