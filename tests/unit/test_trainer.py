"""The shared training loop on one device (``synapse.engine.distil_on_one_device``, the pipeline's
reference; label training through ``synapse.app.run``) on tiny CPU runs.

The centre piece is exact resumption: N steps in one launch must equal N/2 steps, a stop, and
N/2 more after ``resume=auto``, bit for bit (weights, optimizer moments, schedule, RNG).
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from torch import nn

from synapse import checkpoint as ckpt
from synapse.app import run
from synapse.engine import (
    ComputeSetup,
    NonFiniteLossError,
    SingleDeviceStep,
    build_scheduler,
    checks_loss_late,
    distil_on_one_device,
    lr_factor,
)
from synapse.engine import checkpointer as checkpointer_module
from synapse.kd import KDLossParams
from synapse.models import ModelError, build_model, load_weights

# Digits at 16x16 (cheap), augmentation on (the default) and student dropout: both draw random
# numbers, so a resume that lost the RNG or sampler state would diverge. 1438 train images / 96
# = 14 steps per epoch: the resumed half crosses an epoch boundary (new shuffle, new augmentation).
RESUME_RUN = ("data.image_size=16", "data.batch_size=96", "pipeline.microbatches=2", "student.drop_rate=0.2",
              "trainer.max_steps=16", "checkpoint.keep=4")
TOTAL_STEPS, STOP_AT = 16, 8


def quiet(line: str) -> None:
    pass


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def final_state(run_dir: Path) -> tuple[dict, dict, dict]:
    ref = ckpt.latest_valid_checkpoint(run_dir / "checkpoints")
    assert ref is not None and ref.step == TOTAL_STEPS
    model, optim = ckpt.load_student_state(ref.path)
    return model, optim, ckpt.load_run_state(ref.path)


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_tensors(a[key], b[key])
        elif torch.is_tensor(a[key]):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.fixture
def resume_runs(make_config, tiny_run, tmp_path):
    """``launch(run_dir, *overrides)``: one launch of the resume test's run."""

    def launch(run_dir: Path, *overrides: str, log=quiet) -> dict:
        return distil_on_one_device(make_config(*tiny_run, *RESUME_RUN, *overrides, run_dir=run_dir), run_dir, log=log)

    return launch


# ----------------------------------------------------------------------------- exact resume

@pytest.mark.slow  # real training runs
@pytest.mark.timeout(300)
def test_stop_and_resume_equals_one_uninterrupted_run_bit_for_bit(resume_runs, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    resume_runs(whole)
    first = resume_runs(split, f"trainer.stop_after={STOP_AT}")
    assert first["steps"] == STOP_AT
    assert ckpt.latest_valid_checkpoint(split / "checkpoints").step == STOP_AT
    lines: list[str] = []
    second = resume_runs(split, "resume=auto", log=lines.append)
    assert second["steps"] == TOTAL_STEPS and second["steps_this_launch"] == TOTAL_STEPS - STOP_AT
    assert any(f"at step {STOP_AT}" in line and "resumed from" in line for line in lines)

    whole_model, whole_optim, whole_state = final_state(whole)
    split_model, split_optim, split_state = final_state(split)
    assert_same_tensors(whole_model, split_model)  # every parameter and BatchNorm buffer
    assert_same_tensors(whole_optim, split_optim)  # AdamW step, exp_avg, exp_avg_sq per parameter
    assert whole_state["sampler"] == split_state["sampler"]
    assert whole_state["scheduler"] == split_state["scheduler"]
    assert torch.equal(whole_state["rng"]["torch"], split_state["rng"]["torch"])
    whole_train, split_train = records(whole, "train"), records(split, "train")
    assert [r["step"] for r in split_train] == list(range(1, TOTAL_STEPS + 1))
    assert [(r["loss"], r["lr"]) for r in split_train] == [(r["loss"], r["lr"]) for r in whole_train]
    assert [r["student_top1"] for r in records(split, "eval")] == [r["student_top1"] for r in records(whole, "eval")]


@pytest.mark.slow  # real training runs
@pytest.mark.timeout(300)
def test_resume_that_lost_the_rng_state_would_diverge(resume_runs, tmp_path, monkeypatch):
    # Shows the test above can fail: the run really draws random numbers after the resume.
    whole, split = tmp_path / "whole", tmp_path / "split"
    resume_runs(whole)
    resume_runs(split, f"trainer.stop_after={STOP_AT}")
    monkeypatch.setattr(checkpointer_module, "set_rng_state", lambda state: None)
    resume_runs(split, "resume=auto")
    whole_model, split_model = final_state(whole)[0], final_state(split)[0]
    assert any(not torch.equal(whole_model[k], split_model[k]) for k in whole_model)


def test_restored_schedule_puts_its_learning_rate_back_on_the_optimizer(make_config):
    # The first step after a resume must use the learning rate of that step, not of step 0.
    optim_cfg = make_config("optim.lr=0.01", "optim.warmup_steps=2").optim

    def fresh():
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=optim_cfg.lr)
        return optimizer, build_scheduler(optimizer, optim_cfg, total_steps=10)

    optimizer, scheduler = fresh()
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    resumed_optimizer, resumed_scheduler = fresh()
    resumed_scheduler.load_state_dict(scheduler.state_dict())
    expected = 0.01 * lr_factor(5, optim_cfg, 10)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    assert resumed_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    assert resumed_scheduler.get_last_lr() == scheduler.get_last_lr()


# ----------------------------------------------------------------------------- records

SYNTHETIC_RUN = ("data=synthetic", "data.image_size=16", "data.batch_size=16", "data.val_batch_size=16",
                 "data.synthetic_train_size=64", "data.synthetic_val_size=24", "data.synthetic_num_classes=10",
                 "pipeline.microbatches=1", "trainer.epochs=2")


@pytest.mark.timeout(120)
def test_kd_run_writes_one_record_per_step_evaluations_checkpoints_and_summary(make_config, tiny_run, tmp_path):
    run_dir = tmp_path / "kd"
    summary = distil_on_one_device(make_config(*tiny_run, *SYNTHETIC_RUN, run_dir=run_dir), run_dir, log=quiet)
    steps = 2 * 64 // 16
    train = records(run_dir, "train")
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    assert [r["epoch"] for r in train] == [0] * 4 + [1] * 4
    for r in train:
        assert math.isfinite(r["loss"]) and r["loss"] > 0
        assert r["step_time_s"] > 0 and r["images_per_s"] == pytest.approx(16 / r["step_time_s"])
        # cosine schedule from optim.lr=0.002 to 0 over the 8 steps, read after step s
        assert r["lr"] == pytest.approx(0.002 * 0.5 * (1 + math.cos(math.pi * r["step"] / steps)), abs=1e-12)
    # the steady rate next to the launch's (which counts evaluations and checkpoints)
    assert summary["median_step_images_per_s"] == pytest.approx(statistics.median(r["images_per_s"] for r in train))
    evals = records(run_dir, "eval")
    assert [(r["step"], r["epoch"]) for r in evals] == [(4, 0), (8, 1)]
    assert all(0 <= r["student_top1"] <= r["student_top5"] <= 100 and r["student_samples"] == 24 for r in evals)
    assert [r.step for r in ckpt.list_checkpoints(run_dir / "checkpoints")] == [4, 8]
    assert all(ckpt.verify_checkpoint(r.path) for r in ckpt.list_checkpoints(run_dir / "checkpoints"))
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["steps"] == steps and on_disk["mode"] == "kd" and on_disk["student"] == "resnet_micro"
    assert on_disk["final_eval"]["student_top1"] == evals[-1]["student_top1"]
    assert 0 <= on_disk["teacher_eval"]["top1"] <= 100


@pytest.mark.slow  # real training runs
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, trained, other", [("teacher", "resnet_mini", "resnet_micro"),
                                                   ("baseline", "resnet_micro", "resnet_mini")])
def test_label_training_modes_write_model_pt(make_config, tiny_run, tmp_path, mode, trained, other):
    run_dir = tmp_path / mode
    cfg = make_config(*tiny_run, *SYNTHETIC_RUN, f"mode={mode}", "teacher=resnet_mini", "student=resnet_micro",
                      "trainer.max_steps=3", run_dir=run_dir)
    summary = run(cfg, log=quiet)
    assert summary["steps"] == 3 and summary["mode"] == mode
    model = build_model(trained, num_classes=10, img_size=16)
    load_weights(model, run_dir / "model.pt")
    final_weights = ckpt.load_student_state(ckpt.latest_valid_checkpoint(run_dir / "checkpoints").path)[0]
    assert_same_tensors(model.state_dict(), final_weights)
    with pytest.raises(ModelError, match="another architecture|the architecture differs"):
        load_weights(build_model(other, num_classes=10, img_size=16), run_dir / "model.pt")
    assert [r["step"] for r in records(run_dir, "train")] == [1, 2, 3]


@pytest.mark.timeout(120)
def test_zero_epochs_writes_the_initial_weights(make_config, tiny_run, tmp_path):
    torch.manual_seed(123)
    initial = build_model("resnet_micro", num_classes=10, img_size=16).state_dict()
    init_file = tmp_path / "init.pt"
    torch.save(initial, init_file)
    run_dir = tmp_path / "zero"
    cfg = make_config(*tiny_run, *SYNTHETIC_RUN, "mode=baseline", "trainer.epochs=0", f"student.init={init_file}",
                      run_dir=run_dir)
    summary = run(cfg, log=quiet)
    assert summary["steps"] == 0
    assert_same_tensors(torch.load(run_dir / "model.pt", weights_only=True), initial)
    assert records(run_dir, "train") == []


# ------------------------------------------------------------ late loss check
def _tiny_step(check_late: bool = False, microbatches: int = 2) -> tuple[SingleDeviceStep, nn.Module]:
    torch.manual_seed(0)
    student = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    setup = ComputeSetup(torch.device("cpu"), None, False)
    return SingleDeviceStep(student, None, optimizer, scheduler, microbatches, KDLossParams("st", 4.0, 0.9),
                            setup, check_late=check_late), student


def test_a_step_checking_its_loss_raises_before_the_update_and_a_late_one_leaves_it_to_the_reader():
    images, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    at_step, module = _tiny_step(check_late=False)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(NonFiniteLossError, match="step 3: the loss is nan"):
        at_step(images, labels, step=3, corrupt=True)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items() if "weight" in k)

    late, module = _tiny_step(check_late=True)
    loss = late(images, labels, step=3, corrupt=True)  # no read of the loss, no raise: the update ran
    assert not torch.isfinite(module[0].weight).all()
    with pytest.raises(NonFiniteLossError, match="step 3: the loss is nan"):
        late.guard.check_read_loss(3, float(loss))
    late.guard.check_read_loss(4, 0.5)  # a finite loss passes


def test_a_late_check_cannot_be_combined_with_skip():
    with pytest.raises(ValueError, match="late loss check cannot skip"):
        SingleDeviceStep(nn.Linear(2, 2), None, None, None, 1, KDLossParams("st", 4.0, 0.9),
                         ComputeSetup(torch.device("cpu"), None, False), nonfinite="skip", check_late=True)


@pytest.mark.parametrize("check, policy, device, late", [
    ("auto", "stop", "cuda", True), ("auto", "skip", "cuda", False), ("auto", "stop", "cpu", False),
    ("late", "stop", "cpu", True), ("at_step", "stop", "cuda", False)])
def test_auto_checks_late_only_on_cuda_under_stop(check, policy, device, late):
    assert checks_loss_late(check, policy, torch.device(device)) is late


def test_a_step_after_evaluation_trains_in_training_mode_again():
    """The step skips ``train()`` when the student already trains; one left in eval mode (as an
    interrupted evaluation could leave it) must still be switched back, BatchNorm statistics and all."""
    step, student = _tiny_step(microbatches=1)
    student.eval()
    stats = student[1].running_mean.clone()
    step(torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2]), step=1)
    assert student.training and student[1].training
    assert not torch.equal(stats, student[1].running_mean)


def test_one_micro_batch_learns_exactly_what_a_plain_step_learns():
    """M = 1 runs without the split and the running sum: bit for bit a plain forward, backward and
    optimizer step, with that step's loss."""
    images, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    step, student = _tiny_step(microbatches=1)
    _, plain = _tiny_step(microbatches=1)
    plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
    for s in (1, 2):
        loss = step(images, labels, step=s)
        plain_loss = nn.functional.cross_entropy(plain(images), labels)
        plain_loss.backward()
        plain_optimizer.step()
        plain_optimizer.zero_grad(set_to_none=True)
        assert loss.dtype == torch.float32 and torch.equal(loss, plain_loss.detach())
    assert all(torch.equal(a, b) for a, b in zip(student.state_dict().values(), plain.state_dict().values()))
