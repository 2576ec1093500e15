"""A composed config pickled into another process, as submitit pickles every job of hydra/launcher=slurm,
slurm_nodes and local_sequential: its Hydra node classes cannot be imported by name, so cloudpickle carries
copies of them, and the config must still become the typed SynapseConfig there (before: an AssertionError
in ``typed_config`` failed every job of every submitit sweep)."""
from __future__ import annotations

import subprocess
import sys

import cloudpickle
from hydra import compose, initialize_config_dir

import synapse.config  # noqa: F401  (registers the schema)
from synapse.conf import CONF_DIR

UNPICKLE = ("import sys, cloudpickle; from synapse.config.schema import typed_config; "
            "cfg = typed_config(cloudpickle.loads(sys.stdin.buffer.read())); "
            "print(type(cfg).__name__, type(cfg.trainer).__name__, type(cfg.policy).__name__, cfg.trainer.nodes)")


def test_a_config_pickled_into_another_process_is_typed_there(tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        cfg = compose("config", overrides=[f"run_dir={tmp_path}", "trainer.nodes=2", "policy=eta"])
    shown = subprocess.run([sys.executable, "-c", UNPICKLE], input=cloudpickle.dumps(cfg), capture_output=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr.decode()[-3000:]
    assert shown.stdout.decode().split() == ["SynapseConfig", "TrainerConfig", "PolicyConfig", "2"]
