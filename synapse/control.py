"""The control channel between the supervisor and its running workers: one typed request, one
typed acknowledgement, their reader and writer, all here.

The supervisor sends a ``StopRequest``: "after the step you are in, stop (checkpoint and exit)
or re-partition live to this placement". Rank 0 polls the channel after every step and shares
what it saw in the step's exchange, so all ranks act after the same step; rank 0 then answers
with a ``StopAck`` naming the step they acted after. A request, not a signal: a signal could
land mid-collective, and the request carries the decision for the workers' logs.

Transport: ``FileControlChannel`` (``<run_dir>/control/``, written atomically by rename, so a
half-written request is never seen) serves every process that sees the run directory. Across
nodes (failover with ``trainer.nodes > 1``) ``StoreControlChannel`` carries the same records
over the job's own network: two keys in the store node 0 serves at ``trainer.rdzv_endpoint``.
``open_channel`` picks the one a segment uses, the same on the supervisor's side and the workers'.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from synapse.partitioning import Placement
from synapse.rundir import CONTROL, STOP_ACK, STOP_REQUEST

MODES = ("restart", "live")


class ControlRecordError(ValueError):
    """A control file that is not a request or acknowledgement Synapse wrote."""


@dataclass(frozen=True)
class StopRequest:
    id: str  # unique per decision: a live re-partition already applied is not applied twice
    action: str  # the decision: replan, degrade, replace, drill ...
    step: int  # the step the decision was made at
    segment: int  # the run's segment it was made in
    mode: str  # "live": re-partition the running workers; "restart": stop, checkpoint, exit
    placement: Placement  # where the next segment runs

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ControlRecordError(f"a stop request's mode must be one of {MODES}, got {self.mode!r}")

    @property
    def live(self) -> bool:
        return self.mode == "live"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "action": self.action, "step": self.step, "segment": self.segment, "mode": self.mode,
                "placement": self.placement.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StopRequest:
        try:
            return cls(str(data["id"]), str(data["action"]), int(data["step"]), int(data["segment"]),
                       str(data["mode"]), Placement.from_dict(data["placement"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlRecordError(f"not a stop request ({type(exc).__name__}: {exc}): {dict(data)!r}") from None


@dataclass(frozen=True)
class StopAck:
    request_id: str
    after_step: int  # every rank acted on the request after this step

    def to_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "after_step": self.after_step}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StopAck:
        try:
            return cls(str(data["request_id"]), int(data["after_step"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlRecordError(f"not a stop acknowledgement ({exc}): {dict(data)!r}") from None


class ControlChannel(Protocol):
    def send(self, request: StopRequest) -> None: ...
    def poll(self) -> StopRequest | None: ...
    def acknowledge(self, ack: StopAck) -> None: ...
    def acknowledged(self) -> StopAck | None: ...
    def clear(self) -> None: ...


class FileControlChannel:
    """The channel as two small files in ``<run_dir>/control/``."""

    def __init__(self, run_dir: Path | str):
        self.dir = CONTROL.path(run_dir)

    @property
    def request_path(self) -> Path:
        return self.dir / STOP_REQUEST.name()

    @property
    def ack_path(self) -> Path:
        return self.dir / STOP_ACK.name()

    def send(self, request: StopRequest) -> None:
        self._write(self.request_path, request.to_dict())
        self.ack_path.unlink(missing_ok=True)

    def poll(self) -> StopRequest | None:
        data = self._read(self.request_path)
        return None if data is None else StopRequest.from_dict(data)

    def acknowledge(self, ack: StopAck) -> None:
        self._write(self.ack_path, ack.to_dict())

    def acknowledged(self) -> StopAck | None:
        data = self._read(self.ack_path)
        return None if data is None else StopAck.from_dict(data)

    def clear(self) -> None:
        self.request_path.unlink(missing_ok=True)
        self.ack_path.unlink(missing_ok=True)

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = STOP_REQUEST.temp_path(path, os.getpid())  # the request's and the acknowledgement's are alike
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ControlRecordError(f"{path} is not JSON ({exc}); it is written by the supervisor only. "
                                     f"Fix: delete it and restart with resume=auto") from None


class StoreControlChannel:
    """The channel as two keys of a c10d store (``set``/``get``/``check``/``delete_key``: a TCPStore).
    A key is set whole, so a half-written request is never seen either."""

    STOP_KEY, ACK_KEY = "synapse/control/stop", "synapse/control/ack"

    def __init__(self, store: Any):
        self.store = store
        # one connection: the supervisor sends from its watcher and (re-entrant) its signal handler
        self._lock = threading.RLock()

    def send(self, request: StopRequest) -> None:
        with self._lock:
            self.store.set(self.STOP_KEY, json.dumps(request.to_dict()))
            self.store.delete_key(self.ACK_KEY)

    def poll(self) -> StopRequest | None:
        data = self._read(self.STOP_KEY)
        return None if data is None else StopRequest.from_dict(data)

    def acknowledge(self, ack: StopAck) -> None:
        with self._lock:
            self.store.set(self.ACK_KEY, json.dumps(ack.to_dict()))
            self.store.check([self.ACK_KEY])  # a set is not answered; a round trip makes it visible to every client

    def acknowledged(self) -> StopAck | None:
        data = self._read(self.ACK_KEY)
        return None if data is None else StopAck.from_dict(data)

    def clear(self) -> None:
        with self._lock:
            self.store.delete_key(self.STOP_KEY)
            self.store.delete_key(self.ACK_KEY)

    def _read(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            text = self.store.get(key) if self.store.check([key]) else None
        if text is None:
            return None
        try:
            return json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ControlRecordError(f"store key {key} is not JSON ({exc}); it is written by the supervisor only. "
                                     f"Fix: give every run its own trainer.rdzv_endpoint port") from None


def control_endpoint(trainer: Any, failover: Any) -> str | None:
    """Where a segment's stop requests travel: the decider's store across nodes (failover on), else files.
    ``trainer`` and ``failover``: the config's groups of those names (this leaf does not import their types)."""
    return trainer.rdzv_endpoint if failover.enabled and trainer.nodes > 1 and trainer.rdzv_endpoint else None


def open_channel(run_dir: Path | str, endpoint: str | None = None, timeout_s: float = 60.0) -> ControlChannel:
    """The run directory's channel, or with ``endpoint`` (``control_endpoint``) the store there."""
    if not endpoint:
        return FileControlChannel(run_dir)
    from torch.distributed import TCPStore

    host, _, port = endpoint.rpartition(":")
    return StoreControlChannel(TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s)))
