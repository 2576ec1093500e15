"""Training batches in a deterministic, resumable order, shared by every training path.

Each batch comes with its (epoch, step_in_epoch) so the trainer can checkpoint the sampler
state *of the last consumed batch*; a resumed run therefore sees exactly the batches the
uninterrupted run would have seen, whether or not a DataLoader prefetches ahead.
"""
from __future__ import annotations

import ctypes
import signal
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from ..data import BatchIndexSampler, ResumableSampler, iterate_batches


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_the_rank(worker_id: int) -> None:
    """Loader worker start: be killed with the process it loads for.

    A pipeline rank can be SIGKILLed (a real fault, or an injected one); its loader workers
    must not outlive it as orphans, each holding a copy of the data set.
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl: torch's own watchdog still ends the worker
        pass


def loader_processes() -> dict[str, Any]:
    """How loader workers start: forked by the loading process itself, on Linux.

    Workers of a rank started through a fork server would otherwise be forked by a fork server
    of their own, so their parent is that server, not the rank: neither the kernel's parent-death
    signal nor torch's parent watchdog would see the rank die. Forked by the rank, both do.
    """
    if sys.platform != "linux":
        return {}
    return {"multiprocessing_context": "fork", "worker_init_fn": _die_with_the_rank}


@dataclass
class Batch:
    epoch: int
    step_in_epoch: int
    images: torch.Tensor
    labels: torch.Tensor


def train_batches(dataset, sampler: ResumableSampler, num_epochs: int, num_workers: int = 0,
                  load: bool = True) -> Iterator[Batch]:
    """Batches from the sampler's current state to the end of epoch ``num_epochs - 1``.

    ``load=False`` walks the same order without reading any sample (images and labels are None):
    for a pipeline rank that needs neither, so it keeps its sampler in step for free.
    """
    if not load:
        for b in iterate_batches(sampler, num_epochs):
            yield Batch(b.epoch, b.step_in_epoch, None, None)
        return
    if num_workers == 0:
        # In-process: precomputed tensors are sliced directly, no collation overhead.
        for b in iterate_batches(sampler, num_epochs):
            images, labels = dataset.get_batch(b.indices, epoch=b.epoch)
            yield Batch(b.epoch, b.step_in_epoch, images, labels)
        return
    batch_sampler = BatchIndexSampler(sampler)
    loader = DataLoader(dataset, batch_sampler=batch_sampler, num_workers=num_workers, pin_memory=True,
                        persistent_workers=False, **loader_processes())
    while batch_sampler.upcoming()[0] < num_epochs:
        epoch, first_step = batch_sampler.upcoming()
        dataset.set_epoch(epoch)  # before iter(loader): workers copy the data set when iteration starts
        for i, (images, labels) in enumerate(loader):
            yield Batch(epoch, first_step + i, images, labels)


def eval_batches(dataset, batch_size: int, num_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The whole validation split in order, unaugmented."""
    if num_workers == 0:
        for start in range(0, len(dataset), batch_size):
            yield dataset.get_batch(list(range(start, min(start + batch_size, len(dataset)))), epoch=0)
        return
    yield from DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers, pin_memory=True,
                          **loader_processes())
