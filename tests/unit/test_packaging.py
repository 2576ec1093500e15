"""How Synapse is packaged: the wheel's package list, and the Hydra config groups (the checkout's
top-level conf/, installed as the package ``synapse.conf``) found by a checkout whatever else is
installed. The wheel itself, installed and run, is tests/install/test_wheel.py.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, repo_env

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

SETUPTOOLS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]

# Where synapse.conf comes from, and whether Hydra composes the run's config from it (pkg://).
PROBE = """
import json, importlib.resources
import synapse.conf
from hydra import compose, initialize_config_module
import synapse.config  # registers the schema that config.yaml names
with initialize_config_module(config_module="synapse.conf", version_base="1.3"):
    cfg = compose(config_name="config", overrides=["run_dir=unused", "trainer=cpu"])
print(json.dumps({"conf_dir": str(synapse.conf.CONF_DIR), "resources": str(importlib.resources.files("synapse.conf")),
                  "trainer_devices": cfg.trainer.devices}))
"""


def probe(checkout: Path, cwd: Path) -> dict:
    env = repo_env()
    env["PYTHONPATH"] = str(checkout)  # this checkout alone, as a user's PYTHONPATH=. would
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_wheel_lists_every_package_of_synapse_and_maps_conf_into_it():
    # hydra_plugins/ is a namespace package (Hydra finds plugins only there): its own packages are listed
    inits = [*(REPO_ROOT / "synapse").rglob("__init__.py"), *(REPO_ROOT / "hydra_plugins").rglob("__init__.py")]
    on_disk = {".".join(init.parent.relative_to(REPO_ROOT).parts) for init in inits}
    assert set(SETUPTOOLS["packages"]) == on_disk | {"synapse.conf"}, (
        "pyproject.toml's [tool.setuptools] packages must name every package under synapse/ and hydra_plugins/ "
        "(a package missing there is left out of the wheel)")
    assert SETUPTOOLS["package-dir"] == {"synapse.conf": "conf"}
    assert not (REPO_ROOT / "synapse" / "conf" / "__init__.py").exists(), "the config groups are the top-level conf/"


@pytest.mark.slow  # a Python subprocess that imports torch and composes
@pytest.mark.timeout(150)
def test_a_checkout_composes_its_own_conf(tmp_path):
    # An editable install of another checkout (or none) must not decide which config groups this one uses.
    found = probe(REPO_ROOT, cwd=tmp_path)
    assert found["conf_dir"] == found["resources"] == str(REPO_ROOT / "conf")
    assert found["trainer_devices"] == 1  # conf/trainer/cpu.yaml


@pytest.mark.slow  # copies the package and runs a Python subprocess that imports torch
@pytest.mark.timeout(150)
def test_a_synapse_conf_folder_left_by_the_old_layout_does_not_hide_conf(tmp_path):
    # Before conf/ moved to the top level it was synapse/conf/; a checkout updated since keeps that
    # folder's ignored __pycache__, which Python would otherwise import as an empty namespace package.
    checkout = tmp_path / "checkout"
    for folder in ("synapse", "conf"):
        shutil.copytree(REPO_ROOT / folder, checkout / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", checkout)
    cpu = checkout / "conf" / "trainer" / "cpu.yaml"  # this copy's own value, told apart from the original's
    cpu.write_text(cpu.read_text().replace("\ndevices: 1\n", "\ndevices: 5\n"))
    (checkout / "synapse" / "conf" / "__pycache__").mkdir(parents=True)
    found = probe(checkout, cwd=tmp_path)
    assert found["conf_dir"] == found["resources"] == str(checkout / "conf")
    assert found["trainer_devices"] == 5
