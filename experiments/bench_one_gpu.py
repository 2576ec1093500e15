# python experiments/bench_one_gpu.py --pair vitb --rounds 3 --out-dir OUT [--variant NAME='overrides' ...]
"""One GPU: the user's command against the honest baseline, in one call, rounds interleaved.

Baseline: a plain eager KD loop with the batch resident on the GPU: teacher forward under no_grad,
student forward and backward, AdamW (torch's default, unfused), bf16 autocast, channels_last,
cudnn.benchmark=True, the same KD loss. The user's command: ``python train.py trainer=gpu
injection=none teacher=T student=S data=synthetic data.batch_size=128`` plus each variant's overrides
(its default: none, i.e. what trainer=gpu does).

Throughput is images over wall-clock time across a window of steps: from the end of step ``--warm``
to the end of step ``--steps - 5`` (the loop synchronises at both ends; train.py's own step stamps in
metrics.jsonl, written when each step's records are read). Warm-up (compilation, cuDNN's search,
graph capture) and the end (the last checkpoint) are outside the window. Each round runs the loop,
then every variant; rounds alternate so that drift of the machine shows as spread, not as bias.

Writes ``one_gpu_<pair>.json`` and ``one_gpu_<pair>.md`` under ``--out-dir`` after every run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # runnable from a checkout without `pip install -e .`

from benchlib import EagerKDLoop  # noqa: E402

from synapse.models import build_model  # noqa: E402

PAIRS = {"vitb": ("vit_base", "resnet50"), "vitl": ("vit_large", "resnet152")}
BATCH = 128


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="vitb")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warm", type=int, default=20, help="steps left out at the start (compile, cuDNN search)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=overrides of train.py (space separated); default: user= (trainer=gpu as is)")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per train.py run")
    parser.add_argument("--jpeg-tree", type=Path, default=None,
                        help="train.py reads JPEGs from this ImageNet-layout tree (written there first by "
                             "bench_data_path.make_tree, --per-class files a class) with the data group's defaults; "
                             "default: synthetic data made on the GPU")
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--out-dir", type=Path, required=True)
    return parser.parse_args(argv)


def window_rate(stamps: dict[int, float], warm: int, last: int) -> float:
    return (last - warm) * BATCH / (stamps[last] - stamps[warm])


def eager_loop_rate(teacher_name: str, student_name: str, steps: int, warm: int) -> float:
    """The baseline, one run of ``steps`` steps; images/s over steps warm..steps-5."""
    torch.backends.cudnn.benchmark = True
    loop = EagerKDLoop(teacher_name, student_name, BATCH)
    stamps = {}
    for step in range(1, steps + 1):
        loop.step()
        if step in (warm, steps - 5):
            torch.cuda.synchronize()
            stamps[step] = time.perf_counter()
    del loop
    torch.cuda.empty_cache()
    return window_rate(stamps, warm, steps - 5)


def train_py_rate(args, teacher_name: str, student_name: str, teacher_file: Path, overrides: str,
                  run_dir: Path, log: Path) -> tuple[float | None, float]:
    command = [sys.executable, "train.py", "trainer=gpu", "injection=none", f"teacher={teacher_name}",
               f"student={student_name}", *data_overrides(args), f"data.batch_size={BATCH}", "data.image_size=224",
               f"teacher.checkpoint={teacher_file}", "trainer.progress=false", "checkpoint.at_epoch_end=false",
               "checkpoint.every=0", "trainer.eval_every_epochs=100", "report=false",
               f"trainer.max_steps={args.steps}", f"hydra.run.dir={run_dir}", *overrides.split()]
    started = time.perf_counter()
    with open(log, "w") as out:
        subprocess.run(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout,
                       check=False)
    wall = time.perf_counter() - started
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return None, wall
    stamps = {r["step"]: r["time"] for r in map(json.loads, metrics.open()) if r.get("kind") == "train"}
    last = args.steps - 5
    if args.warm not in stamps or last not in stamps:
        return None, wall
    return window_rate(stamps, args.warm, last), wall


def data_overrides(args) -> list[str]:
    if args.jpeg_tree is None:
        return ["data=synthetic"]
    return ["data=imagenet100", f"data.root={args.jpeg_tree}"]  # decode and workers: the defaults, from the host


def summarise(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def write(args, result: dict) -> None:
    out = args.out_dir
    stem = f"one_gpu_{args.pair}" + ("_jpeg" if args.jpeg_tree is not None else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    loop = summarise(result["eager_loop"])
    lines = [f"# One GPU, {result['teacher']} -> {result['student']} @{BATCH} (experiments/bench_one_gpu.py)", "",
             f"train.py's data: `{result['data']}`.", "",
             f"{result['device']}, torch {result['torch']}; images/s over steps {args.warm}..{args.steps - 5}, "
             f"{args.rounds} round(s) interleaved.", "",
             "| run | images/s median (min-max), n | ratio to the eager loop (min-max) |", "| --- | --- | --- |",
             f"| resident eager loop | {loop.get('median', 0):,.0f} ({loop.get('min', 0):,.0f}-"
             f"{loop.get('max', 0):,.0f}), n={loop['n']} | 1 |"]
    for name, runs in result["variants"].items():
        rates = [r["img_s"] for r in runs if r["img_s"] is not None]
        s = summarise(rates)
        if not s["n"] or not loop["n"]:
            lines.append(f"| train.py {name} | failed ({len(runs)} runs) | |")
            continue
        ratios = [r / q for r, q in zip(rates, result["eager_loop"])]
        lines.append(f"| train.py {name} | {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}), n={s['n']} | "
                     f"{s['median'] / loop['median']:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    lines += ["", "Overrides per variant (beside the command in the docstring):", ""]
    lines += [f"- {name}: `{result['overrides'][name] or '(none)'}`" for name in result["variants"]]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    teacher_name, student_name = PAIRS[args.pair]
    variants = dict(v.split("=", 1) for v in (args.variant or ["user="]))
    if args.jpeg_tree is not None:
        sys.path.insert(0, str(REPO_ROOT / "experiments"))
        from bench_data_path import make_tree

        print("JPEG tree:", make_tree(args.jpeg_tree, args.per_class), flush=True)
    teacher_file = Path(f"/tmp/teacher_{teacher_name}.pt")
    if not teacher_file.exists():
        torch.manual_seed(0)
        torch.save(build_model(teacher_name, 100, 3, 224).state_dict(), teacher_file)
    result = {"teacher": teacher_name, "student": student_name, "device": torch.cuda.get_device_name(0),
              "data": " ".join(data_overrides(args)),
              "torch": torch.__version__, "eager_loop": [], "overrides": variants,
              "variants": {name: [] for name in variants}}
    for round_index in range(1, args.rounds + 1):
        result["eager_loop"].append(eager_loop_rate(teacher_name, student_name, args.steps, args.warm))
        write(args, result)
        for name, overrides in variants.items():
            run_dir = Path(f"/tmp/one_gpu_{args.pair}_{name}_{round_index}_{time.time_ns()}")
            rate, wall = train_py_rate(args, teacher_name, student_name, teacher_file, overrides, run_dir,
                                       args.out_dir / f"{args.pair}_{name}_{round_index}.log")
            result["variants"][name].append({"img_s": rate, "wall_s": wall, "round": round_index})
            print(f"{args.pair} round {round_index} {name}: {rate} img/s, {wall:.0f} s wall", flush=True)
            write(args, result)


if __name__ == "__main__":
    main()
