"""A resume refuses any change of what the run learns, and says what it accepted (issue #33, item 5).

Before: ``resume=auto`` with another teacher or ``kd.T`` distilled from a different teacher from
the resume step on; another ``data.batch_size`` trained a new teacher and ended at step 58/60
reported as finished; another ``optim.lr`` was silently overridden by the checkpoint while
``config.yaml`` recorded the new value; another ``seed`` was refused only after the launch.

Each test sets up a run directory as a stopped run leaves it: the ``config.yaml`` the app writes
at the start (``config_yaml`` of the typed config) and a real checkpoint written by the
checkpoint writer. The resume then goes through ``synapse.app.run``: a refusal must come before
anything is written (no teacher trained into the cache, no launch, the recorded config untouched).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from test_bad_inputs import PIPELINE, assert_names, write_student_checkpoint

from synapse.app import run
from synapse.config import ConfigError, check_resume_settings, config_yaml, typed_config

FIRST = ("trainer.max_steps=10", "checkpoint.every=4")


@pytest.fixture
def stopped_run(make_config, tiny_run, tmp_path) -> Path:
    """A run directory holding its recorded config and a checkpoint of step 4."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = make_config(*tiny_run, *PIPELINE, *FIRST, f"cache_dir={tmp_path / 'cache'}", run_dir=run_dir)
    (run_dir / "config.yaml").write_text(config_yaml(typed_config(cfg)))
    write_student_checkpoint(run_dir / "checkpoints", 4)
    return run_dir


def resumed(make_config, tiny_run, run_dir: Path, *changes: str, resume: str = "auto"):
    return make_config(*tiny_run, *PIPELINE, *FIRST, f"cache_dir={run_dir.parent / 'cache'}", f"resume={resume}",
                       *changes, run_dir=run_dir)


@pytest.mark.parametrize("change, named", [
    ("teacher=resnet_mini", "teacher.name=resnet_micro (now resnet_mini)"),
    ("kd.T=2.0", "kd.T=4.0 (now 2.0)"),
    ("data.batch_size=32", "data.batch_size=64 (now 32)"),
    ("optim.lr=0.01", "optim.lr=0.002 (now 0.01)"),
    ("seed=1", "seed=0 (now 1)"),
    ("trainer.max_steps=20", "trainer.max_steps=10 (now 20)"),
])
@pytest.mark.parametrize("resume", ["auto", "path"])
def test_a_change_of_what_is_learned_refuses_the_resume_before_any_work(make_config, tiny_run, stopped_run, change,
                                                                         named, resume):
    recorded = (stopped_run / "config.yaml").read_bytes()
    checkpoint = stopped_run / "checkpoints" / "step_00000004"
    cfg = resumed(make_config, tiny_run, stopped_run, change, resume=str(checkpoint) if resume == "path" else "auto")
    with pytest.raises(ConfigError) as refused:
        run(cfg, log=lambda line: None)
    message = str(refused.value)
    assert_names(message, "resume: this run would learn with other settings than the run it continues (recorded in "
                          f"{stopped_run / 'config.yaml'}): ", named,
                 "only where and how it runs may change (devices, nodes, logging, progress, report, checkpoint cadence",
                 "Fix: continue it with the recorded values (",
                 "or start a new run with the new ones: resume=null in a new run directory")
    assert (stopped_run / "config.yaml").read_bytes() == recorded, "the recorded config was overwritten"
    assert not (stopped_run / "logs").exists(), "a worker was launched"
    assert not (stopped_run.parent / "cache" / "teachers").exists(), "a teacher was trained"
    assert not (stopped_run / "failover_events.jsonl").exists()


def test_every_refused_key_is_named_with_its_recorded_value(make_config, tiny_run, stopped_run):
    cfg = resumed(make_config, tiny_run, stopped_run, "kd.T=2.0", "optim.lr=0.01", "trainer.devices=3")
    with pytest.raises(ConfigError) as refused:
        check_resume_settings(cfg)
    message = str(refused.value)
    assert_names(message, "kd.T=4.0 (now 2.0), optim.lr=0.002 (now 0.01). ", "(kd.T=4.0 optim.lr=0.002)")
    assert "trainer.devices" not in message, "a change that alters nothing learned is not refused"


def test_changes_that_alter_nothing_learned_are_accepted_and_said(make_config, tiny_run, stopped_run):
    cfg = resumed(make_config, tiny_run, stopped_run, "trainer.devices=3", "trainer.progress=true", "report=false",
                  "checkpoint.every=2", "monitor.period_s=1.0", "logger=csv")
    note = check_resume_settings(cfg)
    assert note is not None and note.startswith(
        f"resume=auto: continuing the run recorded in {stopped_run / 'config.yaml'} with the same learning settings; "
        f"changed, none of which alters what is learned: "), note
    assert_names(note, "trainer.devices=2 (now 3)", "trainer.progress=false (now true)", "report=true (now false)",
                 "checkpoint.every=4 (now 2)", "monitor.period_s=5.0 (now 1.0)", "logger.name=tensorboard (now csv)")


def test_an_unchanged_resume_says_so(make_config, tiny_run, stopped_run):
    note = check_resume_settings(resumed(make_config, tiny_run, stopped_run))
    assert note == (f"resume=auto: continuing the run recorded in {stopped_run / 'config.yaml'} with the same "
                    f"learning settings; no setting changed")


def test_resume_auto_with_nothing_to_continue_starts_afresh_with_any_settings(make_config, tiny_run, stopped_run):
    for checkpoint in (stopped_run / "checkpoints").iterdir():
        if checkpoint.is_dir():
            for f in checkpoint.iterdir():
                f.unlink()
            checkpoint.rmdir()
    assert check_resume_settings(resumed(make_config, tiny_run, stopped_run, "kd.T=2.0")) is None


def test_a_checkpoint_with_no_recorded_config_beside_it_is_said(make_config, tiny_run, tmp_path):
    elsewhere = write_student_checkpoint(tmp_path / "loose" / "checkpoints", 4)
    note = check_resume_settings(resumed(make_config, tiny_run, tmp_path / "run", resume=str(elsewhere)))
    assert note == (f"resume={elsewhere}: no config recorded beside the checkpoint (no config.yaml two folders up), "
                    f"so its settings could not be compared with this run's: make sure they are the same")
