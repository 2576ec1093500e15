"""Does per-block calibration predict a placement it has not seen? (issue 17, item 4)

    python experiments/bench_block_calibration.py --out experiments/results/block_calibration_cpu.json

Runs the demo's models (3 CPU ranks, no fault, no evaluation: a rank 0 slower after evaluations
was seen on CPU ranks once, see results/rank0_after_eval_cpu.md, and would not be the blocks') on fixed partitions, and
takes each rank's median compute over the steps after the warm-up. From one partition it learns
block factors (``BlockCalibration``, as the controller does) and predicts every other partition's
stages; against the profile alone and against the profile scaled by one global factor (measured /
predicted compute of the learning partition: what a single calibration scalar does for compute).
Error per stage: |predicted - measured| / measured. ``--runs DIR ...`` re-reads earlier runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

from benchlib import machine_load, markdown_table, read_jsonl, run_train_py, write_results
from omegaconf import OmegaConf

from synapse.calibration import BlockCalibration, measurements
from synapse.partitioning import Placement
from synapse.planning import planner_for_profiles

PARTITIONS = {"auto": None, "front": ([6, 3, 2], [6, 3, 2]), "back": ([2, 3, 6], [2, 3, 6]),
              "mixed": ([6, 4, 1], [2, 4, 5])}
WARMUP_STEPS = 10


def run(run_dir: Path, partition: tuple[list[int], list[int]] | None, epochs: int) -> None:
    """One run of the demo's models; ``partition=None``: the planner's (it writes plan.json with the profiles)."""
    cut = [] if partition is None else ["partition=manual", f"partition.teacher={partition[0]}",
                                        f"partition.student={partition[1]}"]
    overrides = ["injection=none", "policy=keep", *cut, f"trainer.epochs={epochs}", "trainer.eval_every_epochs=100"]
    run_train_py(run_dir, overrides, timeout_s=900)


def measured_stages(run_dir: Path) -> tuple[Placement, list[float]]:
    """The run's placement (it ran one) and each rank's median compute per step after the warm-up."""
    segment = json.loads((run_dir / "segments" / "0" / "segment.json").read_text())
    placement = Placement(segment["devices"], segment["teacher_counts"], segment["student_counts"])
    records = [r for r in read_jsonl(run_dir / "performance.jsonl") if r["step"] > WARMUP_STEPS]
    return placement, [statistics.median(r["compute_s"][rank] for r in records) for rank in range(placement.num_stages)]


def planner_of(run_dir: Path):
    cfg = OmegaConf.load(run_dir / "config.yaml")
    profiles = json.loads((run_dir / "plan.json").read_text())["profiles"] if (run_dir / "plan.json").is_file() \
        else None
    if profiles is None:
        raise SystemExit(f"{run_dir} has no plan.json naming its profiles; run the demo once with partition=auto")
    return planner_for_profiles(cfg, SimpleNamespace(**profiles))


def compare(runs: dict[str, Path], profiles_from: Path) -> list[dict]:
    planner = planner_of(profiles_from)
    data = {name: measured_stages(path) for name, path in runs.items()}
    rows = []
    for learn, (placement, measured) in data.items():
        predicted = planner.per_step_compute_s(placement.devices, placement.teacher_counts, placement.student_counts)
        factors = BlockCalibration.neutral(planner.teacher, planner.student).observe(
            measurements(placement, predicted, measured))
        calibrated, scale = factors.calibrated(planner), sum(measured) / sum(predicted)
        for target, (other, truth) in data.items():
            if target == learn:
                continue
            parts = (other.devices, other.teacher_counts, other.student_counts)
            profile = planner.per_step_compute_s(*parts)
            errors = {"profile": [abs(p - t) / t for p, t in zip(profile, truth)],
                      "global scalar": [abs(scale * p - t) / t for p, t in zip(profile, truth)],
                      "block factors": [abs(c - t) / t for c, t in zip(calibrated.per_step_compute_s(*parts), truth)]}
            rows.append({"learn": learn, "predict": target, "measured_ms": [1e3 * t for t in truth],
                         **{k: v for k, v in errors.items()}})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("experiments/results/block_calibration_cpu.json"))
    parser.add_argument("--workdir", type=Path, default=Path("outputs/bench_block_calibration"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runs", type=Path, nargs="*", help="earlier run dirs named like the partitions")
    parser.add_argument("--profiles-from", type=Path,
                        help="a partition=auto run dir (its plan.json names the profiles)")
    args = parser.parse_args(argv)
    load_before = machine_load()
    if args.runs:
        runs = {path.name: path for path in args.runs}
    else:
        runs = {name: args.workdir / name for name in PARTITIONS}
        for name, partition in PARTITIONS.items():
            run(runs[name], partition, args.epochs)
    profiles_from = args.profiles_from or next((p for p in runs.values() if (p / "plan.json").is_file()), None)
    if profiles_from is None:
        raise SystemExit("no run dir with a plan.json; pass --profiles-from a partition=auto run of the demo")
    rows = compare(runs, profiles_from)
    table = markdown_table(
        ["learnt on", "predicted", "measured ms per stage", "profile: median / max error",
         "global scalar", "block factors"],
        [[r["learn"], r["predict"], " / ".join(f"{m:.1f}" for m in r["measured_ms"]),
          *(f"{statistics.median(r[k]):.0%} / {max(r[k]):.0%}" for k in ("profile", "global scalar", "block factors"))]
         for r in rows])
    kinds = ("profile", "global scalar", "block factors")
    overall = {k: statistics.median(e for r in rows for e in r[k]) for k in kinds}
    errors = ", ".join(f"{k} {v:.0%}" for k, v in overall.items())
    table += f"\nMedian error over every predicted stage: {errors}\n"
    result = {"what": "Per-block calibration: predicting unseen partitions (CPU, 3 ranks)",
              "command": " ".join(["python", *sys.argv]), "rows": rows, "median_error": overall,
              "partitions": PARTITIONS, "load_before": load_before, "load_after": machine_load()}
    write_results(args.out, result, table, runs_note=f"{len(runs)} partitions, one run each; ")
    print(table)


if __name__ == "__main__":
    main()
