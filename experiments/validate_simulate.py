# python experiments/validate_simulate.py [--seeds 5] [--out experiments/results/simulate_validation.json]
"""mode=simulate against measured runs of this repository: each measured run's config, simulated with
``--seeds`` seeds (the noise and nothing else differ), beside what was measured.

Scenarios (each reproduces a benchmark's command in the simulator):

* ``bench_policies_cpu``: the default demo on 3 CPU ranks, rank 1 compute x4 from step 50, five
  policies (experiments/results/bench_policies_cpu.json, 3 measured runs per policy);
* ``bench_policies_replicas_cpu``: 4 CPU ranks as 4 replicas x 1 stage, rank 3 x4 from step 50
  (bench_policies_replicas_cpu.json, 3 runs per policy);
* ``h200x2_kill``: ViT-L -> ResNet-152 on 2 H200, rank 1 killed at step 40, checkpoint every 16,
  80 steps (h200x2/kill.json, 1 run), on the H200 block profiles of experiments/results/profiles_h200.

CPU scenarios use the block profiles measured on this machine when it was quiet
(experiments/results/simulate_profiles_cpu), passed explicitly: profiles measured under load differ
by up to 80x here. Wall time is compared as a run's ``wall_time_s`` (the supervisor's, first launch to
the end); the simulation counts the first launch (the restart prior's launch and warm-up), steps,
restarts and detection, and between steps the checkpoint saves and evaluations the config schedules
(priced: see synapse/simulation/engine.py), and before every step the host's time between two
steps' records, drawn from the recorded fault-free streams (synapse/simulation/noise.py).
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

RESULTS = REPO / "experiments" / "results"
CPU_PROFILES = RESULTS / "simulate_profiles_cpu"
H200_PROFILES = RESULTS / "profiles_h200" / "profiles"
CPU = (f"simulate.teacher_profile={CPU_PROFILES / 'resnet_mini_teacher_mb16_fp32_amd-epyc_32px_1ch_10cls.csv'}",
       f"simulate.student_profile={CPU_PROFILES / 'resnet_micro_student_mb16_fp32_amd-epyc_32px_1ch_10cls.csv'}")
SLOW_RANK_1 = "injection.faults=[{kind:slow_compute,rank:1,start:50,factor:4.0}]"
SLOW_RANK_3 = "injection.faults=[{kind:slow_compute,rank:3,start:50,factor:4.0}]"
SCENARIOS = {
    "bench_policies_cpu": {
        "measured": "bench_policies_cpu.json", "policies": ["eta", "keep", "replan", "degrade", "ski_rental"],
        "overrides": [*CPU, SLOW_RANK_1, "injection.name=bench_policies"],
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


def measured_runs(scenario: dict) -> dict[str, list[dict]]:
    data = json.loads((RESULTS / scenario["measured"]).read_text())
    runs = data["runs"] if isinstance(data, dict) and "runs" in data else [data if isinstance(data, dict) else data]
    by_policy: dict[str, list[dict]] = {}
    for r in runs:
        by_policy.setdefault(r.get("policy", "eta"), []).append(r)
    return by_policy


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", type=Path, default=RESULTS / "simulate_validation.json")
    args = parser.parse_args()
    rows, result = [], {"command": " ".join(["python experiments/validate_simulate.py", *sys.argv[1:]]),
                        "seeds": args.seeds, "scenarios": {}}
    with tempfile.TemporaryDirectory(prefix="synapse-validate-") as tmp:
        for name in args.scenarios.split(","):
            scenario, measured = SCENARIOS[name], measured_runs(SCENARIOS[name])
            result["scenarios"][name] = {}
            for policy in scenario["policies"]:
                sims = [simulate_once([*scenario["overrides"], f"policy={policy}", f"seed={seed}"],
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
    table = ("| scenario | policy | measured wall time: median (min-max, n) | simulated: median (min-max, n) | "
             "error | measured decisions (per run) | simulated decisions (per seed) |\n"
             "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")
    args.out.write_text(json.dumps(result, indent=1, default=str))
    args.out.with_suffix(".md").write_text(f"# mode=simulate against measured runs\n\n`{result['command']}`\n\n"
                                           f"{table}")
    print(table)


if __name__ == "__main__":
    main()
