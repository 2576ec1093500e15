# python experiments/bench_checkpoint_stall.py --device cuda --teacher vit_large_patch16_224 --student resnet152 --out experiments/results/h200/checkpoint_stall  # noqa: E501 (a command to copy)
"""How long each periodic checkpoint holds the training loop: synchronous vs asynchronous save.

Runs the user's command (``python train.py``) twice with the same settings, once with
``checkpoint.async_save=false`` and once with ``true``, saving every ``--every`` steps (at least
``--saves`` saves), and reads per save from the run's ``checkpoint_saved`` events:

* **stall**: seconds from the loop calling ``save`` until it may train again (synchronous: the
  checkpoint written, checksummed and committed; asynchronous: the previous save finished and
  the state copied to host memory: pinned on a GPU);
* **committed after**: seconds until the checkpoint was committed (async: in the background);
* **after-save step excess**: what the background write costs the steps that follow a save:
  the step times (metrics.jsonl) of the ``(every - 1) // 2`` steps right after each save, minus
  the median step time of the later steps of the intervals (after the first save), summed per save.

Medians with min-max over the saves; the first save is listed apart too (it allocates the staging
buffers). CPU (default): one CPU process, resnet_mini teacher -> resnet18 student on the embedded
digits (``--devices 3``: the 3-rank CPU pipeline). GPU: one GPU, bf16, synthetic ImageNet-shaped data.
Writes ``<out>/checkpoint_stall.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import REPO, machine_load, markdown_table, read_events, read_jsonl, run_train_py, write_results

from synapse.models import MODEL_REGISTRY

RUN_TIMEOUT_S = 3000.0


def config_name(name: str) -> str:
    """A model's config-group name, given that name or its timm architecture (vit_large_patch16_224)."""
    if name in MODEL_REGISTRY:
        return name
    by_timm = [short for short, spec in MODEL_REGISTRY.items() if spec.timm_name == name]
    if not by_timm:
        sys.exit(f"--teacher/--student {name!r}: not a model of synapse.models (one of {sorted(MODEL_REGISTRY)} or "
                 f"their timm names)")
    return by_timm[0]


def base_overrides(args: argparse.Namespace) -> list[str]:
    common = [f"teacher={config_name(args.teacher)}", f"student={config_name(args.student)}", "injection=none",
              "teacher.auto_train_epochs=0", "trainer.progress=false", "report=false", "checkpoint.at_epoch_end=false",
              "trainer.eval_every_epochs=1000", f"checkpoint.every={args.every}", "checkpoint.keep=2",
              f"trainer.max_steps={args.every * args.saves}", f"data.batch_size={args.batch}"]
    if args.device == "cuda":
        return ["trainer=gpu", "trainer.devices=[0]", "data=synthetic", *common, *args.overrides]
    devices = ["trainer=demo", "partition=even"] if args.devices > 1 else ["trainer=cpu"]
    return [*devices, *common, *args.overrides]


def after_save_excess(steps: list[dict[str, Any]], saved_at: Sequence[int], window: int) -> list[float]:
    """Per save: extra seconds of the ``window`` steps right after it over the median of the steps
    later in the same intervals (farther from any save), after the first save (warm-up is over)."""
    first = min(saved_at, default=0)
    near = {s + k for s in saved_at for k in range(1, window + 1)}
    far = [r["step_time_s"] for r in steps if r["step"] > first and r["step"] not in near and r["step"] not in saved_at]
    if not far or window == 0:
        return []
    median = statistics.median(far)
    times = {r["step"]: r["step_time_s"] for r in steps}
    return [sum(times[s + k] - median for k in range(1, window + 1)) for s in saved_at
            if all(s + k in times for k in range(1, window + 1))]


def spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "values": [round(v, 4) for v in values]}


def measure(args: argparse.Namespace, asynchronous: bool, work: Path) -> dict[str, Any]:
    run_dir = work / ("async" if asynchronous else "sync")
    overrides = [*base_overrides(args), f"checkpoint.async_save={str(asynchronous).lower()}"]
    wall_s = run_train_py(run_dir, overrides, RUN_TIMEOUT_S)
    saves = sorted(read_events(run_dir, "checkpoint_saved"), key=lambda e: e["step"])
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
    periodic = [e for e in saves if e["step"] % args.every == 0 and e["step"] < args.every * args.saves]
    stalls = [e["stall_s"] for e in saves]
    return {"async_save": asynchronous, "overrides": overrides, "wall_s": wall_s, "saves": len(saves),
            "stall_s": spread(stalls), "stall_s_after_first": spread(stalls[1:]),
            "committed_after_s": spread([e["seconds"] for e in saves]),
            "after_save_step_excess_s": spread(after_save_excess(steps, [e["step"] for e in periodic],
                                                                 max(1, (args.every - 1) // 2))),
            "median_step_s": statistics.median(r["step_time_s"] for r in steps[2:]) if len(steps) > 2 else None}


def table(rows: Sequence[dict[str, Any]]) -> str:
    def cell(stats: dict[str, Any]) -> str:
        return f"{stats['median']:.3f} ({stats['min']:.3f}-{stats['max']:.3f})" if stats.get("n") else "-"

    return markdown_table(
        ["save", "saves", "stall s, median (min-max)", "stall s after the first", "committed after s",
         "after-save step excess s", "median step s", "run wall s"],
        [["async" if r["async_save"] else "sync", r["saves"], cell(r["stall_s"]), cell(r["stall_s_after_first"]),
          cell(r["committed_after_s"]), cell(r["after_save_step_excess_s"]),
          f"{r['median_step_s']:.3f}" if r["median_step_s"] else "-", f"{r['wall_s']:.1f}"] for r in rows])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--teacher", default=None, help="config or timm name (cpu: resnet_mini, cuda: vit_large)")
    parser.add_argument("--student", default=None, help="config or timm name (cpu: resnet18, cuda: resnet152)")
    parser.add_argument("--devices", type=int, default=1, help="cpu only: 1 process, or 3 pipelined ranks")
    parser.add_argument("--every", type=int, default=None, help="save every N steps (cpu 5, cuda 10)")
    parser.add_argument("--saves", type=int, default=6, help="periodic saves per run (>= 5)")
    parser.add_argument("--batch", type=int, default=None, help="data.batch_size (cpu 16, cuda 128)")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "checkpoint_stall_cpu")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for both runs")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    args.teacher = args.teacher or ("vit_large" if gpu else "resnet_mini")
    args.student = args.student or ("resnet152" if gpu else "resnet18")
    args.every = args.every or (10 if gpu else 5)
    args.batch = args.batch or (128 if gpu else 16)
    if args.saves < 5:
        parser.error("--saves: at least 5 saves, for a median and a spread")
    load_before = machine_load()
    with tempfile.TemporaryDirectory(prefix="checkpoint_stall_") as work:
        rows = [measure(args, asynchronous, Path(work)) for asynchronous in (False, True)]
    command = "python experiments/bench_checkpoint_stall.py " + " ".join(argv if argv is not None else sys.argv[1:])
    what = (f"Training-loop stall per checkpoint, sync vs async: {args.teacher} -> {args.student} on "
            f"{'one GPU' if gpu else f'{args.devices} CPU process(es)'}, every {args.every} steps, batch {args.batch}")
    result = {"what": what, "command": command, "rows": rows, "load_before": load_before,
              "load_after": machine_load()}
    write_results(args.out / "checkpoint_stall.json", result, table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
