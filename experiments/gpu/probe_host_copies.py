# python experiments/gpu/probe_host_copies.py OUT_DIR
"""What a boundary of ranks sharing one GPU pays to leave the GPU: a stage's activation copied to pageable
host memory (``tensor.to("cpu")``, the exchange before) against pinned host memory from torch's caching
host allocator (``synapse.pipeline.wire``, now), and back. Sizes: ResNet-50's widest boundary activations at
micro-batch 16 (fp32, 224 px: 256 x 56 x 56) and a ViT-B/16 token tensor (16 x 197 x 768). Each copy is
timed synchronously (as the wire does it), 30 times after 5 untimed; median and min-max, n = 30.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

SHAPES = {"resnet50_layer1_mb16": (16, 256, 56, 56), "vit_b16_tokens_mb16": (16, 197, 768)}
REPEATS, WARMUP = 30, 5


def timed(copy) -> list[float]:
    for _ in range(WARMUP):
        copy()
    seconds = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        started = time.perf_counter()
        copy()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds


def pinned_to_host(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty_like(t, device="cpu", pin_memory=True)
    host.copy_(t)
    return host


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, shape in SHAPES.items():
        on_gpu = torch.randn(shape, device="cuda")
        on_host = on_gpu.cpu()
        nbytes = on_gpu.numel() * on_gpu.element_size()
        copies = (("to host, pageable", lambda g=on_gpu: g.to("cpu")),
                  ("to host, pinned", lambda g=on_gpu: pinned_to_host(g)),
                  ("to GPU from pageable", lambda h=on_host: h.to("cuda")))
        for how, copy in copies:
            s = timed(copy)
            rows.append({"tensor": name, "MB": round(nbytes / 1e6, 1), "copy": how, "n": len(s),
                         "median_ms": round(1e3 * statistics.median(s), 3), "min_ms": round(1e3 * min(s), 3),
                         "max_ms": round(1e3 * max(s), 3), "GB_per_s": round(nbytes / statistics.median(s) / 1e9, 2)})
            print(rows[-1], flush=True)
        assert torch.equal(pinned_to_host(on_gpu), on_gpu.cpu())  # the same bytes either way
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": rows}
    (out / "host_copies.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/out"))
