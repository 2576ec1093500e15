"""Append-only JSONL metric records and accuracy helpers, shared by every training path."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch


class JsonlWriter:
    """Append one JSON object per line; flushed per record so a killed run keeps what it wrote."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        record.setdefault("time", time.time())
        self._file.write(json.dumps(record, default=_jsonable) + "\n")

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "JsonlWriter":
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


def _jsonable(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, os.PathLike):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSONL")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read records, ignoring a torn last line left by a killed writer."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[int, int]:
    """How many samples have their label among the top-k logits, for each k (k capped at the class count)."""
    maxk = min(max(ks), logits.shape[-1])
    top = logits.topk(maxk, dim=-1).indices
    hits = top.eq(labels.unsqueeze(-1))
    return {k: int(hits[:, : min(k, maxk)].any(dim=-1).sum()) for k in ks}
