"""Cut a model into an ordered list of blocks: the unit the planner assigns to pipeline stages.

Running the blocks one after the other gives exactly the model's output (tests check this
bit for bit for every family). Blocks hold the model's own submodules and parameters (no
copies), so a stage built from blocks trains the same tensors a checkpoint names by their
original parameter names (``block_parameter_names``).

The granularity matches the block-wise profiles that TSPipe-style planners use: a ViT-Large
is 30 blocks (patch embed, token embed, pre-norm, 24 transformer blocks, norm, pool, head)
and a ResNet-152 is 57 (conv, bn, act, maxpool, 50 bottlenecks, pool, dropout, fc).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from synapse.models.factory import ModelError


class TokenEmbed(nn.Module):
    """Prefix tokens (class, register) plus absolute position embedding, as timm's ViT does it."""

    def __init__(self, vit: nn.Module):
        super().__init__()
        if getattr(vit, "dynamic_img_size", False):
            raise ModelError("ViTs with dynamic_img_size=True cannot be cut into blocks; "
                             "build it with a fixed img_size")
        self.cls_token = vit.cls_token
        self.reg_token = vit.reg_token
        self.pos_embed = vit.pos_embed
        self.no_embed_class = vit.no_embed_class
        self.pos_drop = vit.pos_drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        x = x.view(x.shape[0], -1, x.shape[-1])
        if self.pos_embed is None:
            return self.pos_drop(torch.cat(prefix + [x], dim=1))
        if self.no_embed_class:  # position embedding covers the patches only: add, then prepend
            x = torch.cat(prefix + [x + self.pos_embed], dim=1)
        else:  # position embedding covers the prefix tokens too: prepend, then add
            x = torch.cat(prefix + [x], dim=1) + self.pos_embed
        return self.pos_drop(x)


class TokenPool(nn.Module):
    """Reduce the token sequence to one feature vector (class token or mean), then the head norm."""

    def __init__(self, vit: nn.Module):
        super().__init__()
        if vit.attn_pool is not None:
            raise ModelError("ViTs with attention pooling are not supported as blocks; "
                             "use global_pool='token' or 'avg'")
        from timm.layers import global_pool_nlc

        self._pool = global_pool_nlc
        self.pool_type = vit.global_pool
        self.num_prefix_tokens = vit.num_prefix_tokens
        self.include_prefix = vit.pool_include_prefix
        self.fc_norm = vit.fc_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._pool(x, pool_type=self.pool_type, num_prefix_tokens=self.num_prefix_tokens,
                       reduce_include_prefix=self.include_prefix)
        return self.fc_norm(x)


class FunctionalDropout(nn.Module):
    """Dropout with the same functional call and probability the timm head uses (keeps RNG use identical)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, p=self.p, training=self.training) if self.p else x


def _head_dropout(m: nn.Module) -> FunctionalDropout:
    # Registered on the model (no parameters, state_dict unchanged) so that model.train() and
    # model.eval() reach it like every other block; a free-standing module would stay in
    # training mode and keep dropping activations after model.eval().
    if not isinstance(getattr(m, "head_dropout_block", None), FunctionalDropout):
        m.add_module("head_dropout_block", FunctionalDropout(m.drop_rate).train(m.training))
    return m.head_dropout_block


def _vit_blocks(m: nn.Module) -> list[nn.Module]:
    return [m.patch_embed, TokenEmbed(m), nn.Sequential(m.patch_drop, m.norm_pre), *m.blocks,
            m.norm, TokenPool(m), nn.Sequential(m.head_drop, m.head)]


def _resnet_blocks(m: nn.Module) -> list[nn.Module]:
    stages = [m.layer1, m.layer2, m.layer3, m.layer4]
    return [m.conv1, m.bn1, m.act1, m.maxpool, *(blk for stage in stages for blk in stage),
            m.global_pool, _head_dropout(m), m.fc]


def _efficientnet_blocks(m: nn.Module) -> list[nn.Module]:
    return [m.conv_stem, m.bn1, *(blk for stage in m.blocks for blk in stage), m.conv_head, m.bn2,
            m.global_pool, _head_dropout(m), m.classifier]


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The model as an ordered list of blocks whose composition equals ``model(x)``."""
    from timm.models.efficientnet import EfficientNet
    from timm.models.resnet import ResNet
    from timm.models.vision_transformer import VisionTransformer

    if getattr(model, "grad_checkpointing", False):
        raise ModelError("gradient checkpointing changes the forward; disable it before cutting into blocks")
    if isinstance(model, VisionTransformer):
        return _vit_blocks(model)
    if isinstance(model, ResNet):
        return _resnet_blocks(model)
    if isinstance(model, EfficientNet):
        return _efficientnet_blocks(model)
    raise ModelError(f"cannot cut {type(model).__name__} into blocks; "
                     "supported: VisionTransformer, ResNet, EfficientNet")


def run_blocks(blocks: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def block_parameter_names(model: nn.Module, blocks: list[nn.Module]) -> list[dict[str, str]]:
    """For each block, its local parameter/buffer name -> the name in ``model.state_dict()``.

    Checkpoints are keyed by the model's names so that any partition can load them.
    """
    original = {id(t): name for name, t in model.state_dict(keep_vars=True).items()}
    result = []
    for i, block in enumerate(blocks):
        names = {}
        for local, tensor in block.state_dict(keep_vars=True).items():
            if id(tensor) not in original:
                raise ModelError(f"block {i} holds a tensor {local!r} that is not part of the model")
            names[local] = original[id(tensor)]
        result.append(names)
    return result


def num_blocks(model: nn.Module) -> int:
    return len(model_blocks(model))


def count_blocks(model_name: str, num_classes: int, in_chans: int, image_size: int) -> int:
    """Block count of a model, built on the meta device (no memory, no time even for ViT-L)."""
    from synapse.models.factory import build_model

    with torch.device("meta"):
        return num_blocks(build_model(model_name, num_classes, in_chans, image_size))
