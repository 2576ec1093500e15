"""Experiment trackers (logger=tensorboard|csv|none): a real run's scalars read back with TensorBoard's
own event reader, CSV rows and markers, and a refused tracker name."""
from __future__ import annotations

import csv

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from synapse.app import run
from synapse.config import ConfigError, validate
from synapse.rundir import JsonlWriter, read_jsonl
from synapse.trackers import CsvTracker, TrackedWriter, open_tracker

SHORT = ("trainer.max_steps=4", "data.batch_size=32", "checkpoint.at_epoch_end=false", "report=false")


def event_scalars(directory) -> EventAccumulator:
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


@pytest.mark.slow  # a real run that writes TensorBoard files
@pytest.mark.timeout(300)
def test_a_run_writes_its_step_and_eval_scalars_to_tensorboard(make_config, tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    run(make_config(*tiny_run, *SHORT, "logger=tensorboard", run_dir=run_dir), log=lambda line: None)
    events = event_scalars(run_dir / "tensorboard" / "train")
    assert {"train/loss", "train/lr", "train/images_per_s", "eval/student_top1"} <= set(events.Tags()["scalars"])
    losses = events.Scalars("train/loss")
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [e.step for e in losses] == [r["step"] for r in records] == [1, 2, 3, 4]
    assert [e.value for e in losses] == pytest.approx([r["loss"] for r in records])


def test_csv_tracker_writes_one_file_per_kind_and_the_markers(tmp_path):
    with TrackedWriter(JsonlWriter(tmp_path / "metrics.jsonl"), CsvTracker(tmp_path / "csv", "train")) as writer:
        writer.write({"kind": "train", "step": 1, "loss": 0.5, "lr": 0.1, "note": "text is no scalar"})
        writer.write({"kind": "train", "step": 2, "loss": float("nan"), "lr": 0.1})
        writer.write({"kind": "eval", "step": 2, "student_top1": 90.0})
        writer.tracker.marker(2, "failover/decision", "REPLAN at step 2")
    train = list(csv.DictReader(open(tmp_path / "csv" / "train_train.csv")))
    assert [(row["step"], row["loss"]) for row in train] == [("1", "0.5"), ("2", "")]  # NaN is no number to plot
    assert list(csv.DictReader(open(tmp_path / "csv" / "train_eval.csv")))[0]["student_top1"] == "90.0"
    assert list(csv.DictReader(open(tmp_path / "csv" / "train_markers.csv")))[0]["text"] == "REPLAN at step 2"
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 2]  # the JSONL keeps everything


def test_tensorboard_markers_are_text_at_their_step(tmp_path):
    tracker = open_tracker("tensorboard", tmp_path, "supervisor")
    tracker.marker(78, "failover/decision", "REPLAN at step 78")
    tracker.close()
    events = event_scalars(tmp_path / "tensorboard" / "supervisor")
    texts = events.Tensors("failover/decision/text_summary")
    assert [t.step for t in texts] == [78] and b"REPLAN at step 78" in texts[0].tensor_proto.string_val[0]


def test_an_unknown_tracker_is_refused_before_any_work(make_config, tiny_run):
    with pytest.raises(ConfigError, match=r"^logger.name: .*Fix: "):
        validate(make_config(*tiny_run, "logger.name=wandb"))
