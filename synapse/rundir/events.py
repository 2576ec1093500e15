"""The failover event log: ``<run_dir>/failover_events.jsonl``, one JSON object per line.

Every process of a run appends to the same file: workers (``fault_injected``,
``fault_cleared``), the supervisor's health monitor (``rank_dead``, ``rank_hung``,
``probe_failed``, ``xid``, ``throttle``) and later the failover controller. Each record is
written with one ``write`` on a descriptor opened with O_APPEND, so lines from concurrent
processes never interleave and a record is in the file (the page cache) as soon as the call
returns, even if the writer is SIGKILLed right after, as a ``kill`` fault does.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from synapse.rundir.layout import EVENTS
from synapse.rundir.records import RecordFileError, iter_jsonl


class EventLogError(RecordFileError):
    """A record that cannot be logged, or a log line that is not a JSON object."""


def events_path(run_dir: Path | str) -> Path:
    return EVENTS.path(run_dir)


class EventLog:
    """Appends events to one JSONL file; safe to share between processes and threads."""

    def __init__(self, path: Path | str, **context: Any):
        """``context`` fields (e.g. ``source='health'``) are added to every record."""
        self.path = Path(path)
        self.context = context

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write ``{"time": now, "event": event, **context, **fields}``; return the record."""
        return self.write({"event": event, **fields})

    def write(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write a record that has an ``event`` name (``time`` is added when missing)."""
        if not isinstance(record.get("event"), str) or not record["event"]:
            raise EventLogError(f"an event record needs a non-empty 'event' name, got {dict(record)!r}")
        full = {"time": time.time(), **self.context, **record}
        line = (json.dumps(full, default=_plain) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)  # one write: atomic w.r.t. other appenders
        finally:
            os.close(fd)
        if written != len(line):
            raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes (disk full?)")
        return full

    __call__ = write  # usable wherever a record callback is expected


def _plain(value: Any) -> Any:
    """JSON for values json cannot encode itself (paths, tuples of numpy numbers, devices)."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def iter_events(path: Path | str) -> Iterator[dict[str, Any]]:
    """The records of an event log (a file, or a run directory) in file order; a missing file has
    none. Read by ``synapse.rundir.records``' one policy: a torn last line is not read yet, any other
    line that is not a JSON object is an error."""
    path = Path(path)
    if path.is_dir():
        path = events_path(path)
    return iter_jsonl(path, EventLogError)


def read_events(path: Path | str, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
    """Records of a log (a file, or a run directory), optionally only those named ``event`` whose
    fields equal ``match`` (e.g. ``read_events(run_dir, "fault_injected", rank=2)``)."""
    return [r for r in iter_events(path)
            if (event is None or r.get("event") == event) and all(r.get(k) == v for k, v in match.items())]
