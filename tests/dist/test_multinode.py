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
