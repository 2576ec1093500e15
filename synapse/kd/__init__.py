"""Knowledge-distillation losses."""
from .losses import KD_MODES, KDLossParams, kd_loss, logits_kd, soft_target_kd

__all__ = ["KD_MODES", "KDLossParams", "kd_loss", "logits_kd", "soft_target_kd"]
