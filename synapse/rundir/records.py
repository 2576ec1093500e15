"""JSONL record files: the one writer, the one reader and the one tailing reader.

Every record file of a run (metrics, performance, health, failover events, sweep records) is
one JSON object per line, appended and flushed per record so a killed process keeps what it
wrote. One policy for reading them, everywhere:

- a last line without its newline is a record still being written (or cut off by a kill or a
  full disk): it is not read yet, never an error;
- any other line that is not a JSON object is an error naming the file, the line and the fix,
  unless the reader asks to skip such lines and be told (``skipped``): the report of a run that
  trained to its end is drawn over a damaged line and names it.

A writer that opens a file whose last record was torn by a killed predecessor first cuts the
torn piece off, so it can never merge with the next record into a bad middle line.

A leaf module: no torch (tensors are written through their ``item``/``tolist``).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class RecordFileError(ValueError):
    """A record file that exists but holds a line that is not one of Synapse's records."""


def _jsonable(value: Any) -> Any:
    if hasattr(value, "numel") and hasattr(value, "tolist"):  # a tensor
        return value.item() if value.numel() == 1 else value.tolist()
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    if isinstance(value, os.PathLike):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSONL")


def cut_torn_tail(path: Path) -> None:
    """Drop an unterminated last line (a record a killed writer never finished)."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
            cut = tail.rfind(b"\n")
            f.truncate(size - len(tail) + cut + 1 if cut >= 0 else (0 if size <= (1 << 20) else size))
    except FileNotFoundError:
        return


class JsonlWriter:
    """Append one JSON object per line; flushed per record so a killed run keeps what it wrote."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cut_torn_tail(self.path)
        self._file = open(self.path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        record.setdefault("time", time.time())
        self._file.write(json.dumps(record, default=_jsonable) + "\n")

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullWriter(JsonlWriter):
    """The writer of a process that keeps no records (e.g. a pipeline rank without the loss)."""

    def __init__(self) -> None:  # opens no file
        pass

    def write(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def parse_line(line: bytes | str, where: str, error: type[Exception] = RecordFileError) -> dict[str, Any]:
    """One complete line as a record; ``where`` (``file:line``) names it in the error."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise error(f"{where} is not JSON ({exc}); Synapse writes one JSON object per line there. "
                    f"Fix: remove or repair that line") from exc
    if not isinstance(record, dict):
        raise error(f"{where}: a {type(record).__name__} where a JSON object belongs. "
                    f"Fix: remove or repair that line")
    return record


def iter_jsonl(path: Path | str, error: type[Exception] = RecordFileError,
               skipped: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """The records of a file in order (none when it is missing), by the policy above. With a
    ``skipped`` list, a bad complete line is left out and its error message appended there."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):  # the last piece lacks its newline
        if not line.strip():
            continue
        try:
            yield parse_line(line, f"{path}:{number}", error)
        except error as exc:
            if skipped is None:
                raise
            skipped.append(str(exc))


def read_jsonl(path: Path | str, error: type[Exception] = RecordFileError,
               skipped: list[str] | None = None) -> list[dict[str, Any]]:
    return list(iter_jsonl(path, error, skipped))


class JsonlTail:
    """Reads the records appended to a file since the last call (a file that grows while read).

    It starts after the last complete line already there: those records belong to earlier
    writers. An unterminated last line is read again at the next call rather than kept: a new
    writer may have cut it off (``cut_torn_tail``) and written a whole record in its place.
    """

    def __init__(self, path: Path | str, from_start: bool = False, error: type[Exception] = RecordFileError):
        self.path, self.error = Path(path), error
        self._offset, self._line = 0, 0  # just after the last complete line read, and its number
        if not from_start:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                data = b""
            self._offset = data.rfind(b"\n") + 1
            self._line = data.count(b"\n")

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        complete = chunk[:chunk.rfind(b"\n") + 1]  # an unterminated last line is still being written
        self._offset += len(complete)
        records = []
        for line in complete.split(b"\n")[:-1]:
            self._line += 1
            if line.strip():
                records.append(parse_line(line, f"{self.path}:{self._line}", self.error))
        return records
