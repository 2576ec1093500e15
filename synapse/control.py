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

A record that is not one the supervisor or rank 0 wrote is no one's fault and stops nothing: the
reader refuses it, says so once (a log line and a ``store_record_refused`` event) and reads "no
request". On the store, which any process that reaches its port can write, every record is sealed
with the run's key for this launch (``synapse.rundir.run_key``): a forged, damaged or replayed one
is refused the same way, and the supervisor puts its request back if it finds it overwritten
(``keep``). Before, rank 0 raised on it and was judged dead: a healthy device dropped.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from synapse.partitioning import Placement
from synapse.rundir import CONTROL, STOP_ACK, STOP_REQUEST, Refusals, SealedStore, run_key

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
    def keep(self) -> None: ...


Refused = Callable[[str, bytes | str, str], None]  # (where, the value, why): synapse.rundir.Refusals


def _typed(cls, data: Any, where: str, raw: bytes | str, refused: Refused):
    """``cls.from_dict(data)``, or None with the refusal said (a record of the wrong shape)."""
    try:
        if not isinstance(data, Mapping):
            raise ControlRecordError(f"not a JSON object but {type(data).__name__}")
        return cls.from_dict(data)
    except Exception as exc:  # noqa: BLE001  (whatever is wrong with it, it is refused, never raised in a rank)
        refused(where, raw, f"not a {cls.__name__}: {type(exc).__name__}: {exc}"[:300])
        return None


class FileControlChannel:
    """The channel as two small files in ``<run_dir>/control/``."""

    def __init__(self, run_dir: Path | str, refused: Refused | None = None):
        self.dir = CONTROL.path(run_dir)
        self.refused = refused or Refusals(run_dir, source="control")

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
        return self._read(self.request_path, StopRequest)

    def acknowledge(self, ack: StopAck) -> None:
        self._write(self.ack_path, ack.to_dict())

    def acknowledged(self) -> StopAck | None:
        return self._read(self.ack_path, StopAck)

    def clear(self) -> None:
        self.request_path.unlink(missing_ok=True)
        self.ack_path.unlink(missing_ok=True)

    def keep(self) -> None:
        """Nothing to put back: only the run's own user can write the run directory."""

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = STOP_REQUEST.temp_path(path, os.getpid())  # the request's and the acknowledgement's are alike
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    def _read(self, path: Path, cls):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self.refused(str(path), raw, f"not JSON: {exc}")
            return None
        return _typed(cls, data, str(path), raw, self.refused)


class StoreControlChannel:
    """The channel as two keys of a c10d store (a TCPStore), each record sealed with the run's key for
    one launch (``scope``). A key is set whole, so a half-written request is never seen either."""

    STOP_KEY, ACK_KEY = "synapse/control/stop", "synapse/control/ack"

    def __init__(self, store: Any, key: bytes, scope: str, refused: Refused):
        self.store = store
        # one connection: the supervisor sends from its watcher and (re-entrant) its signal handler
        self.records = SealedStore(store, key, refused, scope=scope)

    def send(self, request: StopRequest) -> None:
        self.records.put(self.STOP_KEY, request.to_dict())
        self.records.delete(self.ACK_KEY)

    def poll(self) -> StopRequest | None:
        return self._read(self.STOP_KEY, StopRequest)

    def acknowledge(self, ack: StopAck) -> None:
        self.records.put(self.ACK_KEY, ack.to_dict())

    def acknowledged(self) -> StopAck | None:
        return self._read(self.ACK_KEY, StopAck)

    def clear(self) -> None:
        self.records.delete(self.STOP_KEY)
        self.records.delete(self.ACK_KEY)

    def keep(self) -> None:
        """Put the request back if someone overwrote or deleted it before rank 0 acknowledged it."""
        if self.records.wrote(self.STOP_KEY) and self.acknowledged() is None:
            self.records.keep(self.STOP_KEY)

    def _read(self, key: str, cls):
        data = self.records.get(key)  # None also for a value this run did not seal (refused, said once)
        return None if data is None else _typed(cls, data, key, json.dumps(data), self.records.refused)


def control_endpoint(trainer: Any, failover: Any) -> str | None:
    """Where a segment's stop requests travel: the decider's store across nodes (failover on), else files.
    ``trainer`` and ``failover``: the config's groups of those names (this leaf does not import their types)."""
    return trainer.rdzv_endpoint if failover.enabled and trainer.nodes > 1 and trainer.rdzv_endpoint else None


def open_channel(run_dir: Path | str, endpoint: str | None = None, timeout_s: float = 60.0, launch: int = 0,
                 refused: Refused | None = None) -> ControlChannel:
    """The run directory's channel, or with ``endpoint`` (``control_endpoint``) the store there, its
    records sealed for the launch that starts with segment ``launch`` (both sides name the same one)."""
    refused = refused or Refusals(run_dir, source="control")
    if not endpoint:
        return FileControlChannel(run_dir, refused)
    from torch.distributed import TCPStore

    host, _, port = endpoint.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    return StoreControlChannel(store, run_key(run_dir), f"launch {launch}", refused)
