"""What the benchmark scripts share: running ``python train.py``, recording the machine's load,
and writing a result as JSON with a markdown page beside it.

Scripts here run as ``python experiments/<name>.py``, so this folder is on ``sys.path`` and
they import it as ``benchlib``.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from synapse.rundir import read_jsonl

REPO = Path(__file__).resolve().parents[1]


class TrainRunError(RuntimeError):
    """A train.py run that failed or wrote no experiment summary."""


def run_train_py(run_dir: Path, overrides: Sequence[str], timeout_s: float) -> float:
    """``python train.py`` into ``run_dir``; the process's wall time. A failed run raises with its stderr."""
    command = [sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", *overrides]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise TrainRunError(f"train.py {' '.join(overrides)} failed (exit {done.returncode}); its stderr ends:\n"
                            f"{done.stderr[-3000:]}")
    return time.perf_counter() - started


def train_py_summary(run_dir: Path, overrides: Sequence[str], timeout_s: float) -> tuple[dict[str, Any], float]:
    """``run_train_py``, then the run's experiment_summary.json (a run without one raises)."""
    wall_s = run_train_py(run_dir, overrides, timeout_s)
    summary = run_dir / "experiment_summary.json"
    if not summary.is_file():
        raise TrainRunError(f"train.py {' '.join(overrides)} wrote no {summary}")
    return json.loads(summary.read_text()), wall_s


def machine_load() -> dict[str, Any]:
    """How busy the (shared) machine was, from uptime's load averages, and which commit was measured."""
    def output(*command: str) -> str:
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {"uptime": output("uptime"), "loadavg": list(os.getloadavg()), "cpus": os.cpu_count(),
            "commit": output("git", "describe", "--always", "--dirty")}


def write_results(out: Path, result: dict[str, Any], table_md: str, runs_note: str = "") -> None:
    """The JSON, and next to it a short markdown page: the command, the machine's load, the table."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    before, after = result["load_before"], result["load_after"]
    load = f"load before/after {before['loadavg'][0]:.2f} / {after['loadavg'][0]:.2f} on {before['cpus']} cores"
    out.with_suffix(".md").write_text(f"# {result['what']}\n\n`{result['command']}`; {runs_note}{load}\n\n{table_md}")


def spread(values: Sequence[float | None], digits: int = 2) -> str:
    """``median (min-max, n = N)`` of the values given (None: a run that had none, left out); "-" for none."""
    kept = [v for v in values if v is not None]
    if not kept:
        return "-"
    f = f".{digits}f"
    return f"{statistics.median(kept):{f}} ({min(kept):{f}}-{max(kept):{f}}, n = {len(kept)})"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cell = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]) + "\n"


def read_events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """The run's failover events called ``name``."""
    return [e for e in read_jsonl(run_dir / "failover_events.jsonl") if e.get("event") == name]


class EagerKDLoop:
    """The honest one-GPU baseline: a plain eager KD loop on one resident batch (teacher forward under
    no_grad, student forward and backward, AdamW, bf16 autocast, channels_last; the caller sets
    ``cudnn.benchmark``). ``fused``: AdamW's fused update (the baseline itself uses torch's default)."""

    def __init__(self, teacher_name: str, student_name: str, batch: int, fused: bool = False,
                 num_classes: int = 100, image_size: int = 224):
        import torch

        from synapse.kd import KDLossParams
        from synapse.models import build_model

        device = torch.device("cuda")
        torch.manual_seed(0)
        self.teacher = build_model(teacher_name, num_classes, 3, image_size).to(device)
        self.teacher = self.teacher.to(memory_format=torch.channels_last).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.student = build_model(student_name, num_classes, 3, image_size).to(device)
        self.student = self.student.to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.AdamW(self.student.parameters(), lr=0.002, weight_decay=5e-4,
                                           fused=fused or None)
        self.images = torch.randn(batch, 3, image_size, image_size, device=device)
        self.images = self.images.contiguous(memory_format=torch.channels_last)
        self.labels = torch.randint(0, num_classes, (batch,), device=device)
        self.params = KDLossParams("st", 4.0, 0.9)

    def step(self) -> None:
        import torch

        from synapse.kd import kd_loss

        with torch.autocast("cuda", dtype=torch.bfloat16):
            with torch.no_grad():
                teacher_logits = self.teacher(self.images)
            loss = kd_loss(self.student(self.images), teacher_logits, self.labels, self.params)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
