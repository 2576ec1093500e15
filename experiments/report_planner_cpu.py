# python experiments/report_planner_cpu.py --out experiments/results/planner_cpu
"""Planner predictions against measured CPU pipeline steps, K = 1, 2, 3 (partition=auto).

Each K is a real run (K gloo ranks, one thread each). The planner's raw prediction is in
profile time; a calibration (scale, Calibration.fit) is fitted on the K = 1 run alone and
then applied to K = 2 and 3, so those errors are out of sample. Writes <out>.json and
<out>.md. The machine's core count is recorded: with more ranks than cores the ranks share
cores, which no per-device cost model predicts.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import synapse.config  # noqa: E402,F401
from synapse.launch.run import run  # noqa: E402
from synapse.models import build_model  # noqa: E402
from synapse.planner.cost_model import Calibration  # noqa: E402


def run_k(work: Path, k: int, teacher_file: Path, args) -> dict:
    run_dir = work / f"k{k}"
    overrides = [f"run_dir={run_dir}", f"cache_dir={work}/cache", f"teacher={args.teacher}", f"student={args.student}",
                 f"teacher.checkpoint={teacher_file}", "trainer.accelerator=cpu", "trainer.threads=1",
                 "trainer.progress=false", f"trainer.max_steps={args.steps}", f"trainer.devices={k}",
                 "trainer.strategy=pipeline", "partition=auto", f"pipeline.microbatches={args.microbatches}",
                 f"data.batch_size={args.batch}", "checkpoint.at_epoch_end=false", "trainer.eval_every_epochs=1000"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    run(cfg, log=lambda message: None)
    return json.loads((run_dir / "plan_vs_measured.json").read_text()) | {
        "partition": json.loads((run_dir / "partition.json").read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="resnet_mini")
    parser.add_argument("--student", default="resnet_micro")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=REPO / "experiments/results/planner_cpu")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="planner_report_"))
    teacher_file = work / "teacher.pt"
    torch.manual_seed(0)
    torch.save(build_model(args.teacher, 10, 1, 32).state_dict(), teacher_file)
    rows = {k: run_k(work, k, teacher_file, args) for k in (1, 2, 3)}
    calibration = Calibration(scale=rows[1]["measured_step_s"] / rows[1]["predicted_step_s"], overhead_s=0.0)
    table = []
    for k, row in rows.items():
        calibrated = float(calibration.apply(row["predicted_step_s"]))
        table.append({"K": k, "partition": row["partition"], "predicted_raw_s": row["predicted_step_s"],
                      "predicted_calibrated_s": calibrated, "measured_s": row["measured_step_s"],
                      "error_calibrated": calibrated / row["measured_step_s"] - 1,
                      "role": "calibration" if k == 1 else "out of sample",
                      "stage_compute_predicted_calibrated_s": [calibration.scale * t
                                                                for t in row["predicted_stage_compute_s"]],
                      "stage_compute_measured_s": row["measured_stage_compute_s"]})
    result = {"cores": os.cpu_count(), "torch": torch.__version__, "args": vars(args) | {"out": str(args.out)},
              "calibration_scale": calibration.scale, "rows": table}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"# Planner vs measured step time, CPU ({os.cpu_count()} cores, torch {torch.__version__})", "",
             f"`python experiments/report_planner_cpu.py` — {args.teacher} -> {args.student}, batch {args.batch}, "
             f"M={args.microbatches}, {args.steps} steps, calibration scale {calibration.scale:.2f} fitted on K=1.", "",
             "| K | partition (teacher / student) | predicted (calibrated) | measured | error | |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in table:
        lines.append(f"| {row['K']} | {row['partition']['teacher']} / {row['partition']['student']} | "
                     f"{row['predicted_calibrated_s'] * 1e3:.1f} ms | {row['measured_s'] * 1e3:.1f} ms | "
                     f"{row['error_calibrated']:+.1%} | {row['role']} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
