"""Issue #19's bad inputs (round two of the outside matrix): values that passed validation and
failed later with raw errors, or silently. Rows of docs/reliability.md ("B2::") name these tests.

Each is refused before any worker starts (``refused_before_launch``: no ``logs/launch_*``), with
a message naming the key or file, the problem and a fix.
"""
from __future__ import annotations

import pytest
import torch
from test_bad_inputs import HEADER, assert_names, refused_before_launch, write_profile

from synapse.config import ConfigError
from synapse.models import ModelError, build_model
from synapse.partitioning import ProfileError, load_profile_csv


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


@pytest.mark.parametrize("spares, problem", [
    ("[-1]", "trainer.spare_devices: negative device id in [-1]. Fix: device ids start at 0"),
    ("[70]", "trainer.spare_devices: CPU slot ids [70] are out of range (slots are 0..63)"),
])
def test_a_spare_device_that_cannot_exist_is_refused(make_config, tiny_run, tmp_path, spares, problem):
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"trainer.spare_devices={spares}",
                                    error=ConfigError)
    assert_names(message, problem)


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


def test_a_truncated_cached_teacher_names_the_cache_entry_to_delete(make_config, tiny_run, tmp_path, monkeypatch):
    from synapse.engine import teacher as teacher_module

    cfg = make_config(*tiny_run, *("trainer.accelerator=cpu", "trainer.devices=2"), f"cache_dir={tmp_path}/cache",
                      run_dir=tmp_path / "run")
    cached = tmp_path / "cache" / "teachers" / f"{cfg.teacher.name}-{teacher_module.teacher_cache_key(cfg)}.pt"
    cached.parent.mkdir(parents=True)
    torch.save(build_model(cfg.teacher.name, 10, 3, 32).state_dict(), cached)
    cached.write_bytes(cached.read_bytes()[: cached.stat().st_size // 2])  # a copy cut short
    from synapse.app import run

    with pytest.raises(ModelError) as caught:
        run(cfg, log=lambda line: None)
    assert_names(str(caught.value), f"the cached teacher {cached}", f"Fix: delete that cache entry (rm {cached})")
    assert "teacher.checkpoint weights" not in str(caught.value), "blamed on a setting the user never made"
    assert not list((tmp_path / "run").glob("logs/launch_*"))


@pytest.mark.parametrize("row, column, problem", [
    ("b1,1e300,2,3,4,5,6", "forward_time_ms", "value 1e+300 is implausibly large (one block's time above 1 hour"),
    ("b1,1,2,3,4,5,1e15", "parameter_size_kb", "value 1000000000000000.0 is implausibly large (a size above 10 TB"),
])
def test_profile_values_beyond_any_measurement_are_refused(tmp_path, row, column, problem):
    path = write_profile(tmp_path / "p.csv", ["b0,1,2,3,4,5,6", row])
    with pytest.raises(ProfileError) as caught:
        load_profile_csv(path)
    assert_names(str(caught.value), f"line 3, layer 'b1', column '{column}'", problem, "check the units")
    assert HEADER  # the same format as the round-one profile rows


def test_an_absurd_learning_rate_is_refused(make_config, tiny_run, tmp_path):
    # 1e300 is finite, but torch cannot cast it to float32 (a raw RuntimeError in every rank's first step)
    message = refused_before_launch(make_config, tiny_run, tmp_path, "optim.lr=1e300", error=ConfigError)
    assert_names(message, "optim.lr: 1e+300 is implausibly large (above 1000)", "Fix: use a learning rate")


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_checkpoint_with_non_finite_tensors_is_never_written(tmp_path, bad):
    from synapse import checkpoint as ckpt

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


@pytest.mark.parametrize("endpoint", ["10.255.255.1:29500", "example.com:29500"])
def test_a_one_node_run_with_an_outward_rendezvous_endpoint_is_refused(make_config, tiny_run, tmp_path, endpoint):
    # One node listens on loopback only (the rendezvous store must not be reachable from other
    # hosts): an outward address would leave the workers unable to meet, after a timeout.
    message = refused_before_launch(make_config, tiny_run, tmp_path, f"trainer.rdzv_endpoint={endpoint}",
                                    error=ConfigError)
    assert_names(message, f"trainer.rdzv_endpoint: {endpoint}: a one-node run listens on 127.0.0.1 only",
                 "Fix: use 127.0.0.1:29500 or leave trainer.rdzv_endpoint unset")


def test_a_run_dir_that_is_a_file_is_refused_with_its_path(make_config, tiny_run, tmp_path):
    from synapse.app import run
    from synapse.rundir import RunDirUnusableError

    in_the_way = tmp_path / "run"
    in_the_way.write_text("not a directory")
    with pytest.raises(RunDirUnusableError) as caught:
        run(make_config(*tiny_run, "trainer.accelerator=cpu", "trainer.devices=2", run_dir=in_the_way),
            log=lambda line: None)
    assert_names(str(caught.value), f"run directory {in_the_way} cannot be used", "Fix: give a writable directory")
    assert in_the_way.read_text() == "not a directory"
