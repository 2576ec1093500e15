"""Model factory and block decomposition: the blocks are the model, bit for bit.

Small models (the micro variants at 32x32 and the smallest real architectures at 224x224) are
run: composing ``model_blocks`` must reproduce ``model(x)``, the gradients and the BatchNorm
statistics exactly. Large ones (ViT-L, ResNet-152, ...) are built on the meta device (no
memory, no initialisation time) and checked for their block count and parameter coverage.
"""
from __future__ import annotations

import collections
import csv
import os
from functools import cache
from pathlib import Path

import pytest
import timm
import torch
from timm.models.efficientnet import EfficientNet
from timm.models.resnet import BasicBlock, ResNet
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from synapse.models import (
    MODEL_REGISTRY,
    ModelError,
    block_parameter_names,
    build_model,
    load_weights,
    model_blocks,
    model_spec,
    num_blocks,
    run_blocks,
)

PROFILES = Path(__file__).resolve().parents[1] / "data" / "synapse_profiles"
NUM_CLASSES = 10
DROP_RATE = 0.25  # > 0 so that train-mode equality needs identical RNG use

# Blocks per model, from the published depths: a ViT is patch embed, token embed, pre-norm,
# `depth` transformer blocks, norm, pool, head (depth + 6); a ResNet is conv, bn, act, maxpool,
# its residual blocks, pool, dropout, fc (blocks + 7); an EfficientNet is stem conv, bn, its
# MBConv blocks, head conv, bn, pool, dropout, classifier (blocks + 7).
EXPECTED_BLOCKS = {
    "vit_large": 24 + 6, "vit_base": 12 + 6, "vit_small": 12 + 6, "vit_tiny": 12 + 6,
    "deit_base": 12 + 6, "deit_small": 12 + 6, "deit_tiny": 12 + 6,
    "resnet152": (3 + 8 + 36 + 3) + 7, "resnet101": (3 + 4 + 23 + 3) + 7, "resnet50": (3 + 4 + 6 + 3) + 7,
    "resnet34": (3 + 4 + 6 + 3) + 7, "resnet18": (2 + 2 + 2 + 2) + 7,
    "efficientnet_b0": 16 + 7,
    "vit_micro": 4 + 6, "resnet_micro": 4 + 7, "resnet_mini": 4 + 7,
    "efficientnet_micro": 10 + 7,  # TinyNet-E: B0's stage depths scaled by 0.6 and rounded
}
FAMILY_CLASS = {"vit": VisionTransformer, "resnet": ResNet, "efficientnet": EfficientNet}

# (name, image size, batch) of the models that are actually run. The 224-pixel ones and
# efficientnet_micro are slow (seconds each on a CPU); the other micro models run the same code quickly.
RUN_CASES = [
    pytest.param(name, image_size, batch, id=name,
                 marks=[pytest.mark.slow] if image_size == 224 or name == "efficientnet_micro" else [])
    for name, image_size, batch in [
        ("vit_micro", 32, 4), ("resnet_micro", 32, 4), ("resnet_mini", 32, 4), ("efficientnet_micro", 32, 4),
        ("resnet18", 224, 1), ("vit_tiny", 224, 1), ("deit_tiny", 224, 1), ("efficientnet_b0", 224, 1),
    ]
]


@pytest.fixture(autouse=True)
def _one_thread():
    # One intra-op thread: on two, torch's CPU backward of EfficientNet-B0's late blocks is not
    # the same from one process to the next (bn2 gradients of blocks.5 differed in 2 of 5 fresh
    # processes, in 0 of 6 on one thread), so "the blocks are the model, bit for bit" could not be
    # told apart from the kernels' own run-to-run spread.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@cache
def meta_model(name: str) -> nn.Module:
    with torch.device("meta"):
        return build_model(name, num_classes=100, img_size=224)


@cache
def run_case(name: str, image_size: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    """A real model (built once per session) and an input batch."""
    torch.manual_seed(0)
    model = build_model(name, NUM_CLASSES, in_chans=3, img_size=image_size, drop_rate=DROP_RATE)
    return model, torch.randn(batch, 3, image_size, image_size)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def restore(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    model.load_state_dict(state)


def forward_and_grads(model: nn.Module, fn, x: torch.Tensor, seed: int) -> tuple[torch.Tensor, dict, dict]:
    """Output, parameter gradients and state after one train-mode forward/backward of ``fn``."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = fn(x)
    weights = torch.linspace(-1.0, 1.0, out.numel()).view_as(out)  # a loss that weighs every logit differently
    (out * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, snapshot(model)


# ----------------------------------------------------------------------------- structure (every registry name)

def test_every_registry_name_has_an_expected_block_count():
    assert set(EXPECTED_BLOCKS) == set(MODEL_REGISTRY)


@pytest.mark.parametrize("name", sorted(MODEL_REGISTRY))
def test_block_count_and_family(name):
    model = meta_model(name)
    assert isinstance(model, FAMILY_CLASS[model_spec(name).family])
    assert num_blocks(model) == len(model_blocks(model)) == EXPECTED_BLOCKS[name]


@pytest.mark.parametrize("name, profile", [("vit_large", "tnet_vit_large.csv"), ("resnet152", "snet_resnet152.csv")])
def test_block_count_matches_the_shared_gpu_profiles(name, profile):
    with open(PROFILES / profile) as f:
        rows = list(csv.DictReader(f))
    assert [r["layer"] for r in rows] == [f"layer{i}" for i in range(len(rows))]
    assert num_blocks(meta_model(name)) == len(rows)


@pytest.mark.parametrize("name", sorted(MODEL_REGISTRY))
def test_block_parameter_names_cover_the_state_dict_exactly_once(name):
    model = meta_model(name)
    blocks = model_blocks(model)
    mapping = block_parameter_names(model, blocks)
    assert len(mapping) == len(blocks)
    counts = collections.Counter(original for names in mapping for original in names.values())
    state = model.state_dict(keep_vars=True)
    assert set(counts) == set(state)
    assert max(counts.values()) == 1
    for block, names in zip(blocks, mapping):  # the block holds the model's own tensors, not copies
        local_state = block.state_dict(keep_vars=True)
        assert all(local_state[local] is state[original] for local, original in names.items())


def test_model_blocks_refuses_what_it_cannot_cut():
    with pytest.raises(ModelError, match="cannot cut Linear into blocks; supported"):
        model_blocks(nn.Linear(2, 2))
    vit = build_model("vit_micro", NUM_CLASSES, img_size=32)
    vit.set_grad_checkpointing(True)
    with pytest.raises(ModelError, match="gradient checkpointing"):
        model_blocks(vit)
    dynamic = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, embed_dim=24,
                                num_heads=2, num_classes=3, dynamic_img_size=True)
    with pytest.raises(ModelError, match="dynamic_img_size"):
        model_blocks(dynamic)


def test_block_parameter_names_refuses_a_foreign_block():
    model = build_model("resnet_micro", NUM_CLASSES)
    blocks = model_blocks(model) + [nn.Linear(2, 2)]
    with pytest.raises(ModelError, match="block 11 holds a tensor 'weight' that is not part of the model"):
        block_parameter_names(model, blocks)


# ----------------------------------------------------------------------------- the blocks are the model

@pytest.mark.parametrize("name, image_size, batch", RUN_CASES)
def test_blocks_equal_model_in_eval_mode(name, image_size, batch):
    model, x = run_case(name, image_size, batch)
    blocks = model_blocks(model)
    model.eval()  # after cutting: every block, the head dropout included, must follow the model's mode
    with torch.no_grad():
        assert torch.equal(run_blocks(blocks, x), model(x))
    model.train()


@pytest.mark.parametrize("name, image_size, batch", RUN_CASES)
def test_blocks_equal_model_in_train_mode_outputs_gradients_and_statistics(name, image_size, batch):
    model, x = run_case(name, image_size, batch)
    model.train()
    blocks = model_blocks(model)
    before = snapshot(model)
    out_model, grads_model, after_model = forward_and_grads(model, model, x, seed=7)
    restore(model, before)
    out_blocks, grads_blocks, after_blocks = forward_and_grads(model, lambda t: run_blocks(blocks, t), x, seed=7)
    restore(model, before)
    assert torch.equal(out_blocks, out_model)
    assert grads_blocks.keys() == grads_model.keys() == {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(torch.equal(grads_blocks[n], grads_model[n]) for n in grads_model)
    assert all(torch.equal(after_blocks[k], after_model[k]) for k in after_model)  # BatchNorm running stats


@pytest.mark.slow  # a real model run twice
def test_train_mode_dropout_really_draws_random_numbers():
    # Guards the test above: with dropout > 0 two different seeds must give different outputs.
    model, x = run_case("resnet_micro", 32, 4)
    model.train()
    blocks = model_blocks(model)
    outputs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        outputs.append(run_blocks(blocks, x).detach())
    assert not torch.equal(*outputs)


@pytest.mark.slow  # three real models, each run twice
@pytest.mark.parametrize("timm_name, kwargs", [
    ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, depth=2, embed_dim=48, num_heads=3, pos_drop_rate=0.2,
                                  proj_drop_rate=0.2, attn_drop_rate=0.2, drop_path_rate=0.2, drop_rate=0.2,
                                  global_pool="avg", class_token=False, reg_tokens=2)),
    ("resnet", dict(drop_rate=0.2, drop_path_rate=0.2)),
    ("tinynet_e", dict(drop_rate=0.2, drop_path_rate=0.2)),
], ids=["vit-all-dropouts-avgpool-registers", "resnet-drop-path", "tinynet-drop-path"])
def test_blocks_reproduce_models_with_every_stochastic_layer(timm_name, kwargs):
    torch.manual_seed(0)
    if timm_name == "resnet":  # two narrow BasicBlocks per stage: stochastic depth inside residual blocks
        model = ResNet(block=BasicBlock, layers=(2, 2, 2, 2), channels=(8, 16, 32, 64), stem_width=8,
                       num_classes=5, **kwargs).train()
    else:
        model = timm.create_model(timm_name, num_classes=5, **kwargs).train()
    size = kwargs.get("img_size", 64)
    x = torch.randn(2, 3, size, size)
    blocks = model_blocks(model)
    before = snapshot(model)
    out_model, grads_model, _ = forward_and_grads(model, model, x, seed=3)
    restore(model, before)
    out_blocks, grads_blocks, _ = forward_and_grads(model, lambda t: run_blocks(blocks, t), x, seed=3)
    assert torch.equal(out_blocks, out_model)
    assert all(torch.equal(grads_blocks[n], grads_model[n]) for n in grads_model)


# ----------------------------------------------------------------------------- factory

def test_build_model_refuses_unknown_names_and_class_counts():
    with pytest.raises(ModelError, match=r"unknown model 'resnet9000'; choose one of: .*resnet152"):
        build_model("resnet9000", 10)
    with pytest.raises(ModelError, match="num_classes must be >= 1, got 0"):
        build_model("resnet_micro", 0)


def test_build_model_fits_the_data():
    model = build_model("vit_micro", num_classes=7, in_chans=1, img_size=32)
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 7)


# ----------------------------------------------------------------------------- load_weights

def saved_state(tmp_path: Path, name: str, num_classes: int = NUM_CLASSES, wrap: str | None = None,
                seed: int = 1) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    state = build_model(name, num_classes, img_size=32).state_dict()
    path = tmp_path / f"{name}-{num_classes}-{wrap}.pt"
    torch.save({wrap: state} if wrap else state, path)
    return path, state


@pytest.mark.parametrize("wrap", [None, "model", "state_dict"])
def test_load_weights_round_trip(tmp_path, wrap):
    path, state = saved_state(tmp_path, "resnet_micro", wrap=wrap)
    torch.manual_seed(2)
    model = build_model("resnet_micro", NUM_CLASSES)
    assert not torch.equal(model.fc.weight, state["fc.weight"])
    load_weights(model, path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_load_weights_refuses_another_architecture(tmp_path):
    path, _ = saved_state(tmp_path, "vit_micro")
    with pytest.raises(ModelError, match=r"teacher\.checkpoint weights .* are for another architecture: "
                                         r"\d+ missing keys .* pick the model name the file was trained with"):
        load_weights(build_model("resnet_micro", NUM_CLASSES), path, what="teacher.checkpoint")


def test_load_weights_refuses_another_class_count(tmp_path):
    path, _ = saved_state(tmp_path, "resnet_micro", num_classes=100)
    with pytest.raises(ModelError, match=r"fc\.weight has shape \(100, 128\) in the file but \(10, 128\) in the "
                                         r"model; the class count differs"):
        load_weights(build_model("resnet_micro", NUM_CLASSES), path)


def test_load_weights_refuses_another_width(tmp_path):
    path, _ = saved_state(tmp_path, "resnet_mini")
    with pytest.raises(ModelError, match="conv1.weight has shape .* the architecture differs"):
        load_weights(build_model("resnet_micro", NUM_CLASSES), path)


class _RunsCodeWhenUnpickled:
    """A pickle payload that creates a directory when loaded: stands in for arbitrary code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))


def test_load_weights_never_executes_code_in_a_pickle(tmp_path):
    marker = tmp_path / "code-was-executed"
    path = tmp_path / "evil.pt"
    torch.save({"fc.weight": torch.zeros(1), "payload": _RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(ModelError, match=r"student\.init weights .*evil\.pt' cannot be read safely"):
        load_weights(build_model("resnet_micro", NUM_CLASSES), path, what="student.init")
    assert not marker.exists()
    torch.load(path, weights_only=False)  # proves the file really runs code when loaded unsafely
    assert marker.is_dir()


def test_load_weights_refuses_missing_and_non_weight_files(tmp_path):
    model = build_model("resnet_micro", NUM_CLASSES)
    with pytest.raises(ModelError, match="do not exist; give the path of a local checkpoint"):
        load_weights(model, tmp_path / "nope.pt")
    (tmp_path / "text.pt").write_text("not a torch file")
    with pytest.raises(ModelError, match="cannot be read safely"):
        load_weights(model, tmp_path / "text.pt")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(ModelError, match="holds no model state dict"):
        load_weights(model, tmp_path / "list.pt")


def test_fused_stage_hands_on_dense_tensors_when_a_block_ends_in_a_view():
    # timm's PatchEmbed ends in flatten().transpose(): a cut right after it hands on a strided view,
    # which gloo's and NCCL's sends refuse ("input tensor has to be contiguous").
    from synapse.pipeline import FusedStage
    vit = build_model("vit_micro", 10, 3, 32)
    first_vit_block = model_blocks(vit)[0]
    assert not first_vit_block(torch.randn(2, 3, 32, 32)).is_contiguous()
    stage = FusedStage([first_vit_block], [model_blocks(build_model("vit_micro", 10, 3, 32))[0]], is_first=True)
    teacher_out, student_out = stage(torch.randn(2, 3, 32, 32))
    assert teacher_out.is_contiguous() and student_out.is_contiguous()
    student_out.sum().backward()  # still differentiable through the copy
