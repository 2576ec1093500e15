"""Training batches in a deterministic, resumable order, shared by every training path.

Workers ship compact host batches (uint8 pixels, JPEG bytes, integers: see
``EpochDataset.host_item``); ``DevicePrefetcher`` finishes them on the training device ahead
of the step. A rank that needs only labels reads no image; one that needs nothing reads nothing.

Each batch comes with its (epoch, step_in_epoch) so the trainer can checkpoint the sampler
state *of the last consumed batch*; a resumed run therefore sees exactly the batches the
uninterrupted run would have seen, whether or not a DataLoader prefetches ahead.
"""
from __future__ import annotations

import ctypes
import dataclasses
import signal
import sys
import warnings
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from synapse.config import DataConfig, Decode, SynapseConfig
from synapse.data import (
    BadSample,
    BatchIndexSampler,
    HostDataPath,
    ResumableSampler,
    choose_host_data_path,
    dataset_decodes_files,
    device_decoding_available,
    iterate_batches,
)
from synapse.engine.device import available_cores
from synapse.engine.prefetch import DevicePrefetcher

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_the_rank(worker_id: int) -> None:
    """Loader worker start: be killed with the process it loads for.

    A pipeline rank can be SIGKILLed (a real fault, or an injected one); its loader workers
    must not outlive it as orphans, each holding a copy of the data set.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the rank stops at a step boundary, its loader with it
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal: likewise
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
    images: torch.Tensor | None
    labels: torch.Tensor | None


LOADS = ("images", "labels", "nothing")


class BadSampleLog:
    """Counts the samples replaced because their file could not be decoded, warning once per file.

    The records come with the batches from the loader workers (``ImageBatch.bad``), so the count
    is the training process's, whatever the worker count.
    """

    def __init__(self) -> None:
        self.samples: list[BadSample] = []

    @property
    def count(self) -> int:
        return len(self.samples)

    def record(self, bad: Iterable[BadSample]) -> None:
        for sample in bad:
            self.samples.append(sample)
            warnings.warn(f"skipped unreadable image {sample.path} (sample {sample.index}): {sample.reason}; "
                          f"it was replaced by a blank image with its label ({self.count} so far)",
                          DataWarning, stacklevel=2)


class DataWarning(UserWarning):
    """A sample was replaced because its file could not be read or decoded."""


def _load_mode(load: bool | str) -> str:
    if load is True:
        return "images"
    if load is False:
        return "nothing"
    if load not in LOADS:
        raise ValueError(f"load must be one of {LOADS} (or a bool), got {load!r}")
    return load


def train_batches(dataset, sampler: ResumableSampler, num_epochs: int, num_workers: int = 0,
                  load: bool | str = "images", device: torch.device | str | None = None,
                  bad_samples: BadSampleLog | None = None, share: range | None = None,
                  finishers: int | None = None) -> Generator[Batch, None, None]:
    """Batches from the sampler's current state to the end of epoch ``num_epochs - 1``.

    ``load``: ``"images"`` (images and labels; True), ``"labels"`` (labels only, no image read:
    the last pipeline rank) or ``"nothing"`` (False: the same order, images and labels None, for a
    rank that needs neither, so it keeps its sampler in step for free).
    With ``load="images"`` workers ship the data set's compact host batches and the training
    process finishes them on ``device`` (default CPU) one or two batches ahead, on a side stream.
    ``share``: which positions of each global batch to load (a replica's share; None: all of it).
    Only those images are read and decoded, so R replicas together decode each batch once.
    ``finishers``: threads finishing batches on the device at once (default: the data set's
    ``device_finishers``, known once it is bound to ``device``).
    """
    mode = _load_mode(load)
    if mode == "nothing":
        for b in iterate_batches(sampler, num_epochs):
            yield Batch(b.epoch, b.step_in_epoch, None, None)
        return
    if mode == "labels":
        for b in iterate_batches(sampler, num_epochs):
            yield Batch(b.epoch, b.step_in_epoch, None, dataset.labels_of(_shared(b.indices, share)))
        return
    target = torch.device(device or "cpu")  # a name of its own: `device` is typed as the parameter's union
    dataset.bind_device(target)
    log = bad_samples if bad_samples is not None else BadSampleLog()

    def finish(item: tuple[int, int, Any]) -> tuple[Batch, Iterable[BadSample]]:
        epoch, step, host = item
        images, labels = dataset.device_batch(host, target)
        return Batch(epoch, step, images, labels), getattr(host, "bad", ())

    host = _host_train_batches(dataset, sampler, num_epochs, num_workers, pin=target.type == "cuda", share=share)
    threads = dataset.device_finishers if finishers is None else finishers
    for batch, bad in DevicePrefetcher(host, finish, target, finishers=threads):
        log.record(bad)
        yield batch


def _host_train_batches(dataset, sampler: ResumableSampler, num_epochs: int, num_workers: int,
                        pin: bool, share: range | None = None) -> Iterator[tuple[int, int, Any]]:
    """(epoch, step_in_epoch, host batch) in the sampler's order, built in-process or by workers."""
    if num_workers == 0:
        for b in iterate_batches(sampler, num_epochs):
            dataset.set_epoch(b.epoch)
            yield b.epoch, b.step_in_epoch, dataset.host_collate([dataset.host_item(i)
                                                                  for i in _shared(b.indices, share)])
        return
    batch_sampler = BatchIndexSampler(sampler, share)
    loader = DataLoader(_HostItems(dataset), batch_sampler=batch_sampler, num_workers=num_workers,
                        collate_fn=dataset.host_collate, pin_memory=pin, persistent_workers=False,
                        **loader_processes())
    while batch_sampler.upcoming()[0] < num_epochs:
        epoch, first_step = batch_sampler.upcoming()
        dataset.set_epoch(epoch)  # before iter(loader): workers copy the data set when iteration starts
        for i, host in enumerate(loader):
            yield epoch, first_step + i, host


def _shared(indices: list[int], share: range | None) -> list[int]:
    """The positions ``share`` of one batch's sample indices (all of them without a share)."""
    return indices if share is None else indices[share.start:share.stop]


class _HostItems(Dataset):
    """The data set as loader workers see it: ``host_item`` per index."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset.host_item(index)


def eval_batches(dataset, batch_size: int, num_workers: int = 0, device: torch.device | str | None = None,
                 load: str = "images", shard: tuple[int, int] = (0, 1)
                 ) -> Iterator[tuple[torch.Tensor | None, torch.Tensor]]:
    """The whole validation split in order, unaugmented, finished on ``device`` (default CPU).

    ``load="labels"``: images None, labels read without decoding (a pipeline rank after the first).
    ``shard=(i, n)``: only every n-th batch from the i-th (replica i of n evaluates its part).
    """
    index, count = shard
    chunks = [list(range(start, min(start + batch_size, len(dataset))))
              for start in range(0, len(dataset), batch_size)][index::count]
    if _load_mode(load) != "images":
        for chunk in chunks:
            yield None, dataset.labels_of(chunk)
        return
    target = torch.device(device or "cpu")  # a name of its own: `device` is typed as the parameter's union
    dataset.bind_device(target)
    dataset.set_epoch(0)
    if num_workers == 0:
        host: Iterable[Any] = (dataset.host_collate([dataset.host_item(i) for i in chunk]) for chunk in chunks)
    else:
        host = DataLoader(_HostItems(dataset), batch_sampler=chunks, num_workers=num_workers,
                          collate_fn=dataset.host_collate, pin_memory=target.type == "cuda", **loader_processes())
    log = BadSampleLog()
    for images, labels, bad in DevicePrefetcher(host,
                                                lambda h: (*dataset.device_batch(h, target), getattr(h, "bad", ())),
                                                target):
        log.record(bad)
        yield images, labels


def with_host_data_path(cfg: SynapseConfig, device: torch.device, local_ranks: int,
                        local_readers: int) -> tuple[SynapseConfig, HostDataPath]:
    """``cfg`` with ``data.decode`` and ``data.num_workers`` resolved for this host (``auto`` read from
    its cores, its ``local_ranks`` training processes, the ``local_readers`` of them that read images,
    and the decoders ``device`` has), and the choice with its reason. Config values that are not
    ``auto`` are kept as given."""
    data = cfg.data
    reads_files = dataset_decodes_files(data.name)
    on_cuda = device.type == "cuda"
    probe = data.decode == "auto" and on_cuda and reads_files  # a real decode on the GPU: only when it decides
    path = choose_host_data_path(
        decode=str(data.decode), workers=data.num_workers, reads_files=reads_files,
        cores=available_cores(),
        local_ranks=local_ranks, local_readers=local_readers, on_cuda=on_cuda,
        device_decoder=device_decoding_available(device) if probe else False)
    resolved = dataclasses.replace(data, num_workers=path.workers, decode=Decode(path.decode))
    return dataclasses.replace(cfg, data=resolved), path


def loader_workers(data: DataConfig) -> int:
    """``data.num_workers`` once ``with_host_data_path`` resolved it (what every loader is built with)."""
    if isinstance(data.num_workers, str):
        raise ValueError(f"data.num_workers={data.num_workers!r} is not resolved for this host yet "
                         "(with_host_data_path does it where a process learns its device)")
    return data.num_workers
