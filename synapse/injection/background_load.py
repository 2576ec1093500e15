"""Background load: separate processes that do real, contending work on a rank's device.

A ``background_load`` fault makes a device slower the way a noisy neighbour does, not by
sleeping in our code: on CPU each load process runs a busy loop pinned to the rank's core
(and the worker is pinned to that same core, or the scheduler would just move it away); on
a GPU it multiplies matrices on the rank's GPU, sharing the SMs by time-slicing.

Rank -> core mapping (CPU): local rank r gets the r-th core, modulo their number, of the
cores the worker may run on (``sorted(os.sched_getaffinity(0))[r % n]``). Only ranks with a
background_load fault are pinned, from the moment their injector is built (before step 1),
so the steps before the load starts are measured under the same pinning as those during it.

Lifetime: the processes are spawned when the injector is built and wait for a "go" line
on stdin (so a GPU load's CUDA start-up does not delay the start step). Pause/resume are
SIGSTOP/SIGCONT (intermittent loads). They never outlive the worker: they exit when their
stdin reaches EOF (the worker closed it or died), get SIGKILL from the kernel when the worker
dies (PR_SET_PDEATHSIG), and check that their parent is still the worker.

Run as a program by the worker only, by its file path (``python .../background_load.py``), not
with ``-m``: that would import the ``synapse.injection`` package, and with it torch, first. This
module imports nothing outside the standard library at top level, so it starts in milliseconds.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, cast

_PR_SET_PDEATHSIG = 1


class BackgroundLoadError(ValueError):
    """A background load that cannot run here (e.g. CPU pinning unsupported on this OS)."""


@dataclass(frozen=True)
class LoadTarget:
    """Where the load runs: ``device`` 'cpu' (pinned to ``core``) or 'cuda:N'."""

    device: str
    core: int | None = None


def cpu_core_for_rank(local_rank: int, available: set[int] | None = None) -> int:
    """The CPU core of local rank ``local_rank``: the (r mod n)-th of the ``available`` cores."""
    if available is None:
        available = _affinity()
    cores = sorted(available)
    return cores[local_rank % len(cores)]


def pin_process_to_core(core: int, pid: int | None = None) -> None:
    """Pin every thread of process ``pid`` (default: this one) to ``core``.

    ``sched_setaffinity(pid)`` moves only one thread; torch's intra-op and gloo threads
    already exist, so each thread id in /proc/<pid>/task is pinned (threads started later
    inherit the affinity of the thread that starts them).
    """
    pid = os.getpid() if pid is None else pid
    _affinity()  # fails clearly where pinning is unsupported
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except ProcessLookupError:
            continue  # the thread ended meanwhile


def prepare_load_target(device: str, local_rank: int) -> LoadTarget:
    """The target of this rank's background loads; on CPU, pins this worker to its core now."""
    if device.startswith("cuda"):
        return LoadTarget(device if ":" in device else "cuda:0")
    core = cpu_core_for_rank(local_rank)
    pin_process_to_core(core)
    return LoadTarget("cpu", core)


def _affinity() -> set[int]:
    if not hasattr(os, "sched_getaffinity"):
        raise BackgroundLoadError("CPU background load needs os.sched_setaffinity (Linux); on this OS use "
                                  "slow_compute to simulate a slower device")
    return os.sched_getaffinity(0)


class LoadProcess:
    """One contending process, spawned waiting; ``go``, ``pause``, ``resume``, ``stop``."""

    def __init__(self, target: LoadTarget, matrix_size: int = 4096):
        # -I: isolated, so the script's own folder (synapse/injection/) is not on its sys.path
        args = [sys.executable, "-I", os.path.abspath(__file__), "--parent", str(os.getpid()),
                "--device", target.device, "--matrix-size", str(matrix_size)]
        if target.core is not None:
            args += ["--core", str(target.core)]
        self.process = subprocess.Popen(args, stdin=subprocess.PIPE)
        self.state = "waiting"

    @property
    def pid(self) -> int:
        return self.process.pid

    def go(self) -> None:
        self._send(b"go\n")
        self.state = "running"

    def pause(self) -> None:
        if self.state == "running":
            self._signal(signal.SIGSTOP)
            self.state = "paused"

    def resume(self) -> None:
        if self.state == "paused":
            self._signal(signal.SIGCONT)
            self.state = "running"

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the process: EOF on stdin first (a clean exit), SIGKILL if it does not go."""
        if self.state == "stopped":
            return
        self._signal(signal.SIGCONT)  # a stopped process cannot see the EOF
        try:
            cast(IO[bytes], self.process.stdin).close()  # started with stdin=PIPE
        except OSError:
            pass  # it is gone already
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.state = "stopped"

    def _send(self, line: bytes) -> None:
        try:
            stdin = cast(IO[bytes], self.process.stdin)  # started with stdin=PIPE
            stdin.write(line)
            stdin.flush()
        except OSError as exc:
            raise BackgroundLoadError(f"background load process {self.pid} is gone (exit code "
                                      f"{self.process.poll()}); see the worker's stderr") from exc

    def _signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signum)


class BackgroundLoad:
    """The ``workers`` contending processes of one background_load fault."""

    def __init__(self, target: LoadTarget, workers: int = 1, matrix_size: int = 4096):
        self.target = target
        self.processes = [LoadProcess(target, matrix_size) for _ in range(workers)]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def start(self) -> None:
        for process in self.processes:
            process.go()

    def pause(self) -> None:
        for process in self.processes:
            process.pause()

    def resume(self) -> None:
        for process in self.processes:
            process.resume()

    def stop(self) -> None:
        for process in self.processes:
            process.stop()


# ------------------------------------------------------------------ the load process itself
def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the stdin EOF and parent checks below still end the process
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)


def _exit_on_eof() -> None:
    """Runs on a thread: the load ends when the worker closes stdin or dies."""
    while sys.stdin.buffer.readline():
        pass
    os._exit(0)


def _cpu_work(core: int | None, matrix_size: int, parent: int):
    if core is not None:
        os.sched_setaffinity(0, {core})

    def spin() -> None:
        x, i = 1, 0
        while True:
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF  # pure integer work: one core at 100%
            i += 1
            if i % 1_000_000 == 0 and os.getppid() != parent:
                os._exit(0)

    return spin


def _gpu_work(device: str, matrix_size: int, parent: int):
    import torch  # only GPU loads pay for importing torch

    dev = torch.device(device)
    torch.cuda.set_device(dev)
    a = torch.randn(matrix_size, matrix_size, device=dev)
    b = torch.randn(matrix_size, matrix_size, device=dev)
    out = torch.empty_like(a)
    torch.cuda.synchronize(dev)  # CUDA start-up happens now, before the start step

    def multiply() -> None:
        while True:
            for _ in range(8):
                torch.mm(a, b, out=out)
            torch.cuda.synchronize(dev)
            if os.getppid() != parent:
                os._exit(0)

    return multiply


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="contending load on one device (started by a worker)")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--core", type=int, default=None)
    parser.add_argument("--matrix-size", type=int, default=4096)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    if args.device == "cpu":
        work = _cpu_work(args.core, args.matrix_size, args.parent)
    else:
        work = _gpu_work(args.device, args.matrix_size, args.parent)
    if sys.stdin.buffer.readline().strip() != b"go":
        return  # EOF before go: the fault never started
    threading.Thread(target=_exit_on_eof, daemon=True).start()
    work()


if __name__ == "__main__":
    main()
