"""Where a mid-network ResNet stage spends GPU time its blocks do not spend inside the whole model.

    python experiments/gpu/probe_stage_kernels.py vit_base resnet50 128 12:13 6:11

The stage replay (experiments/bench_stage_replay.py) found ViT-B/16 -> ResNet-50 stages that
start inside layer1/layer2 running 20-25% over their blocks' in-graph profile, in eager and
graphed runs alike (so in the kernels, not the launches). This probe times the stage's eager
iteration with its student input and output gradient in NCHW (what the replay and a pipeline's
receive buffers hand it) and in channels_last, and prints each variant's top kernels
(torch.profiler, summed over 3 iterations), beside the same student blocks run with no teacher.
A diagnosis tool for one device call.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_stage_replay import KERNEL_ITERATIONS, kernel_events, pair_blocks, time_iterations  # noqa: E402

from synapse.pipeline import FusedStage  # noqa: E402


def iteration(stage: FusedStage, teacher_in, student_in, grad_format):
    grad = None

    def step():
        nonlocal grad
        with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
            _, out = stage(teacher_in, student_in.requires_grad_(True))
        if grad is None:
            grad = torch.ones_like(out).contiguous(memory_format=grad_format)
        out.backward(grad)
    return step


def kernels(step, label: str) -> None:
    events = kernel_events(step)
    total = sum(e.self_device_time_total for e in events) / KERNEL_ITERATIONS / 1e3
    print(f"--- {label}: {total:.2f} ms of kernels per iteration; top kernels (ms per iteration, calls)")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:12]:
        print(f"  {e.self_device_time_total / KERNEL_ITERATIONS / 1e3:7.3f}  {e.count // KERNEL_ITERATIONS:4d}  "
              f"{e.key[:110]}")


def main() -> None:
    teacher_name, student_name, micro = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t_lo, t_hi = (int(v) for v in sys.argv[4].split(":"))
    s_lo, s_hi = (int(v) for v in sys.argv[5].split(":"))
    torch.backends.cudnn.benchmark = True
    t_blocks, s_blocks, t_acts, s_acts = pair_blocks(teacher_name, student_name, micro)
    variants = {
        "NCHW input, NCHW grad (the replay's)": (torch.contiguous_format, torch.contiguous_format),
        "channels_last input, NCHW grad": (torch.channels_last, torch.contiguous_format),
        "channels_last input, channels_last grad": (torch.channels_last, torch.channels_last),
    }
    for teacher_part in ((t_lo, t_hi), (t_lo, t_lo)):
        stage = FusedStage(t_blocks[teacher_part[0]:teacher_part[1]], s_blocks[s_lo:s_hi], is_first=False)
        for label, (in_format, grad_format) in variants.items():
            s_in = s_acts[s_lo].detach().clone().contiguous(memory_format=in_format)
            if s_in.dim() != 4:
                s_in = s_acts[s_lo].detach().clone()
            step = iteration(stage, t_acts[teacher_part[0]], s_in, grad_format)
            timed = time_iterations(step, 5, 4)
            name = f"teacher {teacher_part}, student {s_lo}:{s_hi}, {label}"
            print(f"{name}: {timed['median']:.2f} ms per iteration (q1 {timed['q1']:.2f}, q3 {timed['q3']:.2f})",
                  flush=True)
            kernels(step, name)
            stage.student.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
