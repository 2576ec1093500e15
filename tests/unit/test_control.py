"""The control channel's one request and one acknowledgement, through the file transport."""
from __future__ import annotations

import pytest

from synapse.control import ControlRecordError, FileControlChannel, StopAck, StopRequest
from synapse.partitioning import Placement


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


def test_bad_records_are_named(tmp_path):
    with pytest.raises(ControlRecordError, match="mode must be one of"):
        request("teleport")
    channel = FileControlChannel(tmp_path)
    channel.request_path.parent.mkdir(parents=True)
    channel.request_path.write_text("{torn")
    with pytest.raises(ControlRecordError, match="stop.json is not JSON.*Fix: delete it"):
        channel.poll()
    channel.request_path.write_text('{"id": "x"}')
    with pytest.raises(ControlRecordError, match="not a stop request"):
        channel.poll()
