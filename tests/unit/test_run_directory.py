"""The run directory as a protocol: synapse/rundir/layout.py declares every file and folder, and
nothing else in synapse/ spells one of their names.

The source scan reads every module's string literals (plain and f-strings, docstrings aside) and
refuses one that spells a declared name: a name with a suffix or a field (``metrics.jsonl``,
``rank_{rank}.json``, ``step_*.tmp-*``) anywhere, a folder's plain word (``live``, ``segments``)
only where a path is built from it (``run_dir / "live"``, ``Path(..., "live")``, a ``*_DIR``
constant), since the same words are modes, keys and tags elsewhere. A real run then writes nothing
the layout does not declare, and docs/run_directory.md is the layout's own table.
"""
from __future__ import annotations

import ast
import os
import re
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
SYNAPSE = REPO / "synapse"
LAYOUT_MODULE = SYNAPSE / "rundir" / "layout.py"
DOCS = REPO / "docs" / "run_directory.md"

# ----------------------------------------------------------------------------------------------- the scan
# Calls whose string arguments are parts of a path.
PATH_CALLS = {"Path", "PurePath", "PurePosixPath", "joinpath", "glob", "rglob", "with_name", "with_suffix"}
# Module constants whose value is a path part (CONTROL_DIR = "control").
PATH_CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*(DIR|FILE|FOLDER|PATH|SUBDIR|NAME)S?$")
TOKEN_BREAKS = re.compile(r"[\s`'\"(),;:=<>\[\]]+")
PLAIN_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _shape(template_part: str) -> str:
    """A template's part with every field as ``*`` (``rank_{rank}.json`` -> ``rank_*.json``)."""
    return re.sub(r"\{[^{}]*\}", "*", template_part)


def _constant_length(shape: str) -> int:
    return len(shape.replace("*", ""))


class Declared:
    """One part (between slashes) of a declared template, as the scan compares literals with it."""

    def __init__(self, part: str, entry: Entry):
        self.part, self.entry, self.shape = part, entry, _shape(part)
        self.regex = re.compile(Entry(part, "", "", "", "", "").name_regex.pattern)
        self.plain = "{" not in part and bool(PLAIN_WORD.fullmatch(part))

    def spelled_by(self, part: str, in_path: bool) -> bool:
        """Whether a literal's part (``*`` where an f-string has a value) spells this name: the layout's
        pattern takes it whole, or, with ``*``, it matches the declared shape and spells as much of it."""
        if self.plain:
            return in_path and part == self.part
        if "*" not in part:
            return bool(self.regex.fullmatch(part))
        as_glob = "".join(".*" if c == "*" else re.escape(c) for c in part)
        return bool(re.fullmatch(as_glob, self.shape)) and _constant_length(part) >= _constant_length(self.shape)


def declared_parts() -> list[Declared]:
    """Every distinctive part of every template (and temporary): parts that are only fields, or with
    fewer than three letters besides them (``{job}``, ``{figure}.{ext}``), could be anything."""
    parts = {}
    for entry in ENTRIES:
        for template in filter(None, (entry.template, entry.temp_template)):
            for part in template.rstrip("/").split("/"):
                if _constant_length(_shape(part)) >= 3 and part not in parts:
                    parts[part] = Declared(part, entry)
    return list(parts.values())


def _literal(node: ast.AST) -> str | None:
    """A string constant's text, or an f-string's with ``*`` for each value (``f"rank_{r}.json"``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _shape(node.value)  # a str.format template's fields are values too
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
    return None


def _in_path(node: ast.AST, parent: ast.AST | None) -> bool:
    """Whether the literal ``node`` is used as a part of a path."""
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div):
        return True
    if isinstance(parent, ast.Call) and node in parent.args:
        func = parent.func
        return (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) in PATH_CALLS
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        return any(isinstance(t, ast.Name) and PATH_CONSTANT.match(t.id) for t in targets)
    return False


def spelled_names(source: str, parts: list[Declared] | None = None) -> list[tuple[int, str, str]]:
    """(line, literal, the declared name) for every literal of ``source`` that spells a declared name."""
    parts = declared_parts() if parts is None else parts
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skipped.add(node.value)  # a docstring (or a bare string): prose about the files, not a path
        if isinstance(node, ast.JoinedStr):  # read whole, not piece by piece (its values' own code is read)
            skipped.update(v for v in node.values if isinstance(v, ast.Constant))
            for value in node.values:
                if isinstance(value, ast.FormattedValue) and value.format_spec is not None:
                    skipped.update(ast.walk(value.format_spec))  # "08d" of f"{step:08d}"
    found = []
    for node in ast.walk(tree):
        text = None if node in skipped else _literal(node)
        if not text:
            continue
        in_path = _in_path(node, parents.get(node))
        for token in filter(None, TOKEN_BREAKS.split(text)):
            for piece in filter(None, token.split("/")):
                for part in parts:
                    if part.spelled_by(piece, in_path):
                        found.append((node.lineno, text, part.part))
    return found


def test_no_module_outside_the_layout_spells_a_run_directory_name():
    parts = declared_parts()
    offenders = []
    for path in sorted(SYNAPSE.rglob("*.py")):
        if path == LAYOUT_MODULE:
            continue
        for line, text, name in spelled_names(path.read_text(), parts):
            offenders.append(f"{path.relative_to(REPO)}:{line}: {text!r} spells the layout's {name}")
    assert not offenders, ("get these paths from synapse.rundir's layout (Entry.path / name / glob / shown):\n"
                           + "\n".join(offenders))


@pytest.mark.parametrize("snippet", [
    'path = run_dir / "performance.jsonl"',
    'tail = JsonlTail(Path(run_dir) / "metrics.jsonl")',
    'path = failure_dir / f"rank_{rank}.json"',
    'beats = (Path(run_dir) / "live").glob("rank_*.json")',
    'STATE_FILE = "failover/controller_state.json"',
    'CONTROL_DIR = "control"',
    'root = Path(run_dir, "segments")',
    'ref = latest_valid_checkpoint(run_dir / "checkpoints")',
    'name = f"step_{step:08d}"',
    'strays = root.glob("step_*.tmp-*")',
    'locks = Path(run_dir) / f".synapse{suffix}.lock"',
    'log_dir = run_dir / "logs" / f"launch_{attempt}"',
    'raise ValueError(f"{path} is unreadable: see {run_dir}/failover_events.jsonl")',
    'lines.append("the records: metrics.jsonl, performance.jsonl")',
    'folders = log_dir.glob("*/attempt_*/0")',
    'path = "segments/{}/segment.json".format(index)',
    'lines.append(f"records: {run_dir / \'failover_events.jsonl\'}")',  # the code inside an f-string's braces
])
def test_the_scan_finds_a_run_directory_name_spelled_again(snippet):
    assert spelled_names(snippet), f"the scan missed {snippet!r}"


@pytest.mark.parametrize("snippet", [
    'mode = "live" if live else "restart"',  # modes, keys and commands share the folders' words
    'segments = summary["segments"]',
    'MODES = ("restart", "live")',
    'parser.add_parser("report")',
    'path = cache_dir / "profiles" / f"{key}.csv"',  # the profile cache is not the run directory
    'seconds = record["step_seconds"]',
    'launcher = "launch_pipeline"',
    'def f():\n    """Reads live/rank_<r>.json and metrics.jsonl."""\n',  # docstrings are prose
    'path = directory / f"{name}.{fmt}"',  # any folder's figure
    'EVENTS.path(run_dir)',
    'tracker.marker(step, "failover/segment", text)',  # a tag with a slash is no path
    'STOP_KEY = "synapse/control/stop"',  # nor is a store key
])
def test_the_scan_passes_what_is_not_a_run_directory_name(snippet):
    assert not spelled_names(snippet)


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


# ----------------------------------------------------------------------------------------------- a real run
@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_real_run_with_a_restart_writes_only_what_the_layout_declares(train_py, tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    # A cache of its own: the teacher is trained here (teacher_training/), not found cached by an earlier test.
    result = train_py([*tiny_run, "trainer.devices=3", "trainer.max_steps=12", "checkpoint.every=4",
                       "checkpoint.keep=10", "data.batch_size=16", "data.augment=false", "pipeline.microbatches=4",
                       "failover.drills=[{step:5,action:degrade,device:0}]", f"hydra.run.dir={run_dir}"], timeout=880,
                      SYNAPSE_CACHE=str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    written = sorted(Path(folder, name).relative_to(run_dir).as_posix()
                     for folder, folders, files in os.walk(run_dir) for name in [*folders, *files])
    undeclared = [path for path in written if declared(path) is None]
    assert not undeclared, f"the run wrote files the layout does not declare: {undeclared}"
    # The run went through what the test is about: two segments, checkpoints, heartbeats, a nested run.
    seen = {declared(path).template for path in written}
    for template in ("segments/{segment}/segment.json", "segments/{segment}/resume/", "checkpoints/step_{step:08d}/",
                     "live/rank_{rank}.json", "live/rank_{rank}.progress", "performance.jsonl", "metrics.jsonl",
                     "failover_events.jsonl", "failover/controller_state.json", "experiment_summary.json",
                     "logs/launch_{attempt}/{agent}/attempt_{restart}/{local_rank}/stdout.log",
                     "report/report.md", "teacher_training/"):
        assert template in seen, f"the run wrote no {template}"
    assert SEGMENT_RECORD.path(run_dir, segment=1).is_file()
