# python experiments/validate_simulate.py [--seeds 5] [--out experiments/results/simulate_validation.json]
"""mode=simulate against measured runs of this repository: each measured run's config, simulated with
``--seeds`` seeds (the noise and nothing else differ), beside what was measured.

Scenarios (each reproduces a benchmark's command in the simulator):

* ``bench_policies_cpu``: the default demo on 3 CPU ranks, rank 1 compute x4 from step 50, five
  policies (experiments/results/bench_policies_cpu_quiet_2026-12-04.json: today's code, measured quiet,
  3 runs per policy), each simulated **on the measured runs' first cut** (their records' first segment:
  ``partition=manual``), so that the plan is not what differs;
* ``bench_policies_replicas_cpu``: 4 CPU ranks as 4 replicas x 1 stage, rank 3 x4 from step 50
  (bench_policies_replicas_cpu.json, 3 runs per policy);
* the recovery runs (``RECOVERY``, below), compared on failure -> first step;
* ``h200x2_kill``: ViT-L -> ResNet-152 on 2 H200, rank 1 killed at step 40, checkpoint every 16,
  80 steps (h200x2/kill.json, 1 run), on the H200 block profiles of experiments/results/profiles_h200.

CPU scenarios use the block profiles of this machine's CPU measured quiet on 2026-12-05
(experiments/results/simulate_profiles_cpu_2026-12-05: ``experiments/profile_models.py --threads 1``, one
thread as a demo rank has), passed explicitly: profiles measured under load differ by up to 80x here, and
the older simulate_profiles_cpu are of another CPU (an AMD EPYC; this machine's is an Intel Xeon).
``--step-noise PATH`` draws the noise from a fault-free stream of this machine (default: the shipped one).
Wall time is compared as a run's ``wall_time_s`` (the supervisor's, its start to its end); the simulation
counts the first launch (measured: synapse/simulation/launch.py), steps, restarts and detection, between
steps the checkpoint saves and evaluations the config schedules (priced: see synapse/simulation/engine.py),
before every step the host's time between two steps' records, drawn from the recorded fault-free streams
(synapse/simulation/noise.py), and after the last one the workers' exit.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hydra import compose, initialize_config_dir  # noqa: E402

import synapse.config  # noqa: E402, F401  (registers the config schema)
from synapse.app import run  # noqa: E402
from synapse.conf import CONF_DIR  # noqa: E402
from synapse.rundir import read_jsonl  # noqa: E402

RESULTS = REPO / "experiments" / "results"
CPU_PROFILES = RESULTS / "simulate_profiles_cpu_2026-12-05" / "profiles"
H200_PROFILES = RESULTS / "profiles_h200" / "profiles"
CPU_KEY = "mb16_fp32_intel-r-xeon-r-processor_32px_1ch_10cls.csv"
CPU = (f"simulate.teacher_profile={CPU_PROFILES / f'resnet_mini_teacher_{CPU_KEY}'}",
       f"simulate.student_profile={CPU_PROFILES / f'resnet_micro_student_{CPU_KEY}'}")
SLOW_RANK_1 = "injection.faults=[{kind:slow_compute,rank:1,start:50,factor:4.0}]"
SLOW_RANK_3 = "injection.faults=[{kind:slow_compute,rank:3,start:50,factor:4.0}]"
SCENARIOS = {
    "bench_policies_cpu": {
        "measured": "bench_policies_cpu_quiet_2026-12-04.json", "policies": ["eta", "keep", "replan", "degrade",
                                                                          "ski_rental"],
        "overrides": [*CPU, SLOW_RANK_1, "injection.name=bench_policies"], "first_cut_from_records": True,
    },
    "bench_policies_replicas_cpu": {
        "measured": "bench_policies_replicas_cpu.json", "policies": ["eta", "keep", "degrade", "rebalance"],
        "overrides": [*CPU, SLOW_RANK_3, "injection.name=bench_policies", "trainer.devices=4", "trainer.replicas=4",
                      "partition=even", "pipeline.microbatches=1"],
    },
    "h200x2_kill": {
        "measured": "h200x2/kill.json", "policies": ["eta"],
        "overrides": ["teacher=vit_large", "student=resnet152", "data=synthetic", "data.batch_size=128",
                      "trainer.accelerator=cuda", "trainer.devices=2", "trainer.max_steps=80", "trainer.epochs=1",
                      "pipeline.microbatches=8", "checkpoint.every=16", "injection.name=kill",
                      "injection.faults=[{kind:kill,rank:1,step:40}]",
                      f"simulate.teacher_profile={H200_PROFILES / 'vit_large_teacher_mb16_bf16_nvidia-h200_224px_3ch_100cls.csv'}",  # noqa: E501
                      f"simulate.student_profile={H200_PROFILES / 'resnet152_student_mb16_bf16_nvidia-h200_224px_3ch_100cls.csv'}"],  # noqa: E501
    },
}

# experiments/results/recovery_nodes_cpu.json (bench_recovery_nodes.py): 4 CPU ranks of the micro models, a
# kill of rank 2 in step 8 on one node or across two, or node 1 lost after step 6 (failover.node_timeout_s=3,
# the time to notice it, given as simulate.failure_detect_s). Compared: failure -> the first step after it,
# the action and the step resumed from (the table above compares whole runs; these runs were timed this way).
RECOVERY_COMMON = ["partition=even", "trainer.accelerator=cpu", "trainer.threads=1", "trainer.max_steps=16",
                   "data.batch_size=16", "pipeline.microbatches=4", "teacher=resnet_micro", "student=resnet_micro",
                   "checkpoint.every=4", "injection.name=recovery_nodes", "policy=eta"]
RECOVERY_KILL = "injection.faults=[{kind:kill,rank:2,step:8,phase:backward}]"
RECOVERY = {
    "one_node": [RECOVERY_KILL, "trainer.devices=4"],
    "two_nodes": [RECOVERY_KILL, "trainer.devices=4", "trainer.nodes=2"],
    "node_lost": ["injection=none", "trainer.devices=4", "trainer.nodes=2", "simulate.trace={trace}",
                  "simulate.failure_detect_s=3"],
}


def simulate_recovery(case: str, seed: int, run_dir: Path) -> dict:
    """One recovery case simulated: failure (the first ``rank_dead``) -> the first step after the restart."""
    trace = run_dir.parent / "node1_lost_after_step_6.csv"  # node 1 = devices 2, 3: its first device names it
    trace.write_text("device,kind,start_step,end_step,factor\n2,node_loss,7,,\n")
    overrides = [o.replace("{trace}", str(trace)) for o in RECOVERY[case]]
    simulate_once([*RECOVERY_COMMON, *overrides, f"seed={seed}"], run_dir)
    events = [json.loads(line) for line in (run_dir / "failover_events.jsonl").read_text().splitlines()]
    dead = next(e for e in events if e["event"] == "rank_dead")
    first = next(e for e in events if e["event"] == "first_step_after_restart")
    return {"failure_to_step_s": first["time"] - dead["time"], "action": first["action"],
            "resume_step": first["step"] - 1, "components": first["components"]}

# The one-H200 runs with a failover decision and a config (h200/early_faults/run2_lone_check.tgz: ViT-B ->
# ResNet-50 as a K = 1 pipeline, `trainer=gpu`, 300 and 150 steps, batch 256 in 2 micro-batches): fault-free, and
# rank 0's compute x2 from step 5. They ran no supervisor's summary (no wall_time_s), so they are compared on
# the median step, the record span (first record to last), the first detection and the decisions.
EARLY_FAULTS = RESULTS / "h200" / "early_faults" / "run2_lone_check.tgz"
ONE_H200_COMMON = ["trainer=gpu", "teacher=vit_base", "student=resnet50", "data=synthetic", "data.batch_size=256",
                   "data.synthetic_train_size=8192", "data.synthetic_val_size=512", "trainer.devices=1",
                   "trainer.epochs=6", "trainer.eval_every_epochs=100",
                   "pipeline.microbatches=2", "checkpoint.every=0", "policy=eta",
                   f"simulate.teacher_profile={H200_PROFILES / 'vit_base_teacher_mb32_bf16_nvidia-h200_224px_3ch_100cls.csv'}",  # noqa: E501
                   f"simulate.student_profile={H200_PROFILES / 'resnet50_student_mb32_bf16_nvidia-h200_224px_3ch_100cls.csv'}"]  # noqa: E501
ONE_H200 = {
    "none": ["injection=none", "injection.name=none", "trainer.max_steps=300"],
    "compute5": ["trainer.max_steps=150", "injection.name=compute5",
                 "injection.faults=[{kind:slow_compute,rank:0,start:5,factor:2.0}]"],
}


def one_h200_reading(records: list[dict], events: list[dict]) -> dict:
    detected = [e["detected_step"] for e in events if e.get("event") == "slowdown_detected"]
    return {"median_step_s": statistics.median(r["step_seconds"] for r in records),
            "span_s": records[-1]["time"] - records[0]["time"], "first_detection": detected[0] if detected else None,
            "actions": sorted({e["action"] for e in events if e.get("event") == "decision"})}


def one_h200_rows(seeds: int, tmp: Path) -> tuple[list[str], dict]:
    import tarfile
    rows, result = [], {}
    with tarfile.open(EARLY_FAULTS) as archive:
        def read(case: str, name: str) -> list[dict]:
            member = archive.extractfile(f"early/{case}/{name}")
            return [json.loads(line) for line in member.read().decode().splitlines() if line.strip()] if member else []
        measured = {case: one_h200_reading(read(case, "performance.jsonl"), read(case, "failover_events.jsonl"))
                    for case in ONE_H200}
    for case, overrides in ONE_H200.items():
        sims = []
        for seed in range(seeds):
            run_dir = tmp / f"one_h200_{case}_{seed}"
            simulate_once([*ONE_H200_COMMON, *overrides, f"seed={seed}"], run_dir)
            events = [json.loads(line) for line in (run_dir / "failover_events.jsonl").read_text().splitlines()]
            sims.append(one_h200_reading([json.loads(line) for line in
                                          (run_dir / "performance.jsonl").read_text().splitlines()], events))
        real = measured[case]
        result[case] = {"measured": real, "simulated": sims}
        span = [s["span_s"] for s in sims]
        simulated_actions = ", ".join(sorted({a for s in sims for a in s["actions"]})) or "-"
        rows.append(f"| {case} | {1e3 * real['median_step_s']:.1f} ms | "
                    f"{1e3 * statistics.median(s['median_step_s'] for s in sims):.1f} ms | {real['span_s']:.1f} s | "
                    f"{spread(span)} | {statistics.median(span) / real['span_s'] - 1:+.0%} | "
                    f"{real['first_detection'] or '-'} | {', '.join(str(s['first_detection'] or '-') for s in sims)} | "
                    f"{', '.join(real['actions']) or '-'} | {simulated_actions} |")
        print(rows[-1], flush=True)
    return rows, result


def outcomes(runs: list[dict]) -> str:
    return "; ".join(sorted({f"{r['action']}, resumed from {r['resume_step']}" for r in runs}))


def recovery_rows(seeds: int, tmp: Path) -> tuple[list[str], dict]:
    measured = json.loads((RESULTS / "recovery_nodes_cpu.json").read_text())["runs"]
    rows, result = [], {}
    for case in RECOVERY:
        sims = [simulate_recovery(case, seed, tmp / f"recovery_{case}_{seed}") for seed in range(seeds)]
        real = measured[case]
        sim_s, real_s = [s["failure_to_step_s"] for s in sims], [r["failure_to_step_s"] for r in real]
        error = statistics.median(sim_s) / statistics.median(real_s) - 1
        launch = statistics.median(r["components"]["launch_s"] for r in real)
        result[case] = {"simulated": sims, "measured": real, "error": error}
        rows.append(f"| {case} | {spread(real_s)} | {spread(sim_s)} | {error:+.0%} | {outcomes(real)} | "
                    f"{outcomes(sims)} | {launch:.1f} s / {sims[0]['components']['launch_s']:.2f} s |")
        print(rows[-1], flush=True)
    return rows, result


def measured_runs(scenario: dict) -> dict[str, list[dict]]:
    data = json.loads((RESULTS / scenario["measured"]).read_text())
    runs = data["runs"] if isinstance(data, dict) and "runs" in data else [data if isinstance(data, dict) else data]
    by_policy: dict[str, list[dict]] = {}
    for r in runs:
        by_policy.setdefault(r.get("policy", "eta"), []).append(r)
    return by_policy


def first_cut(runs: list[dict]) -> list[str]:
    """The measured runs' first cut (their records' first segment), as the overrides that start a run on
    it: the runs planned it on the profiles they had at their start, which no record holds."""
    cuts = {(tuple(r["segments"][0]["teacher_counts"]), tuple(r["segments"][0]["student_counts"])) for r in runs}
    if len(cuts) != 1:
        raise SystemExit(f"the measured runs start on {len(cuts)} different cuts {sorted(cuts)}: simulate them one "
                         f"by one (their first cuts must agree to be one scenario)")
    (teacher, student), = cuts
    return ["partition=manual", f"partition.teacher=[{','.join(map(str, teacher))}]",
            f"partition.student=[{','.join(map(str, student))}]"]


def decisions_text(decisions: list[dict]) -> str:
    return ", ".join(f"{d['action']}@{d['step']}" for d in decisions) or "-"


def simulate_once(overrides: list[str], run_dir: Path) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="validate"):
        cfg = compose(config_name="config", overrides=[f"run_dir={run_dir}", "mode=simulate", "report=false",
                                                       "trainer.progress=false", *overrides])
    began = time.perf_counter()
    result = run(cfg, log=lambda line: None)["simulation"]
    summary = json.loads((run_dir / "experiment_summary.json").read_text())
    return {"wall_time_s": result["wall_time_s"], "decisions": result["decisions"], "steps": result["steps"],
            "restarts": summary["restarts"], "simulate_s": time.perf_counter() - began}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f}, n={len(values)})"


# Run directories of the 3-rank scenario measured beside this validation (2026-12-05, load average 0.6-2.5: one
# run each of keep, degrade, replan, eta; python train.py policy=P with the scenario's fault), whose records the
# simulated runs' pieces are checked against (``pieces``).
MEASURED_RUNS = RESULTS / "simulate_validation_runs_2026-12-05.tgz"
ONSET, PER_EPOCH = 50, 22  # the 3-rank scenario's fault onset; digits: 1,438 training images in batches of 64


def pieces(run_dir: Path) -> dict[str, float | list[float] | None]:
    """What a run's wall time is made of, read from its records alike for a measured run and a simulated
    one: the first launch (the start to the first step's start), the healthy step and each rank's compute
    (steps 6 to the onset), the slowed step and compute (segment 0 from 5 steps after the onset: keep's
    whole slowdown, the others' few steps before they act), the host's time between steps (not at an
    epoch end), the epoch end's pause (save and evaluation), the end (last record to the supervisor's end)
    and each restart's stop -> first step."""
    records = read_jsonl(run_dir / "performance.jsonl")
    segments = sorted((run_dir / "segments").glob("*/segment.json"), key=lambda f: int(f.parent.name))
    started_at = json.loads(segments[0].read_text())["started_at"]
    ended_at = json.loads(segments[-1].read_text())["ended_at"]
    first_segment = [r for r in records if r.get("segment", 0) == 0]
    healthy = [r for r in first_segment if 6 <= r["step"] < ONSET]
    slowed = [r for r in first_segment if r["step"] >= ONSET + 5]
    pairs = [(a, b) for a, b in zip(records, records[1:]) if b["step"] == a["step"] + 1 and
             b.get("segment", 0) == a.get("segment", 0)]
    gaps = [b["time"] - b["step_seconds"] - a["time"] for a, b in pairs if a["step"] % PER_EPOCH]
    pauses = [b["time"] - b["step_seconds"] - a["time"] for a, b in pairs if not a["step"] % PER_EPOCH]
    median = statistics.median

    def per_rank(rows: list[dict]) -> list[float] | None:
        return [round(median(r["compute_s"][i] for r in rows), 4) for i in range(len(rows[0]["compute_s"]))] \
            if rows else None
    summary = json.loads((run_dir / "experiment_summary.json").read_text())
    return {"first_launch_s": records[0]["time"] - records[0]["step_seconds"] - started_at,
            "healthy_step_s": median(r["step_seconds"] for r in healthy), "healthy_compute_s": per_rank(healthy),
            "slowed_step_s": median(r["step_seconds"] for r in slowed) if len(slowed) >= 5 else None,
            "slowed_compute_s": per_rank(slowed) if len(slowed) >= 5 else None,
            "host_gap_s": median(gaps), "epoch_end_pause_s": median(pauses) if pauses else None,
            "end_s": ended_at - records[-1]["time"],
            "restart_recovery_s": [round(r["recovery_s"], 3) for r in summary["restarts"] if r.get("recovery_s")],
            "wall_time_s": summary["wall_time_s"]}


PIECES = ("wall_time_s", "first_launch_s", "healthy_step_s", "healthy_compute_s", "slowed_step_s", "slowed_compute_s",
          "host_gap_s", "epoch_end_pause_s", "end_s", "restart_recovery_s")


def shown(value: object) -> str:
    if value is None or value == []:
        return "-"
    if isinstance(value, list):
        return "/".join(f"{v:.3f}" for v in value)
    return f"{value:.3f}"


def pieces_rows(tmp: Path, seeds: int) -> tuple[list[str], dict]:
    """Each measured run's pieces beside the median over the seeds of the same policy's simulations (the
    simulations of ``bench_policies_cpu`` in ``tmp``)."""
    import tarfile
    with tarfile.open(MEASURED_RUNS) as archive:
        archive.extractall(tmp / "measured", filter="data")
    rows, result = [], {}
    for run_dir in sorted((tmp / "measured").glob("*/*_0")):
        policy = run_dir.name.rsplit("_", 1)[0]
        if not (tmp / f"bench_policies_cpu_{policy}_0").is_dir():
            continue
        real = pieces(run_dir)
        sims = [pieces(tmp / f"bench_policies_cpu_{policy}_{seed}") for seed in range(seeds)]
        result[policy] = {"measured": real, "simulated": sims}
        for key in PIECES:
            values = [s[key] for s in sims if s[key] not in (None, [])]
            if values and isinstance(values[0], list):
                sim = [round(statistics.median(v[i] for v in values), 4) for i in range(min(len(v) for v in values))]
            else:
                sim = statistics.median(values) if values else None  # type: ignore[type-var]
            rows.append(f"| {policy} | {key} | {shown(real[key])} | {shown(sim)} |")
    return rows, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", type=Path, default=RESULTS / "simulate_validation.json")
    parser.add_argument("--step-noise", default=None,
                        help="simulate.step_noise of the CPU scenarios (a fault-free performance.jsonl here)")
    args = parser.parse_args()
    noise = [f"simulate.step_noise={args.step_noise}"] if args.step_noise else []
    rows, result = [], {"command": " ".join(["python experiments/validate_simulate.py", *sys.argv[1:]]),
                        "seeds": args.seeds, "scenarios": {}}
    with tempfile.TemporaryDirectory(prefix="synapse-validate-") as tmp:
        for name in args.scenarios.split(","):
            scenario, measured = SCENARIOS[name], measured_runs(SCENARIOS[name])
            cut = first_cut([r for runs in measured.values() for r in runs]) if scenario.get("first_cut_from_records") \
                else []
            cpu_noise = noise if any(o.startswith("simulate.teacher_profile") and str(CPU_PROFILES) in o
                                     for o in scenario["overrides"]) else []
            result["scenarios"][name] = {"overrides": [o.replace(f"{REPO}/", "") for o in  # paths from the repository
                                                       [*scenario["overrides"], *cut, *cpu_noise]]}
            for policy in scenario["policies"]:
                sims = [simulate_once([*scenario["overrides"], *cut, *cpu_noise, f"policy={policy}", f"seed={seed}"],
                                      Path(tmp) / f"{name}_{policy}_{seed}") for seed in range(args.seeds)]
                real = measured.get(policy, [])
                sim_wall = [s["wall_time_s"] for s in sims]
                real_wall = [float(r["wall_time_s"]) for r in real]
                error = (statistics.median(sim_wall) / statistics.median(real_wall) - 1) if real_wall else None
                result["scenarios"][name][policy] = {"simulated": sims, "measured": [
                    {"wall_time_s": r["wall_time_s"], "decisions": r.get("decisions", [])} for r in real],
                    "wall_time_error": error}
                rows.append(f"| {name} | {policy} | {spread(real_wall) if real_wall else '-'} | {spread(sim_wall)} | "
                            f"{'-' if error is None else f'{error:+.0%}'} | "
                            f"{'; '.join(decisions_text(r.get('decisions', [])) for r in real) or '-'} | "
                            f"{'; '.join(decisions_text(s['decisions']) for s in sims)} |")
                print(rows[-1], flush=True)
        piece_rows, result["pieces_3_rank"] = pieces_rows(Path(tmp), args.seeds) if "bench_policies_cpu" in \
            args.scenarios.split(",") else ([], {})
        recovery, result["recovery_nodes_cpu"] = recovery_rows(args.seeds, Path(tmp))
        one_h200, result["one_h200_early_faults"] = one_h200_rows(args.seeds, Path(tmp))
    table = ("| scenario | policy | measured wall time: median (min-max, n) | simulated: median (min-max, n) | "
             "error | measured decisions (per run) | simulated decisions (per seed) |\n"
             "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
             f"The 3-rank scenario's pieces: one measured run per policy ({MEASURED_RUNS.name}) beside the median of "
             f"the simulated seeds (seconds; per-rank compute as rank 0/1/2)\n\n"
             "| policy | piece | measured | simulated |\n| --- | --- | --- | --- |\n" + "\n".join(piece_rows) + "\n\n"
             "Recovery runs (recovery_nodes_cpu): failure -> first step after it\n\n"
             "| case | measured: median (min-max, n) | simulated | error | measured action | simulated action | "
             "launch measured / prior |\n| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(recovery) + "\n\n"
             "One H200 (h200/early_faults, run 2): steps, detection and decisions\n\n"
             "| case | measured median step | simulated | measured span | simulated span | error | measured first "
             "detection | simulated | measured actions | simulated |\n"
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(one_h200) + "\n")
    args.out.write_text(json.dumps(result, indent=1, default=str))
    args.out.with_suffix(".md").write_text(f"# mode=simulate against measured runs\n\n`{result['command']}`\n\n"
                                           f"{table}")
    print(table)


if __name__ == "__main__":
    main()
