# python experiments/report_planner_cpu.py --out experiments/results/planner_cpu
"""Planner predictions against measured CPU pipeline steps, K = 1, 2, 3.

What is calibrated from what (nothing from the K = 2 or K = 3 runs):

* the K = 1 run (one rank; medians over its steps after warm-up) gives ``TermCalibration``:
  compute_scale (measured block compute / profiled), the per-micro-batch overhead (wall
  time that is neither blocks, loss nor optimizer), the KD loss and the optimizer step;
* a gloo ping-pong between two processes (experiments/bench_gloo_p2p.py) gives the link's
  latency and bandwidth;
* the core count (os.sched_getaffinity) and trainer.threads give each rank's contention,
  max(1, K * threads / cores) (synapse.planning.device_specs).

With these terms the exact partitioner plans K = 2 and 3 and predicts the step; the plan
is run (partition=manual) and measured. On the same partition the table also gives the
old prediction (profile times scaled to the K = 1 run, nothing else) and the prediction
with each term added in turn.

The profiles are measured in this process with the workers' thread count, so that profile
and run agree (the product's profiler runs with torch's default thread count). Each run
waits for an idle machine and counts the CPU time other processes used while it ran; a
run disturbed by more than --max-foreign cores is repeated (--attempts), the quietest kept.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "experiments"))

from bench_gloo_p2p import measure_link

import synapse.config  # noqa: F401
from synapse.app import run
from synapse.calibration import TermCalibration
from synapse.conf import CONF_DIR
from synapse.models import build_model
from synapse.partitioning import CostModel, ModelProfile, StepSpec, load_profile_csv, plan_with_cost_model
from synapse.planning import device_specs, measured_step_summary

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
PLANNER = "+ link (planner)"  # the model with every term: what the planner plans and predicts with


# ---------------------------------------------------------------- how quiet the machine is


def _busy_cpu_s() -> float:
    """CPU seconds all processes spent busy since boot (/proc/stat, all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) * TICK_S  # minus idle and iowait


def idle_fraction(seconds: float = 2.0) -> float:
    start, t0 = _busy_cpu_s(), time.perf_counter()
    time.sleep(seconds)
    return 1.0 - (_busy_cpu_s() - start) / ((time.perf_counter() - t0) * os.cpu_count())


def wait_until_quiet(min_idle: float, max_wait_s: float) -> float:
    """Wait (up to max_wait_s) for a 2-second window with at least min_idle of the CPU idle; returns it."""
    deadline = time.monotonic() + max_wait_s
    idle = idle_fraction()
    while idle < min_idle and time.monotonic() < deadline:
        time.sleep(3.0)
        idle = idle_fraction()
    return idle


def _process_cpu_s() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far) of every process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S)
    return table


class ForeignCpu:
    """CPU seconds that processes outside this process's tree used during the `with` block.

    Busy time of the whole machine minus this process and its descendants (the workers
    come from a fork server, so they are sampled from /proc every `interval` seconds).
    """

    def __init__(self, interval: float = 0.1):
        self.interval, self.first, self.last = interval, {}, {}
        self.foreign_s = self.wall_s = 0.0

    def _sample(self, baseline: bool = False) -> None:
        table, tree, grew = _process_cpu_s(), {os.getpid()}, True
        while grew:
            children = {pid for pid, (parent, _) in table.items() if parent in tree} - tree
            tree, grew = tree | children, bool(children)
        for pid in tree:
            self.first.setdefault(pid, table[pid][1] if baseline else 0.0)
            self.last[pid] = table[pid][1]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ForeignCpu:
        self._sample(baseline=True)
        self._busy0, self._t0 = _busy_cpu_s(), time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall_s = time.perf_counter() - self._t0
        own = sum(self.last[pid] - self.first[pid] for pid in self.last)
        self.foreign_s = max(0.0, _busy_cpu_s() - self._busy0 - own)

    @property
    def foreign_cores(self) -> float:
        return self.foreign_s / self.wall_s if self.wall_s else 0.0


# ---------------------------------------------------------------- runs


def compose_run(run_dir: Path, work: Path, k: int, args, partition: tuple | None):
    overrides = [f"run_dir={run_dir}", f"cache_dir={work}/cache", f"teacher={args.teacher}", f"student={args.student}",
                 f"teacher.checkpoint={work}/teacher.pt", "trainer=cpu", f"trainer.threads={args.threads}",
                 "trainer.progress=false", f"trainer.max_steps={args.steps}", f"trainer.devices={k}",
                 f"pipeline.microbatches={args.microbatches}", "pipeline=1f1b",
                 f"data.batch_size={args.batch}", "checkpoint.at_epoch_end=false", "trainer.eval_every_epochs=1000",
                 "injection=none", "policy=keep"]
    if partition is None:
        overrides.append("partition=auto")
    else:
        overrides += ["partition=manual", f"partition.teacher={list(partition[0])}",
                      f"partition.student={list(partition[1])}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    if "failover" in cfg:  # a plain run: no slowdown detection, no restarts
        cfg.failover.enabled = False
    if "report" in cfg:  # no figures at the end
        cfg.report = False
    return cfg


def measured_runs(work: Path, k: int, args, partition: tuple | None = None) -> dict[str, Any]:
    """--repeats quiet runs of K ranks, and the median over them of every measured number."""
    runs = [quiet_run(work, k, args, partition, repeat) for repeat in range(args.repeats)]
    return {"runs": runs, "partition": runs[0]["partition"], "measured": median_summary([r["measured"] for r in runs])}


def median_summary(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians across runs of `measured_step_summary` results (each already a median over steps)."""
    ranks = range(len(summaries[0]["stage_compute_s"]))
    parts = summaries[0]["stage_parts_s"][0]
    return {"steps": sum(s["steps"] for s in summaries), "step_s": statistics.median(s["step_s"] for s in summaries),
            **{key: [statistics.median(s[key][r] for s in summaries) for r in ranks]
               for key in ("stage_compute_s", "stage_comm_s")},
            "stage_parts_s": [{p: statistics.median(s["stage_parts_s"][r][p] for s in summaries) for p in parts}
                              for r in ranks]}


def quiet_run(work: Path, k: int, args, partition: tuple | None, repeat: int) -> dict[str, Any]:
    """Run K ranks when the machine is idle; repeat if others used the CPU meanwhile; keep the quietest."""
    best = None
    for attempt in range(args.attempts):
        idle = wait_until_quiet(args.min_idle, args.max_wait)
        load = os.getloadavg()[0]
        run_dir = work / f"k{k}_run{repeat}_attempt{attempt}"
        cfg = compose_run(run_dir, work, k, args, partition)
        with ForeignCpu() as foreign:
            run(cfg, log=lambda message: None)
        record = {"run_dir": run_dir, "attempt": attempt, "idle_before": idle, "load1_before": load,
                  "load1_after": os.getloadavg()[0], "foreign_cores": foreign.foreign_cores,
                  "partition": json.loads((run_dir / "partition.json").read_text()),
                  "measured": measured_step_summary(run_dir / "performance.jsonl", args.warmup_steps)}
        if best is None or record["foreign_cores"] < best["foreign_cores"]:
            best = record
        if record["foreign_cores"] <= args.max_foreign:
            break
    return best


def quiet_link(args) -> dict[str, Any]:
    idle = wait_until_quiet(args.min_idle, args.max_wait)
    with ForeignCpu() as foreign:
        link = measure_link(repeats=args.link_repeats)
    return link | {"idle_before": idle, "foreign_cores": foreign.foreign_cores}


# ---------------------------------------------------------------- models


def calibrate(k1: dict[str, Any], teacher: ModelProfile, student: ModelProfile, cfg, args) -> TermCalibration:
    """The cost model's per-step terms from the K = 1 run (medians of its rank's clock)."""
    parts = k1["measured"]["stage_parts_s"][0]
    single = CostModel(teacher, student, device_specs(cfg.trainer, cfg.partition, 1), StepSpec(args.microbatches))
    blocks = parts["teacher_fwd"] + parts["student_fwd"] + parts["student_bwd"]
    return TermCalibration.from_single_device_step(single, blocks, parts["loss"], parts["optimizer"],
                                                   k1["measured"]["step_s"])


def model_variants(cfg, k: int, teacher: ModelProfile, student: ModelProfile, terms: TermCalibration,
                   link: dict[str, Any], args) -> dict[str, CostModel]:
    """The cost model with the terms added one by one; the last one is what the planner uses."""
    step = StepSpec(args.microbatches)
    specs = device_specs(cfg.trainer, cfg.partition, k)  # contention from the cores and trainer.threads
    alone = [dataclasses.replace(d, contention=1.0) for d in specs]
    linked = [dataclasses.replace(d, link_latency_s=link["latency_s"],
                                  link_bandwidth_bytes_per_s=link["bandwidth_bytes_per_s"]) for d in specs]
    return {"profile only": CostModel(teacher, student, alone, step),
            "+ K=1 terms": terms.apply(CostModel(teacher, student, alone, step)),
            "+ contention": terms.apply(CostModel(teacher, student, specs, step)),
            PLANNER: terms.apply(CostModel(teacher, student, linked, step))}


def predictions(models: dict[str, CostModel], counts: tuple, old_scale: float) -> dict[str, Any]:
    """Step time of each variant on one partition; 'old' = profile-only times scaled to the K = 1 run."""
    steps = {name: model.evaluate(*counts).step_time_s for name, model in models.items()}
    steps = {"old (scaled profile)": old_scale * steps.pop("profile only"), **steps}
    cost = models[PLANNER].evaluate(*counts)
    m = models[PLANNER].step.microbatches
    return {"step_s": steps, "stage_compute_s": [m * c for c in cost.stage_compute_s],
            "stage_noncompute_s": [m * (o + c) for o, c in zip(cost.stage_overhead_s, cost.stage_comm_s)]}


# ---------------------------------------------------------------- report


def row(k: int, record: dict[str, Any], predicted: dict[str, Any], role: str) -> dict[str, Any]:
    """One K: prediction of every variant, the measured medians, and how quiet each run was."""
    measured = record["measured"]
    planner = predicted["step_s"][PLANNER]
    compute = [c - p["optimizer"] for c, p in zip(measured["stage_compute_s"], measured["stage_parts_s"])]
    return {"K": k, "role": role, "partition": record["partition"], "measured_step_s": measured["step_s"],
            "predicted_step_s": planner, "error": planner / measured["step_s"] - 1,
            "variants_step_s": predicted["step_s"],
            "variants_error": {n: t / measured["step_s"] - 1 for n, t in predicted["step_s"].items()},
            "stage_compute_predicted_s": predicted["stage_compute_s"], "stage_compute_measured_s": compute,
            "stage_noncompute_predicted_s": predicted["stage_noncompute_s"],
            "stage_noncompute_measured_s": measured["stage_comm_s"],
            "stage_optimizer_measured_s": [p["optimizer"] for p in measured["stage_parts_s"]],
            "steps_compared": measured["steps"],
            "runs": [{"step_s": run_["measured"]["step_s"], "run_dir": str(run_["run_dir"]),
                      **{key: run_[key] for key in ("idle_before", "load1_before", "load1_after", "foreign_cores",
                                                    "attempt")}} for run_ in record["runs"]]}


def markdown(result: dict[str, Any]) -> str:
    args, terms, link = result["args"], result["terms"], result["link"]
    variants = [v for v in result["rows"][0]["variants_step_s"] if v != PLANNER]  # the ablation columns
    lines = [f"# Planner vs measured step time, CPU ({result['cores']} cores, torch {result['torch']})", "",
             f"`{result['command']}`", "",
             f"{args['teacher']} -> {args['student']}, batch {args['batch']}, M={args['microbatches']} micro-batches, "
             f"1F1B, gloo, {args['threads']} thread(s) per rank, {args['steps']} steps (medians after "
             f"{args['warmup_steps']} warm-up steps).", "",
             "Calibrated terms (none from the K=2 or K=3 runs):", "",
             f"- from the K=1 run: compute scale {terms['compute_scale']:.3f} (measured block compute / profiled), "
             f"per-micro-batch overhead {terms['per_microbatch_overhead_s'] * 1e3:.2f} ms, KD loss "
             f"{terms['loss_s'] * terms['compute_scale'] * 1e3:.2f} ms per micro-batch, optimizer step "
             f"{terms['optimizer_step_s'] * 1e3:.2f} ms;",
             f"- from a gloo ping-pong (experiments/bench_gloo_p2p.py): link latency {link['latency_s'] * 1e6:.0f} us "
             f"per message, bandwidth {link['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s;",
             f"- from the machine: {result['cores']} cores, contention max(1, K x {args['threads']} / "
             f"{result['cores']}) per rank.", "",
             "Prediction with every term (what the planner plans with), and on the same partition the old "
             "prediction and the terms added one by one:", "",
             f"Measured: median over {args['repeats']} runs (range); load: 1-minute load average before the runs "
             "(it counts this script's own previous runs) / CPU that other processes used during a run.", "",
             "| K | partition (teacher / student) | planner prediction | measured | error | "
             + " | ".join(variants) + " | load / other processes' CPU |",
             "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in variants) + " | --- |"]
    for r in result["rows"]:
        runs = r["runs"]
        spread = f"{min(x['step_s'] for x in runs) * 1e3:.1f}-{max(x['step_s'] for x in runs) * 1e3:.1f}"
        quiet = (f"{min(x['load1_before'] for x in runs):.2f}-{max(x['load1_before'] for x in runs):.2f} / "
                 f"<= {max(x['foreign_cores'] for x in runs):.2f} cores")
        cells = " | ".join(f"{r['variants_step_s'][v] * 1e3:.1f} ms ({r['variants_error'][v]:+.1%})" for v in variants)
        lines.append(f"| {r['K']} | {r['partition']['teacher']} / {r['partition']['student']} | "
                     f"{r['predicted_step_s'] * 1e3:.1f} ms | {r['measured_step_s'] * 1e3:.1f} ms ({spread}) | "
                     f"{r['error']:+.1%}{' (calibration)' if r['role'] == 'calibration' else ''} | {cells} | {quiet} |")
    lines += ["", "Per stage and step, predicted / measured (ms): compute = blocks + loss (the clock's compute "
              "without the optimizer); non-compute = overhead + communication (measured: also the waiting in "
              "pipeline bubbles, which the model has in the step formula, not per stage).", ""]
    for r in result["rows"]:
        def pairs(predicted: list[float], measured: list[float]) -> str:
            return ", ".join(f"{a * 1e3:.1f} / {b * 1e3:.1f}" for a, b in zip(predicted, measured))

        lines.append(f"- K={r['K']}: compute {pairs(r['stage_compute_predicted_s'], r['stage_compute_measured_s'])}; "
                     f"non-compute {pairs(r['stage_noncompute_predicted_s'], r['stage_noncompute_measured_s'])}")
    lines += ["", "Limits: contention is the fair share of the cores for every stage, right for the bottleneck stage "
              "(always busy) and too high for the others (they idle in bubbles); the measured step is the slowest "
              "rank's step wall time and, like the model, leaves out the work between steps (data loading, "
              "records). The link was measured with "
              f"{link['foreign_cores']:.2f} cores of other processes' CPU."]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="resnet_mini")
    parser.add_argument("--student", default="resnet_micro")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (and for profiling)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--link-repeats", type=int, default=50)
    parser.add_argument("--min-idle", type=float, default=0.95, help="idle CPU fraction to wait for before a run")
    parser.add_argument("--max-wait", type=float, default=600.0, help="seconds to wait for that, then run anyway")
    parser.add_argument("--max-foreign", type=float, default=0.05,
                        help="repeat a run if other processes used more than this many cores meanwhile")
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="runs per K; the report gives their median")
    parser.add_argument("--out", type=Path, default=REPO / "experiments/results/planner_cpu")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    command = "python " + shlex.join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])
    print(command, flush=True)
    torch.set_num_threads(args.threads)  # the profiles are measured in this process: as the workers run
    work = Path(tempfile.mkdtemp(prefix="planner_report_"))
    torch.manual_seed(0)
    torch.save(build_model(args.teacher, 10, 1, 32).state_dict(), work / "teacher.pt")
    link = quiet_link(args)
    k1 = measured_runs(work, 1, args)  # partition=auto: profiles the models here, plans all on one rank
    profiles = json.loads((k1["runs"][0]["run_dir"] / "plan.json").read_text())["profiles"]
    teacher, student = load_profile_csv(profiles["teacher"]), load_profile_csv(profiles["student"])
    terms = calibrate(k1, teacher, student, compose_run(work / "unused", work, 1, args, None), args)
    counts1 = (k1["partition"]["teacher"], k1["partition"]["student"])
    models1 = model_variants(compose_run(work / "unused", work, 1, args, None), 1, teacher, student, terms, link, args)
    old_scale = k1["measured"]["step_s"] / models1["profile only"].evaluate(*counts1).step_time_s
    rows = [row(1, k1, predictions(models1, counts1, old_scale), "calibration")]
    for k in (2, 3):
        cfg = compose_run(work / "unused", work, k, args, None)
        models = model_variants(cfg, k, teacher, student, terms, link, args)
        plan = plan_with_cost_model(models[PLANNER])
        counts = (plan.teacher_counts, plan.student_counts)
        record = measured_runs(work, k, args, counts)
        rows.append(row(k, record, predictions(models, counts, old_scale), "out of sample"))
        print(f"K={k}: predicted {rows[-1]['predicted_step_s'] * 1e3:.1f} ms, measured "
              f"{rows[-1]['measured_step_s'] * 1e3:.1f} ms ({rows[-1]['error']:+.1%})", flush=True)
    result = {"command": command, "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
              "args": {k: os.path.relpath(v, REPO) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "terms": dataclasses.asdict(terms), "link": link, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    text = markdown(result)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
