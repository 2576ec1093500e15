"""The one JSONL writer, reader and tailing reader (synapse.rundir.records), and the record readers built on it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from synapse.analysis import RecordFileError as AnalysisRecordError
from synapse.analysis import read_jsonl as analysis_read_jsonl
from synapse.detection import TimingRecordError, read_step_timings
from synapse.rundir import EventLogError, JsonlTail, JsonlWriter, RecordFileError, read_events, read_jsonl

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"


def test_a_torn_last_line_is_not_read_yet_and_a_torn_middle_line_is_an_error(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(RecordFileError, match=r"r.jsonl:2 is not JSON .*Fix: remove or repair that line"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(RecordFileError, match=r"r.jsonl:2: a list where a JSON object belongs"):
        read_jsonl(path)
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_every_reader_applies_the_same_policy_with_its_own_error_type(tmp_path):
    path = tmp_path / "failover_events.jsonl"
    good = '{"event": "x", "time": 1, "step": 1, "step_seconds": 1, "compute_s": [1], "comm_s": [0]}'
    path.write_text(f'{good}\n{{oops\n{good}\n')
    for reader, error in ((read_events, EventLogError), (analysis_read_jsonl, AnalysisRecordError),
                          (read_step_timings, TimingRecordError)):
        with pytest.raises(error, match=r"failover_events.jsonl:2 is not JSON"):
            reader(path)
        assert issubclass(error, RecordFileError)


def test_a_writer_cuts_the_torn_record_a_killed_writer_left_so_the_next_record_stays_whole(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')  # a writer killed mid-record
    with JsonlWriter(path) as writer:
        writer.write({"step": 2, "loss": torch.tensor(0.5)})
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    assert read_jsonl(path)[1]["loss"] == 0.5


def test_the_tail_reads_only_new_complete_records_and_survives_a_cut_torn_tail(tmp_path):
    path = tmp_path / "performance.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "x')  # an earlier launch's records, and its torn end
    tail = JsonlTail(path)
    assert tail.read_new() == []
    with JsonlWriter(path) as writer:  # the next launch's writer cuts the torn piece off
        writer.write({"step": 2})
        assert tail.read_new() == [{"step": 2, "time": read_jsonl(path)[-1]["time"]}]
        writer._file.write('{"step": 3')  # half a record: not read yet
        writer._file.flush()
        assert tail.read_new() == []
        writer._file.write(', "time": 0}\n')
    assert tail.read_new() == [{"step": 3, "time": 0}]
    assert JsonlTail(path, from_start=True).read_new()[0] == {"step": 1}


def test_the_runtimes_own_performance_records_are_step_timings():
    # The committed record of a real H200 run: the runtime writes "time", the detector reads it as wall_time.
    records = read_jsonl(RESULTS / "h200" / "monitor_bgload" / "performance.jsonl")
    timings = read_step_timings(RESULTS / "h200" / "monitor_bgload" / "performance.jsonl")
    assert len(timings) == len(records) > 100
    assert [t.wall_time for t in timings] == [r["time"] for r in records]
    assert json.loads(timings[0].to_json_line())["step"] == records[0]["step"]
