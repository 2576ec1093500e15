"""The control channel's one request and one acknowledgement, through the file transport."""
from __future__ import annotations

import logging

import pytest

from synapse.control import ControlRecordError, FileControlChannel, StopAck, StopRequest
from synapse.partitioning import Placement
from synapse.rundir import read_events


def request(mode: str = "live") -> StopRequest:
    return StopRequest("abc", "replan", 78, 0, mode, Placement((0, 1, 2), (5, 5, 1), (4, 6, 1)))


def test_a_request_and_its_acknowledgement_round_trip_and_clear(tmp_path):
    channel = FileControlChannel(tmp_path)
    assert channel.poll() is None and channel.acknowledged() is None
    channel.send(request())
    assert channel.poll() == request() and channel.poll().live
    channel.acknowledge(StopAck("abc", 79))
    assert channel.acknowledged() == StopAck("abc", 79)
    channel.send(request("restart"))  # a new request drops the old acknowledgement
    assert channel.acknowledged() is None and not channel.poll().live
    channel.clear()
    assert channel.poll() is None and not any(channel.dir.iterdir())


def test_bad_records_are_refused_and_logged_never_raised_in_a_rank(tmp_path, caplog, monkeypatch):
    """#33 item 9: rank 0 raised on a bad record, was judged dead and its healthy device dropped."""
    # An in-process Hydra run earlier in this worker configures logging and may have disabled the
    # existing "synapse" logger or stopped it propagating to caplog's handler
    logger = logging.getLogger("synapse")
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "propagate", True)
    with pytest.raises(ControlRecordError, match="mode must be one of"):
        request("teleport")
    channel = FileControlChannel(tmp_path)
    channel.request_path.parent.mkdir(parents=True)
    for bad in ("{torn", '{"id": "x"}', "[1, 2]", "\udcff"):
        channel.request_path.write_text(bad, errors="surrogateescape")
        assert channel.poll() is None
    refusals = [r.getMessage() for r in caplog.records if "refused the value" in r.getMessage()]
    assert len(refusals) == 4 and all(f"under '{channel.request_path}'" in line for line in refusals), refusals
    assert "not a StopRequest" in refusals[1]
    events = read_events(tmp_path, "store_record_refused")
    assert [e["key"] for e in events] == [str(channel.request_path)] * 4
