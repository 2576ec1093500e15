"""Accuracy helpers shared by every training path (record files: ``synapse.records``)."""
from __future__ import annotations

import torch


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> dict[int, int]:
    """How many samples have their label among the top-k logits, for each k (k capped at the class count)."""
    maxk = min(max(ks), logits.shape[-1])
    top = logits.topk(maxk, dim=-1).indices
    hits = top.eq(labels.unsqueeze(-1))
    return {k: int(hits[:, : min(k, maxk)].any(dim=-1).sum()) for k in ks}
