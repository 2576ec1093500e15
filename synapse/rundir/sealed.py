"""The run's key, and the sealed records the run's processes exchange over a store with it.

A c10d ``TCPStore`` (the workers' rendezvous store; across nodes, the decider's store) has no
authentication: any process that reaches its port (every user of the machine on 127.0.0.1, the
network on a node's address) can list every key (``list_keys``), read every value and overwrite or
delete it. torch's rendezvous unpickles the state it finds under its key, so a crafted value there
ran code in the supervisor; Synapse's own readers raised on a value they could not parse, which
killed the decider's watch thread or got rank 0 judged dead. Hiding the keys cannot help (they can
be listed), and a store only the run's processes can reach needs what TCPStore lacks (a unix socket,
or credentials); so every value is authenticated instead:

* ``run.key`` in the run directory holds 32 random bytes, readable by its owner only (mode 0600;
  refused if it is anything else). It is made once per run directory by the first process of the
  run that needs it, and kept on resume; every node of a run reads the same file (the run directory
  is shared across nodes).
* Every value the run's processes put on a store is sealed with it: an HMAC-SHA256 over the store
  key, a scope (the launch, the nodes' meeting) and the value. A reader checks the seal before
  anything else, so a value someone else wrote never reaches pickle or a JSON parser: it is
  refused, said once (a log line and a ``store_record_refused`` event), and read as absent.
  A record copied to another key or scope does not open there either.

What someone who reaches the store can still do: read the records (configs, placements and
progress; no secret), and overwrite or delete them. The writers put their records back when they
find them gone (``SealedStore.keep``), so a one-off overwrite changes nothing; one kept up for the
whole run can still stop it (denial of service), never run code in it or drop a device.

A leaf module: the standard library only (the store is any object with torch's Store methods).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from synapse.rundir.events import EventLog, events_path
from synapse.rundir.layout import RUN_KEY

KEY_BYTES = 32
MAC_BYTES = 32  # SHA-256
# compare_set(key, ABSENT, ABSENT) reads a key without blocking: a missing key answers ABSENT and
# stays missing (store.get would wait for it, and a key deleted between check and get would hang
# the reader for the store's whole timeout).
ABSENT = "\0synapse:absent"


class RunKeyError(ValueError):
    """The run's key file exists but cannot be trusted or read; the message names the fix."""


class ForeignRecordError(ValueError):
    """A store value that is not sealed with this run's key (or not for the key and scope it was read under)."""


# ------------------------------------------------------------------------------------------ the key
def run_key(run_dir: Path | str) -> bytes:
    """This run's key: read from ``<run_dir>/run.key``, made there first if there is none."""
    path = RUN_KEY.path(run_dir)
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = RUN_KEY.temp_path(path, secrets.token_hex(4))
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (secrets.token_hex(KEY_BYTES) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)  # whole or not at all; the first of two racing nodes wins, the other reads its key
    except FileExistsError:
        pass
    finally:
        temp.unlink()
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ELOOP: a symbolic link, which could point at anyone's file
        raise RunKeyError(f"{path}: cannot be opened as the run's key ({exc}). Fix: delete it; the next start "
                          f"of the run makes a new one") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise RunKeyError(
                f"{path}: the run's key must be a regular file of this user (uid {os.getuid()}) that no one else "
                f"can read or write (mode 0600); it is uid {info.st_uid}, mode {stat.filemode(info.st_mode)}. "
                f"Anyone who can read it can speak for the run on its stores. Fix: delete it; the next start of "
                f"the run makes a new one")
        text = os.read(fd, 4 * KEY_BYTES).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise RunKeyError(f"{path}: not a run key ({2 * KEY_BYTES} hex digits expected). Fix: delete it; the next "
                          f"start of the run makes a new one")
    return key


def derived_id(key: bytes, purpose: str, length: int = 16) -> str:
    """A name derived from the key (a rendezvous id): unguessable without the key, the same on every node."""
    return hmac.new(key, f"synapse id: {purpose}".encode(), hashlib.sha256).hexdigest()[:length]


# ------------------------------------------------------------------------------------------ sealing
def mac(key: bytes, name: str, scope: str, payload: bytes) -> bytes:
    """The seal of ``payload`` stored under ``name`` in ``scope``."""
    header = json.dumps([name, scope]).encode()  # unambiguous: no name/scope pair reads as another
    return hmac.new(key, header + b"\n" + payload, hashlib.sha256).digest()


def seal_bytes(key: bytes, name: str, scope: str, payload: bytes) -> bytes:
    return mac(key, name, scope, payload) + payload


def open_bytes(key: bytes, name: str, scope: str, sealed: bytes) -> bytes:
    """The payload of ``sealed``, or ``ForeignRecordError`` if its seal is not this run's for ``name``/``scope``."""
    if len(sealed) < MAC_BYTES or not hmac.compare_digest(sealed[:MAC_BYTES],
                                                          mac(key, name, scope, sealed[MAC_BYTES:])):
        raise ForeignRecordError("not sealed with this run's key")
    return sealed[MAC_BYTES:]


def seal_record(key: bytes, name: str, scope: str, record: Any) -> str:
    """A JSON record as the text stored under ``name``: its seal in hex, a newline, the JSON."""
    text = json.dumps(record)
    return mac(key, name, scope, text.encode()).hex() + "\n" + text


def open_record(key: bytes, name: str, scope: str, raw: bytes | str) -> Any:
    """The record ``seal_record`` stored, or ``ForeignRecordError``; the JSON is parsed only once the seal holds."""
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    head, newline, payload = data.partition(b"\n")
    try:
        seal = bytes.fromhex(head.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        seal = b""
    if not newline or len(seal) != MAC_BYTES or not hmac.compare_digest(seal, mac(key, name, scope, payload)):
        raise ForeignRecordError("not sealed with this run's key")
    return json.loads(payload)


# ------------------------------------------------------------------------------------------ refusals
class Refusals:
    """Says that a value was refused, once per (where, value): one log line naming what was refused and
    where, and a ``store_record_refused`` event in the run's event log. Called from any thread.

    At most ``LIMIT`` distinct refusals are said (then one line that the rest are not): someone writing
    new garbage for the whole run must not fill the disk with the run's account of it."""

    LIMIT = 100

    def __init__(self, run_dir: Path | str | None, source: str, log: Callable[[str], None] | None = None):
        self.source = source
        self.events = EventLog(events_path(run_dir), source=source) if run_dir is not None else None
        self.log = log or _warn
        self._seen: set[tuple[str, bytes]] = set()
        self._lock = threading.Lock()

    def __call__(self, name: str, raw: bytes | str, why: str) -> None:
        value = raw.encode() if isinstance(raw, str) else bytes(raw)
        with self._lock:
            seen = (name, hashlib.sha256(value).digest())
            if seen in self._seen or len(self._seen) > self.LIMIT:
                return
            self._seen.add(seen)
            last = len(self._seen) > self.LIMIT
        if last:
            self.log(f"{self.source}: {self.LIMIT} values refused so far; further refusals are not logged")
            return
        self.log(f"{self.source}: refused the value under {name!r} ({why}; {len(value)} bytes, starting "
                 f"{value[:24]!r}): not a record of this run, so another process wrote it; ignored, the run goes "
                 f"on. See docs/reliability.md (records the run did not write)")
        if self.events is not None:
            try:
                self.events.append("store_record_refused", key=name, why=why, value_bytes=len(value),
                                   value_head=repr(value[:48]))
            except OSError:  # the event is a record of the refusal, never a second failure
                pass


def _warn(message: str) -> None:
    import logging

    logging.getLogger("synapse").warning(message)


# ------------------------------------------------------------------------------------------ the store
class SealedStore:
    """Sealed JSON records on a c10d store (one connection, shared by a process's threads).

    ``scope`` is part of every seal (a launch, the nodes' meeting): a record written in one scope
    does not open in another, so an old record replayed into a later launch is refused too."""

    def __init__(self, store: Any, key: bytes, refused: Callable[[str, bytes | str, str], None], scope: str = ""):
        self.store, self.key, self.refused, self.scope = store, key, refused, scope
        self._lock = threading.RLock()
        self._written: dict[str, str] = {}  # what this side put under each key: put back when someone overwrote it

    def put(self, name: str, record: Any) -> None:
        text = seal_record(self.key, name, self.scope, record)
        with self._lock:
            self.store.set(name, text)
            self.store.check([name])  # a set is not answered; a round trip makes it visible to every client
            self._written[name] = text

    def peek(self, name: str) -> bytes | None:
        """The raw value under ``name`` (None: absent), without blocking."""
        with self._lock:
            raw = self.store.compare_set(name, ABSENT, ABSENT)
        return None if raw == ABSENT.encode() else raw

    def get(self, name: str) -> Any | None:
        """The record under ``name``; None if there is none, or only one this run did not seal (refused, said once)."""
        raw = self.peek(name)
        if raw is None:
            return None
        try:
            return open_record(self.key, name, self.scope, raw)
        except ForeignRecordError as exc:
            self.refused(name, raw, str(exc))
            return None

    def wrote(self, name: str) -> bool:
        """Whether this side put a record under ``name`` (and has not deleted it since)."""
        return name in self._written

    def keep(self, name: str) -> bool:
        """Put back what this side wrote under ``name`` if the store no longer holds it (overwritten or
        deleted by someone else); True if it did."""
        with self._lock:
            text = self._written.get(name)
            if text is None or self.peek(name) == text.encode():
                return False
            self.store.set(name, text)
            self.store.check([name])
            return True

    def claim(self, name: str, record: Any) -> Any | None:
        """Put ``record`` under ``name`` only if the key is free. Returns the record that holds it now:
        ours, one of this run's other processes' (opened), or None for a value this run did not seal."""
        text = seal_record(self.key, name, self.scope, record)
        with self._lock:
            raw = self.store.compare_set(name, "", text)
            if raw == text.encode():
                self._written[name] = text
        try:
            return open_record(self.key, name, self.scope, raw)
        except ForeignRecordError as exc:
            self.refused(name, raw, str(exc))
            return None

    def delete(self, name: str) -> None:
        with self._lock:
            self.store.delete_key(name)
            self._written.pop(name, None)
