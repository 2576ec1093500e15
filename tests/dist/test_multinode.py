"""Two launchers on one machine act as two nodes of one run (c10d rendezvous)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from synapse.launch import free_port

from .helpers import BASE_OVERRIDES, assert_identical_states, compose_config, final_student_state

pytestmark = [pytest.mark.dist, pytest.mark.timeout(420)]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.long  # test_multinode_failover's kill on node 1 also ends bit-identical (20-minute budget)
def test_two_nodes_train_like_one_node(tmp_path, teacher_file):
    common = [*BASE_OVERRIDES, f"teacher.checkpoint={teacher_file}", f"cache_dir={tmp_path}/cache"]
    port = free_port()
    two_nodes = tmp_path / "two_nodes"
    nodes = [
        subprocess.Popen([sys.executable, "train.py", *common, f"run_dir={two_nodes}", "trainer.devices=1",
                          "trainer.nodes=2", f"trainer.node_rank={rank}", f"trainer.rdzv_endpoint=127.0.0.1:{port}",
                          "trainer.rdzv_id=two-node-test"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-3000:]

    from synapse.app import run

    one_node = tmp_path / "one_node"
    run(compose_config(one_node, [f"teacher.checkpoint={teacher_file}", "trainer.devices=2"]), log=lambda m: None)
    assert_identical_states(final_student_state(two_nodes), final_student_state(one_node))


def test_node_local_run_directories_are_refused_before_the_first_step_naming_the_fix(tmp_path, teacher_file):
    """Issue #36, item 5: two launchers as two nodes, each with its own run directory (as on nodes
    without a shared filesystem). Before: the run trained until the first restart and then died of
    a raw FileNotFoundError for the other node's checkpoint shard. Now the meeting fails: node 1
    names its run directory and the fix, node 0 says node 1 left nothing in its run directory."""
    common = [*BASE_OVERRIDES, f"teacher.checkpoint={teacher_file}", f"cache_dir={tmp_path}/cache",
              "trainer.devices=1", "trainer.nodes=2", f"trainer.rdzv_endpoint=127.0.0.1:{free_port()}",
              "trainer.rdzv_timeout_s=15"]  # node 1 must reach the store while node 0 waits
    dirs = [tmp_path / f"node{rank}" for rank in (0, 1)]
    nodes = [subprocess.Popen([sys.executable, "train.py", *common, f"run_dir={run_dir}", f"trainer.node_rank={rank}"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank, run_dir in enumerate(dirs)]
    outputs = [node.communicate(timeout=180)[0] for node in nodes]
    assert all(node.returncode != 0 for node in nodes), outputs
    assert (f"node_rank 1: this node's run directory {dirs[1]} is not node 0's: it holds another run key"
            in outputs[1]), outputs[1][-3000:]
    assert "Fix: put hydra.run.dir on a filesystem every node sees" in outputs[1]
    assert f"Node(s) [1] left nothing in this run directory ({dirs[0]})" in outputs[0], outputs[0][-3000:]
    for run_dir in dirs:  # refused before the first step: no step was recorded, no checkpoint written
        assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
