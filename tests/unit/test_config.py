"""The Hydra configuration: every file composes, every experiment runs, every bad value is refused early.

Composition goes through Hydra's compose API on conf/ (what ``python train.py`` does), so these
tests see the real defaults list, the structured schema and the group files.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from synapse.app import run
from synapse.conf import CONF_DIR
from synapse.config import ConfigError, validate
from synapse.models import build_model
from tests.conftest import as_written

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")
MEMBERS = [(group, f.stem) for group in GROUPS for f in sorted((CONF_DIR / group).glob("*.yaml"))]
EXPERIMENTS = [member for group, member in MEMBERS if group == "experiment"]
HAS_CUDA = torch.cuda.is_available()

# Group members that cannot run on this machine, even as their file documents, and the key the
# error must name (ImageNet100 needs the data set, trainer=gpu a GPU).
NEEDS_MORE = {("data", "imagenet100"): "data.root"}
if not HAS_CUDA:
    NEEDS_MORE[("trainer", "gpu")] = "trainer.accelerator"
    NEEDS_MORE[("trainer", "shared_gpu")] = "trainer.accelerator"
    NEEDS_MORE[("experiment", "failover_vit_resnet")] = "trainer.accelerator"
    NEEDS_MORE[("experiment", "failover_batch_sweep")] = "trainer.accelerator"
NEEDS_MORE[("experiment", "kd_vit_resnet_imagenet100")] = "teacher.checkpoint"  # its documented command names a file
DOCUMENTED_COMMAND = re.compile(r"python train\.py((?: [^\s#]+)+)")


def documented_overrides(path: Path, group: str, member: str) -> list[str]:
    """The overrides of the ``python train.py ...`` line a file documents itself with, else just itself."""
    for line in path.read_text().splitlines():
        match = DOCUMENTED_COMMAND.search(line) if line.lstrip().startswith("#") else None
        if match and f"{group}={member}" in match.group(1).split():
            return [token for token in match.group(1).split() if not token.startswith("-")]  # not -m
    return [f"{group}={member}"]


def yaml_leaves(node, prefix: str = ""):
    """(dotted key, value) of every leaf of a YAML file's content, the defaults list excluded."""
    for key, value in node.items_ex(resolve=False) if isinstance(node, DictConfig) else []:
        if key == "defaults" and not prefix:
            continue
        dotted = f"{prefix}{key}"
        if isinstance(value, DictConfig) and len(value):
            yield from yaml_leaves(value, dotted + ".")
        else:
            yield dotted, value


def package_prefix(path: Path, group: str) -> str:
    return "" if "@package _global_" in path.read_text() else f"{group}."


# ----------------------------------------------------------------------------- composition

def test_there_are_config_groups_and_experiments():
    assert {"teacher", "student", "data", "trainer", "experiment"} <= set(GROUPS)
    assert EXPERIMENTS


def test_default_config_composes_and_validates(make_config):
    cfg = make_config()
    defaults = (cfg.mode, cfg.teacher.name, cfg.student.name, cfg.data.name)
    assert defaults == ("kd", "resnet_mini", "resnet_micro", "digits")
    validate(cfg)


def test_run_dir_comes_from_hydra_unless_given(make_config, tmp_path):
    raw = OmegaConf.load(CONF_DIR / "config.yaml")
    assert OmegaConf.to_container(raw, resolve=False)["run_dir"] == "${hydra:runtime.output_dir}"
    assert make_config(run_dir=tmp_path / "elsewhere").run_dir == str(tmp_path / "elsewhere")


@pytest.mark.slow  # 66 members, a Hydra composition and validation each
@pytest.mark.parametrize("group, member", MEMBERS, ids=[f"{g}={m}" for g, m in MEMBERS])
def test_every_group_member_composes_is_applied_and_validates(make_config, group, member):
    cfg = make_config(f"{group}={member}")
    path = CONF_DIR / group / f"{member}.yaml"
    prefix = package_prefix(path, group)
    for key, value in yaml_leaves(OmegaConf.load(path)):
        full_key = prefix + key
        if full_key.startswith("hydra."):  # Hydra's own settings (sweeper params) are not in the job's config
            continue
        if value == "???":  # merged onto an Optional field, '???' leaves it unset: validate names it
            assert OmegaConf.select(cfg, full_key) is None
        elif isinstance(value, str) and value.startswith("${"):  # an interpolation: applied as written, resolved
            raw = OmegaConf.to_container(cfg, resolve=False)
            for part in full_key.split("."):
                raw = raw[part]
            assert raw == value and OmegaConf.select(cfg, full_key) is not None, f"{path.name} sets {full_key}"
        else:
            assert as_written(OmegaConf.select(cfg, full_key)) == value, f"{path.name} sets {full_key}={value}"
    # ... and the command the file documents validates, or the error names what this machine lacks.
    overrides = documented_overrides(path, group, member)
    if overrides != [f"{group}={member}"]:
        cfg = make_config(*overrides)
    lacking = NEEDS_MORE.get((group, member)) or ("trainer.devices" if wants_more_gpus_than_here(cfg) else None)
    if lacking is None:
        validate(cfg)
        return
    with pytest.raises(ValueError, match=re.escape(lacking)):
        validate(cfg)


def wants_more_gpus_than_here(cfg: DictConfig) -> bool:
    """A GPU run on a machine with a GPU but fewer than it names (a 4-GPU experiment on one H200)."""
    if not HAS_CUDA or cfg.trainer.accelerator == "cpu" or cfg.trainer.shared_gpu is not None:
        return False  # (ranks sharing one GPU need only that one)
    devices = cfg.trainer.devices
    wanted = int(devices) if isinstance(devices, int) else max(int(d) for d in devices) + 1
    return wanted > torch.cuda.device_count()


# Experiments sized for GPUs (ViT-L -> ResNet-152 at 224 px) keep their shape in the smoke run: their
# device count, pipeline schedule, planned partition, injected faults, policy and data kind. Only
# the networks and images shrink to CPU stand-ins of the same families, or one ViT-L forward pass
# per image would take the CPU seconds and profiling 87 blocks minutes.
GPU_SCALE = {"failover_vit_resnet", "failover_batch_sweep", "kd_vit_resnet_imagenet100"}
CPU_STAND_INS = ("teacher=vit_micro", "student=resnet_micro", "data.image_size=32", "data.batch_size=8",
                 "data.num_workers=0", "pipeline.microbatches=4")


def tiny_imagenet100(root: Path) -> Path:
    """An ImageNet-layout folder with the 100 synsets and one small JPEG per synset and split."""
    from PIL import Image

    from synapse.data import imagenet100_synsets
    for split in ("train", "val"):
        for index, synset in enumerate(imagenet100_synsets()):
            (root / split / synset).mkdir(parents=True)
            Image.new("RGB", (40, 40), (index * 2, 255 - index * 2, 90)).save(root / split / synset / "a.JPEG")
    return root


def test_only_experiments_with_gpu_scale_models_get_stand_ins(make_config):
    for experiment in EXPERIMENTS:
        cfg = make_config(f"experiment={experiment}")
        at_gpu_scale = (cfg.teacher.name, cfg.student.name) == ("vit_large", "resnet152")
        simulated = cfg.mode == "simulate"  # no model is built: the GPU profiles stand in for the hardware
        assert (at_gpu_scale and not simulated) == (experiment in GPU_SCALE), experiment


@pytest.mark.slow  # each shipped experiment really runs
@pytest.mark.timeout(300)
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_smoke_runs_on_cpu(make_config, tmp_path, experiment):
    # Only what makes it small and CPU-bound is overridden; the rest is the experiment's. Its schedule
    # too: the launch stops after 2 steps (trainer.stop_after), so the faults and drills it injects
    # later stay inside the run (one beyond the run's last step is refused, issue #33 item 15).
    overrides = [f"experiment={experiment}", "trainer.accelerator=cpu", "trainer.stop_after=2", "trainer.threads=1",
                 "trainer.progress=false", "teacher.auto_train_epochs=0", "report=false"]
    if experiment in GPU_SCALE:
        overrides += CPU_STAND_INS
        if make_config(f"experiment={experiment}").data.name == "imagenet100":
            teacher = tmp_path / "teacher.pt"
            torch.save(build_model("vit_micro", 100, 3, 32).state_dict(), teacher)
            overrides += [f"data.root={tiny_imagenet100(tmp_path / 'imagenet')}", f"teacher.checkpoint={teacher}"]
    if make_config(f"experiment={experiment}").mode == "simulate":  # no worker runs: a short simulation as set
        short = make_config(f"experiment={experiment}", "trainer.max_steps=20", "report=false",
                            run_dir=tmp_path / experiment)
        result = run(short, log=lambda line: None)["simulation"]
        assert result["completed"] and result["steps"] == 20
        return
    cfg = make_config(*overrides, run_dir=tmp_path / experiment)
    assert cfg.trainer.devices == make_config(f"experiment={experiment}").trainer.devices
    summary = run(cfg, log=lambda line: None)
    records = [json.loads(line) for line in (tmp_path / experiment / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 2
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]
    assert (tmp_path / experiment / "summary.json").is_file()


# ----------------------------------------------------------------------------- errors while composing

def test_misspelt_key_is_refused_while_composing(make_config):
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'trainer\.epoch'"):
        make_config("trainer.epoch=3")


def test_misspelt_key_added_with_plus_is_refused_by_validate(make_config):
    # Hydra's hint for the error above is '+trainer.epoch=3', which it then accepts silently.
    cfg = make_config("+trainer.epoch=3")
    with pytest.raises(ConfigError, match=r"^trainer\.epoch: is not a Synapse setting .*Fix: remove the override; "
                                          r"did you mean trainer\.epochs\?"):
        validate(cfg)
    with pytest.raises(ConfigError, match=r"^nonsense: is not a Synapse setting"):
        validate(make_config("+nonsense=1"))
    validate(make_config("failover.detector.window=5"))  # settings dicts hold their defaults: plain overrides
    # Each policy has its own parameter schema: another policy's parameter fails while composing ...
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'policy\.params\.ladder'"):
        make_config("policy.params.ladder=[replan]")
    with pytest.raises(ConfigError, match=r"^policy.params.margin: is not a Synapse setting"):
        validate(make_config("+policy.params.margin=0.1"))  # ... and none at all


@pytest.mark.parametrize("override, key", [
    ("failover.max_restarts=-1", "failover.max_restarts"),
    ("failover.decide_every=0", "failover.decide_every"),
    ("+failover.detector.windw=5", "failover.detector.windw"),  # a typed node: the key itself is named
    ("failover.detector.threshold=0.5", "failover.detector"),
    ("failover.estimator.ema_weight=2", "failover.estimator"),
    ("failover.restart_cost_file=/nonexistent.json", "failover.restart_cost_file"),
    ("trainer.spare_devices=[0]", "trainer.spare_devices"),
])
def test_bad_failover_settings_are_refused(make_config, override, key):
    with pytest.raises(ConfigError, match=f"^{key}: .*Fix: "):
        validate(make_config(override))


@pytest.mark.parametrize("override, cause", [
    ("data.batch_size=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
    ("kd.T=hot", "Value 'hot' of type 'str' could not be converted to Float"),
    ("trainer.progress=maybe", "Value 'maybe' is not a valid bool"),
    # a choice outside its set: Hydra names the valid ones (Choice fields, synapse/config/schema.py)
    ("kd.mode=kl", "Invalid value 'kl', expected one of [st, logits]"),
    ("optim.name=adam", "Invalid value 'adam', expected one of [sgd, adamw]"),
    ("mode=distil", "Invalid value 'distil', expected one of [kd, teacher, baseline, profile, simulate]"),
    ("trainer.accelerator=tpu", "Invalid value 'tpu', expected one of [auto, cpu, cuda]"),
    ("failover.replan_mode=teleport", "Invalid value 'teleport', expected one of [live, restart]"),
    ("trainer.nonfinite=ignore", "Invalid value 'ignore', expected one of [stop, skip]"),
    ("policy.name=oracle",
     "Invalid value 'oracle', expected one of [eta, keep, replan, degrade, rebalance, shrink, ski_rental]"),
])
def test_wrong_type_is_refused_while_composing(make_config, override, cause):
    with pytest.raises(ConfigCompositionException, match=f"Error merging override {override}") as error:
        make_config(override)
    assert cause in str(error.value.__cause__)
    assert f"full_key: {override.split('=')[0]}" in str(error.value.__cause__)


def test_unknown_group_member_lists_the_available_ones(make_config):
    with pytest.raises(MissingConfigException, match=r"Could not find 'teacher/nope'") as error:
        make_config("teacher=nope")
    assert "Available options in 'teacher'" in str(error.value) and "resnet_micro" in str(error.value)


# ----------------------------------------------------------------------------- errors from validate
# (overrides, the message's start: "<key>: <problem>", a fragment of the fix)
VALIDATION_ERRORS = [
    (["kd.T=0"], "kd.T: must be > 0, got 0.0", "set kd.T to a value > 0"),
    (["kd.T=-1.5"], "kd.T: must be > 0, got -1.5", "set kd.T to a value > 0"),
    (["kd.lambda_kd=1.5"], "kd.lambda_kd: must be in [0, 1], got 1.5", "kd.lambda_kd=0.9 weighs KD 0.9"),
    (["data.batch_size=0"], "data.batch_size: must be > 0, got 0", "set data.batch_size to a value > 0"),
    (["data.batch_size=-8"], "data.batch_size: must be > 0, got -8", "set data.batch_size"),
    (["data.val_batch_size=0"], "data.val_batch_size: must be > 0", "set data.val_batch_size"),
    (["optim.lr=0"], "optim.lr: must be > 0, got 0.0", "set optim.lr to a value > 0"),
    (["optim.lr=-0.1"], "optim.lr: must be > 0, got -0.1", "set optim.lr"),
    (["teacher.name=nope"], "teacher.name: unknown model 'nope'", "choose one of deit_base"),
    (["student.name=resnet9000"], "student.name: unknown model 'resnet9000'", "resnet152"),
    (["student.drop_rate=1.0"], "student.drop_rate: must be in [0, 1), got 1.0", "student.drop_rate=0.1"),
    (["teacher.checkpoint=/nonexistent/t.pt"], "teacher.checkpoint: file '/nonexistent/t.pt' does not exist",
     "weights are never downloaded"),
    (["resume=/nonexistent/step_1"], "resume: checkpoint '/nonexistent/step_1' does not exist", "resume=auto"),
    (["pipeline.microbatches=3"], "pipeline.microbatches: 3 micro-batches do not divide data.batch_size=64",
     "choose a divisor of the batch size"),
    (["pipeline.microbatches=0"], "pipeline.microbatches: must be > 0", "set pipeline.microbatches"),
    (["trainer.accelerator=cpu", "trainer.devices=3", "pipeline.microbatches=2"],
     "pipeline.microbatches: 2 micro-batches for pipelines of 3 stages: the 1F1B schedule needs at least one",
     "pipeline.schedule=gpipe"),
    (["trainer.accelerator=cpu", "trainer.devices=6", "trainer.replicas=2", "pipeline.microbatches=2"],
     "pipeline.microbatches: 2 micro-batches for pipelines of 3 stages", "pipeline.microbatches=3 or more"),
    (["trainer.accelerator=cpu", "trainer.devices=[0,0]"], "trainer.devices: duplicate device ids in [0, 0]",
     "list each device once"),
    (["trainer.accelerator=cpu", "trainer.shared_gpu=0"],
     "trainer.shared_gpu: 0 names a GPU for every rank, but the run is on the CPU", "trainer.shared_gpu=null"),
    (["trainer.accelerator=cpu", "trainer.devices=[]"], "trainer.devices: no devices given",
     "trainer.devices=1"),
    (["trainer.accelerator=cpu", "trainer.devices=abc"], "trainer.devices: 'abc' is neither a count nor a list",
     "trainer.devices=2"),
    (["partition=manual", "partition.teacher=[5,5]", "partition.student=[4]", "trainer.accelerator=cpu",
      "trainer.devices=2"], "partition.student: 1 stages given for 2 devices", "give exactly 2 block counts"),
    (["partition=manual"], "partition.teacher: partition.mode=manual needs blocks per stage",
     "or use partition=even"),
    (["data=imagenet100"], "data.root: ImageNet100 needs a data root", "set data.root=/path/to/imagenet"),
    (["checkpoint.keep=0"], "checkpoint.keep: must be > 0", "set checkpoint.keep"),
    (["trainer=cpu", "injection=none", "partition=auto", "partition.alphas=[1,2]"],
     "partition.alphas: 2 speeds given for 1 devices",
     "give exactly 1 values"),
    (["partition=auto", "trainer.accelerator=cpu", "trainer.devices=2", "partition.alphas=[1,0]"],
     "partition.alphas: slowdowns must be > 0", "use 1.0 for a nominal device"),
    (["trainer.nodes=2"], "trainer.rdzv_endpoint: trainer.nodes=2 needs a rendezvous endpoint",
     "set trainer.rdzv_endpoint=host:port"),
    (["trainer.accelerator=cpu", "trainer.devices=3", "injection.faults=[{kind:raise,rank:3,step:2}]"],
     "injection.faults: injection.faults[0] targets rank 3 but the run has 3 rank(s)", "see conf/injection/"),
]


@pytest.mark.parametrize("overrides, problem, fix", VALIDATION_ERRORS,
                         ids=[" ".join(o) for o, _, _ in VALIDATION_ERRORS])
def test_bad_value_is_refused_with_key_and_fix(make_config, overrides, problem, fix):
    with pytest.raises(ConfigError) as error:
        validate(make_config(*overrides))
    message = str(error.value)
    assert message.startswith(problem), message
    assert fix in message.split(". Fix: ", 1)[1], message


@pytest.mark.skipif(HAS_CUDA, reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_refused(make_config):
    with pytest.raises(ConfigError, match=r"^trainer\.accelerator: cuda requested but no CUDA device is visible\. "
                                          r"Fix: use trainer\.accelerator=cpu"):
        validate(make_config("trainer.accelerator=cuda"))
    with pytest.raises(ConfigError, match=r"^trainer\.accelerator: cuda requested"):
        validate(make_config("trainer=gpu"))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_gpu_id_beyond_the_machine_is_refused(make_config):
    count = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=rf"^trainer\.devices: GPU ids \[{count + 3}\] do not exist .*Fix: "):
        validate(make_config("trainer.accelerator=cuda", f"trainer.devices=[{count + 3}]"))


def test_missing_imagenet_root_folder_is_refused_before_any_work(make_config, tmp_path):
    with pytest.raises(ValueError, match=r"ImageNet100 root '.*absent' does not exist; expected <root>/train/"
                                         r".*\(data\.root in the config\)"):
        validate(make_config("data=imagenet100", f"data.root={tmp_path / 'absent'}"))


def test_run_refuses_a_bad_config_before_creating_anything(make_config, tmp_path):
    cfg = make_config("kd.T=0", run_dir=tmp_path / "never")
    with pytest.raises(ConfigError, match=r"^kd\.T"):
        run(cfg, log=lambda line: None)
    assert not (tmp_path / "never").exists()


@pytest.mark.slow  # composes and validates many configs
def test_relative_eta_thresholds_are_checked_by_validate(make_config):
    validate(make_config("policy.params.min_saving_restart_frac=1.5", "policy.params.min_saving_frac=0.2"))
    with pytest.raises(ConfigError, match=r"^policy: .*min_saving_restart_frac must be in \[0, 10\]"):
        validate(make_config("policy.params.min_saving_restart_frac=-1"))
    with pytest.raises(ConfigError, match=r"^policy: .*min_saving_frac must be in \[0, 1\)"):
        validate(make_config("policy.params.min_saving_frac=1.5"))


def test_fewer_micro_batches_than_stages_are_fine_under_gpipe_and_for_one_stage(make_config):
    validate(make_config("trainer.accelerator=cpu", "trainer.devices=3", "pipeline.microbatches=2",
                         "pipeline.schedule=gpipe"))
    validate(make_config("trainer.accelerator=cpu", "trainer.devices=4", "trainer.replicas=4",
                         "pipeline.microbatches=1"))
