# python experiments/gpu/profile_kd_step.py   (one GPU, repository root)
"""Where the eager KD step's GPU time goes: CUDA kernel time per step of the ViT-B/16 -> ResNet-50
@128 eager loop (bf16 autocast, channels_last, cudnn.benchmark, fused AdamW), the top 30 kernels,
averaged over 5 profiled steps after 15 warm-up steps."""
from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
sys.path.insert(0, "experiments")
from benchlib import EagerKDLoop  # noqa: E402

PROFILED_STEPS = 5

torch.backends.cudnn.benchmark = True
loop = EagerKDLoop("vit_base", "resnet50", 128, fused=True)
step = loop.step

for _ in range(15):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(PROFILED_STEPS):
        step()
    torch.cuda.synchronize()
rows = sorted(((e.device_time_total / PROFILED_STEPS / 1e3, e.count // PROFILED_STEPS, e.key[:110])
               for e in prof.key_averages() if e.device_time_total > 0), reverse=True)
print(f"GPU kernel time per step: {sum(r[0] for r in rows):.1f} ms")
for ms, count, name in rows[:30]:
    print(f"{ms:7.2f} ms {count:5d}x  {name}")
