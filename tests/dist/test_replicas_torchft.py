"""torchft carries the replica level (failover.replica_engine=torchft): R = 2 x K = 1 on CPU ranks (gloo), each
replica a launch of its own under the supervisor's lighthouse.

The reference is the single-device loop over the same global batches (tests/dist/test_replicas.py); the
replicas' weights match it within 1e-5 of each tensor's scale (a LayerNorm student, SGD: the same
tolerance as the restart path's replicas). A replica SIGKILLed mid-run is respawned by its own agent
and heals from its peer; the survivor goes on in the same process, takes the whole batch while alone,
and the step that met the dead peer is done again: nothing learnt changes.
"""
from __future__ import annotations

import json

import pytest

from synapse.app import run
from synapse.failover import read_segments
from synapse.rundir import events_path

from .helpers import SHARED_GPU, final_student_state
from .test_replicas import COMMON, VIT, assert_close_states, compose_config, losses, reference_run

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600),
              pytest.mark.skipif(SHARED_GPU is not None, reason="torchft's replica groups run on gloo CPU ranks here")]

TORCHFT = ["failover.replica_engine=torchft", "trainer.devices=2", "trainer.replicas=2", "pipeline.microbatches=2"]


def events(run_dir, name: str) -> list[dict]:
    records = [json.loads(line) for line in events_path(run_dir).read_text().splitlines()]
    return [r for r in records if r.get("event") == name]


def test_torchft_replicas_learn_what_one_device_learns(tmp_path, teacher_file):
    """Two replicas of one CPU rank under torchft's quorum: every step's global batch cut in two, the
    gradients summed through the Managers' process groups, committed by vote; one device's weights."""
    reference = reference_run(tmp_path / "reference", teacher_file, 4, VIT)
    run_dir = tmp_path / "torchft"
    run(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", *COMMON, *VIT, *TORCHFT]), log=print)
    assert_close_states(final_student_state(run_dir), reference)
    assert losses(run_dir) == pytest.approx(losses(tmp_path / "reference"), rel=1e-5)
    assert [s.outcome for s in read_segments(run_dir)] == ["finished"]
