"""Checkpoint I/O as a component of the training loop, the same for one device and for K ranks.

A checkpoint holds the student tensors each rank trains, keyed by their original names, with
their optimizer state, in torch.distributed.checkpoint (DCP) storage, plus each rank's RNG and
one ``state`` file (step, sampler position, learning-rate schedule, RNG) written by rank 0, and a
checksummed manifest committed by rank 0 once every rank's part is on disk. Because tensors are
addressed by name, any partition and any number of ranks can load it.

Saves are asynchronous (``checkpoint.async_save``, on by default): ``save`` copies the state into
host buffers (pinned on a GPU) and returns; DCP writes them on its thread, and rank 0 then
checksums and commits (the manifest last, the folder renamed into place): only then is it a
checkpoint. The next ``save`` first waits for this one (the buffers are reused: one copy of the
state at most), and so do the end of the run and a stop request (``wait``). A process killed
meanwhile leaves a ``.tmp`` folder and the previous checkpoint in use.

``ShardGroup`` is what differs between the paths: the ranks agree on the temporary folder's
name and wait for each other, and DCP coordinates on the group's own ``process_group`` (none for
one device; a separate gloo group in the pipeline, so DCP's thread never shares a group with
the training loop's collectives).

Where an asynchronous checkpoint's tensors wait while DCP writes them: ``HostBufferStager``, a
DCP ``AsyncStager`` that copies a state dict into host buffers it keeps from save to save
(pinned on a CUDA device, so the copy runs at full PCIe speed; plain memory on CPU ranks), and
returns once the copy is done: training may change its tensors right after. The buffers are
reused, so the loop must not stage again before the previous upload finished
(``Checkpointer.wait``): that is what bounds staging memory to one copy of the rank's state.

Why not torch's ``DefaultStager``: on torch 2.11 it closes its cache after each ``stage`` (a
reused one fails on its second save; a new one pins fresh memory every time, slow); on 2.14 it
caches by storage. This one behaves the same on both, and a key that a live re-partition
moved away simply drops its buffer.
"""
from __future__ import annotations

import copy
import errno
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.staging import AsyncStager

from synapse import checkpoint as ckpt
from synapse.checkpoint import dcp_store
from synapse.engine.device import rng_state, set_rng_state
from synapse.engine.optim import load_optimizer_state_by_name, optimizer_state_by_name
from synapse.injection import FaultInjector
from synapse.rundir import filesystem_full


class HostBufferStager(AsyncStager):
    _synchronize_after_execute = False

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda" and torch.cuda.is_available()
        self._buffers: dict[str, torch.Tensor] = {}

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        staged: dict[str, Any] = {}
        for key, value in state_dict.items():
            if torch.is_tensor(value):
                buffer = self._buffers.get(key)
                if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                    buffer = torch.empty(value.shape, dtype=value.dtype, pin_memory=self.pin)
                staged[key] = buffer.copy_(value.detach(), non_blocking=self.pin)
            else:
                staged[key] = copy.deepcopy(value)
        self._buffers = {key: value for key, value in staged.items() if torch.is_tensor(value)}
        if self.pin:  # the copies were queued after the step's kernels: done once this returns
            torch.cuda.current_stream(self.device).synchronize()
        return staged

    def reserve(self, state_dict: dict[str, Any]) -> None:
        """Allocate (and pin) the buffers ``stage`` will need, without copying: pinning host memory
        is the slow part of a first save (0.66 s for ResNet-152's 480 MB on an H200, then 0.12 s)."""
        self._buffers = {key: torch.empty(value.shape, dtype=value.dtype, pin_memory=self.pin)
                         for key, value in state_dict.items() if torch.is_tensor(value)}

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        self._buffers = {}

    @property
    def staged(self) -> dict[str, torch.Tensor]:
        """The host copies of the last ``stage`` (valid until the next)."""
        return dict(self._buffers)

    @property
    def staged_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._buffers.values())


logger = logging.getLogger(__name__)
# A save that waits longer than this for the previous one says checkpoints come faster than they are written.
WAITED_WARNING_S = 0.1


class ShardGroup(Protocol):
    rank: int
    world_size: int

    def agree(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""

    def barrier(self) -> None: ...

    @property
    def process_group(self) -> Any:
        """The group DCP coordinates on (None: one process, no collectives)."""


class SingleShard:
    """One process holds the whole student: nothing to agree on, nobody to wait for."""

    rank, world_size = 0, 1
    process_group = None

    def agree(self, value: Any) -> Any:
        return value

    def barrier(self) -> None:
        pass


@dataclass
class HeldState:
    """What this rank trains right now (it changes with a live re-partition, so it is asked for at
    each save and load rather than kept)."""

    tensors: Mapping[str, torch.Tensor]  # original student name -> the tensor training updates
    optimizer: torch.optim.Optimizer
    scheduler: Any
    meta: Mapping[str, Any]  # written into the manifest (e.g. the placement)

    @property
    def parameters(self) -> dict[str, torch.nn.Parameter]:
        return {n: t for n, t in self.tensors.items() if isinstance(t, torch.nn.Parameter)}


@dataclass
class Checkpointer:
    root: Path
    keep: int
    student_name: str
    shards: ShardGroup
    injector: FaultInjector
    # (step, path, seconds until committed, seconds the training loop was held, context): rank 0, once
    # committed (on the commit thread); context is what ``save_context`` said when the save started
    on_saved: Callable[[int, Path, float, float, dict], None] = lambda step, path, seconds, stall, context: None
    save_context: Callable[[], dict] = dict
    mark: Callable[[str], None] = lambda phase: None  # where this rank is (the hang watchdog's board)
    asynchronous: bool = True  # False: every save is committed before ``save`` returns
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _pending: Future | None = None
    _stager: HostBufferStager | None = None
    _finisher: ThreadPoolExecutor | None = None
    _warned_waiting: bool = False

    def save(self, step: int, held: HeldState, sampler_state: Mapping[str, Any]) -> Path:
        """Start checkpoint ``step``; with ``asynchronous``, return once its state is staged."""
        entered = time.perf_counter()  # the loop is held from here: waiting for the previous save counts
        self.wait()  # the previous save first: its buffers are about to be reused
        started = time.perf_counter()
        self._warn_if_waited(step, started - entered)
        rank, world = self.shards.rank, self.shards.world_size
        tmp = ckpt.begin_checkpoint(self.root, step, nonce=self.shards.agree(ckpt.new_nonce() if world > 1 else None))
        self.mark("checkpoint_write")
        if rank == 0:  # the committer frees what failed saves left, before the new files take space
            ckpt.remove_stray_temporaries(self.root, keep=tmp)
        optim = optimizer_state_by_name(held.optimizer, held.parameters, clone=False)
        entries = dcp_store.flat_state(held.tensors, optim, rng={rank: rng_state()})
        # What changes with the next step is captured now; rank 0 writes it once DCP's write is done.
        state = {"step": step, "sampler": dict(sampler_state), "scheduler": held.scheduler.state_dict(),
                 "rng": rng_state()} if rank == 0 else None
        if self._stager is None:
            self._stager = HostBufferStager(self.device)
        upload = dcp_store.start_save(entries, tmp, self._stager, self.shards.process_group)
        staged_at = time.perf_counter()
        meta = {"student": self.student_name, "world_size": world, **held.meta}
        if self._finisher is None:
            self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-commit")
        timing = (entered, started, staged_at)
        self._pending = self._finisher.submit(self._finish, step, tmp, upload, self._stager.staged, state, meta,
                                              timing, self.save_context())
        if not self.asynchronous:
            self.wait()
        return self.root / ckpt.step_dir_name(step)

    def _warn_if_waited(self, step: int, waited_s: float) -> None:
        # On an H200, ViT-L/16 -> ResNet-152 saved every 10 steps (1.2 s) took ~3 s to write: each
        # asynchronous save then held the loop ~1.9 s waiting for the last instead of ~0.15 s.
        if self.asynchronous and waited_s > WAITED_WARNING_S and not self._warned_waiting:
            self._warned_waiting = True
            logger.warning("checkpoint at step %d waited %.2f s for the previous one to be written: checkpoints "
                           "come faster than they are written; raise checkpoint.every (or write to faster storage)",
                           step, waited_s)

    def prepare(self, held: HeldState) -> None:
        """Allocate the staging buffers for ``held`` now (after a first step, when the optimizer has
        its state), so that the first save holds the loop no longer than the others."""
        if self._stager is None:
            self._stager = HostBufferStager(self.device)
        optim = optimizer_state_by_name(held.optimizer, held.parameters, clone=False)
        self._stager.reserve(dcp_store.flat_state(held.tensors, optim, rng={self.shards.rank: rng_state()}))

    def _finish(self, step: int, tmp: Path, upload: Future, staged: Mapping[str, Any], state: dict | None,
                meta: dict[str, Any], timing: tuple[float, float, float], context: dict) -> Path:
        """On the commit thread: DCP's write done everywhere, then rank 0 checks, checksums and commits."""
        entered, started, staged_at = timing
        try:
            upload.result()
        except BaseException as exc:  # DCP says a rank's failure as CheckpointException (a BaseException)
            raise _write_failure(tmp, exc) from exc
        _refuse_nonfinite(staged, tmp)  # the staged copy is what was written: checked off the loop
        self.injector.on("checkpoint_write", step)  # this rank's files written, nothing committed
        path = self.root / ckpt.step_dir_name(step)
        if self.shards.rank == 0:
            ckpt.save_tensor_file(state, tmp / ckpt.STATE_FILE)
            path = ckpt.commit_checkpoint(tmp, step, meta=meta)
            ckpt.prune_checkpoints(self.root, self.keep)
            done = time.perf_counter()
            # Held: until staged (async), or until committed (a synchronous save returns only then).
            stall = (staged_at if self.asynchronous else done) - entered
            self.on_saved(step, path, done - started, stall, context)
        return path

    def wait(self) -> Path | None:
        """Block until the save in flight is committed (rank 0) or written (others); raise its error."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        self.mark("checkpoint_wait")
        return pending.result()

    def close(self, wait: bool = True) -> None:
        """Flush the save in flight (``wait``) and free the staging buffers and the commit thread."""
        try:
            if wait:
                self.wait()
        finally:
            if self._finisher is not None:
                self._finisher.shutdown(wait=wait)
                self._finisher = None
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    def load(self, path: Path, held: HeldState) -> tuple[int, dict[str, Any]]:
        """Load this rank's tensors by name from a checkpoint of any partition and world size;
        returns the step and the sampler's state."""
        self.wait()  # a checkpoint this process is still writing is not loaded half-done
        model_state, optim_state, rng_by_rank = ckpt.load_training_state(path)
        missing = [n for n in held.tensors if n not in model_state]
        if missing:
            raise ckpt.CheckpointError(f"{path} lacks {len(missing)} tensors this stage needs (e.g. {missing[:3]}); "
                                       f"it was written for another student model")
        if self.shards.world_size == 1:  # the whole student: nothing may be left over either
            unexpected = [n for n in model_state if n not in held.tensors]
            if unexpected:
                raise ckpt.CheckpointError(f"{path} holds {len(unexpected)} tensors the student lacks (e.g. "
                                           f"{unexpected[:3]}); it was written for another student model")
        with torch.no_grad():
            for name, tensor in held.tensors.items():
                tensor.copy_(model_state[name])
        load_optimizer_state_by_name(held.optimizer, held.parameters, optim_state)
        state = ckpt.load_run_state(path)
        held.scheduler.load_state_dict(state["scheduler"])
        same_ranks = ckpt.read_manifest(path)["meta"].get("world_size") == self.shards.world_size
        own = rng_by_rank.get(self.shards.rank) if same_ranks else None
        if own is not None:  # the same ranks: each continues its own RNG stream
            set_rng_state(own)
        elif self.shards.world_size == 1:  # one device continues rank 0's (older K=1 shards hold none)
            set_rng_state(state["rng"])
        return int(state["step"]), state["sampler"]


def _refuse_nonfinite(staged: Mapping[str, Any], tmp: Path) -> None:
    """No checkpoint holding NaN or inf is ever committed: its folder is removed, the previous stays newest."""
    bad = ckpt.first_nonfinite({k: v for k, v in staged.items() if not k.startswith(dcp_store.RNG)})
    if bad is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ckpt.NonFiniteCheckpointError(
            f"refusing to commit {tmp}: tensor {bad!r} holds NaN or infinite values (training diverged); no "
            f"checkpoint with non-finite values is ever committed, so the newest intact one in {tmp.parent} "
            f"stays the newest. Fix: lower optim.lr (or raise optim.warmup_steps) in a new run (resume=null in a new "
            f"run directory: a resumed run keeps the learning settings of the run it continues)")


def _write_failure(tmp: Path, exc: BaseException) -> BaseException:
    """A failed DCP write as ``CheckpointWriteError`` when the OS refused it (disk full, read-only)."""
    for failure in dcp_store.failures(exc):
        reason: BaseException | None = failure
        while reason is not None and not isinstance(reason, OSError):
            reason = reason.__cause__ or reason.__context__
        if isinstance(reason, OSError):
            return ckpt.write_error(tmp, reason)
    if filesystem_full(tmp.parent):  # torch.save inside DCP says a full disk as "unexpected pos 704 vs 598"
        return ckpt.write_error(tmp, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    first = dcp_store.first_failure(exc)
    return first if isinstance(first, Exception) else RuntimeError(f"checkpoint write failed: {first!r}")
