"""Finish host batches on the training device ahead of the step that needs them.

What a loader worker ships (uint8 pixels, JPEG bytes, a few integers) still has work left on
the device: copy, decode, crop, normalise. ``DevicePrefetcher`` does that for the next
batches in a background thread, on a side CUDA stream, while the current step computes on
the default stream; the step waits only on an event recorded after its batch was finished.
This is the approach of timm's prefetching loader, with the host half (pulling from the
DataLoader, launching decode kernels) moved off the training thread too.

On the CPU the same code runs without streams, so tests exercise it. Order is preserved: one
thread pulls from the source and deals items round-robin to the finishing threads, and the
consumer collects them in the same round. Errors raised while pulling or finishing a batch
re-raise in the consumer, at that batch's place.
"""
from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

_END = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class DevicePrefetcher:
    """Iterate ``finish(item)`` for each ``item`` of ``source``, ``depth`` items ahead.

    ``finish`` returns a tuple of tensors (and anything else) on ``device``; on CUDA it runs
    under a side stream and the consumer's stream waits for it before the tuple is handed
    out. Stop early with ``close()`` (a ``for`` loop that breaks does it through the
    generator's close).

    ``finishers`` threads finish items at once, each on its own stream; item ``i`` goes to
    finisher ``i % finishers`` and is handed out in source order. More than one pays where
    ``finish`` spends host time outside the interpreter lock: torchvision's batched nvJPEG
    decodes each file's entropy-coded data on the host, 25 ms of a 256-image batch on the
    H200's host, and two finishers overlap that (experiments/gpu/probe_loader.py).
    """

    def __init__(self, source: Iterable[Any], finish: Callable[[Any], Any], device: torch.device,
                 depth: int = 2, overlap: bool | None = None, finishers: int = 1) -> None:
        """``overlap``: finish items on background threads (default: on accelerators only; on the
        CPU the same cores would do both, and a second Python thread slows the step's own dispatch:
        on 3 CPU ranks it made rank 0's compute 1.3x slower, which the slowdown detector saw)."""
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if finishers < 1:
            raise ValueError(f"finishers must be >= 1, got {finishers}")
        self.device = device
        self.overlap = device.type != "cpu" if overlap is None else overlap
        self._source, self._finish = source, finish
        self._stop = threading.Event()
        # One inbox and one outbox per finisher: round-robin on both sides keeps the order with no
        # sequence numbers; ``depth`` items wait finished, spread over the outboxes.
        self._inboxes: list[queue.Queue] = [queue.Queue(maxsize=1) for _ in range(finishers)]
        per_finisher = max(1, -(-depth // finishers))
        self._outboxes: list[queue.Queue] = [queue.Queue(maxsize=per_finisher) for _ in range(finishers)]
        self._streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in range(finishers)]
        self._thread = threading.Thread(target=self._produce, name="device-prefetch", daemon=True)
        self._finishers = [threading.Thread(target=self._finish_loop, args=(k,), name=f"device-finish-{k}",
                                            daemon=True) for k in range(finishers)]
        self._started = False

    def __iter__(self) -> Iterator[Any]:
        if self._started:
            raise RuntimeError("a DevicePrefetcher is iterated once; build a new one")
        self._started = True
        if not self.overlap:
            yield from (self._finish(item) for item in self._source)
            return
        self._thread.start()
        for finisher in self._finishers:
            finisher.start()
        try:
            for position in itertools.count():
                item = self._outboxes[position % len(self._outboxes)].get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield self._hand_over(*item)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the producer and the finishers, wait for them, and drop what they had finished.
        Every wait of theirs on a queue gives up within 0.05 s once stopped, so joining is enough."""
        self._stop.set()
        for thread in (self._thread, *self._finishers):
            if thread.ident is not None:
                thread.join()
        for box in (*self._inboxes, *self._outboxes):
            with contextlib.suppress(queue.Empty):
                while True:
                    box.get_nowait()

    # ---------------------------------------------------------------- producer side
    def _produce(self) -> None:
        """Pull items from the source (one thread: a DataLoader is iterated by one) and deal them out."""
        position = 0
        try:
            for item in self._source:
                if self._stop.is_set():
                    return
                if not self._put(self._inboxes[position % len(self._inboxes)], item):
                    return
                position += 1
            self._put(self._inboxes[position % len(self._inboxes)], _END)
        except BaseException as error:  # handed to the consumer at this position, which raises it
            self._put(self._inboxes[position % len(self._inboxes)], _Failure(error))
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:  # a generator source: run its cleanup (loader workers) here
                with contextlib.suppress(Exception):
                    close()

    def _finish_loop(self, k: int) -> None:
        inbox, outbox = self._inboxes[k], self._outboxes[k]
        while not self._stop.is_set():
            try:
                item = inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is _END or isinstance(item, _Failure):
                self._put(outbox, item)
                return
            try:
                finished = self._finish_on_side_stream(item, self._streams[k])
            except BaseException as error:  # handed to the consumer at this position, which raises it
                self._put(outbox, _Failure(error))
                return
            if not self._put(outbox, finished):
                return

    def _finish_on_side_stream(self, item: Any, stream: torch.cuda.Stream | None
                               ) -> tuple[Any, torch.cuda.Event | None]:
        if stream is None:
            return self._finish(item), None
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            result = self._finish(item)
            ready = torch.cuda.Event()
            ready.record(stream)
        return result, ready

    def _put(self, box: queue.Queue, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                box.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    # ---------------------------------------------------------------- consumer side
    def _hand_over(self, result: Any, ready: torch.cuda.Event | None) -> Any:
        if ready is None:
            return result
        current = torch.cuda.current_stream(self.device)
        current.wait_event(ready)
        for tensor in _tensors(result):
            if tensor.device.type == "cuda":
                tensor.record_stream(current)  # allocated on a side stream, freed after use here
        return result


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for element in value:
            yield from _tensors(element)
    elif hasattr(value, "__dict__"):
        for element in vars(value).values():
            yield from _tensors(element)
