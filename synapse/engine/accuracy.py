"""Accuracy: top-1 / top-5 of a model over the whole validation split, and the top-k count
every training path shares.
"""
from __future__ import annotations

import torch
from torch import nn

from synapse.engine.batches import eval_batches
from synapse.engine.device import ComputeSetup


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[int, int]:
    """How many samples have their label among the top-k logits, for each k (k capped at the class count)."""
    maxk = min(max(ks), logits.shape[-1])
    top = logits.topk(maxk, dim=-1).indices
    hits = top.eq(labels.unsqueeze(-1))
    return {k: int(hits[:, : min(k, maxk)].any(dim=-1).sum()) for k in ks}


@torch.no_grad()
def evaluate(model: nn.Module, val_ds, setup: ComputeSetup, batch_size: int, num_workers: int = 0) -> dict[str, float]:
    was_training = model.training
    model.eval()
    hits = {1: 0, 5: 0}
    seen = 0
    for images, labels in eval_batches(val_ds, batch_size, num_workers, device=setup.device):
        with setup.autocast():
            logits = model(setup.prepare_input(images))
        for k, n in topk_correct(logits.float(), labels.to(logits.device)).items():
            hits[k] += n
        seen += labels.numel()
    model.train(was_training)
    return {"top1": 100.0 * hits[1] / seen, "top5": 100.0 * hits[5] / seen, "samples": seen}
