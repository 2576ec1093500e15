"""Shared fixtures: an isolated teacher cache, Hydra composition of conf/, and train.py subprocesses.

Every test session gets its own ``SYNAPSE_CACHE`` (a temporary directory), so no test reads or
writes ``~/.cache/synapse`` and a teacher trained by one test can be reused by the next.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import settings
from omegaconf import DictConfig, OmegaConf

import synapse.config  # noqa: F401  (registers the structured-config schema used by conf/config.yaml)
from synapse.conf import CONF_DIR

# No per-example deadline in any property test: a deadline is a timing target in a unit test, and on a
# loaded 2-core machine an example of the shrunk-replica pricing took 339 ms once against Hypothesis'
# default 200 ms (and 117 ms when re-run). Timing targets live in experiments/.
settings.register_profile("synapse", deadline=None)
settings.load_profile("synapse")

REPO_ROOT = Path(__file__).resolve().parents[1]

# Overrides that make any run tiny and CPU-only: micro models, one thread, no progress bar, and a
# teacher that is "trained" for zero epochs (its initial weights: enough to exercise KD).
TINY_RUN = (
    "trainer=cpu",  # not the default demo's 3 ranks, partition=auto and injected slowdown
    "partition=even",
    "injection=none",
    "teacher=resnet_micro",
    "student=resnet_micro",
    "teacher.auto_train_epochs=0",
    "trainer.accelerator=cpu",
    "trainer.threads=1",
    "trainer.progress=false",
)


@pytest.fixture(scope="session", autouse=True)
def synapse_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh SYNAPSE_CACHE for the whole session (inherited by subprocesses)."""
    cache = tmp_path_factory.mktemp("synapse_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SYNAPSE_CACHE", str(cache))
        yield cache


def compose_config(overrides: Sequence[str], run_dir: Path) -> DictConfig:
    """Compose conf/config.yaml as ``python train.py <overrides>`` would, with ``run_dir`` set.

    config.yaml takes run_dir from ``${hydra:runtime.output_dir}``, which only exists inside a
    Hydra run; tests give it explicitly instead.
    """
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="test"):
        return compose(config_name="config", overrides=[f"run_dir={run_dir}", *overrides])


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., DictConfig]:
    """``make_config(*overrides, run_dir=None)``: a composed config whose run dir is under tmp_path."""

    def make(*overrides: str, run_dir: Path | None = None) -> DictConfig:
        return compose_config(list(overrides), run_dir or tmp_path / "run")

    return make


@pytest.fixture
def tiny_run() -> tuple[str, ...]:
    return TINY_RUN


def repo_env(**env_vars: str) -> dict[str, str]:
    """This session's environment plus ``env_vars``, with the checkout first on PYTHONPATH: a Python
    subprocess imports this repository's synapse whatever is installed."""
    return dict(os.environ, **env_vars,
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))


def run_train_py(args: Sequence[str], timeout: float, **env_vars: str) -> subprocess.CompletedProcess:
    """``python train.py <args>`` from the repository root, with this session's environment plus ``env_vars``."""
    return subprocess.run([sys.executable, str(REPO_ROOT / "train.py"), *args], cwd=REPO_ROOT, env=repo_env(**env_vars),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def train_py() -> Callable[..., subprocess.CompletedProcess]:
    return run_train_py


def as_written(value):
    """A composed value as a YAML file wrote it: typed nodes (policy.params, each injected fault) hold
    every key they do not set as None."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: as_written(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [as_written(v) for v in value]
    return value


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A long or extended test is slow as well. `-m` on the command line replaces the `-m` of addopts,
    # so the fast loop's `-m "not dist and not slow"` would otherwise bring the hour-long runs back.
    for item in items:
        if item.get_closest_marker("long") or item.get_closest_marker("extended"):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist every worker is in the controller's process group, so a test that looks
    # for processes it left behind by group (tests/dist/test_reliability.py) would see its sibling
    # workers' runs. Each worker leads a group of its own instead.
    if os.environ.get("PYTEST_XDIST_WORKER") and os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
