"""The pipeline learns exactly what the single-device trainer learns.

Same seed, same data order, same M micro-batches: the single-device trainer accumulates
gradients over the micro-batches; the pipeline runs them through K CPU ranks (gloo) with
GPipe or 1F1B. Every student tensor and every optimizer state must end bit-identical.
"""
from __future__ import annotations

import json

import pytest

from synapse.app import run
from synapse.engine import distil_on_one_device

from .helpers import SHARED_GPU, assert_close_states, assert_identical_states, compose_config, final_student_state

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

COMPILED_ON_GPU_TOLERANCE = 1e-4  # of each tensor's scale after 4 steps; the H200 misses it by far (open, docs/gpu.md)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, teacher_file):
    run_dir = tmp_path_factory.mktemp("single")
    distil_on_one_device(compose_config(run_dir, [f"teacher.checkpoint={teacher_file}", "trainer.devices=1"]), run_dir,
                         log=lambda m: None)
    return final_student_state(run_dir)


@pytest.mark.parametrize("devices,schedule,partition", [
    (2, "1f1b", None),
    (2, "gpipe", ("[3,8]", "[9,2]")),
    (3, "1f1b", ("[5,3,3]", "[2,2,7]")),
    (3, "gpipe", None),
])
def test_pipeline_matches_single_device(tmp_path, teacher_file, reference, devices, schedule, partition):
    overrides = [f"teacher.checkpoint={teacher_file}", f"trainer.devices={devices}", f"pipeline={schedule}",
                 "pipeline.microbatches=4"]
    if partition:
        overrides += ["partition=manual", f"partition.teacher={partition[0]}", f"partition.student={partition[1]}"]
    run(compose_config(tmp_path, overrides), log=lambda m: None)
    assert_identical_states(final_student_state(tmp_path), reference)


def test_a_channels_last_pipeline_matches_a_channels_last_single_device(tmp_path, teacher_file):
    """trainer.channels_last=true on the CPU: the stages send 4-D activations as NHWC views
    (pipeline.wire), as on a GPU, and the pipeline still learns bit for bit what one device learns."""
    common = [f"teacher.checkpoint={teacher_file}", "trainer.channels_last=true"]
    single = tmp_path / "single"
    distil_on_one_device(compose_config(single, common + ["trainer.devices=1"]), single, log=lambda m: None)
    piped = tmp_path / "pipeline"
    run(compose_config(piped, common + ["trainer.devices=2", "pipeline=1f1b", "pipeline.microbatches=4"]),
        log=lambda m: None)
    assert_identical_states(final_student_state(piped), final_student_state(single))


def test_one_device_runs_supervised_and_learns_what_the_single_device_loop_learns(tmp_path, teacher_file, reference):
    """K = 1 takes the one run path: the pipeline runtime under the supervisor (its records: the
    experiment summary, the event log, the segment record, heartbeats), learning bit for bit what
    the single-device loop learns."""
    run(compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", "trainer.devices=1"]), log=lambda m: None)
    assert_identical_states(final_student_state(tmp_path), reference)
    experiment = json.loads((tmp_path / "experiment_summary.json").read_text())
    assert [(s["devices"], s["outcome"]) for s in experiment["segments"]] == [([0], "finished")]
    assert (tmp_path / "failover_events.jsonl").is_file() and (tmp_path / "live" / "rank_0.json").is_file()


def test_a_pipeline_of_compiled_stages_learns_what_one_device_learns(tmp_path, teacher_file, reference):
    """pipeline.compiler=aot_eager: every block goes through torch.compile's graph capture and AOT
    autograd (the path inductor takes on a GPU, with eager kernels), across a 1F1B pipeline of 2
    stages and 4 micro-batches, and the student ends where one eager device ends: bit for bit on CPU
    ranks; on a GPU within COMPILED_ON_GPU_TOLERANCE, with SGD (docs/gpu.md says why)."""
    overrides = [f"teacher.checkpoint={teacher_file}", "trainer.devices=2", "pipeline=1f1b",
                 "pipeline.microbatches=4", "pipeline.compiler=aot_eager"]
    if SHARED_GPU is None:
        run(compose_config(tmp_path, overrides), log=lambda m: None)
        assert_identical_states(final_student_state(tmp_path), reference)
        return
    # On a GPU, AOT autograd's decompositions (batch norm's among them) round unlike the eager
    # kernels. Under AdamW a rounding difference on a near-zero gradient moves that weight by up to
    # the learning rate, so the GPU form compares SGD runs, where rounding stays rounding.
    sgd = ["optim.name=sgd"]
    single, piped = tmp_path / "single", tmp_path / "pipeline"
    distil_on_one_device(compose_config(single, [f"teacher.checkpoint={teacher_file}", "trainer.devices=1", *sgd]),
                         single, log=lambda m: None)
    run(compose_config(piped, overrides + sgd), log=lambda m: None)
    assert_close_states(final_student_state(piped), final_student_state(single), COMPILED_ON_GPU_TOLERANCE)
