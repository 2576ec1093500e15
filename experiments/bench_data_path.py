# python experiments/bench_data_path.py --out-dir experiments/results/h200   (one GPU; add --quick for a smoke run)
"""Does the data path keep one GPU busy? Loader alone, then the user's command against resident data.

1. Generates an ImageNet-layout JPEG tree itself (500x375 photo-like JPEGs, ~90 KB each,
   ``--per-class`` train images in each of the 100 synsets, 2 val images each), in parallel.
2. Loader alone: images/s delivered to the GPU (normalised float32, 224 px, training
   RandomResizedCrop + flip) by ``synapse.engine.batches.train_batches``, per decode placement
   (``cpu``: workers decode; ``gpu``: nvJPEG in the training process; ``gpu`` with a share: both
   at once, ``data.gpu_decode_share`` of the files on the GPU) and worker count; plus
   synthetic data generated on the device. The consumer does no compute; the clock stops after
   a device synchronisation.
3. End to end, in one run, for each case: the user's command
   ``python train.py trainer=gpu injection=none teacher=T student=S data=... pipeline.microbatches=1``
   (the JPEG runs with the decode setting that was fastest in step 2 at the same worker count, recorded)
   (single device, bf16, channels_last, cudnn.benchmark from conf/trainer/gpu.yaml; one micro-batch so
   that it computes what the plain loop computes) against the same models in a plain eager loop
   with the batch resident on the GPU (teacher forward under no_grad + student forward/backward +
   AdamW, bf16 autocast, channels_last, cudnn.benchmark=True, the same KD loss). Images/s per block
   of ``--block`` consecutive steps after ``--skip`` warm-up steps: the trainer's own
   ``metrics.jsonl`` step times summed over the block, and the loop's clock around the block (it
   synchronises at block ends only). Per-step rates no longer measure throughput: the trainer
   reads each loss a step late, so the host runs a step ahead and the wait moves between
   neighbouring steps. Medians of the block rates, with the quartiles, and the ratio of the medians.

Writes ``bench_data_path.json`` and ``bench_data_path.md`` under ``--out-dir``.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # runnable from a checkout without `pip install -e .`

from benchlib import EagerKDLoop  # noqa: E402

from synapse.data import ImageNet100, ResumableSampler, SyntheticImages, imagenet100_synsets  # noqa: E402
from synapse.engine import BadSampleLog, train_batches  # noqa: E402
from synapse.models import build_model  # noqa: E402

CASES = (  # (name, teacher, student, data)
    ("vitl_r152_synthetic", "vit_large", "resnet152", "synthetic"),
    ("vitl_r152_jpeg", "vit_large", "resnet152", "jpeg"),
    ("vitb_r50_jpeg", "vit_base", "resnet50", "jpeg"),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--tree", type=Path, default=Path("/tmp/bench_jpeg_tree"))
    parser.add_argument("--per-class", type=int, default=100, help="train JPEGs per synset (100 synsets)")
    parser.add_argument("--loader-batch", type=int, default=256)
    parser.add_argument("--loader-batches", type=int, default=40, help="timed batches per loader configuration")
    parser.add_argument("--cpu-workers", default="4,8,14", help="worker counts for decode=cpu")
    parser.add_argument("--gpu-workers", default="2,4,8", help="worker counts for decode=gpu, all JPEGs on the GPU")
    parser.add_argument("--split-workers", default="8", help="worker counts for decode=gpu with --split-share")
    parser.add_argument("--split-share", type=float, default=0.5, help="data.gpu_decode_share of the split runs")
    parser.add_argument("--e2e-workers", type=int, default=8)
    parser.add_argument("--e2e-decode", default="best",
                        help="data.decode[:gpu_decode_share] of the train.py JPEG runs, e.g. gpu:0.5; 'best': the "
                             "fastest loader setting measured above with --e2e-workers workers")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per end-to-end run")
    parser.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the medians")
    parser.add_argument("--block", type=int, default=5, help="consecutive steps per timed block")
    parser.add_argument("--cases", default=",".join(c[0] for c in CASES))
    parser.add_argument("--quick", action="store_true", help="small tree, few batches, one short case")
    args = parser.parse_args(argv)
    if args.quick:
        args.per_class, args.loader_batches, args.steps, args.skip = 20, 8, 20, 5
        args.cpu_workers, args.gpu_workers, args.split_workers, args.cases = "8", "4", "8", "vitb_r50_jpeg"
    return args


# ----------------------------------------------------------------------------- the JPEG tree

def photo_jpeg(seed: int, width: int = 500, height: int = 375) -> bytes:
    """Smooth colour fields plus texture noise: sizes and decode costs near real 500x375 photos."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    low = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    mid = Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).resize((width, height), Image.BILINEAR)
    pixels = (0.6 * np.asarray(low, np.float32) + 0.4 * np.asarray(mid, np.float32)
              + rng.normal(0, 16, (height, width, 3)))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _write_class(job: tuple[str, int, str, int, int]) -> int:
    root, class_index, synset, train, val = job
    total = 0
    for split, count in (("train", train), ("val", val)):
        folder = Path(root) / split / synset
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(count):
            data = photo_jpeg(class_index * 100_000 + k + (50_000 if split == "val" else 0))
            (folder / f"{synset}_{k}.JPEG").write_bytes(data)
            total += len(data)
    return total


def make_tree(root: Path, per_class: int) -> dict:
    marker = root / f".complete_{per_class}"
    if marker.exists():
        return json.loads(marker.read_text())
    started = time.perf_counter()
    jobs = [(str(root), n, s, per_class, 2) for n, s in enumerate(imagenet100_synsets())]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        total = sum(pool.map(_write_class, jobs))
    files = len(jobs) * (per_class + 2)
    info = {"root": str(root), "train_files": per_class * 100, "mean_kb": total / files / 1e3,
            "size": "500x375", "seconds": time.perf_counter() - started}
    marker.write_text(json.dumps(info))
    return info


# ----------------------------------------------------------------------------- loader alone

def loader_rate(dataset, workers: int, batch: int, batches: int, warmup: int | None = None,
                device: str = "cuda") -> dict:
    """Steady-state images/s. The warm-up drains what the DataLoader fetched ahead (2 batches per
    worker) plus a few: timed, those would count as free. Until 2026-12-01 the warm-up was 4
    batches, so with 14 workers up to 24 of the timed batches could already be waiting."""
    if warmup is None:
        warmup = 2 * workers + 4
    device = torch.device(device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sampler = ResumableSampler(len(dataset), seed=0, batch_size=batch, drop_last=True)
    log = BadSampleLog()
    stream = train_batches(dataset, sampler, 10**6, num_workers=workers, device=device, bad_samples=log)
    for _ in range(warmup):
        next(stream)
    synchronize()
    started = time.perf_counter()
    checksum = torch.zeros((), device=device)
    for _ in range(batches):
        b = next(stream)
        checksum += b.images[:, :, 0, 0].sum()  # the images are used, as a step would
    synchronize()
    seconds = time.perf_counter() - started
    stream.close()
    return {"workers": workers, "images": batches * batch, "seconds": seconds,
            "images_per_s": batches * batch / seconds, "bad_samples": log.count}


def bench_loader(args, tree: Path) -> list[dict]:
    rows = []
    counts = lambda text: [int(w) for w in text.split(",") if w]  # noqa: E731
    configs = [("cpu", w, 0.0) for w in counts(args.cpu_workers)] \
        + [("gpu", w, 1.0) for w in counts(args.gpu_workers)] \
        + [("gpu", w, args.split_share) for w in counts(args.split_workers)]
    for decode, workers, share in configs:
        dataset = ImageNet100(tree, "train", image_size=224, seed=0, decode=decode,
                              gpu_share=share if decode == "gpu" else 1.0)
        row = {"data": "jpeg", "decode": decode, "gpu_share": share,
               **loader_rate(dataset, workers, args.loader_batch, args.loader_batches)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    synthetic = SyntheticImages(num_samples=args.loader_batch * 64, image_size=224)
    row = {"data": "synthetic", "decode": "-", "gpu_share": 0.0,
           **loader_rate(synthetic, 4, args.loader_batch, args.loader_batches)}
    print(json.dumps(row), flush=True)
    rows.append(row)
    return rows


# ----------------------------------------------------------------------------- end to end

def summary(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"n": len(values), "median": statistics.median(values), "q25": q[0], "q75": q[2],
            "min": min(values), "max": max(values)}


def save_teacher(name: str) -> Path:
    path = Path(f"/tmp/bench_{name}_teacher.pt")
    if not path.exists():
        torch.manual_seed(0)
        torch.save(build_model(name, 100, 3, 224).state_dict(), path)
    return path


def user_command(args, teacher: str, student: str, data: str, tree: Path, run_dir: Path) -> list[str]:
    command = [sys.executable, "train.py", "trainer=gpu", "injection=none", f"teacher={teacher}",
               f"student={student}", f"teacher.checkpoint={save_teacher(teacher)}", f"data.batch_size={args.batch}",
               f"data.num_workers={args.e2e_workers}", "pipeline.microbatches=1", f"trainer.max_steps={args.steps}",
               "trainer.progress=false", "checkpoint.at_epoch_end=false", "report=false", f"run_dir={run_dir}"]
    if data == "synthetic":
        return command + ["data=synthetic", f"data.synthetic_train_size={args.batch * (args.steps + 5)}",
                          "data.synthetic_val_size=256"]
    decode, _, share = args.e2e_decode.partition(":")
    return command + ["data=imagenet100", f"data.root={tree}", f"data.decode={decode}",
                      f"data.gpu_decode_share={share or 1.0}"]


def best_loader_setting(rows: list[dict], workers: int) -> str:
    """The fastest JPEG loader setting measured with ``workers`` workers, as decode[:share]."""
    candidates = [r for r in rows if r["data"] == "jpeg" and r["workers"] == workers]
    if not candidates:
        return "auto"
    best = max(candidates, key=lambda r: r["images_per_s"])
    return "cpu" if best["decode"] == "cpu" else f"gpu:{best['gpu_share']}"


def trainer_rates(args, teacher, student, data, tree) -> tuple[list[float], str]:
    run_dir = Path(f"/tmp/bench_run_{teacher}_{student}_{data}_{time.time_ns()}")
    command = user_command(args, teacher, student, data, tree, run_dir)
    print(" ".join(command), flush=True)
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=420)
    if done.returncode != 0:
        raise RuntimeError(f"train.py failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in records if r.get("kind") == "train" and r["step"] > args.skip]
    blocks = [times[i:i + args.block] for i in range(0, len(times) - args.block + 1, args.block)]
    return [args.block * args.batch / sum(block) for block in blocks], " ".join(command[1:])


def resident_rates(args, teacher_name: str, student_name: str) -> list[float]:
    """The plain eager loop on one resident batch: what the GPU does when data costs nothing."""
    torch.backends.cudnn.benchmark = True
    loop = EagerKDLoop(teacher_name, student_name, args.batch)
    rates = []
    started = time.perf_counter()
    for step in range(args.steps):
        loop.step()
        done = step + 1
        if done == args.skip or (done > args.skip and (done - args.skip) % args.block == 0):
            torch.cuda.synchronize()  # a block's end: the only sync, as a loop that reads no loss
            now = time.perf_counter()
            if done > args.skip:
                rates.append(args.block * args.batch / (now - started))
            started = now
    del loop
    torch.cuda.empty_cache()
    return rates


def bench_end_to_end(args, tree: Path) -> list[dict]:
    rows = []
    resident_cache: dict[tuple[str, str], list[float]] = {}
    for name, teacher, student, data in CASES:
        if name not in args.cases.split(","):
            continue
        user, command = trainer_rates(args, teacher, student, data, tree)
        if (teacher, student) not in resident_cache:
            resident_cache[(teacher, student)] = resident_rates(args, teacher, student)
        resident = resident_cache[(teacher, student)]
        row = {"case": name, "command": command, "user": summary(user), "resident": summary(resident),
               "ratio": statistics.median(user) / statistics.median(resident)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def write_markdown(path: Path, result: dict) -> None:
    lines = ["# Data path on one GPU (experiments/bench_data_path.py)", "",
             f"{result['device']}, torch {result['torch']}, {result['cpus']} CPUs; JPEG tree: "
             f"{result['tree']['train_files']} train files, {result['tree']['size']}, "
             f"{result['tree']['mean_kb']:.0f} KB mean.", "",
             "## Loader alone (224 px, RandomResizedCrop + flip, normalised float32 on the GPU)", "",
             "| data | decode | share on GPU | workers | images/s |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['data']} | {r['decode']} | {r['gpu_share']} | {r['workers']} | {r['images_per_s']:,.0f} |"
              for r in result["loader"]]
    block = result["args"].get("block", "1")
    lines += ["", f"## End to end: the user's command vs resident data (images/s per {block}-step block: "
              "median [q25, q75], n blocks)", "",
              f"JPEG runs decode with: {result.get('e2e_decode', result['args'].get('e2e_decode'))}.", "",
              "| case | train.py | resident plain loop | ratio |", "| --- | --- | --- | --- |"]
    for r in result["end_to_end"]:
        u, p = r["user"], r["resident"]
        lines.append(f"| {r['case']} | {u['median']:,.0f} [{u['q25']:,.0f}, {u['q75']:,.0f}], n={u['n']} | "
                     f"{p['median']:,.0f} [{p['q25']:,.0f}, {p['q75']:,.0f}], n={p['n']} | {r['ratio']:.3f} |")
    lines += ["", "Commands:", ""] + [f"    python {r['command']}" for r in result["end_to_end"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        raise SystemExit("bench_data_path.py needs a CUDA device")
    tree = make_tree(args.tree, args.per_class)
    print(json.dumps({"tree": tree}), flush=True)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cpus": os.cpu_count(),
              "python": platform.python_version(), "args": {k: str(v) for k, v in vars(args).items()},
              "tree": tree, "loader": bench_loader(args, args.tree)}
    if args.e2e_decode == "best":
        args.e2e_decode = best_loader_setting(result["loader"], args.e2e_workers)
        result["e2e_decode"] = f"{args.e2e_decode} (the fastest loader setting with {args.e2e_workers} workers)"
    result["end_to_end"] = bench_end_to_end(args, args.tree)
    (args.out_dir / "bench_data_path.json").write_text(json.dumps(result, indent=1))
    write_markdown(args.out_dir / "bench_data_path.md", result)
    print((args.out_dir / "bench_data_path.md").read_text())


if __name__ == "__main__":
    main()
