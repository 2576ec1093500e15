"""conf/experiment/: each file composes, names the command that runs it, and keeps every value it sets.

The seed's experiments are GPU runs; here they are composed with Hydra's compose API (as
``python train.py experiment=<name>`` would) and, where no real data or weights are needed,
validated with ``trainer.accelerator=cpu`` (block counts on the meta device, no GPU touched).
"""
from __future__ import annotations

from collections.abc import Iterator
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

import synapse.config  # noqa: F401  (registers the schema)
from synapse.conf import CONF_DIR
from synapse.config import ConfigError, validate
from synapse.engine import teacher_weights
from tests.conftest import as_written

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
BATCH_SIZES = [8, 16, 32, 64, 128, 256, 512]


def compose_experiment(name: str, tmp_path: Path, *overrides: str, hydra: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="test"):
        return compose("config", overrides=[f"experiment={name}", f"run_dir={tmp_path / 'run'}",
                                            f"cache_dir={tmp_path / 'cache'}", *overrides],
                       return_hydra_config=hydra)


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a YAML mapping; lists are leaves."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_the_seeds_experiments_are_there():
    assert {"failover_vit_resnet", "failover_batch_sweep", "kd_vit_resnet_imagenet100"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_experiment_file_starts_with_the_command_that_runs_it(name):
    package, first_comment = (CONF_DIR / "experiment" / f"{name}.yaml").read_text().splitlines()[:2]
    assert package == "# @package _global_", "experiment files override keys anywhere in the config"
    assert "python train.py" in first_comment and f"experiment={name}" in first_comment, first_comment


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_value_an_experiment_sets_survives_composition(name, tmp_path):
    """conf/config.yaml merges its own body after the experiment: a key set in both is silently lost."""
    written = yaml.safe_load((CONF_DIR / "experiment" / f"{name}.yaml").read_text())
    written.pop("defaults", None)
    written.pop("hydra", None)
    cfg = compose_experiment(name, tmp_path)
    for key, value in leaves(written):
        composed = as_written(OmegaConf.select(cfg, key))
        if isinstance(value, str) and value.startswith("${"):  # an interpolation: it must still be the one written
            composed = OmegaConf.to_container(cfg, resolve=False)
            for part in key.split("."):
                composed = composed[part]
        assert composed == value, f"{name}.yaml sets {key}={value!r} but the composed config has {composed!r}"


def test_failover_vit_resnet_is_the_seeds_setup_and_validates_on_cpu(tmp_path):
    cfg = compose_experiment("failover_vit_resnet", tmp_path, "trainer.accelerator=cpu")
    assert (cfg.teacher.name, cfg.student.name) == ("vit_large", "resnet152")
    assert (cfg.data.name, cfg.data.image_size, cfg.trainer.precision) == ("synthetic", 224, "bf16")
    assert list(cfg.trainer.devices) == [0, 1, 2, 3] and cfg.partition.mode == "auto" and cfg.policy.name == "eta"
    (fault,) = OmegaConf.to_container(cfg.injection.faults)
    assert (fault["kind"], fault["rank"]) == ("background_load", 3)  # GPU 3 = pipeline rank 3 of [0, 1, 2, 3]
    validate(cfg)  # 4 stages of ViT-L (blocks counted on the meta device), the fault's rank, the policy


def test_failover_vit_resnet_on_gpus_is_refused_here_with_the_cpu_fix(tmp_path):
    cfg = compose_experiment("failover_vit_resnet", tmp_path)
    assert cfg.trainer.accelerator == "cuda"
    import torch

    if torch.cuda.device_count() >= 4:
        pytest.skip("this machine has the 4 GPUs the experiment asks for")
    with pytest.raises(ConfigError, match="trainer"):
        validate(cfg)


def sweep_jobs(cfg: DictConfig, *command_line: str) -> list[list[str]]:
    """The jobs ``python train.py -m`` runs for this config: its sweeper params, then the command line's."""
    params = [f"{key}={value}" for key, value in cfg.hydra.sweeper.params.items()]
    parsed = OverridesParser.create().parse_overrides([*params, *command_line])
    (batch,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return batch


@pytest.mark.slow  # composes and validates every job of the sweep
def test_the_batch_sweep_runs_every_batch_size_under_both_policies(tmp_path):
    cfg = compose_experiment("failover_batch_sweep", tmp_path, hydra=True)
    jobs = sweep_jobs(cfg)
    assert len(jobs) == 14 and set(map(tuple, jobs)) == {(f"data.batch_size={b}", f"policy={p}")
                                                         for b, p in product(BATCH_SIZES, ["keep", "eta"])}
    (fault,) = as_written(cfg.injection.faults)
    assert fault == {"kind": "slow_compute", "rank": 3, "start": 80, "factor": 4.0}
    assert (cfg.teacher.name, cfg.student.name, cfg.trainer.precision) == ("vit_large", "resnet152", "bf16")
    by_batch = {int(dict(o.split("=") for o in job)["data.batch_size"]): job for job in jobs}
    for batch in (min(BATCH_SIZES), max(BATCH_SIZES)):  # pipeline.microbatches must divide both
        validate(compose_experiment("failover_batch_sweep", tmp_path, "trainer.accelerator=cpu", *by_batch[batch]))


@pytest.mark.slow  # composes and validates sweep jobs
def test_the_batch_sweeps_floor_has_no_fault_and_the_command_line_policy_wins(tmp_path):
    floor = ("trainer.accelerator=cpu", "injection.faults=[]", "injection.name=none")
    jobs = sweep_jobs(compose_experiment("failover_batch_sweep", tmp_path, *floor, hydra=True), "policy=keep")
    assert set(map(tuple, jobs)) == {(f"data.batch_size={b}", "policy=keep") for b in BATCH_SIZES}
    cfg = compose_experiment("failover_batch_sweep", tmp_path, *floor, *jobs[0])
    assert list(cfg.injection.faults) == [] and cfg.injection.name == "none" and cfg.policy.name == "keep"
    validate(cfg)


def test_kd_on_imagenet100_asks_for_the_data_and_never_trains_a_vit_large_teacher(tmp_path):
    cfg = compose_experiment("kd_vit_resnet_imagenet100", tmp_path, "trainer.accelerator=cpu")
    assert (cfg.teacher.name, cfg.student.name, cfg.data.name) == ("vit_large", "resnet152", "imagenet100")
    with pytest.raises(ConfigError, match="data.root"):
        validate(cfg)
    with pytest.raises(ConfigError, match="teacher.checkpoint"):
        teacher_weights(cfg, tmp_path / "run", log=lambda line: None)
    given = compose_experiment("kd_vit_resnet_imagenet100", tmp_path, "data.root=/datasets/imagenet",
                               "teacher.checkpoint=/weights/vit_large.pt")
    assert given.data.root == "/datasets/imagenet" and given.teacher.checkpoint == "/weights/vit_large.pt"


def test_the_cpu_batch_slowdown_sweep_is_16_jobs_through_submitit_with_seeds_as_repeats(tmp_path):
    from synapse.analysis import scenario_labels

    cfg = compose_experiment("batch_slowdown_sweep_cpu", tmp_path, hydra=True)
    assert cfg.hydra.launcher._target_.endswith("submitit_launcher.LocalLauncher"), "local_sequential"
    jobs = sweep_jobs(cfg)
    assert len(jobs) == 16
    overrides = [dict(o.split("=") for o in job) for job in jobs]
    assert {o["injection"] for o in overrides} == {"slow_compute", "intermittent"}
    assert {o["seed"] for o in overrides} == {"0", "1"} and {o["policy"] for o in overrides} == {"keep", "eta"}
    assert len(set(scenario_labels(overrides))) == 4, "batch x pattern; policy and seed are not the scenario"
    validate(compose_experiment("batch_slowdown_sweep_cpu", tmp_path, *jobs[-1]))
