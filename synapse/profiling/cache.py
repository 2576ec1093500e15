"""Profiles cached on disk, and the entry point ``python train.py mode=profile`` calls.

A profile is cached under ``<cache_dir>/profiles/<key>.csv`` where the key names the model,
role, micro-batch, dtype, hardware, image size, input channels and class count (see
``cache_key``): the same request on the same kind of device is measured once.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from synapse.profiling.profiler import Log, run_profile
from synapse.profiling.request import ProfileRequest, cache_key, device_name, resolve_device, resolve_precision
from synapse.profiling.result import ProfileResult, load_result, save_result
from synapse.rundir import cache_full_error, is_disk_full

PROFILES_SUBDIR = "profiles"

# Takes a profile where the run's devices are, for a process that has none of them (a decider on a host of
# its own): (request, cache_dir, refresh) -> (the name of its cache file there, its CSV text).
ProfileTaker = Callable[[ProfileRequest, str, bool], tuple[str, str]]
_taker: ProfileTaker | None = None


@contextlib.contextmanager
def profiles_taken_by(taker: ProfileTaker | None) -> Iterator[None]:
    """Within this block, every profile this process needs is taken by ``taker`` (None: here, as usual) and
    cached here under the name it had there: a host without the run's devices measures nothing itself."""
    global _taker
    kept, _taker = _taker, taker
    try:
        yield
    finally:
        _taker = kept


def cached_profile_path(request: ProfileRequest, cache_dir: str | Path) -> Path:
    """Where ``request``'s profile lives in the cache (resolving the device to name its hardware)."""
    hardware = device_name(resolve_device(request.device))
    return Path(cache_dir) / PROFILES_SUBDIR / f"{cache_key(request, hardware)}.csv"


def get_or_profile(request: ProfileRequest, cache_dir: str | Path, refresh: bool = False,
                   log: Log | None = None) -> tuple[ProfileResult, Path]:
    """The cached profile for ``request`` if there is one (unless ``refresh``), else measure and cache it;
    inside ``profiles_taken_by``, the taker's (which has its own cache), kept in this cache too."""
    if _taker is not None:
        return _taken_elsewhere(_taker, request, Path(cache_dir), refresh)
    path = cached_profile_path(request, cache_dir)
    if path.exists() and not refresh:
        if log:
            log(f"{request.model_name} ({request.role}): cached profile {path}")
        return load_result(path), path
    result = run_profile(request, log)
    try:
        save_result(result, path)  # staged in a scratch folder that goes with it: nothing partial stays
    except OSError as exc:
        if is_disk_full(exc):  # the cache's disk, named as such (not the run directory's)
            raise cache_full_error(Path(cache_dir), f"caching the profile {path}") from exc
        raise
    if log:
        log(f"{request.model_name} ({request.role}): profile written to {path}")
    return result, path


def _taken_elsewhere(taker: ProfileTaker, request: ProfileRequest, cache_dir: Path, refresh: bool
                     ) -> tuple[ProfileResult, Path]:
    # not looked up here first: the cache key names the hardware, which only the host that has it can name
    name, text = taker(request, str(cache_dir), refresh)
    path = cache_dir / PROFILES_SUBDIR / Path(name).name
    staged = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(text)
        os.replace(staged, path)  # whole or not at all: another process may read the same name
    except OSError as exc:
        staged.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise cache_full_error(cache_dir, f"caching the profile {path}") from exc
        raise
    return load_result(path), path


@dataclass(frozen=True)
class ProfilePaths:
    teacher: Path
    student: Path


def profile_for_config(teacher_name: str, student_name: str, micro_batch: int, precision: str, device: str,
                       num_classes: int, in_chans: int, image_size: int, cache_dir: str | Path,
                       warmup: int = 3, repeats: int = 10, refresh: bool = False,
                       log: Log | None = None, launch: str = "eager") -> ProfilePaths:
    """Profile (or find in the cache) the teacher and the student of a run; returns the two CSV paths.

    ``precision`` is the trainer's ('auto' | 'fp32' | 'bf16'; auto = bf16 on CUDA, fp32 on CPU);
    ``launch`` how the stages will run ('eager' | 'graphed', see ``profiling.graphed``).
    """
    dtype = resolve_precision(precision, device)
    paths = {}
    for role, name in (("teacher", teacher_name), ("student", student_name)):
        request = ProfileRequest(name, role, micro_batch, dtype, device, num_classes, in_chans, image_size,
                                 warmup, repeats, launch)
        paths[role] = get_or_profile(request, cache_dir, refresh=refresh, log=log)[1]
    return ProfilePaths(**paths)
