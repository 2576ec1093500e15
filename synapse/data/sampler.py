"""Deterministic, resumable sampling: the order of samples is a pure function of
(seed, epoch), so a run that stops after any batch can continue with exactly the batches
an uninterrupted run would have seen.

State is three integers, ``{"epoch", "position", "seed"}``; ``position`` counts the samples
of ``epoch`` already handed out.

Checkpointing rule (why ``state_after`` exists): a ``DataLoader`` with ``num_workers > 0``
pulls indices from its sampler ahead of time (``prefetch_factor * num_workers`` batches),
so the sampler's live position runs ahead of what the training loop has consumed. The
trainer must therefore save the state *of the last consumed batch*,
``sampler.state_after(epoch, step_in_epoch)``, never ``sampler.state_dict()`` while a
loader is iterating. Because batches are fixed slices of a fixed order, that state is
computable from (epoch, step) alone, and the same batches come out for any
``num_workers``.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch
from torch.utils.data import Sampler

from synapse.data.base import DataError
from synapse.data.seeding import seeded_generator

_STATE_KEYS = ("epoch", "position", "seed")


def _require_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class ResumableSampler(Sampler[int]):
    """Per-epoch seeded permutation of ``range(num_samples)`` that can stop and resume.

    ``batch_size`` only matters with ``drop_last=True``: an epoch then hands out
    ``num_samples // batch_size * batch_size`` indices so that every batch is full; it is
    also what ``state_after`` and the batch helpers below cut batches with.

    Iterating yields the *rest* of the current epoch (from ``position``); once an epoch
    is fully handed out, the next iteration starts the following epoch.
    One live iteration at a time: ``set_epoch``, ``load_state_dict`` and a newer
    ``iter()`` invalidate older iterators (they raise if advanced), since they all share
    one position.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
        batch_size: int = 1,
    ) -> None:
        self.num_samples = _require_int("num_samples", num_samples, 1)
        self.seed = _require_int("seed", seed, 0)
        self.batch_size = _require_int("batch_size", batch_size, 1)
        if drop_last and num_samples < batch_size:
            raise DataError(
                f"drop_last=True with num_samples={num_samples} < batch_size={batch_size} "
                "would give empty epochs; lower batch_size or set drop_last=False"
            )
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        self._generation = 0  # bumped on every state change from outside, see _check_live

    @property
    def epoch_length(self) -> int:
        """Number of indices handed out per epoch."""
        if self.drop_last:
            return self.num_samples // self.batch_size * self.batch_size
        return self.num_samples

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.epoch_length / self.batch_size)

    def epoch_order(self, epoch: int) -> list[int]:
        """The full order of ``epoch`` (already cut to ``epoch_length``)."""
        _require_int("epoch", epoch, 0)
        if not self.shuffle:
            return list(range(self.epoch_length))
        generator = seeded_generator(self.seed, epoch)
        return torch.randperm(self.num_samples, generator=generator)[: self.epoch_length].tolist()

    def upcoming(self) -> tuple[int, int]:
        """(epoch, position) that the next iteration starts from."""
        if self.position >= self.epoch_length:
            return self.epoch + 1, 0
        return self.epoch, self.position

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (same meaning as DistributedSampler's)."""
        self.epoch = _require_int("epoch", epoch, 0)
        self.position = 0
        self._generation += 1

    def __len__(self) -> int:
        """Indices the next iteration yields (DataLoader sizes itself from this)."""
        _, position = self.upcoming()
        return self.epoch_length - position

    def __iter__(self) -> Iterator[int]:
        self.epoch, self.position = self.upcoming()
        self._generation += 1  # a newer iteration retires older live ones
        generation = self._generation
        order = self.epoch_order(self.epoch)
        while self.position < len(order):
            if generation != self._generation:
                raise RuntimeError(
                    "sampler state was changed (set_epoch, load_state_dict or a newer "
                    "iteration) while this iterator was live; start a new iteration"
                )
            index = order[self.position]
            self.position += 1  # counted when handed out, before the consumer sees it
            yield index

    def state_dict(self) -> dict[str, int]:
        """Live state: what has been *handed out*; see the module note on prefetching."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def state_after(self, epoch: int, step_in_epoch: int) -> dict[str, int]:
        """State to checkpoint once batch ``step_in_epoch`` of ``epoch`` was consumed."""
        _require_int("epoch", epoch, 0)
        if not 0 <= step_in_epoch < self.steps_per_epoch:
            raise DataError(f"step_in_epoch={step_in_epoch} is outside an epoch of "
                            f"{self.steps_per_epoch} batches (0..{self.steps_per_epoch - 1})")
        position = min((step_in_epoch + 1) * self.batch_size, self.epoch_length)
        return {"epoch": epoch, "position": position, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise DataError(f"sampler state {dict(state)!r} lacks keys {missing}; "
                            f"expected a dict with keys {list(_STATE_KEYS)}")
        if state["seed"] != self.seed:
            raise DataError(
                f"sampler state was saved with seed={state['seed']} but this sampler has "
                f"seed={self.seed}; resuming would replay a different order. Resume with "
                f"seed={state['seed']} or start a fresh run"
            )
        epoch = _require_int("state['epoch']", state["epoch"], 0)
        position = _require_int("state['position']", state["position"], 0)
        if position > self.epoch_length:
            raise DataError(
                f"state['position']={position} exceeds the epoch length {self.epoch_length}; "
                "the state comes from a different data set size, batch_size or drop_last"
            )
        self.epoch, self.position = epoch, position
        self._generation += 1


class IndexBatch(NamedTuple):
    """One batch of sample indices and where it sits in training."""

    epoch: int
    step_in_epoch: int
    indices: list[int]


def epoch_batches(sampler: ResumableSampler) -> Iterator[IndexBatch]:
    """Batches of the rest of the upcoming epoch, cut every ``sampler.batch_size``."""
    epoch, position = sampler.upcoming()
    batch_size = sampler.batch_size
    if position % batch_size:
        raise DataError(
            f"sampler position {position} is not a multiple of batch_size {batch_size}; "
            "states must be saved at batch boundaries (use sampler.state_after(epoch, step))"
        )
    step = position // batch_size
    chunk: list[int] = []
    for index in sampler:
        chunk.append(index)
        if len(chunk) == batch_size:
            yield IndexBatch(epoch, step, chunk)
            step, chunk = step + 1, []
    if chunk:  # only possible with drop_last=False: the short last batch
        yield IndexBatch(epoch, step, chunk)


def iterate_batches(
    sampler: ResumableSampler, num_epochs: int | None = None
) -> Iterator[IndexBatch]:
    """``IndexBatch`` records from the sampler's current state on, across epochs.

    Stops before epoch ``num_epochs`` (epochs are numbered from 0), or never with None.
    Load a saved state into ``sampler`` first to resume mid-epoch.
    """
    if num_epochs is not None:
        _require_int("num_epochs", num_epochs, 0)
    while num_epochs is None or sampler.upcoming()[0] < num_epochs:
        yield from epoch_batches(sampler)


class BatchIndexSampler(Sampler[list[int]]):
    """Adapter for ``DataLoader(dataset, batch_sampler=BatchIndexSampler(sampler))``.

    Each ``iter()`` (one per ``iter(loader)``) yields the index lists of the rest of one
    epoch. Training-loop pattern, identical for any ``num_workers``::

        epoch, first_step = batches.upcoming()
        dataset.set_epoch(epoch)              # before iter(loader): workers copy the dataset
        for i, (x, y) in enumerate(loader):
            step = first_step + i
            ...
            checkpoint(sampler_state=batches.sampler.state_after(epoch, step))
    """

    def __init__(self, sampler: ResumableSampler, share: range | None = None) -> None:
        """``share``: the positions of each batch to yield (a data-parallel replica's share)."""
        self.sampler = sampler
        self.share = share

    def upcoming(self) -> tuple[int, int]:
        """(epoch, step_in_epoch) of the first batch the next iteration yields."""
        epoch, position = self.sampler.upcoming()
        return epoch, position // self.sampler.batch_size

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.sampler.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in epoch_batches(self.sampler):
            yield batch.indices if self.share is None else batch.indices[self.share.start:self.share.stop]
