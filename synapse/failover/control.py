"""The one message the supervisor sends to running workers: "stop after this step".

The supervisor writes ``<run_dir>/control/stop.json`` (atomically); rank 0 looks for it after
every step and shares what it saw in the step's all-gather, so all ranks stop after the same
step, write one checkpoint together and exit cleanly. A file, not a signal: a signal could
land mid-collective, and the file also says why (the decision) for the workers' logs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CONTROL_DIR = "control"
STOP_FILE = "stop.json"


def stop_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / CONTROL_DIR / STOP_FILE


def request_stop(run_dir: Path | str, **reason: Any) -> None:
    path = stop_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(reason))
    os.replace(tmp, path)


def stop_requested(run_dir: Path | str) -> dict[str, Any] | None:
    """The stop request, or None (a half-written file cannot be seen: it is renamed into place)."""
    try:
        return json.loads(stop_path(run_dir).read_text())
    except FileNotFoundError:
        return None


def clear_stop(run_dir: Path | str) -> None:
    stop_path(run_dir).unlink(missing_ok=True)
