"""Measurement primitives: time marks, bytes saved for backward, peak extra CUDA memory."""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import torch

Arg = TypeVar("Arg")


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's elements (not of its storage: a view counts its own elements)."""
    return tensor.numel() * tensor.element_size()


class MarkTimer:
    """Timestamps at labelled points of one stream of work; a duration is the gap between two marks.

    On CUDA a mark is an event recorded on the stream that was current when the timer was made
    (from any thread: autograd hooks mark from the engine's thread), and the first
    ``elapsed_ms`` synchronises once; between marks nothing waits for the GPU, so a gap is what
    the GPU spent there, including any wait for the host. ``reserve`` creates events ahead, so
    that a mark costs the host one record call. On CPU a mark reads the host clock.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._marks: dict[Hashable, Any] = {}
        self._aliases: dict[Hashable, Hashable] = {}
        self._spare_events: list[Any] = []
        self._stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self._synchronised = False

    def reserve(self, count: int) -> None:
        if self._stream is None:
            return
        for _ in range(count):
            event = torch.cuda.Event(enable_timing=True)
            event.record(self._stream)  # the driver creates CUDA events lazily, at the first record
            self._spare_events.append(event)

    def mark(self, key: Hashable) -> None:
        if self._stream is None:
            self._marks[key] = time.perf_counter()
            return
        event = self._spare_events.pop() if self._spare_events else torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        self._marks[key] = event

    def alias(self, key: Hashable, same_as: Hashable) -> None:
        """``key`` is the same point as ``same_as`` (which may be marked later)."""
        self._aliases[key] = same_as

    def _resolve(self, key: Hashable) -> Hashable:
        while key in self._aliases:
            key = self._aliases[key]
        return key

    def has(self, key: Hashable) -> bool:
        return self._resolve(key) in self._marks

    def elapsed_ms(self, start: Hashable, end: Hashable) -> float:
        first, last = self._marks[self._resolve(start)], self._marks[self._resolve(end)]
        if self.device.type != "cuda":
            return (last - first) * 1e3
        if not self._synchronised:
            torch.cuda.synchronize(self.device)
            self._synchronised = True
        return first.elapsed_time(last)


def storage_keys(tensors: Iterable[torch.Tensor]) -> set[tuple[str, int]]:
    """Identity of the memory behind tensors: (device, storage address)."""
    return {(str(t.device), t.untyped_storage().data_ptr()) for t in tensors}


class SavedTensorBytes:
    """Counts the bytes autograd saves for backward inside a ``with`` block.

    Each storage counts once, in full (a saved view keeps its whole storage alive), and
    storages in ``exclude`` (the model's parameters and buffers, already counted as
    parameters) do not count. Tensors are saved as they are: the graph is unchanged.
    """

    def __init__(self, exclude: set[tuple[str, int]]):
        self.exclude = exclude
        self.seen: set[tuple[str, int]] = set()
        self.total = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without a storage hold no memory of their own
            return tensor
        key = (str(tensor.device), storage.data_ptr())
        if key not in self.exclude and key not in self.seen and storage.nbytes() > 0:
            self.seen.add(key)
            self.total += storage.nbytes()
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def __enter__(self) -> SavedTensorBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


def peak_extra_cuda_bytes(run: Callable[[Arg], Any], arg: Arg, device: torch.device) -> tuple[Any, int]:
    """``run(arg)`` and the most memory it held above what was allocated before it (its output included)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = run(arg)
    torch.cuda.synchronize(device)
    return result, max(0, torch.cuda.max_memory_allocated(device) - before)
