"""The run directory as a protocol: synapse/rundir/layout.py declares every file and folder; every
entry renders inside its directory and reads back, and docs/run_directory.md is the layout's own
table.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from synapse.rundir import (
    CHECKPOINT,
    ENTRIES,
    EVENTS,
    FAILURE_RECORD,
    FAILURES,
    HEARTBEAT,
    NESTED_RUN,
    RUN,
    SEGMENT_RECORD,
    SWEEP,
    Entry,
    LayoutError,
    declared,
    entries,
    markdown_table,
)
from synapse.rundir import FIELDS as LAYOUT_FIELDS

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "run_directory.md"


# ----------------------------------------------------------------------------------------------- the layout
def sample(entry: Entry) -> dict[str, object]:
    """A value of each of the entry's fields, as the run fills them in."""
    values = {"rank": 2, "segment": 3, "node": 1, "attempt": "3_node1", "step": 120, "nonce": "ab12cd34",
              "token": 4242, "role": "train", "kind": "eval", "agent": "5f0c1d2e3a4b_x1y2z3w4", "restart": 0,
              "local_rank": 1, "figure": "timeline", "ext": "svg", "job": 7, "job_id": "123456", "task": 0,
              "stream": "err"}
    assert set(LAYOUT_FIELDS) <= set(values), "a field without a sample value here"
    return {field: values[field] for field in entry.fields}


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.root}:{e.template}")
def test_every_entry_renders_inside_its_directory_and_reads_back(entry, tmp_path):
    fields = sample(entry)
    path = entry.path(tmp_path, **fields)
    assert path.resolve().is_relative_to(tmp_path.resolve()) and path != tmp_path
    relative = path.relative_to(tmp_path).as_posix()
    assert "{" not in relative and "}" not in relative
    match = entry.regex.fullmatch(relative)
    assert match, f"{relative} does not match its own template {entry.template}"
    assert declared(relative, entry.root) is entry or declared(relative, entry.root).template == entry.template
    assert entry.name(**{f: v for f, v in fields.items() if "{" + f in entry.template.rstrip("/").rsplit("/", 1)[-1]}
                      ) == path.name
    assert entry.name_regex.match(path.name)
    assert Path(tmp_path).joinpath(entry.glob(**fields)) == path
    assert entry.holds and entry.writer and entry.readers and entry.format and entry.written
    if entry.temp:
        temporary = entry.temp_path(path, 4242)
        assert temporary.parent == path.parent and temporary.name != path.name
        assert declared(temporary.relative_to(tmp_path).as_posix(), entry.root) is entry
    if entry.inside:
        assert entry.is_folder, "only a folder holds another format's files"


def test_templates_are_unique_per_directory_and_never_leave_it():
    for root in (RUN, SWEEP):
        templates = [e.template for e in entries(root)]
        assert len(templates) == len(set(templates)), "an entry declared twice"
    for entry in ENTRIES:
        assert not entry.template.startswith("/") and ".." not in entry.template.split("/")


@pytest.mark.parametrize("bad", [{"rank": "../../etc"}, {"rank": "1/2"}, {"rank": ".."}, {"rank": "x"}, {},
                                 {"rank": 1, "segment": 2}])
def test_a_path_with_a_missing_unknown_or_unsafe_field_is_refused(bad, tmp_path):
    with pytest.raises(LayoutError):
        HEARTBEAT.path(tmp_path, **bad)


def test_names_globs_and_temporaries_are_the_ones_the_writers_have_always_used(tmp_path):
    assert HEARTBEAT.glob() == "live/rank_*.json"
    assert HEARTBEAT.temp_path(HEARTBEAT.path(tmp_path, rank=0), 12) == tmp_path / "live" / "rank_0.tmp-12"
    assert CHECKPOINT.name(step=8) == "step_00000008" and CHECKPOINT.name_regex.match("step_00000008").group(1)
    assert not CHECKPOINT.name_regex.match("step_00000008.tmp-ab12")
    assert FAILURE_RECORD.glob(within=FAILURES) == "rank_*.json"
    assert SEGMENT_RECORD.shown == "segments/<segment>/segment.json"
    assert EVENTS.path(tmp_path) == tmp_path / "failover_events.jsonl"


def test_inside_a_nested_run_directory_the_layout_applies_again():
    nested = [e for e in ENTRIES if e.inside == NESTED_RUN]
    assert nested
    assert declared("teacher_training/checkpoints/step_00000004") is not None
    assert declared("teacher_training/not_ours.txt") is None
    assert declared("3/segments/1/segment.json", SWEEP) is SEGMENT_RECORD
    assert declared("checkpoints/step_00000004/__0_0.distcp") is CHECKPOINT  # the checkpoint format's own file
    assert declared("stray.json") is None and declared("live/rank_x.json") is None


def test_the_docs_are_the_layout_s_own_table():
    assert DOCS.read_text() == markdown_table(), (
        "docs/run_directory.md is out of date: python -c \"from synapse.rundir import markdown_table; "
        "print(markdown_table(), end='')\" > docs/run_directory.md")


def test_the_table_lists_every_entry_once_under_its_directory():
    run_part, sweep_part = markdown_table().split("## A sweep directory")
    for entry in ENTRIES:
        part = run_part if entry.root == RUN else sweep_part
        assert part.count(f"| `{entry.template}` |") == 1, entry.template


# ----------------------------------------------------------------------------------------------- a writer
class Killed(BaseException):
    """A writer stopped mid-write (the elastic agent's SIGTERM, SIGKILL): no except clause runs."""


def test_a_failure_record_is_whole_or_absent_under_its_name(tmp_path, monkeypatch):
    from synapse.pipeline import write_failure

    failures = FAILURES.path(tmp_path, attempt="0")
    write_failure(failures, 1, RuntimeError("the root cause"))
    assert sorted(p.name for p in failures.iterdir()) == [FAILURE_RECORD.name(rank=1)]  # no temporary left behind

    def stopped_halfway(path: Path, data: str, *args: object, **kwargs: object) -> int:
        with open(path, "w") as f:
            f.write(data[: len(data) // 2])
        raise Killed

    monkeypatch.setattr(Path, "write_text", stopped_halfway)
    with pytest.raises(Killed):
        write_failure(failures, 2, RuntimeError("a peer's loss"))
    # The launcher reads rank_*.json: rank 2's half record is not among them, only a temporary it ignores.
    assert sorted(p.name for p in failures.glob(FAILURE_RECORD.glob(within=FAILURES))) == [FAILURE_RECORD.name(rank=1)]
    [stray] = [p for p in failures.iterdir() if p.name != FAILURE_RECORD.name(rank=1)]
    assert declared(stray.relative_to(tmp_path).as_posix()) is FAILURE_RECORD
