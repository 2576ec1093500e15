"""Reading a run directory's record files, forgivingly: a missing file is "no records", never an error.

A run that is still going (or was killed) may end a JSONL file with half a line; that line is
skipped. Anything else that is not JSON is someone else's file, and says so.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from synapse.rundir import CONFIG, EVENTS, EXPERIMENT_SUMMARY, METRICS, MULTIRUN, PERFORMANCE, RUN_SUMMARY
from synapse.rundir import RecordFileError as BaseRecordFileError
from synapse.rundir import read_jsonl as read_records

# Any one of these makes a directory a run directory (a run killed early may have only a few).
RUN_FILES = (METRICS, PERFORMANCE, EVENTS, EXPERIMENT_SUMMARY, RUN_SUMMARY, CONFIG)


class AnalysisError(ValueError):
    """Something synapse.analysis was given cannot be analysed (the message says what and the fix)."""


class RunDirError(AnalysisError):
    """A path that is not a run directory."""


class SweepDirError(AnalysisError):
    """A path that is not a Hydra multirun (sweep) directory."""


class RecordFileError(AnalysisError, BaseRecordFileError):
    """A record file that exists but is not what Synapse writes."""


def read_jsonl(path: Path, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file in file order ([] when the file is missing), by
    ``synapse.rundir.records``' one policy (a torn last line is skipped; any other bad line is an
    error, or, given a ``skipped`` list, left out and named there)."""
    return read_records(path, RecordFileError, skipped)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file ({} when missing)."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RecordFileError(f"{path} is not JSON ({exc}); it may have been cut off. Fix: rerun, or delete it "
                              f"to analyse the run without it") from exc
    if not isinstance(value, dict):
        raise RecordFileError(f"{path} holds a {type(value).__name__}, not a JSON object")
    return value


def read_yaml(path: Path) -> Any:
    """A YAML file's content (None when missing)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecordFileError(f"{path} is not YAML ({exc})") from exc


def is_run_dir(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and any(entry.path(path).is_file() for entry in RUN_FILES)


def check_run_dir(path: Path) -> Path:
    """``path`` as a Path if it is a run directory, else a RunDirError saying what would be."""
    path = Path(path)
    if not path.exists():
        raise RunDirError(f"run directory {path} does not exist. Fix: pass the run's output directory "
                          f"(hydra.run.dir, e.g. outputs/<date>/<time>_kd)")
    if not path.is_dir():
        raise RunDirError(f"{path} is a file, not a run directory. Fix: pass the directory that holds it")
    if MULTIRUN.path(path).is_file():
        raise RunDirError(f"{path} is a sweep (it has {MULTIRUN.template}), not one run. Fix: use "
                          f"load_sweep({str(path)!r}), or load_run on one of its job folders")
    if not is_run_dir(path):
        raise RunDirError(f"{path} is not a run directory: it has none of {', '.join(e.template for e in RUN_FILES)}. "
                          f"Fix: pass the directory that python train.py wrote (hydra.run.dir)")
    return path


def latest_run_dir(outputs: str | Path = "outputs") -> Path:
    """The newest run directory Hydra wrote under ``outputs/<date>/<time>_<mode>`` (sweeps excluded)."""
    outputs = Path(outputs)
    runs = [p for p in outputs.glob("*/*") if p.parent.name != "multirun" and is_run_dir(p)]
    if not runs:
        raise RunDirError(f"no run directory under {outputs}/<date>/<time>. Fix: run python train.py first, or "
                          f"point at a run (e.g. SYNAPSE_RUN_DIR=/path/to/run for the notebooks)")
    return max(runs, key=lambda p: p.stat().st_mtime)


def latest_sweep_dir(outputs: str | Path = "outputs") -> Path:
    """The newest sweep directory under ``outputs/multirun/<date>/<time>``."""
    outputs = Path(outputs)
    sweeps = [p.parent for p in outputs.glob(f"multirun/*/*/{MULTIRUN.template}")]
    if not sweeps:
        raise SweepDirError(f"no sweep under {outputs}/multirun/<date>/<time>. Fix: run python train.py -m ... "
                            f"first, or point at a sweep (e.g. SYNAPSE_SWEEP_DIR=/path/to/sweep for the notebooks)")
    return max(sweeps, key=lambda p: p.stat().st_mtime)
