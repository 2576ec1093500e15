"""CUDA context probe: can a fresh process still create a context, allocate and run a kernel?

The probe runs in a child process, never in the supervisor: a wedged driver can block a
CUDA call forever, and only a process can be abandoned (killed) after a timeout; and the
supervisor keeps no CUDA context of its own (no GPU memory, no device it could wedge).
Outcomes: ``ok``; ``failed`` (error or wrong result: a hard failure); ``timeout`` (hard);
``inconclusive`` (out of memory: the workers may legitimately hold the whole device).

``CudaProbe`` is non-blocking (``start`` then ``poll`` each monitor period);
``probe_device`` is the blocking form.
"""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, cast

# Exit codes of the probe program.
_WRONG_RESULT, _OUT_OF_MEMORY = 3, 4
PROBE_PROGRAM = f"""
import sys
import torch
try:
    device = torch.device(sys.argv[1])
    x = torch.arange(1024, device=device, dtype=torch.float32)
    total = float((x * 2).sum())  # a kernel, and a copy back
except RuntimeError as exc:
    print(exc, file=sys.stderr)
    sys.exit({_OUT_OF_MEMORY} if "out of memory" in str(exc) else 1)
sys.exit(0 if total == 1047552.0 else {_WRONG_RESULT})
"""


@dataclass(frozen=True)
class ProbeResult:
    device: str
    outcome: str  # ok | failed | timeout | inconclusive
    seconds: float
    detail: str = ""

    @property
    def hard_failure(self) -> bool:
        return self.outcome in ("failed", "timeout")


class CudaProbe:
    """One probe of one device in a child process, polled without blocking."""

    def __init__(self, device: str, timeout_s: float = 30.0, program: str = PROBE_PROGRAM):
        self.device, self.timeout_s, self.program = device, timeout_s, program
        self._process: subprocess.Popen | None = None
        self._started = 0.0

    @property
    def running(self) -> bool:
        return self._process is not None

    def start(self) -> None:
        self._started = time.monotonic()
        self._process = subprocess.Popen([sys.executable, "-c", self.program, self.device],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def poll(self) -> ProbeResult | None:
        """The result once the probe ended or timed out; None while it runs (or never started)."""
        if self._process is None:
            return None
        elapsed = time.monotonic() - self._started
        code = self._process.poll()
        if code is None and elapsed < self.timeout_s:
            return None
        process, self._process = self._process, None
        if code is None:
            process.kill()
            process.wait()
            return ProbeResult(self.device, "timeout", elapsed, f"no answer within {self.timeout_s:.0f} s")
        stderr = cast(IO[bytes], process.stderr)  # started with stderr=PIPE
        detail = stderr.read().decode(errors="replace").strip()[-500:]
        stderr.close()
        outcome = {0: "ok", _OUT_OF_MEMORY: "inconclusive"}.get(code, "failed")
        if code == _WRONG_RESULT:
            detail = "the probe kernel computed a wrong result"
        return ProbeResult(self.device, outcome, elapsed, detail if outcome != "ok" else "")

    def abandon(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


def probe_device(device: str, timeout_s: float = 30.0) -> ProbeResult:
    """Run one probe of ``device`` (e.g. 'cuda:0') and wait for its outcome."""
    probe = CudaProbe(device, timeout_s)
    probe.start()
    while (result := probe.poll()) is None:
        time.sleep(0.05)
    return result
