"""Which ResNet student block fails graphed profiling on a GPU, and with which capture variant.

    python experiments/gpu/probe_graphed_profile.py resnet50 32

Per block of the student: the library's replay timing (synapse.profiling.graphed._time_replays),
then, on failure, two variants of the capture inputs, each printed with its error. A diagnosis
tool for one device call; the profiler's GPU test is the check.
"""
from __future__ import annotations

import copy
import gc
import sys
import traceback

import torch

from synapse.engine import TrainingReplay
from synapse.models import build_model, model_blocks
from synapse.profiling import MeasureContext, ProfileRequest, graphed, loss_gradient
from synapse.profiling.profiler import _compute_setup


def variant_separate_call_tensor(module, x, context):
    sample = x.detach().clone().requires_grad_(True)
    call = x.detach().clone().requires_grad_(True)
    with context.setup.autocast(cache=False):
        g = TrainingReplay(copy.deepcopy(module), (sample,))
        out = g(call)
        out.backward(loss_gradient(out).detach())
    torch.cuda.synchronize()


def variant_synchronized(module, x, context):
    torch.cuda.synchronize()
    gc.collect()
    variant_separate_call_tensor(module, x, context)


def main() -> None:
    name, micro = sys.argv[1], int(sys.argv[2])
    torch.backends.cudnn.benchmark = True
    request = ProfileRequest(name, "student", micro, "bf16", "cuda:0", 1000, 3, 224, 2, 3, "graphed")
    device = torch.device("cuda:0")
    context = MeasureContext(request, _compute_setup(request, device))
    model = build_model(name, 1000).to(device).to(memory_format=torch.channels_last)
    blocks = model_blocks(model)
    images = torch.randn(micro, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
    inputs = graphed._block_inputs(blocks, images, context)
    for index, (block, x) in enumerate(zip(blocks, inputs)):
        chain = graphed._Chain([block])
        try:
            fwd, bwd = graphed._time_replays(chain, x, context, input_grad=index > 0)
            print(f"block {index} {type(block).__name__}: ok fwd {fwd:.3f} bwd {bwd:.3f} ms", flush=True)
            continue
        except Exception as exc:  # noqa: BLE001 - a diagnosis: print and go on
            print(f"block {index} {type(block).__name__}: library FAILED {type(exc).__name__}: {str(exc)[:300]}")
            traceback.print_exc(limit=-4)
        for variant in (variant_separate_call_tensor, variant_synchronized):
            try:
                variant(chain, x, context)
                print(f"  {variant.__name__}: ok", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"  {variant.__name__}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        break
    try:
        times = graphed.graphed_times(blocks, images, context)
        print("graphed_times ok: sum fwd", round(sum(times.forward_ms), 3), "whole", round(times.whole_forward_ms, 3),
              "sum bwd", round(sum(times.backward_ms), 3), "whole", round(times.whole_backward_ms, 3))
    except Exception as exc:  # noqa: BLE001
        print(f"graphed_times FAILED {type(exc).__name__}: {str(exc)[:300]}")


if __name__ == "__main__":
    main()
