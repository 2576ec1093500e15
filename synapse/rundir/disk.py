"""A full disk, said as such: ``DiskFullError`` names ENOSPC, the run directory and the fix.

When the disk holding the run directory fills between checkpoints, every process of the run
fails on some small write (a metrics line, a heartbeat, the error record a failing worker
leaves for its supervisor: that one ends up empty). Without care the user sees whatever parser
tripped over the empty file last (``JSONDecodeError``). Here: a failure whose exception chain
holds ENOSPC, or a launch that failed without a readable record while the run's filesystem has
no room left, becomes one ``DiskFullError``.
"""
from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

# Below this much free space a write of a record or an error report can fail: "full".
FULL_BELOW_BYTES = 256 << 10


class DiskFullError(OSError):
    """The disk holding the run directory is full (``errno`` ENOSPC); the message says what to do."""


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or one of its causes is an ENOSPC ``OSError``."""
    seen = []
    while exc is not None and exc not in seen:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return False


def filesystem_full(path: Path) -> bool:
    """Whether the filesystem holding ``path`` has (almost) no room left."""
    try:
        return shutil.disk_usage(path).free < FULL_BELOW_BYTES
    except OSError:
        return False


def disk_full_error(run_dir: Path, newest_checkpoint: Path | None, detail: str = "") -> DiskFullError:
    kept = (f"the newest intact checkpoint is {newest_checkpoint}" if newest_checkpoint is not None
            else "no checkpoint had been written yet")
    return DiskFullError(errno.ENOSPC, f"No space left on device: the disk holding the run directory {run_dir} is "
                         f"full{f' ({detail})' if detail else ''}; {kept}. Fix: free space on that filesystem (or set "
                         f"run_dir to another disk), then continue with resume=auto")


def cache_full_error(cache_dir: Path, detail: str = "") -> DiskFullError:
    """The disk of the cache (trained teachers, block profiles), not the run directory's, is full:
    the fix is elsewhere (SYNAPSE_CACHE), and freeing the run directory's disk would not help. The
    cache is written before the first launch, so nothing trained in this run is lost."""
    return DiskFullError(errno.ENOSPC, f"No space left on device: the disk holding the cache {cache_dir} (trained "
                         f"teachers, block profiles) is full{f' ({detail})' if detail else ''}, not the run "
                         f"directory's. Fix: free space on that filesystem, or point SYNAPSE_CACHE (or cache_dir=...) "
                         f"at another disk; then rerun the same command")


def read_json_record(path: Path) -> dict | None:
    """A JSON record another process wrote, or None if it is empty or cut short (its writer ran out
    of disk, or died while writing)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
