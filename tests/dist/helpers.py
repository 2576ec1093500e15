"""Shared pieces of the multi-process tests: composed configs on tiny models and CPU ranks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

import synapse.config  # noqa: F401  (registers the schema)
from synapse.checkpoint import latest_valid_checkpoint, load_student_state
from synapse.conf import CONF_DIR as PACKAGE_CONF_DIR

CONF_DIR = str(PACKAGE_CONF_DIR)

# SYNAPSE_TEST_SHARED_GPU=<gpu>: the same runs with every rank on that one GPU (trainer.shared_gpu),
# in fp32 with deterministic kernels: the multi-GPU code paths (graphs, CUDA clocks read late, GPU
# checkpoints, live re-partition) where one GPU is all there is (experiments/gpu/shared_gpu.sh).
SHARED_GPU = os.environ.get("SYNAPSE_TEST_SHARED_GPU")
ON_DEVICE = (["trainer.accelerator=cpu"] if SHARED_GPU is None else
             ["trainer.accelerator=cuda", f"trainer.shared_gpu={SHARED_GPU}", "trainer.deterministic=true"])

# Small, fast and deterministic: one thread per rank, fixed micro-batches, no augmentation.
BASE_OVERRIDES = [
    "trainer=cpu", "partition=even", "injection=none",  # not the default demo's partition=auto and slowdown
    *ON_DEVICE, "trainer.threads=1", "trainer.progress=false", "trainer.max_steps=4",
    "data.batch_size=16", "data.augment=false", "pipeline.microbatches=4", "checkpoint.keep=10",
    "teacher=resnet_micro", "student=resnet_micro",
]


def compose_config(run_dir: Path, overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=[*BASE_OVERRIDES, f"run_dir={run_dir}",
                                            f"cache_dir={run_dir}/cache", *overrides])


def final_student_state(run_dir: Path) -> tuple[dict, dict]:
    ref = latest_valid_checkpoint(Path(run_dir) / "checkpoints")
    assert ref is not None, f"no checkpoint in {run_dir}"
    return load_student_state(ref.path)


def assert_identical_states(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    (model_a, optim_a), (model_b, optim_b) = a, b
    assert model_a.keys() == model_b.keys()
    for name in model_a:
        assert torch.equal(model_a[name], model_b[name]), (
            f"student tensor {name} differs: {largest_difference(model_a[name], model_b[name])}")
    assert optim_a.keys() == optim_b.keys()
    for name in optim_a:
        for key, value in optim_a[name].items():
            other = optim_b[name][key]
            same = torch.equal(value, other) if torch.is_tensor(value) else value == other
            assert same, f"optimizer state {name}.{key} differs: {largest_difference(value, other)}"


def largest_difference(a, b) -> str:
    """How far apart two tensors are, for a failure message (a bit-exact test says only that they differ)."""
    if not (torch.is_tensor(a) and torch.is_tensor(b)) or a.shape != b.shape:
        return f"{a!r} against {b!r}"
    gap = (a.double() - b.double()).abs()
    scale = b.double().abs().max().clamp_min(1e-30)
    return f"largest |difference| {gap.max().item():.3g}, {(gap.max() / scale).item():.3g} of its largest magnitude"


def plant_heartbeat(run_dir: Path, rank: int, pid: int) -> None:
    """A hostile live/rank_<r>.json: a pid that is not the run's, dated in the future (so no
    'older than this launch' filter skips it) and never advancing."""
    path = run_dir / "live" / f"rank_{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "pid": pid, "device": "cpu:9", "step": 0, "phase": "training",
                                "time": time.time() + 3600}))


def outputs_of(launchers: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each launcher's output once it ended; any still running after ``timeout`` (or when waiting fails)
    is killed with its whole process group, so no node outlives its test."""
    try:
        return [launcher.communicate(timeout=timeout)[0] for launcher in launchers]
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)


# Runs that sum in another order than the reference (replicas' all-reduce, a GPU's other kernels)
# agree to rounding: every tensor within this share of its scale (test_replicas.py says why 1e-5).
CLOSE_TOLERANCE = 1e-5


def assert_close_states(a: tuple[dict, dict], b: tuple[dict, dict], tolerance: float = CLOSE_TOLERANCE) -> None:
    """Every student tensor and optimizer state within ``tolerance`` x max(1, its largest magnitude)."""
    (model_a, optim_a), (model_b, optim_b) = a, b
    assert model_a.keys() == model_b.keys() and optim_a.keys() == optim_b.keys()
    pairs = [(name, model_a[name], model_b[name]) for name in model_a]
    pairs += [(f"{name}.{key}", value, optim_b[name][key]) for name in optim_a for key, value in optim_a[name].items()
              if torch.is_tensor(value)]
    ratios = {}
    for name, x, y in pairs:
        scale = max(1.0, float(y.double().abs().max()))
        ratios[name] = float((x.double() - y.double()).abs().max()) / scale
    name = max(ratios, key=ratios.__getitem__)
    print(f"largest difference: {name}, {ratios[name]:.2g} of its scale")
    assert ratios[name] <= tolerance, f"{name} differs by {ratios[name]:.3g} of its scale"
