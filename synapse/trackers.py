"""Experiment trackers (``logger=tensorboard|csv|none``): the run's scalars where other tools read them.

The JSONL records stay the source of truth (``synapse.rundir.records``); a tracker receives the same
records and writes what a person compares across runs: per training step the loss, learning rate,
step time and images/s; per evaluation the accuracies; failover decisions and segment changes as
text markers at their step. TensorBoard event files go to ``<run_dir>/tensorboard/<role>``
(each writing process its own folder: the last pipeline rank writes the training scalars, the
supervisor the failover markers), CSV files to ``<run_dir>/csv/<role>_<kind>.csv``.

``none`` is a tracker with nothing to do, not an ``if`` at every call site.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Protocol

from synapse.rundir import CSV_TABLE, CSV_TRACKER, TENSORBOARD_EVENTS

TRACKERS = ("tensorboard", "csv", "none")
_SCALAR_KINDS = ("train", "eval")


class Tracker(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...
    def marker(self, step: int, tag: str, text: str) -> None: ...
    def close(self) -> None: ...


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers, by name (step, epoch and time are axes, not scalars)."""
    return {key: float(value) for key, value in record.items()
            if key not in ("step", "epoch", "time", "kind") and isinstance(value, (int, float))
            and not isinstance(value, bool) and math.isfinite(value)}


class NullTracker:
    def write(self, record: dict[str, Any]) -> None:
        pass

    def marker(self, step: int, tag: str, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    def __init__(self, directory: Path):
        from torch.utils.tensorboard import SummaryWriter  # only runs that ask for TensorBoard import it

        self._writer = SummaryWriter(log_dir=str(directory), flush_secs=10)

    def write(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind not in _SCALAR_KINDS or "step" not in record:
            return
        for name, value in scalars_of(record).items():
            self._writer.add_scalar(f"{kind}/{name}", value, global_step=int(record["step"]),
                                    walltime=record.get("time"))

    def marker(self, step: int, tag: str, text: str) -> None:
        self._writer.add_text(tag, text, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class CsvTracker:
    """One CSV per record kind; its columns are the first record's scalars (later new names are dropped)."""

    def __init__(self, directory: Path, role: str):
        self.directory, self.role = directory, role
        self._files: dict[str, tuple[Any, csv.DictWriter]] = {}

    def _writer(self, kind: str, columns: list[str]) -> csv.DictWriter:
        if kind not in self._files:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / CSV_TABLE.name(role=self.role, kind=kind)
            fresh = not path.exists()
            handle = open(path, "a", newline="", buffering=1)
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
            if fresh:
                writer.writeheader()
            self._files[kind] = (handle, writer)
        return self._files[kind][1]

    def write(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind not in _SCALAR_KINDS or "step" not in record:
            return
        row = {"step": record["step"], "time": record.get("time"), **scalars_of(record)}
        self._writer(kind, list(row)).writerow(row)

    def marker(self, step: int, tag: str, text: str) -> None:
        self._writer("markers", ["step", "tag", "text"]).writerow({"step": step, "tag": tag, "text": text})

    def close(self) -> None:
        for handle, _ in self._files.values():
            handle.close()
        self._files.clear()


def open_tracker(name: str, run_dir: Path | str, role: str) -> Tracker:
    """The tracker ``logger.name`` asks for, writing as ``role`` (e.g. "train", "supervisor")."""
    run_dir = Path(run_dir)
    if name == "tensorboard":
        return TensorBoardTracker(TENSORBOARD_EVENTS.path(run_dir, role=role))
    if name == "csv":
        return CsvTracker(CSV_TRACKER.path(run_dir), role)
    if name == "none":
        return NullTracker()
    raise ValueError(f"logger {name!r} is not one of {TRACKERS}")


class TrackedWriter:
    """A record writer (``synapse.rundir.records.JsonlWriter``) that also hands every record to a tracker."""

    def __init__(self, records: Any, tracker: Tracker):
        self.records, self.tracker = records, tracker

    def write(self, record: dict[str, Any]) -> None:
        self.records.write(record)  # the JSONL writer adds the time first
        self.tracker.write(record)

    def close(self) -> None:
        self.records.close()
        self.tracker.close()

    def __enter__(self) -> TrackedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
