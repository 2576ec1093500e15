"""Knowledge-distillation losses.
"""
from synapse.kd.losses import KD_MODES, KDLossParams, kd_loss, logits_kd, soft_target_kd

__all__ = ["KDLossParams", "KD_MODES", "kd_loss", "logits_kd", "soft_target_kd"]
