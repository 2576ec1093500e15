# python experiments/gpu/profile_kd_step.py   (one GPU, repository root)
"""Where the eager KD step's GPU time goes: CUDA kernel time per step of the ViT-B/16 -> ResNet-50
@128 eager loop (bf16 autocast, channels_last, cudnn.benchmark, fused AdamW), the top 30 kernels,
averaged over 5 profiled steps after 15 warm-up steps."""
from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from synapse.kd import KDLossParams, kd_loss  # noqa: E402
from synapse.models import build_model  # noqa: E402

PROFILED_STEPS = 5

torch.backends.cudnn.benchmark = True
device = torch.device("cuda")
torch.manual_seed(0)
teacher = build_model("vit_base", 100, 3, 224).to(device).to(memory_format=torch.channels_last).eval()
for p in teacher.parameters():
    p.requires_grad_(False)
student = build_model("resnet50", 100, 3, 224).to(device).to(memory_format=torch.channels_last)
optimizer = torch.optim.AdamW(student.parameters(), lr=0.002, weight_decay=5e-4, fused=True)
images = torch.randn(128, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
labels = torch.randint(0, 100, (128,), device=device)
params = KDLossParams("st", 4.0, 0.9)


def step() -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with torch.no_grad():
            teacher_logits = teacher(images)
        loss = kd_loss(student(images), teacher_logits, labels, params)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


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
