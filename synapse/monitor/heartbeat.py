"""Liveness records: each worker says who it is (pid) and how far it got (step), atomically.

``<run_dir>/live/rank_<r>.json`` is rewritten (temp file + rename) at start-up and after
every step, so the supervisor's watchdog can tell a dead process (pid gone) from a hung one
(pid alive, step not advancing) without any collective.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "live" / f"rank_{rank}.json"


class Heartbeat:
    def __init__(self, run_dir: Path, rank: int, device: str):
        self.path = heartbeat_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.device = rank, device
        self.beat(step=0, phase="starting")

    def beat(self, step: int, phase: str = "training") -> None:
        record = {"rank": self.rank, "pid": os.getpid(), "device": self.device, "step": step, "phase": phase,
                  "time": time.time()}
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)


def read_heartbeats(run_dir: Path) -> dict[int, dict[str, Any]]:
    beats = {}
    for path in sorted((Path(run_dir) / "live").glob("rank_*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being replaced right now: the next read sees it
        if is_heartbeat(record):  # anything else (damaged, or planted) is not a worker's: ignored
            beats[record["rank"]] = record
    return beats


def is_heartbeat(record: Any) -> bool:
    """Whether ``record`` has the shape ``Heartbeat.beat`` writes (the fields the monitor reads)."""
    def whole(value: Any, minimum: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= minimum

    return (isinstance(record, dict) and whole(record.get("rank"), 0) and whole(record.get("pid"), 1)
            and whole(record.get("step"), 0) and isinstance(record.get("phase", ""), str)
            and isinstance(record.get("time", 0.0), (int, float)) and not isinstance(record.get("time"), bool))
