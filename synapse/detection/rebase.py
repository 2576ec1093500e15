"""How the slowdown detector's baselines follow the devices over a re-partition (pure).

A device found slow keeps its compute baseline, scaled by the cost model's predicted new / old
compute of its stage: learning it again would make its slowdown its new normal. Every other
device learns its baseline again from the new segment's first steps, as at the start of a run
(with the same check against its peers and the plan). A scaled baseline is only as good as the
cost model's ratio between two stages, and that ratio misses what the block profiles do not
hold (dispatching each part, the loss): on CPU ranks a healthy device that a re-plan gave a
smaller stage read 1.5-2.2x slow from the first step of it (the slow_comm member). A spare that
replaces a dropped device takes over the dropped device's place.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CarryOver:
    """Arguments of `SlowdownDetector.rebase` for one re-partition."""

    previous_rank: list[int]  # new rank -> the old rank whose baseline it takes
    compute_scale: list[float]  # new / old predicted compute of that baseline's device
    relearn: list[int]  # new ranks that learn their compute baseline again
    fresh: list[int]  # new ranks on a device the old stage did not have (a spare): no slowdown follows


def carry_over(old_devices: Sequence[int], old_compute_s: Sequence[float], new_devices: Sequence[int],
               new_compute_s: Sequence[float], slow_old_ranks: Collection[int] = ()) -> CarryOver:
    """``*_compute_s``: each rank's predicted compute per step at nominal speed;
    ``slow_old_ranks``: old ranks with an active compute slowdown (they keep their baselines)."""
    old_by_device: Mapping[int, float] = dict(zip(old_devices, old_compute_s))
    replaced = [d for d in old_devices if d not in new_devices]
    mapping, scale = [], []
    for device, compute in zip(new_devices, new_compute_s):
        old_device = device if device in old_by_device else replaced.pop(0)
        mapping.append(list(old_devices).index(old_device))
        scale.append(compute / max(old_by_device[old_device], 1e-12))
    fresh = [rank for rank, device in enumerate(new_devices) if device not in old_by_device]
    relearn = [rank for rank, old_rank in enumerate(mapping) if old_rank not in slow_old_ranks or rank in fresh]
    return CarryOver(mapping, scale, relearn, fresh)
