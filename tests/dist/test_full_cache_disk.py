"""A full cache disk is named as the cache's, and leaves no partial entry (issue #33, item 15).

Before: with ``SYNAPSE_CACHE`` on a full disk, caching the label-trained teacher failed with
ENOSPC, the run blamed "the disk holding the run directory" (which had room) and a 0-byte
``teachers/<name>-<key>.tmp-<pid>`` stayed in the cache.

Real processes and a real full disk: ``python train.py`` with the cache on a small tmpfs, the run
directory on the ordinary disk: 256 KiB (the teacher's weights are about 1.3 MB), or one page
under ``partition=auto`` (the block profiles, written first, need several). Mounting needs rights:
skipped without them.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import TINY_RUN

# generous limits: a loaded machine (other test runs beside) makes each run several times slower
pytestmark = [pytest.mark.dist, pytest.mark.timeout(480)]


def small_disk(tmp_path: Path, size_bytes: int) -> Path:
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small filesystem (a real full disk) needs mount rights: {mounted.stderr.strip()}")
    return mount_point


@pytest.mark.parametrize("entry, size_bytes, partition, written", [
    ("teachers", 256 << 10, "partition=even", "caching the trained teacher as {entries}/resnet_micro-"),
    ("profiles", 4 << 10, "partition=auto", "caching the profile {entries}/resnet_micro_"),
])
def test_a_full_cache_disk_is_blamed_on_the_cache_not_the_run_directory(train_py, tmp_path, entry, size_bytes,
                                                                        partition, written):
    disk = small_disk(tmp_path, size_bytes)
    try:
        cache, run_dir = disk / "cache", tmp_path / "run"
        result = train_py([*TINY_RUN, partition, "trainer.devices=2", "trainer.max_steps=2",
                           f"hydra.run.dir={run_dir}"], timeout=400, SYNAPSE_CACHE=str(cache))
        output = result.stdout + result.stderr
        assert result.returncode != 0, output[-3000:]
        assert (f"No space left on device: the disk holding the cache {cache} (trained teachers, block profiles) "
                f"is full ({written.format(entries=cache / entry)}") in output, output[-3000:]
        assert "Fix: free space on that filesystem, or point SYNAPSE_CACHE (or cache_dir=...) at another disk" in output
        assert "the disk holding the run directory" not in output, output[-3000:]
        assert [p.name for p in (cache / entry).iterdir() if not p.name.endswith(".csv")] == [], \
            "a partial cache entry was left behind"
        assert not (run_dir / "logs").exists(), "no worker was started"
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
