"""The data path a host can feed: where JPEGs are decoded and how many loader workers each rank
that reads images gets, from the host's cores, its ranks and the decoders it has
(``data.decode=auto``, ``data.num_workers=auto``).

Measured on an H200 host (16 cores, docs/gpu.md, "The data path"), 500x375 JPEGs to 224 px crops:
loader workers decode about 300 images/s each (4,302 img/s with 14), nvJPEG in the training process
7,600 img/s however many workers feed it; yet end to end the CPU path with 14 workers ran
ViT-B/16 -> ResNet-50 at 0.95 of resident data and nvJPEG with 8 at 0.82, because decoding in the
training process takes the GPU and the host thread from the step. So the CPU decodes wherever a
reader has enough cores for workers that keep up, and the GPU decodes only on hosts too thin for
that. Pure: the caller says what the host has.
"""
from __future__ import annotations

from dataclasses import dataclass

# Fewer workers than this decode below what ViT-B/16 -> ResNet-50 @128 eats on an H200 (~2,900 img/s
# at ~300 img/s a worker; 8 workers measured 2,517): there the GPU decodes instead.
CPU_DECODE_MIN_WORKERS = 8
# The most workers measured to still add throughput (14 on the 16-core host); more only add processes.
MAX_WORKERS = 14
# Cores each rank keeps for itself: its training thread and the thread that pins and finishes batches.
CORES_PER_RANK = 2


@dataclass(frozen=True)
class HostDataPath:
    """Resolved ``data.decode`` (cpu | gpu) and ``data.num_workers`` for one rank, and why."""

    decode: str
    workers: int
    reason: str


def choose_host_data_path(*, decode: str, workers: int | str, reads_files: bool, cores: int, local_ranks: int,
                          local_readers: int, on_cuda: bool, device_decoder: bool) -> HostDataPath:
    """``decode`` (auto | cpu | gpu) and ``workers`` (a count or "auto") as configured; the host: its
    ``cores`` (this process's affinity), ``local_ranks`` training processes on it, ``local_readers`` of
    them reading images (the first stage of each pipeline replica), whether this rank runs on CUDA and
    whether it can decode JPEGs there (``device_decoder``). ``reads_files``: the data set decodes files
    (synthetic data is made on the device and digits sit in memory: no workers to feed)."""
    if not reads_files:
        count = 0 if workers == "auto" else int(workers)
        return HostDataPath("cpu", count, "the data set decodes no files" if workers == "auto" else "as configured")
    readers = max(1, local_readers)
    # Ranks that read no images still need their own cores; the readers share what is left.
    spare = max(0, cores - CORES_PER_RANK * max(local_ranks, readers)) // readers
    count = min(spare, MAX_WORKERS) if workers == "auto" else int(workers)
    source = (f"{cores} cores, {local_ranks} rank(s) here, {readers} reading images: {count} workers each"
              if workers == "auto" else f"{count} workers as configured")
    if decode != "auto":
        return HostDataPath(decode, count, f"{source}; decode={decode} as configured")
    if not on_cuda:
        return HostDataPath("cpu", count, f"{source}; the workers decode (no GPU)")
    if count >= CPU_DECODE_MIN_WORKERS or not device_decoder:
        why = "enough of them to keep up" if device_decoder else "no JPEG decoder on this GPU"
        return HostDataPath("cpu", count, f"{source}; the workers decode ({why})")
    return HostDataPath("gpu", count, f"{source}; too few to keep up, nvJPEG decodes on the GPU")
