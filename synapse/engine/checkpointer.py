"""Checkpoint I/O as a component of the training loop, the same for one device and for K ranks.

A checkpoint is one shard per rank (the single device is rank 0 of 1) holding the student
tensors that rank trains, keyed by their original names, with their optimizer state and the
rank's RNG, plus one ``state`` file (step, sampler position, learning-rate schedule, RNG)
written by rank 0 and a checksummed manifest committed by rank 0 once every shard is on disk.
Because tensors are addressed by name, any partition and any number of ranks can load it.

``ShardGroup`` is what differs between the paths: the ranks agree on the temporary folder's
name and wait for each other (no-ops for one device; collectives in the pipeline).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import torch

from .. import checkpoint as ckpt
from ..monitor.injection import FaultInjector
from .device import rng_state, set_rng_state
from .optim import load_optimizer_state_by_name, optimizer_state_by_name


class ShardGroup(Protocol):
    rank: int
    world_size: int

    def agree(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""

    def barrier(self) -> None: ...


class SingleShard:
    """One process holds the whole student: nothing to agree on, nobody to wait for."""

    rank, world_size = 0, 1

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
    on_saved: Callable[[int, Path, float], None] = lambda step, path, seconds: None
    mark: Callable[[str], None] = lambda phase: None  # where this rank is (the hang watchdog's board)

    def save(self, step: int, held: HeldState, sampler_state: Mapping[str, Any]) -> Path:
        started = time.perf_counter()
        rank, world = self.shards.rank, self.shards.world_size
        tmp = ckpt.begin_checkpoint(self.root, step, nonce=self.shards.agree(ckpt.new_nonce() if world > 1 else None))
        self.mark("checkpoint_write")
        if rank == 0:  # the committer frees what failed saves left, before the shards take space
            ckpt.remove_stray_temporaries(self.root, keep=tmp)
        ckpt.save_tensor_file({"model": {n: t.detach().cpu() for n, t in held.tensors.items()},
                               "optim": optimizer_state_by_name(held.optimizer, held.parameters),
                               "rng": rng_state()}, tmp / ckpt.shard_name(rank))
        if rank == 0:
            state = {"step": step, "sampler": dict(sampler_state), "scheduler": held.scheduler.state_dict(),
                     "rng": rng_state()}
            ckpt.save_tensor_file(state, tmp / ckpt.STATE_FILE)
        self.injector.on("checkpoint_write", step)  # this rank's files written, nothing committed
        self.shards.barrier()
        path = self.root / ckpt.step_dir_name(step)
        if rank == 0:
            self.mark("checkpoint_write")
            meta = {"student": self.student_name, "world_size": world, **held.meta}
            path = ckpt.commit_checkpoint(tmp, step, meta=meta)
            ckpt.prune_checkpoints(self.root, self.keep)
        self.shards.barrier()  # nobody moves on before the checkpoint is committed
        if rank == 0:
            self.on_saved(step, path, time.perf_counter() - started)
        return path

    def load(self, path: Path, held: HeldState) -> tuple[int, dict[str, Any]]:
        """Load this rank's tensors by name from a checkpoint of any partition and world size;
        returns the step and the sampler's state."""
        model_state, optim_state = ckpt.load_student_state(path)
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
        own = ckpt.load_file(Path(path) / ckpt.shard_name(self.shards.rank)).get("rng") if same_ranks else None
        if own is not None:  # the same ranks: each continues its own RNG stream
            set_rng_state(own)
        elif self.shards.world_size == 1:  # one device continues rank 0's (older K=1 shards hold none)
            set_rng_state(state["rng"])
        return int(state["step"]), state["sampler"]
