"""The "bad inputs" and "security" rows of the reliability matrix (docs/reliability.md), issue #8's
and issue #19's (values that passed validation and then failed later with raw errors, or silently).

Every bad input is refused with a ValueError subclass whose message names the problem and a fix,
*before any worker starts*: pipeline cases go through ``synapse.app.run`` with two CPU
devices and then check that the run dir holds no ``logs/launch_*`` directory (the elastic launcher
creates one per launch before it spawns a worker). Security rows prove that checkpoints, weight
files and profiles are read without running code from them.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from hydra.errors import MissingConfigException

from synapse import checkpoint as ckpt
from synapse.app import run
from synapse.config import ConfigError, validate
from synapse.data import DataError, dataset_info, imagenet100_synsets
from synapse.engine import optimizer_state_by_name
from synapse.models import ModelError, build_model
from synapse.partitioning import PROFILE_COLUMNS, ProfileError, load_profile_csv
from synapse.profiling import ProfileRequest, cached_profile_path, resolve_precision
from synapse.rundir import RunDirUnusableError

# Two CPU ranks: any of these configs would start a pipeline of two worker processes.
PIPELINE = ("trainer.accelerator=cpu", "trainer.devices=2")
DIGITS = dataset_info("digits", image_size=32)  # the default data: 10 classes, 3 channels, 32 px
HEADER = ",".join(PROFILE_COLUMNS)


def refused_before_launch(make_config, tiny_run, tmp_path, *overrides: str, error=ValueError) -> str:
    """Run a two-rank pipeline config that must be refused; return the error message.

    Asserts the error type and that no worker was launched (no ``logs/launch_*`` in the run dir).
    """
    run_dir = tmp_path / "run"
    cfg = make_config(*tiny_run, *PIPELINE, *overrides, run_dir=run_dir)
    with pytest.raises(error) as caught:
        run(cfg, log=lambda line: None)
    assert not list(run_dir.glob("logs/launch_*")), "a worker was launched for a bad input"
    return str(caught.value)


def assert_names(message: str, *fragments: str) -> None:
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"


# ----------------------------------------------------------------------------- config values

def test_unknown_config_group_member_lists_the_available_ones(make_config):
    with pytest.raises(MissingConfigException) as caught:  # Hydra, while composing: nothing has run
        make_config("student=resnet9000")
    assert_names(str(caught.value), "Could not find 'student/resnet9000'", "Available options in 'student'",
                 "resnet_micro")


def test_unknown_model_name(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "teacher.name=vit_gigantic", error=ConfigError)
    assert_names(message, "teacher.name: unknown model 'vit_gigantic'", "Fix: choose one of", "vit_large")


def test_partition_lengths_that_do_not_match_the_device_count(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "partition=manual", "partition.teacher=[6,5]",
                                    "partition.student=[4,4,3]", error=ConfigError)
    assert_names(message, "partition.student: 3 stages given for 2 devices", "Fix: give exactly 2 block counts")


@pytest.mark.parametrize("role, counts", [("teacher", "[6,6]"), ("student", "[5,5]")])
def test_block_counts_that_do_not_sum_to_the_model(make_config, tiny_run, tmp_path, role, counts):
    other = "student" if role == "teacher" else "teacher"
    message = refused_before_launch(make_config, tiny_run, tmp_path, "partition=manual",
                                    f"partition.{role}={counts}", f"partition.{other}=[6,5]", error=ConfigError)
    total = sum(json.loads(counts))
    assert_names(message, f"partition.{role}: {json.loads(counts)} covers {total} blocks but the {role} "
                          f"resnet_micro has 11", f"Fix: make the counts sum to 11, e.g. partition.{role}=[6, 5]")


@pytest.mark.parametrize("partition", ["even", "auto"])
def test_more_stages_than_blocks(make_config, tiny_run, tmp_path, partition):
    # resnet_micro has 11 blocks; 12 CPU ranks would leave a stage without one.
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"partition={partition}", "trainer.devices=12",
                                    error=ConfigError)
    assert_names(message, "trainer.devices: 12 pipeline stages but the teacher resnet_micro has only 11 blocks",
                 "Fix: use at most 11 devices")


def test_more_stages_than_blocks_in_a_manual_partition(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "partition=manual", "trainer.devices=12",
                                    f"partition.teacher=[{','.join(['1'] * 12)}]",
                                    f"partition.student=[{','.join(['1'] * 12)}]", error=ConfigError)
    assert_names(message, "12 pipeline stages but the teacher resnet_micro has only 11 blocks")


def test_duplicate_device_ids(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.devices=[1,1]", error=ConfigError)
    assert_names(message, "trainer.devices: duplicate device ids in [1, 1]", "Fix: list each device once")


@pytest.mark.parametrize("devices, problem, fix", [
    ("[-1,0]", "negative device id in [-1, 0]", "device ids start at 0"),
    ("[0,100]", "CPU slot ids [100] are out of range (slots are 0..63)",
     "number CPU slots from 0, e.g. trainer.devices=2"),
])
def test_out_of_range_cpu_device_ids(make_config, tiny_run, tmp_path, devices, problem, fix):
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"trainer.devices={devices}", error=ConfigError)
    assert_names(message, f"trainer.devices: {problem}", f"Fix: {fix}")


def test_out_of_range_gpu_ids(make_config, tiny_run, monkeypatch):
    # Pretend to be a machine with one GPU: id 3 does not exist there.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError) as caught:
        validate(make_config(*tiny_run, "trainer.accelerator=cuda", "trainer.devices=[0,3]"))
    assert_names(str(caught.value), "trainer.devices: GPU ids [3] do not exist (this machine has 1: 0..0)",
                 "Fix: choose ids below 1")


def test_microbatches_that_do_not_divide_the_batch(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "pipeline.microbatches=5", error=ConfigError)
    assert_names(message, "pipeline.microbatches: 5 micro-batches do not divide data.batch_size=64",
                 "Fix: choose a divisor of the batch size")


@pytest.mark.parametrize("override, problem", [
    ("kd.T=0", "kd.T: must be > 0, got 0.0"),
    ("kd.T=-2", "kd.T: must be > 0, got -2.0"),
    ("data.batch_size=0", "data.batch_size: must be > 0, got 0"),
    ("data.batch_size=-64", "data.batch_size: must be > 0, got -64"),
    ("optim.lr=0", "optim.lr: must be > 0, got 0.0"),
    ("optim.lr=-0.01", "optim.lr: must be > 0, got -0.01"),
])
def test_zero_or_negative_temperature_batch_size_learning_rate(make_config, tiny_run, tmp_path, override, problem):
    message = refused_before_launch(make_config, tiny_run, tmp_path, override, error=ConfigError)
    key = override.split("=")[0]
    assert_names(message, problem, f"Fix: set {key} to a value > 0")


def test_injection_aimed_at_a_rank_that_does_not_exist(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "injection.faults=[{kind:raise,rank:2,step:1}]",
                                    error=ConfigError)
    assert_names(message, "injection.faults: injection.faults[0] targets rank 2 but the run has 2 rank(s)",
                 "Fix: see conf/injection/")


@pytest.mark.parametrize("override, key", [
    ("optim.lr=nan", "optim.lr"),
    ("optim.lr=inf", "optim.lr"),
    ("kd.T=nan", "kd.T"),
    ("trainer.collective_timeout_s=nan", "trainer.collective_timeout_s"),
    ("monitor.hang_timeout_s=nan", "monitor.hang_timeout_s"),  # silently disabled the hang watchdog
    ("optim.weight_decay=inf", "optim.weight_decay"),
    ("partition.alphas=[1.0,nan]", "partition.alphas[1]"),
    ("partition.link_bandwidth_gbps=inf", "partition.link_bandwidth_gbps"),
    ("failover.detector.threshold=nan", "failover.detector.threshold"),
    ("failover.estimator.ema_weight=-inf", "failover.estimator.ema_weight"),
    ("policy.params.min_saving_s=nan", "policy.params.min_saving_s"),
])
def test_every_float_must_be_finite(make_config, tiny_run, tmp_path, override, key):
    message = refused_before_launch(make_config, tiny_run, tmp_path, override, error=ConfigError)
    assert_names(message, f"{key}: must be a finite number, got", "Fix: set", "nan and inf are never valid")


@pytest.mark.parametrize("gamma", ["-1", "0", "1.5"])
def test_a_step_decay_factor_outside_0_1_is_refused(make_config, tiny_run, tmp_path, gamma):
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"optim.gamma={gamma}", error=ConfigError)
    assert_names(message, "optim.gamma: must be in (0, 1]", f"got {float(gamma)}", "Fix: use e.g. optim.gamma=0.1")


def test_an_absurd_learning_rate_is_refused(make_config, tiny_run, tmp_path):
    # 1e300 is finite, but torch cannot cast it to float32 (a raw RuntimeError in every rank's first step)
    message = refused_before_launch(make_config, tiny_run, tmp_path, "optim.lr=1e300", error=ConfigError)
    assert_names(message, "optim.lr: 1e+300 is implausibly large (above 1000)", "Fix: use a learning rate")


@pytest.mark.parametrize("spares, problem", [
    ("[-1]", "trainer.spare_devices: negative device id in [-1]. Fix: device ids start at 0"),
    ("[70]", "trainer.spare_devices: CPU slot ids [70] are out of range (slots are 0..63)"),
])
def test_a_spare_device_that_cannot_exist_is_refused(make_config, tiny_run, tmp_path, spares, problem):
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"trainer.spare_devices={spares}",
                                    error=ConfigError)
    assert_names(message, problem)


def test_an_unknown_trainer_role_and_a_role_on_one_node_are_refused(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.role=leader", "trainer.nodes=2",
                                    "trainer.rdzv_endpoint=127.0.0.1:29999", error=ConfigError)
    assert_names(message, "trainer.role: 'leader' is not one of auto, decider, agent", "Fix: use auto")
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.role=decider", error=ConfigError)
    assert_names(message, "trainer.role: decider splits a run across nodes, but trainer.nodes=1",
                 "Fix: set trainer.nodes")


def test_a_node_rank_beyond_the_node_count_is_refused(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.node_rank=3", error=ConfigError)
    assert_names(message, "trainer.node_rank: must be in 0..0 for trainer.nodes=1, got 3", "Fix: number the nodes")


@pytest.mark.parametrize("overrides, where", [
    (("data.batch_size=1", "pipeline.microbatches=1"), "data.batch_size=1 / pipeline.microbatches=1"),
    (("data.batch_size=4", "pipeline.microbatches=4"), "data.batch_size=4 / pipeline.microbatches=4"),
])
def test_one_sample_micro_batches_with_batch_norm_are_refused_before_profiling(make_config, tiny_run, tmp_path,
                                                                               overrides, where):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "partition=auto", *overrides, error=ConfigError)
    assert_names(message, f"data.batch_size: {where} gives micro-batches of one sample", "BatchNorm",
                 "Fix: use at least 2 samples per micro-batch")
    assert not (tmp_path / "run").exists(), "refused before the profiler (or anything) ran"


@pytest.mark.parametrize("endpoint", ["10.255.255.1:29500", "example.com:29500"])
def test_a_one_node_run_with_an_outward_rendezvous_endpoint_is_refused(make_config, tiny_run, tmp_path, endpoint):
    # One node listens on loopback only (the rendezvous store must not be reachable from other
    # hosts): an outward address would leave the workers unable to meet, after a timeout.
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"trainer.rdzv_endpoint={endpoint}",
                                    error=ConfigError)
    assert_names(message, f"trainer.rdzv_endpoint: {endpoint}: a one-node run listens on 127.0.0.1 only",
                 "Fix: use 127.0.0.1:29500 or leave trainer.rdzv_endpoint unset")


# ----------------------------------------------------------------------------- data root

def test_missing_data_root(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "data=imagenet100", error=ConfigError)
    assert_names(message, "data.root: ImageNet100 needs a data root", "Fix: set data.root=/path/to/imagenet")


def test_data_root_that_does_not_exist(make_config, tiny_run, tmp_path):
    root = tmp_path / "imagenet"
    message = refused_before_launch(make_config, tiny_run, tmp_path, "data=imagenet100", f"data.root={root}",
                                    error=DataError)
    assert_names(message, f"ImageNet100 root '{root}' does not exist", "pass the folder holding train/ and val/")


def test_data_root_of_the_wrong_layout(make_config, tiny_run, tmp_path):
    root = tmp_path / "imagenet"
    (root / "train").mkdir(parents=True)
    (root / "validation").mkdir()
    message = refused_before_launch(make_config, tiny_run, tmp_path, "data=imagenet100", f"data.root={root}",
                                    error=DataError)
    assert_names(message, "has no val/ folder (it holds: train, validation)",
                 "expected <root>/train/<synset>/*.JPEG and <root>/val/<synset>/*.JPEG")


def test_data_root_that_is_a_split_folder_points_to_its_parent(make_config, tiny_run, tmp_path):
    split = tmp_path / "imagenet" / "train"
    for synset in imagenet100_synsets()[:3]:
        (split / synset).mkdir(parents=True)
    message = refused_before_launch(make_config, tiny_run, tmp_path, "data=imagenet100", f"data.root={split}",
                                    error=DataError)
    assert_names(message, "looks like a split folder itself", f"use its parent '{split.parent}' as data.root")


# ----------------------------------------------------------------------------- teacher weights

def save_weights(path: Path, name: str, num_classes: int = DIGITS.num_classes) -> Path:
    torch.save(build_model(name, num_classes, DIGITS.in_chans, DIGITS.image_size).state_dict(), path)
    return path


@pytest.mark.slow  # builds a second model to save its weights
def test_teacher_checkpoint_of_another_architecture(make_config, tiny_run, tmp_path):
    weights = save_weights(tmp_path / "vit.pt", "vit_micro")
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"teacher.checkpoint={weights}",
                                    error=ModelError)
    assert_names(message, f"teacher.checkpoint weights '{weights}' are for another architecture",
                 "the file holds vit_micro weights but teacher.name=resnet_micro",
                 "Fix: pick the model name the file was trained with (teacher=vit_micro)")


def test_teacher_checkpoint_of_another_width(make_config, tiny_run, tmp_path):
    weights = save_weights(tmp_path / "wider.pt", "resnet_mini")  # same tensor names, other shapes
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"teacher.checkpoint={weights}",
                                    error=ModelError)
    assert_names(message, "the architecture differs: the file holds resnet_mini weights but teacher.name=resnet_micro",
                 "(teacher=resnet_mini)")


def test_teacher_checkpoint_of_another_class_count(make_config, tiny_run, tmp_path):
    weights = save_weights(tmp_path / "imagenet100_head.pt", "resnet_micro", num_classes=100)
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"teacher.checkpoint={weights}",
                                    error=ModelError)
    assert_names(message, "fc.weight has shape (100, 128) in the file but (10, 128) in the model",
                 "the file was trained for 100 classes, the configured data has 10",
                 "Fix: give weights trained on this data set")


def test_student_init_is_checked_the_same_way(make_config, tiny_run, tmp_path):
    weights = save_weights(tmp_path / "vit.pt", "vit_micro")
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"student.init={weights}", error=ModelError)
    assert_names(message, "student.init weights", "student.name=resnet_micro", "(student=vit_micro)")


@pytest.mark.slow  # run() goes as far as the teacher's load
def test_a_truncated_cached_teacher_names_the_cache_entry_to_delete(make_config, tiny_run, tmp_path, monkeypatch):
    from synapse.engine import teacher as teacher_module

    cfg = make_config(*tiny_run, *("trainer.accelerator=cpu", "trainer.devices=2"), f"cache_dir={tmp_path}/cache",
                      run_dir=tmp_path / "run")
    cached = tmp_path / "cache" / "teachers" / f"{cfg.teacher.name}-{teacher_module.teacher_cache_key(cfg)}.pt"
    cached.parent.mkdir(parents=True)
    torch.save(build_model(cfg.teacher.name, 10, 3, 32).state_dict(), cached)
    cached.write_bytes(cached.read_bytes()[: cached.stat().st_size // 2])  # a copy cut short
    with pytest.raises(ModelError) as caught:
        run(cfg, log=lambda line: None)
    assert_names(str(caught.value), f"the cached teacher {cached}", f"Fix: delete that cache entry (rm {cached})")
    assert "teacher.checkpoint weights" not in str(caught.value), "blamed on a setting the user never made"
    assert not list((tmp_path / "run").glob("logs/launch_*"))


# ----------------------------------------------------------------------------- checkpoints

def write_student_checkpoint(root: Path, step: int, student: str = "resnet_micro", num_classes: int = 10,
                             meta_student: str | None = "resnet_micro") -> Path:
    """A checkpoint as the single-device trainer writes it: shard 0, state.pt, manifest."""
    model = build_model(student, num_classes, DIGITS.in_chans, DIGITS.image_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tmp = ckpt.begin_checkpoint(root, step)
    ckpt.save_tensor_file({"model": model.state_dict(),
                           "optim": optimizer_state_by_name(optimizer, dict(model.named_parameters()))},
                          tmp / ckpt.shard_name(0))
    ckpt.save_tensor_file({"step": step}, tmp / ckpt.STATE_FILE)
    meta = {"world_size": 1, **({"student": meta_student} if meta_student else {})}
    return ckpt.commit_checkpoint(tmp, step, meta=meta)


def edit_manifest(path: Path, **changes) -> None:
    manifest = json.loads((path / ckpt.MANIFEST).read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key)
        else:
            manifest[key] = value
    (path / ckpt.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("resume", ["path", "auto"])
@pytest.mark.parametrize("version, why", [
    (ckpt.FORMAT_VERSION + 1, "it was written by a newer Synapse: update this installation"),
    ("one", "'one' is not a version any Synapse release wrote"),
])
def test_checkpoint_of_an_incompatible_version(make_config, tiny_run, tmp_path, resume, version, why):
    path = write_student_checkpoint(tmp_path / "run" / "checkpoints", 8)
    edit_manifest(path, format_version=version)
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"resume={path if resume == 'path' else 'auto'}",
                                    error=ckpt.IncompatibleCheckpointError)
    assert_names(message, f"{path} has checkpoint format version {version!r}, this Synapse reads version "
                          f"{ckpt.FORMAT_VERSION}", why, "start afresh with resume=null in a new run dir")


def test_checkpoint_without_a_version_field_is_version_1_and_still_resumable(make_config, tiny_run, tmp_path):
    # Checkpoints written before the manifest recorded a version: same format, so they stay readable.
    path = write_student_checkpoint(tmp_path / "run" / "checkpoints", 8)
    edit_manifest(path, format_version=None)
    assert "format_version" not in json.loads((path / ckpt.MANIFEST).read_text())
    for resume in (str(path), "auto"):
        validate(make_config(*tiny_run, *PIPELINE, f"resume={resume}", run_dir=tmp_path / "run"))
    assert ckpt.check_resumable(path, "resnet_micro")["step"] == 8


@pytest.mark.parametrize("resume", ["path", "auto"])
def test_checkpoint_of_another_student(make_config, tiny_run, tmp_path, resume):
    path = write_student_checkpoint(tmp_path / "run" / "checkpoints", 8, student="resnet_mini",
                                    meta_student="resnet_mini")
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"resume={path if resume == 'path' else 'auto'}",
                                    error=ckpt.IncompatibleCheckpointError)
    assert_names(message, f"{path} holds the student 'resnet_mini' but this run's student is 'resnet_micro'",
                 "set student=resnet_mini to continue that run")


def test_checkpoint_of_another_student_without_its_name_is_caught_by_shapes(make_config, tiny_run, tmp_path):
    path = write_student_checkpoint(tmp_path / "ckpts", 8, student="vit_micro", meta_student=None)
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"resume={path}",
                                    error=ckpt.IncompatibleCheckpointError)
    assert_names(message, f"{path} was written for another student model than 'resnet_micro'",
                 "start afresh with resume=null")


def test_checkpoint_of_another_class_count(make_config, tiny_run, tmp_path):
    path = write_student_checkpoint(tmp_path / "ckpts", 8, num_classes=100)
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"resume={path}",
                                    error=ckpt.IncompatibleCheckpointError)
    assert_names(message, "fc.weight has shape (100, 128) in the checkpoint but (10, 128) in the configured model",
                 "resume with the settings that wrote it")


def test_an_untouched_checkpoint_passes_every_check(make_config, tiny_run, tmp_path):
    # The control for the refusals around it: the same writer, unedited, is resumable both ways.
    path = write_student_checkpoint(tmp_path / "run" / "checkpoints", 8)
    for resume in (str(path), "auto"):
        validate(make_config(*tiny_run, *PIPELINE, f"resume={resume}", run_dir=tmp_path / "run"))


def test_damaged_checkpoint_given_by_path(make_config, tiny_run, tmp_path):
    path = write_student_checkpoint(tmp_path / "ckpts", 8)
    state = path / ckpt.STATE_FILE
    state.write_bytes(state.read_bytes()[:-10])
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"resume={path}", error=ckpt.CheckpointError)
    assert_names(message, "state.pt is corrupt or truncated (checksum mismatch)")


def test_resume_auto_still_skips_a_damaged_checkpoint_for_the_previous_one(make_config, tiny_run, tmp_path):
    # Damage is what resume=auto recovers from (a crash mid-write): only *incompatible* ones stop the run.
    root = tmp_path / "run" / "checkpoints"
    write_student_checkpoint(root, 4)
    (write_student_checkpoint(root, 8) / ckpt.MANIFEST).write_text("{torn")
    validate(make_config(*tiny_run, *PIPELINE, "resume=auto", run_dir=tmp_path / "run"))
    assert ckpt.latest_valid_checkpoint(root).step == 4


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_checkpoint_with_non_finite_tensors_is_never_written(tmp_path, bad):
    root = tmp_path / "checkpoints"
    good = ckpt.begin_checkpoint(root, 2)
    state = {"model": {"fc.weight": torch.ones(3, 3)}, "optim": {"fc.weight": {"exp_avg": torch.zeros(3, 3)}}}
    ckpt.save_tensor_file(state, good / ckpt.shard_name(0))
    ckpt.commit_checkpoint(good, 2)
    state["optim"]["fc.weight"]["exp_avg"][1, 2] = bad  # diverged optimizer state, finite weights
    tmp = ckpt.begin_checkpoint(root, 3)
    with pytest.raises(ckpt.NonFiniteCheckpointError) as caught:
        ckpt.save_tensor_file(state, tmp / ckpt.shard_name(0))
    assert_names(str(caught.value), "tensor 'optim.fc.weight.exp_avg' holds NaN or infinite values",
                 "Fix: lower optim.lr")
    assert not (tmp / ckpt.shard_name(0)).exists()
    assert [r.step for r in ckpt.list_checkpoints(root)] == [2]


# ----------------------------------------------------------------------------- profile CSV

def write_profile(path: Path, rows: list[str], header: str = HEADER) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize("header, rows, where, problem", [
    ("layer,forward_time_ms,backward_time_ms", ["b0,1,2"], "the header (line 1)",
     "missing columns ['input_activation_size_kb', 'output_activation_size_kb', 'accum_activation_size_kb', "
     "'parameter_size_kb']"),
    (HEADER, ["b0,1,2,3,4,5,6", "b1,-0.5,2,3,4,5,6"], "line 3, layer 'b1', column 'forward_time_ms'",
     "value -0.5 is negative; times and sizes must be >= 0"),
    (HEADER, ["b0,1,2,3,4,5,6", "b1,1,fast,3,4,5,6"], "line 3, layer 'b1', column 'backward_time_ms'",
     "'fast' is not a number; write a decimal such as 1.5"),
    (HEADER, ["b0,1,2,3,4,5,6", "b1,1,,3,4,5,6"], "line 3, layer 'b1', column 'backward_time_ms'",
     "value is missing"),
], ids=["missing-columns", "negative-time", "non-numeric", "empty-cell"])
def test_bad_profile_csv_names_file_row_and_column(tmp_path, header, rows, where, problem):
    path = write_profile(tmp_path / "teacher.csv", rows, header)
    with pytest.raises(ProfileError) as caught:
        load_profile_csv(path)
    assert_names(str(caught.value), f"{path}: {where}", problem)


def test_bad_cached_profile_stops_partition_auto_before_launch(make_config, tiny_run, tmp_path):
    # partition=auto reads the teacher's cached profile first: plant a damaged one where it will look.
    cache = tmp_path / "cache"
    cfg = make_config(*tiny_run, *PIPELINE, "partition=auto", f"cache_dir={cache}")
    request = ProfileRequest("resnet_micro", "teacher", cfg.data.batch_size // cfg.pipeline.microbatches,
                             resolve_precision(cfg.trainer.precision, "cpu"), "cpu", DIGITS.num_classes,
                             DIGITS.in_chans, DIGITS.image_size)
    path = cached_profile_path(request, cache)
    path.parent.mkdir(parents=True)
    write_profile(path, [f"block{i},1,2,3,4,5,6" for i in range(10)] + ["block10,-1,2,3,4,5,6"])
    message = refused_before_launch(make_config, tiny_run, tmp_path, "partition=auto", f"cache_dir={cache}",
                                    error=ProfileError)
    assert_names(message, f"{path}: line 12, layer 'block10', column 'forward_time_ms': value -1.0 is negative",
                 "re-profile the model with mode=profile")


@pytest.mark.parametrize("row, column, problem", [
    ("b1,1e300,2,3,4,5,6", "forward_time_ms", "value 1e+300 is implausibly large (one block's time above 1 hour"),
    ("b1,1,2,3,4,5,1e15", "parameter_size_kb", "value 1000000000000000.0 is implausibly large (a size above 10 TB"),
])
def test_profile_values_beyond_any_measurement_are_refused(tmp_path, row, column, problem):
    path = write_profile(tmp_path / "p.csv", ["b0,1,2,3,4,5,6", row])
    with pytest.raises(ProfileError) as caught:
        load_profile_csv(path)
    assert_names(str(caught.value), f"line 3, layer 'b1', column '{column}'", problem, "check the units")


# ----------------------------------------------------------------------------- run directory

def test_a_run_dir_that_is_a_file_is_refused_with_its_path(make_config, tiny_run, tmp_path):
    in_the_way = tmp_path / "run"
    in_the_way.write_text("not a directory")
    with pytest.raises(RunDirUnusableError) as caught:
        run(make_config(*tiny_run, "trainer.accelerator=cpu", "trainer.devices=2", run_dir=in_the_way),
            log=lambda line: None)
    assert_names(str(caught.value), f"run directory {in_the_way} cannot be used", "Fix: give a writable directory")
    assert in_the_way.read_text() == "not a directory"


# ----------------------------------------------------------------------------- security: nothing runs code

class WritesAMarkerWhenUnpickled:
    """A pickle payload that runs a shell command when loaded: stands in for arbitrary code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def test_the_payload_really_runs_code_when_unpickled_unsafely(tmp_path):
    # Makes the tests below able to fail: the same file loaded without weights_only runs the command.
    marker, path = tmp_path / "code-ran", tmp_path / "evil.pt"
    torch.save({"payload": WritesAMarkerWhenUnpickled(marker)}, path)
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("resume", ["path", "auto"])
def test_checkpoint_holding_code_is_refused_and_never_run(make_config, tiny_run, tmp_path, resume):
    marker = tmp_path / "code-ran"
    state = build_model("resnet_micro", 10, DIGITS.in_chans, DIGITS.image_size).state_dict()
    tmp = ckpt.begin_checkpoint(tmp_path / "run" / "checkpoints", 8)
    ckpt.save_tensor_file({"model": {**state, "payload": WritesAMarkerWhenUnpickled(marker)}, "optim": {}},
                          tmp / ckpt.shard_name(0))
    ckpt.save_tensor_file({"step": 8}, tmp / ckpt.STATE_FILE)
    path = ckpt.commit_checkpoint(tmp, 8, meta={"student": "resnet_micro", "world_size": 1})  # checksums match
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"resume={path if resume == 'path' else 'auto'}",
                                    error=ckpt.UnsafeCheckpointError)
    assert_names(message, f"{path / ckpt.shard_name(0)} cannot be read safely", "Weights only load failed",
                 "weights_only=True and never runs code")
    with pytest.raises(ckpt.UnsafeCheckpointError, match="cannot be read safely"):
        ckpt.load_student_state(path)  # what every worker calls
    assert not marker.exists()


def test_teacher_weights_holding_code_are_refused_and_never_run(make_config, tiny_run, tmp_path):
    marker, path = tmp_path / "code-ran", tmp_path / "teacher.pt"
    torch.save({"fc.weight": torch.zeros(1), "payload": WritesAMarkerWhenUnpickled(marker)}, path)
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"teacher.checkpoint={path}", error=ModelError)
    assert_names(message, f"teacher.checkpoint weights '{path}' cannot be read safely", "weights_only=True")
    assert not marker.exists()


def test_profile_cells_are_parsed_as_numbers_never_evaluated(tmp_path):
    marker = tmp_path / "code-ran"
    path = write_profile(tmp_path / "p.csv", [f"b0,__import__('os').system('touch {marker}'),2,3,4,5,6"])
    with pytest.raises(ProfileError, match="is not a number"):
        load_profile_csv(path)
    assert not marker.exists()


REPO = Path(__file__).resolve().parents[2]
UNSAFE_LOADERS = re.compile(r"\bpickle\.loads?\(|\byaml\.(?:unsafe_)?load\(|\bmarshal\.loads?\(|(?<![\w.])eval\(|"
                            r"(?<![\w.])exec\(|allow_pickle=True")


def test_every_loader_in_the_code_is_safe():
    """Every torch.load passes weights_only=True; nothing unpickles, evals or yaml.loads a file
    (synapse/, experiments/ and train.py: everything that reads checkpoints, weights or profiles)."""
    files_with_torch_load, unsafe = set(), []
    for file in sorted([*(REPO / "synapse").rglob("*.py"), *(REPO / "experiments").rglob("*.py"), REPO / "train.py"]):
        text = file.read_text()
        for match in re.finditer(r"torch\.load\(", text):
            files_with_torch_load.add(file.relative_to(REPO).as_posix())
            call = text[match.start(): match.start() + 200]  # the call's arguments, up to a few lines
            if "weights_only=True" not in call:
                unsafe.append(f"{file.relative_to(REPO)}: {call.splitlines()[0]}")
        unsafe += [f"{file.relative_to(REPO)}: {m.group(0)}" for m in UNSAFE_LOADERS.finditer(text)]
    # the scan sees the real loaders (DCP's values: checkpoint/dcp.py; its index: a restricted unpickler there)
    assert {"synapse/checkpoint/read.py", "synapse/checkpoint/dcp.py",
            "synapse/models/factory.py"} <= files_with_torch_load
    assert not unsafe, unsafe


# ---------------------------------------------------------------- layouts (replicas x stages)
def test_replicas_that_do_not_divide_the_devices(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.devices=4", "trainer.replicas=3",
                                    error=ConfigError)
    assert_names(message, "trainer.replicas: 3 replicas do not divide the run's 4 devices", "Fix: use one of [1, 2, 4]")


def test_a_batch_that_cannot_be_shared_out_over_the_replicas(make_config, tiny_run, tmp_path):
    # 8 images in micro-batches of 4 each: two shares for four replicas
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.devices=4", "trainer.replicas=4",
                                    "data.batch_size=8", "pipeline.microbatches=4", error=ConfigError)
    assert_names(message, "data.batch_size: data.batch_size=8 gives 4 replicas less than one micro-batch of 4 each",
                 "Fix: use a batch of at least 16 images")


@pytest.mark.parametrize("shares, problem", [
    ("[12,2]", "[12, 2] must give each of 2 replicas a positive number of images, 16 (data.batch_size) in all"),
    ("[16]", "[16] must give each of 2 replicas"),
    ("[10,6]", "10 images do not split into 4 equal micro-batches"),
    ("[0,16]", "[0, 16] must give each of 2 replicas a positive number"),
])
def test_replica_shares_that_do_not_make_the_batch(make_config, tiny_run, tmp_path, shares, problem):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.replicas=2", "data.batch_size=16",
                                    "pipeline.microbatches=4", f"trainer.replica_shares={shares}", error=ConfigError)
    assert_names(message, f"trainer.replica_shares: {problem}", "Fix:")


def test_replicas_auto_needs_the_planner(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.replicas=auto", error=ConfigError)
    assert_names(message, "trainer.replicas: auto is chosen by the planner, but partition.mode=even",
                 "Fix: use partition=auto")


def test_a_manual_partition_is_one_replica_s_stages(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.devices=4", "trainer.replicas=2",
                                    "partition=manual", "partition.teacher=[3,3,3,2]", "partition.student=[3,3,3,2]",
                                    error=ConfigError)
    assert_names(message, "partition.teacher: 4 stages given for 2 devices per replica (2 replicas)",
                 "Fix: give exactly 2 block counts")


def test_replicas_cut_differently_must_cover_the_replicas_and_the_devices(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.devices=3", "trainer.replicas=2",
                                    "partition.replica_stages=[2,2]", error=ConfigError)
    assert_names(message, "partition.replica_stages: [2, 2] must give each of 2 replicas at least one stage, the "
                 "run's 3 devices in all", "Fix: list 2 stage counts summing to 3")
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.devices=3", "trainer.replicas=2",
                                    "partition=auto", "partition.replica_stages=[2,1]", error=ConfigError)
    assert_names(message, "partition.replica_stages: replicas cut differently are given, not planned")
