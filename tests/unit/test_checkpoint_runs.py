"""Which checkpoints are whose, and which one a resume takes (issue #33, items 4 and 6).

Every checkpoint here is a real one: the student resnet_micro of the default data, saved by the
real ``Checkpointer`` (DCP storage, format 2) into a real directory, then damaged, renamed or
mixed the way the report did it. Refusals go through ``synapse.app.run`` or ``validate`` as a
user's command does.

Item 4: a run's checkpoints carry its identity; pruning deletes only those, and a fresh run (or a
resume by path from elsewhere) refuses a directory holding another run's checkpoints.
Item 6: the checkpoint resumed is the newest intact one by what its manifest says; every one
passed over is said with the reason; a manifest that vouches for too little is damage; and where
all are damaged, the run stops instead of starting from step 0.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from synapse import checkpoint as ckpt
from synapse.app import run
from synapse.config import validate
from synapse.data import dataset_info
from synapse.engine import Checkpointer, HeldState, SingleShard, resolve_resume
from synapse.injection import FaultInjector
from synapse.models import build_model
from synapse.rundir import read_events

DIGITS = dataset_info("digits", image_size=32)  # the default data: what the configs below train on
PIPELINE = ("trainer.accelerator=cpu", "trainer.devices=2")


class Student:
    """The configured student in training, and a real Checkpointer saving it under ``root``."""

    def __init__(self, root: Path, keep: int = 10):
        torch.manual_seed(0)
        self.model = build_model("resnet_micro", DIGITS.num_classes, DIGITS.in_chans, DIGITS.image_size)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)
        self.saver = Checkpointer(root, keep, "resnet_micro", SingleShard(), FaultInjector([], rank=0),
                                  asynchronous=False)

    def train_and_save(self, *steps: int) -> list[Path]:
        paths = []
        for step in steps:
            self.model(torch.randn(4, DIGITS.in_chans, DIGITS.image_size, DIGITS.image_size)).square().mean().backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            held = HeldState(self.model.state_dict(keep_vars=True), self.optimizer, self.scheduler, {})
            paths.append(self.saver.save(step, held, {"epoch": 0, "step_in_epoch": step}))
        self.saver.close()
        return paths


def saved_run(root: Path, *steps: int, keep: int = 10) -> list[Path]:
    return Student(root, keep).train_and_save(*steps)


def step_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def manifest_of(path: Path) -> dict:
    return json.loads((path / ckpt.MANIFEST).read_text())


def edit_manifest(path: Path, edit) -> None:
    manifest = manifest_of(path)
    edit(manifest)
    (path / ckpt.MANIFEST).write_text(json.dumps(manifest))


def flip_byte(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def resume_auto(run_dir: Path) -> tuple[Path | None, list[str]]:
    lines: list[str] = []
    chosen = resolve_resume("auto", run_dir, log=lines.append)
    return chosen, lines


def refused_run(make_config, tiny_run, run_dir: Path, *overrides: str, error) -> str:
    """``synapse.app.run`` of a two-rank pipeline that must be refused; nothing may be launched."""
    cfg = make_config(*tiny_run, *PIPELINE, *overrides, run_dir=run_dir)
    with pytest.raises(error) as caught:
        run(cfg, log=lambda line: None)
    assert not list(run_dir.glob("logs/launch_*")), "a worker was launched"
    return str(caught.value)


# ----------------------------------------------------------------------------- item 4: whose checkpoints

def test_every_checkpoint_records_its_runs_identity_kept_across_restarts(tmp_path):
    root = tmp_path / "checkpoints"
    first = saved_run(root, 5, 10)
    again = Student(root).train_and_save(15)  # a restart (failover, resume=auto): a new Checkpointer
    identity = json.loads((root / ckpt.RUN_FILE).read_text())["run"]
    assert re.fullmatch(r"[0-9a-f]{32}", identity)
    assert [manifest_of(p)["run"] for p in [*first, *again]] == [identity] * 3
    other = saved_run(tmp_path / "elsewhere" / "checkpoints", 5)
    assert manifest_of(other[0])["run"] != identity  # another directory, another run


def test_pruning_deletes_only_this_runs_checkpoints(tmp_path):
    # The report: an earlier run's steps 30 and 40 sat in the directory; with checkpoint.keep=2 the
    # new run's own checkpoints were deleted as soon as they were written, the old ones kept.
    earlier = saved_run(tmp_path / "earlier" / "checkpoints", 30, 40)
    root = tmp_path / "run" / "checkpoints"
    student = Student(root, keep=2)
    student.train_and_save(5)
    for path in earlier:  # checkpoints of another run that came to sit in this directory
        shutil.copytree(path, root / path.name)
    legacy = saved_run(tmp_path / "legacy" / "checkpoints", 1)[0]  # written before runs had identities
    edit_manifest(legacy, lambda m: m.pop("run"))
    shutil.copytree(legacy, root / legacy.name)
    student.train_and_save(10, 15, 20)
    assert step_names(root) == ["step_00000001", "step_00000015", "step_00000020", "step_00000030",
                                "step_00000040"]


def test_a_fresh_run_into_a_used_run_dir_is_refused_before_anything_is_written(make_config, tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    saved_run(run_dir / "checkpoints", 30, 40)
    (run_dir / "config.yaml").write_text("# the earlier run's settings\n")
    before = tree_digest(run_dir)
    message = refused_run(make_config, tiny_run, run_dir, error=ckpt.ForeignCheckpointError)
    assert message == (
        f"{run_dir} already holds the checkpoints of an earlier run (2 checkpoints in {run_dir / 'checkpoints'}, "
        f"steps 30, 40) and resume=null starts a fresh run: its checkpoints would mix with those, and a later "
        f"resume=auto could continue the earlier run's. Nothing was started, and the earlier run's files are "
        f"untouched. Fix: continue the earlier run with resume=auto, or start this one in a new directory "
        f"(run_dir=<new directory>)")
    after = tree_digest(run_dir)
    assert {k: v for k, v in after.items() if not k.startswith(".synapse")} == before  # only the run dir's lock


def test_resume_by_path_from_another_run_into_a_used_run_dir_is_refused(make_config, tiny_run, tmp_path):
    elsewhere = saved_run(tmp_path / "other_run" / "checkpoints", 8)[0]
    run_dir = tmp_path / "run"
    saved_run(run_dir / "checkpoints", 30, 40)
    message = refused_run(make_config, tiny_run, run_dir, f"resume={elsewhere}", error=ckpt.ForeignCheckpointError)
    assert message.startswith(f"{run_dir} holds the checkpoints of another run (2 checkpoints in ")
    assert f"than the one resume={elsewhere} continues" in message
    assert message.endswith(f"Fix: resume into a new directory (run_dir=<new directory>), or continue the run in "
                            f"{run_dir} with resume=auto")


@pytest.mark.parametrize("case", ["auto", "own checkpoint by path", "empty directory", "only an unfinished save"])
def test_what_a_run_dir_may_hold_for_each_resume(tmp_path, case):
    root = tmp_path / "run" / "checkpoints"
    if case == "empty directory":
        root.mkdir(parents=True)
        ckpt.check_run_dir_checkpoints(root, None)
        return
    if case == "only an unfinished save":  # a run killed before its first commit: nothing to mix with
        ckpt.begin_checkpoint(root, 5)
        ckpt.check_run_dir_checkpoints(root, None)
        return
    paths = saved_run(root, 30, 40)
    ckpt.check_run_dir_checkpoints(root, "auto" if case == "auto" else str(paths[0]))  # no refusal


def test_a_lost_identity_file_is_taken_up_again_from_the_checkpoints(tmp_path):
    root = tmp_path / "checkpoints"
    identity = manifest_of(saved_run(root, 5, keep=2)[0])["run"]
    (root / ckpt.RUN_FILE).unlink()
    saved_run(root, 10, 15, keep=2)
    assert manifest_of(root / "step_00000015")["run"] == identity
    assert json.loads((root / ckpt.RUN_FILE).read_text())["run"] == identity
    assert step_names(root) == ["step_00000010", "step_00000015"]  # and step 5 was pruned as the run's own


# ----------------------------------------------------------------------------- item 6: which checkpoint

@pytest.mark.parametrize("at", [0.1, 1 / 3, 0.5, 0.99])
def test_a_flipped_byte_in_the_newest_metadata_resumes_the_previous_one(make_config, tiny_run, tmp_path, at):
    run_dir = tmp_path / "run"
    _, newest = saved_run(run_dir / "checkpoints", 22, 24)
    flip_byte(newest / ckpt.dcp_store.METADATA_FILE, at)
    validate(make_config(*tiny_run, *PIPELINE, "resume=auto", run_dir=run_dir))  # no refusal: damage, not code
    chosen, lines = resume_auto(run_dir)
    assert chosen == run_dir / "checkpoints" / "step_00000022"
    assert lines == [f"skipping checkpoint {newest}: {newest}: .metadata is corrupt or truncated (checksum mismatch)"]
    (skipped,) = read_events(run_dir, "checkpoint_skipped")
    assert skipped["step"] == 24 and skipped["source"] == "resume"


def test_a_checkpoint_copied_past_the_newest_counts_as_the_step_it_holds(tmp_path):
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    student = Student(root, keep=2)
    ten, twenty = student.train_and_save(10, 20)
    copy = root / "step_00000099"
    shutil.copytree(ten, copy)
    chosen, lines = resume_auto(run_dir)
    assert chosen == twenty  # not the copy of step 10: 20 steps would have been lost
    assert lines == [f"skipping checkpoint {copy}: {copy} is named step 99 but its manifest says step 10 (a renamed "
                     f"or copied checkpoint): it counts as step 10, older than step 20"]
    student.train_and_save(30)  # pruning (keep=2) takes the oldest by what the manifests say
    assert step_names(root) == ["step_00000020", "step_00000030"]


def test_a_manifest_step_that_its_state_contradicts_is_damage(tmp_path):
    run_dir = tmp_path / "run"
    older, newest = saved_run(run_dir / "checkpoints", 22, 24)
    edit_manifest(older, lambda m: m.update(step=99))  # damaged into looking like the newest
    chosen, lines = resume_auto(run_dir)
    assert chosen == newest
    assert lines == [f"skipping checkpoint {older}: {older}: manifest.json says step 99 but state.pt holds step 22; "
                     f"the manifest was edited or damaged"]


@pytest.mark.parametrize("field, problem", [
    ("bytes", "the entry of __0_0.distcp has no valid 'bytes' (found None; every file needs its 'sha256' and its "
              "size in 'bytes')"),
    ("sha256", "the entry of __0_0.distcp has no valid 'sha256' (found None; every file needs its 'sha256' and "
               "its size in 'bytes')"),
])
def test_a_manifest_entry_without_its_size_or_checksum_is_named(tmp_path, field, problem):
    run_dir = tmp_path / "run"
    older, newest = saved_run(run_dir / "checkpoints", 22, 24)
    edit_manifest(newest, lambda m: m["files"]["__0_0.distcp"].pop(field))
    expected = f"{newest / ckpt.MANIFEST} is corrupt: {problem}; the manifest was edited or damaged"
    with pytest.raises(ckpt.CheckpointError) as caught:  # was: a bare KeyError
        ckpt.verify_checkpoint(newest)
    assert str(caught.value) == expected
    chosen, lines = resume_auto(run_dir)
    assert chosen == older and lines == [f"skipping checkpoint {newest}: {expected}"]


@pytest.mark.parametrize("listed, missing", [
    ([], ckpt.STATE_FILE),  # the report's case: an empty file list
    ([".metadata", "state.pt"], "__0_0.distcp"),  # the tensors' file alone left out
])
def test_a_manifest_that_lists_too_little_vouches_for_nothing(tmp_path, listed, missing):
    run_dir = tmp_path / "run"
    older, newest = saved_run(run_dir / "checkpoints", 22, 24)
    edit_manifest(newest, lambda m: m.update(files={k: v for k, v in m["files"].items() if k in listed}))
    flip_byte(newest / "__0_0.distcp")  # a flipped tensor byte that an emptied list let through
    expected = (f"{newest}: manifest.json does not list {missing}, which a load reads, so nothing vouches for its "
                f"bytes; the manifest was edited or damaged")
    for read in (ckpt.verify_checkpoint, ckpt.load_student_state):
        with pytest.raises(ckpt.CheckpointError) as caught:
            read(newest)
        assert str(caught.value) == expected
    chosen, lines = resume_auto(run_dir)
    assert chosen == older and lines == [f"skipping checkpoint {newest}: {expected}"]


def test_all_checkpoints_damaged_stops_resume_auto_naming_each(make_config, tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    older, newest = saved_run(run_dir / "checkpoints", 22, 24)
    flip_byte(newest / ckpt.dcp_store.METADATA_FILE)
    state = older / ckpt.STATE_FILE
    state.write_bytes(state.read_bytes()[:100])
    before = tree_digest(run_dir / "checkpoints")
    expected = (
        f"resume=auto: none of the 2 checkpoints in {run_dir / 'checkpoints'} is intact, so there is nothing to "
        f"continue from (step_00000024: {newest}: .metadata is corrupt or truncated (checksum mismatch); "
        f"step_00000022: {older}: state.pt is corrupt or truncated (checksum mismatch)). Nothing was started and "
        f"nothing was deleted. Fix: put back an intact copy of one of them (e.g. from a backup); or, to start over "
        f"from step 0, run with resume=null in a new run_dir (run_dir=<new directory>), which leaves these "
        f"checkpoints as they are for inspection")
    # The command: refused before any work (it used to say "no checkpoint yet, starting fresh").
    assert refused_run(make_config, tiny_run, run_dir, "resume=auto", error=ckpt.NoIntactCheckpointError) == expected
    with pytest.raises(ckpt.NoIntactCheckpointError) as caught:  # and the resume itself, with each skip said
        resume_auto_lines: list[str] = []
        resolve_resume("auto", run_dir, log=resume_auto_lines.append)
    assert str(caught.value) == expected
    assert resume_auto_lines == [f"skipping checkpoint {newest}: {newest}: .metadata is corrupt or truncated "
                                 f"(checksum mismatch)",
                                 f"skipping checkpoint {older}: {older}: state.pt is corrupt or truncated "
                                 f"(checksum mismatch)"]
    assert tree_digest(run_dir / "checkpoints") == before
    # The way out the message names: a fresh run in a new directory is not refused.
    ckpt.check_run_dir_checkpoints(tmp_path / "new" / "checkpoints", None)


def test_a_directory_without_any_checkpoint_still_starts_fresh(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    ckpt.begin_checkpoint(tmp_path / "checkpoints", 5)  # an unfinished save is no checkpoint
    chosen, lines = resume_auto(tmp_path)
    assert chosen is None and lines == ["resume=auto: no checkpoint yet, starting fresh"]
