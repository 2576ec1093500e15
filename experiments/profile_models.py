# Run (repo root): PYTHONPATH=. python experiments/profile_models.py --teachers vit_base vit_large --students resnet50 resnet152 --micro-batches 16 32 --dtype bf16 --device cuda --image-size 224 --num-classes 100 --out experiments/results/profiles_h200  # noqa: E501 (a command to copy)
"""Profile teachers and students block by block at several micro-batch sizes.

Writes ``<out>/profiles/<key>.csv`` (+ ``.meta.json`` and ``.details.json``) for every
(model, role, micro-batch), the same layout as the profile cache (so ``--out`` can be a
``cache_dir``), and ``<out>/index.json`` listing them with their totals, the blocks/whole
sanity ratios and how long each took. Profiles already in ``--out`` are reused unless
``--refresh`` is given.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from synapse.profiling import DTYPES, ProfileRequest, ProfileResult, cached_profile_path, get_or_profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", nargs="*", default=[], help="models profiled forward-only (no_grad, eval)")
    parser.add_argument("--students", nargs="*", default=[], help="models profiled forward + backward")
    parser.add_argument("--micro-batches", nargs="+", type=int, required=True)
    parser.add_argument("--dtype", choices=DTYPES, default="fp32")
    parser.add_argument("--device", default="cpu", help="'cpu', 'cuda' or 'cuda:N'")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--in-chans", type=int, default=3)
    # At micro-batch 16-32 an H200 waits on the host (kernel launches), so times carry host noise:
    # a median of 20 after 5 warm-up calls keeps the whole 8-profile run under a minute there.
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before timing (cudnn autotuning)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls; the median is recorded")
    parser.add_argument("--out", type=Path, required=True, help="output directory (profiles/ and index.json)")
    parser.add_argument("--refresh", action="store_true", help="measure again even if a profile exists")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (CPU timings are only stable without oversubscription)")
    args = parser.parse_args(argv)
    if not args.teachers and not args.students:
        parser.error("nothing to profile: give --teachers and/or --students")
    return args


def build_requests(args: argparse.Namespace) -> list[ProfileRequest]:
    """All requests, checked before the first model is built (a typo fails at once, not after minutes)."""
    jobs = [("teacher", name) for name in args.teachers] + [("student", name) for name in args.students]
    return [ProfileRequest(name, role, micro_batch, args.dtype, args.device, args.num_classes, args.in_chans,
                           args.image_size, args.warmup, args.repeats)
            for role, name in jobs for micro_batch in args.micro_batches]


def index_entry(result: ProfileResult, csv_path: Path, out: Path, cached: bool, wall_s: float) -> dict:
    profile, details = result.profile, result.details
    entry = {
        "model": profile.model_name, "role": details.role if details else None, "micro_batch": profile.micro_batch,
        "dtype": profile.dtype, "device_name": profile.device, "csv": str(csv_path.relative_to(out)),
        "num_blocks": len(profile), "cached": cached, "wall_s": round(wall_s, 3),
        "forward_ms": float(profile.column("forward_time_ms").sum()),
        "backward_ms": float(profile.column("backward_time_ms").sum()),
        "parameter_mb": float(profile.column("parameter_size_kb").sum()) / 1024,
    }
    if details is not None:
        entry.update(whole_forward_ms=details.whole_forward_ms, whole_backward_ms=details.whole_backward_ms,
                     forward_ratio=details.forward_ratio, backward_ratio=details.backward_ratio,
                     torch_version=details.torch_version)
    return entry


def profile_one(request: ProfileRequest, label: str, args: argparse.Namespace) -> dict:
    print(f"{label}: profiling on {request.device} ...", flush=True)
    started = time.perf_counter()
    cached = cached_profile_path(request, args.out).exists() and not args.refresh
    result, csv_path = get_or_profile(request, args.out, refresh=args.refresh)
    entry = index_entry(result, csv_path, args.out, cached, time.perf_counter() - started)
    print(f"{label}: {entry['num_blocks']} blocks, forward {entry['forward_ms']:.2f} ms, backward "
          f"{entry['backward_ms']:.2f} ms, blocks/whole fwd {entry.get('forward_ratio', float('nan')):.3f}"
          f"{' (cached)' if cached else ''}, {entry['wall_s']:.1f} s -> {csv_path}", flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    requests = build_requests(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    started, entries = time.perf_counter(), []
    for number, request in enumerate(requests, start=1):
        label = f"[{number}/{len(requests)}] {request.model_name} {request.role} mb{request.micro_batch}"
        entries.append(profile_one(request, f"{label} {request.dtype}", args))
    total_s = time.perf_counter() - started
    index = {"command": " ".join(sys.argv), "total_s": round(total_s, 3), "profiles": entries}
    (args.out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    print(f"{len(entries)} profiles in {total_s:.1f} s; index written to {args.out / 'index.json'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
