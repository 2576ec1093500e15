"""Synapse as a user installs it: a wheel in a fresh virtual environment, no source tree on the path.

The wheel must carry what a run needs at run time (the Hydra config groups, the restart-cost
priors, the class list): a run launched from that environment, in a folder that is not the
checkout, composes its segment configs from the installed package. The environment reuses the
site-packages of the interpreter running the tests for torch and the other dependencies (nothing
is downloaded), and the test checks that ``synapse`` itself is imported from the wheel, not from
the checkout.
"""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

from synapse.models import build_model

REPO = Path(__file__).resolve().parents[2]
# The installed package must be the one found: nothing on PYTHONPATH may point at a checkout.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel built from this checkout installed in it; returns its bin/."""
    root = tmp_path_factory.mktemp("install")
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(REPO)], check=True, cwd=root, timeout=300)
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    see_the_dependencies(env_dir / "bin" / "python")
    wheel = next(wheels.glob("synapse-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "--no-deps",
                    "--no-index", "--ignore-installed", "-q", str(wheel)],
                   check=True, cwd=root, timeout=300, env=CLEAN_ENV)
    return env_dir / "bin"


def see_the_dependencies(python: Path) -> None:
    """Let the venv of ``python`` import what the interpreter running the tests has installed.

    ``--system-site-packages`` would show it the *base* interpreter's packages, which lack the
    dependencies when the tests run from a virtual environment (as the README installs Synapse).
    A .pth file in the venv's own site-packages appends this interpreter's site directories after
    it, so the wheel installed there is found first. Their own .pth files are not run, so an
    editable install of the checkout there (an import hook) stays out of the venv.
    """
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         check=True, capture_output=True, text=True, timeout=60, env=CLEAN_ENV).stdout.strip()
    ours = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    (Path(own) / "enclosing_environment.pth").write_text("".join(f"{path}\n" for path in ours))


def test_the_wheel_carries_configs_and_priors_and_imports_from_itself(installed, tmp_path):
    probe = ("import json, synapse, synapse.conf, synapse.failover.run as f; "
             "print(json.dumps({'file': synapse.__file__, 'conf': str(synapse.conf.CONF_DIR), "
             "'priors': sorted(p.name for p in f.PRIORS_DIR.glob('*.json'))}))")
    out = subprocess.run([str(installed / "python"), "-c", probe], check=True, capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, env=CLEAN_ENV).stdout
    found = json.loads(out)
    assert not found["file"].startswith(str(REPO)), f"synapse was imported from the checkout: {found['file']}"
    assert ((Path(found["conf"]) / "config.yaml").is_file()
            and (Path(found["conf"]) / "injection" / "demo.yaml").is_file())
    assert {"restart_cost_cpu.json", "live_replan_cpu.json"} <= set(found["priors"])


@pytest.mark.extended  # a real run from the installed wheel; the install itself is the test above
def test_the_installed_command_runs_a_failover_that_composes_a_segment_config(installed, tmp_path):
    teacher = tmp_path / "teacher.pt"
    torch.manual_seed(1234)
    torch.save(build_model("resnet_micro", 10, 1, 32).state_dict(), teacher)
    run_dir = tmp_path / "run"
    command = [str(installed / "synapse"), f"hydra.run.dir={run_dir}", f"cache_dir={tmp_path / 'cache'}",
               "trainer=cpu", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.threads=1",
               "trainer.progress=false", "trainer.max_steps=20", "partition=even", "injection=none",
               "teacher=resnet_micro", "student=resnet_micro", f"teacher.checkpoint={teacher}",
               "data.batch_size=16", "pipeline.microbatches=2", "report=false",
               "failover.drills=[{step:3,action:degrade,device:1}]"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=420, env=CLEAN_ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    segment1 = run_dir / "segments" / "1"
    composed = (segment1 / "config.yaml").read_text()
    assert "devices:" in composed and json.loads((segment1 / "segment.json").read_text())["devices"] == [0]
    summary = json.loads((run_dir / "experiment_summary.json").read_text())
    assert summary["steps"] == summary["total_steps"] == 20
    assert [s["index"] for s in summary["segments"]] == [0, 1]
