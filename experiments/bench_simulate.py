# python experiments/bench_simulate.py [--steps 10000] [--devices 64] [--layouts 64x1,8x8] [--policy eta]
#                                     [--repeats 1] [--record-detector DIR] [--record-searches DIR]
# python experiments/bench_simulate.py --replay-detector DIR/8x8_0.json.gz [--repeats 1]
# python experiments/bench_simulate.py --replay-searches DIR/8x8_0.json.gz [--repeats 1]
"""How fast mode=simulate is: a ``--steps``-step run of ``--devices`` simulated H200s (ViT-L ->
ResNet-152 on the H200 block profiles), one per layout (R replicas x K stages), timed end to end
in this process (config, planner, first plan, the steps, the records) and for the steps alone,
``--repeats`` times per layout (the table gives each run; the machine is shared, so CPU time too).
The issue's target: 10,000 steps of 64 GPUs in under 30 s on one core. One slowdown (device 5
compute x3 for 500 steps from the middle step) makes the controller decide as in a real run.
Writes experiments/results/simulate_speed.{json,md}.

``--record-detector DIR`` also writes every call each run makes on its slowdown detector to
DIR/<layout>_<repeat>.json.gz; ``--replay-detector FILE`` replays one such file on the detector of this
script's tree and prints the CPU time of its calls and a digest of every answer (events, ratios, active
slowdowns, baselines, the state every 97 steps and at the end): the detector alone, its speed and its
sameness. To compare two trees on the same calls, run this script from each (copied into the other).

``--record-searches DIR`` likewise writes every partition search a run makes (each cost model: profiles,
devices, step; and the plan) to DIR/<layout>_<repeat>.json.gz; ``--replay-searches FILE`` runs them
again, in order and on shared profile objects as in the run, on the partitioner of this script's tree
and prints their CPU time, a digest of every plan and how many equal the recorded ones.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import itertools
import json
import os
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

H200 = REPO / "experiments" / "results" / "profiles_h200" / "profiles"
MODELS = ("teacher=vit_large", "student=resnet152", "data=synthetic", "trainer.accelerator=cuda",
          f"simulate.teacher_profile={H200 / 'vit_large_teacher_mb32_bf16_nvidia-h200_224px_3ch_100cls.csv'}",
          f"simulate.student_profile={H200 / 'resnet152_student_mb32_bf16_nvidia-h200_224px_3ch_100cls.csv'}")


def simulate(overrides: list[str], run_dir: Path) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="bench_simulate"):
        cfg = compose(config_name="config", overrides=[f"run_dir={run_dir}", "mode=simulate", "report=false",
                                                       *MODELS, *overrides])
    began, cpu_began = time.perf_counter(), time.process_time()
    result = run(cfg, log=lambda line: None)["simulation"]
    # CPU time too: this machine is shared, and its wall time follows the others' load
    return {**result, "total_s": time.perf_counter() - began, "cpu_s": time.process_time() - cpu_began}


DETECTOR_CALLS = ("update", "set_replicas", "set_expected", "rebase", "rewind", "load_state_dict")


def record_detector_calls() -> list[dict]:
    """From now on, every call on a `SlowdownDetector` in this process, as JSON-friendly dicts."""
    from synapse.detection import SlowdownDetector

    calls: list[dict] = []

    def recorded(name: str):
        method = getattr(SlowdownDetector, name)

        def call(detector, *args, **kwargs):
            if name == "update":
                calls.append({"call": name, "args": [args[0].to_dict()], "kwargs": {}})
            else:
                calls.append({"call": name, "args": json.loads(json.dumps(list(args))),
                              "kwargs": json.loads(json.dumps(kwargs))})
            if len(calls) == 1:  # the settings, once a run
                calls[0]["config"] = dict(vars(detector.config))
            return method(detector, *args, **kwargs)
        return call

    for name in DETECTOR_CALLS:
        setattr(SlowdownDetector, name, recorded(name))
    return calls


def replay_detector_calls(path: Path) -> dict:
    """The calls of one recording on a fresh detector: their CPU time and a digest of every answer."""
    from synapse.detection import DetectorConfig, SlowdownDetector, StepTiming

    calls = json.loads(gzip.decompress(path.read_bytes()))
    steps = [(c["call"], [StepTiming.from_dict(c["args"][0])] if c["call"] == "update" else c["args"], c["kwargs"])
             for c in calls]
    detector, digest, spent = SlowdownDetector(DetectorConfig(**calls[0]["config"])), hashlib.sha256(), 0.0
    for name, args, kwargs in steps:
        began = time.process_time()
        answer = getattr(detector, name)(*args, **kwargs)
        spent += time.process_time() - began
        digest.update(repr([e.to_dict() for e in answer or []]).encode())
        digest.update(repr((detector.latest_ratios, detector.active, detector.baseline("compute"),
                            detector.baseline("comm"), detector.prior_replaced)).encode())
        if name == "update" and args[0].step % 97 == 0:
            digest.update(json.dumps(detector.state_dict(), sort_keys=True).encode())
    digest.update(json.dumps(detector.state_dict(), sort_keys=True).encode())
    updates = sum(name == "update" for name, _, _ in steps)
    return {"file": str(path), "digest": digest.hexdigest(), "updates": updates, "cpu_s": spent,
            "ms_per_update": 1e3 * spent / max(1, updates), "load_average": os.getloadavg()[0]}


def record_searches() -> list[dict]:
    """From now on, every partition search of the planner in this process (`plan_with_cost_model`): its cost
    model's profiles (by name, each once), devices and step, and the plan, as JSON-friendly dicts."""
    import synapse.partitioning.planner as planner

    searches: list[dict] = []
    search = planner.plan_with_cost_model

    def recorded(model):
        plan = search(model)
        searches.append({"teacher": dataclasses.asdict(model.teacher), "student": dataclasses.asdict(model.student),
                         "devices": [dataclasses.asdict(d) for d in model.devices],
                         "step": {**dataclasses.asdict(model.step), "schedule": model.step.schedule.value},
                         "plan": plan.to_dict()})
        return plan

    planner.plan_with_cost_model = recorded
    return searches


def replay_searches(path: Path) -> dict:
    """The searches of one recording on this tree's partitioner: their CPU time and a digest of every plan."""
    from synapse.partitioning import BlockProfile, CostModel, DeviceSpec, ModelProfile, StepSpec, plan_with_cost_model

    profiles: dict[str, ModelProfile] = {}  # one object per profile, as in the run (the planner keeps tables by it)

    def profile(fields: dict) -> ModelProfile:
        key = json.dumps(fields, sort_keys=True)
        if key not in profiles:
            profiles[key] = ModelProfile(**{**fields, "blocks": tuple(BlockProfile(**b) for b in fields["blocks"])})
        return profiles[key]

    recorded = json.loads(gzip.decompress(path.read_bytes()))
    models = [CostModel(profile(r["teacher"]), profile(r["student"]), [DeviceSpec(**d) for d in r["devices"]],
                        StepSpec(**r["step"])) for r in recorded]
    digest, same, spent = hashlib.sha256(), 0, 0.0
    for model, r in zip(models, recorded):
        began = time.process_time()
        plan = plan_with_cost_model(model)
        spent += time.process_time() - began
        digest.update(repr(plan).encode())
        same += json.loads(json.dumps(plan.to_dict())) == r["plan"]
    return {"file": str(path), "searches": len(models), "same_plans": same, "digest": digest.hexdigest(),
            "cpu_s": spent, "load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--layouts", default="64x1,8x8", help="RxK per run, comma-separated")
    parser.add_argument("--policy", default="eta")
    parser.add_argument("--repeats", type=int, default=1, help="runs per layout (n)")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "simulate_speed.json")
    parser.add_argument("--record-detector", type=Path, help="write each run's detector calls here")
    parser.add_argument("--replay-detector", type=Path, help="replay one recording (--repeats times) and stop")
    parser.add_argument("--record-searches", type=Path, help="write each run's partition searches here")
    parser.add_argument("--replay-searches", type=Path, help="replay one recording (--repeats times) and stop")
    args = parser.parse_args()
    if args.replay_detector is not None:
        for _ in range(args.repeats):
            print(json.dumps(replay_detector_calls(args.replay_detector)), flush=True)
        return
    if args.replay_searches is not None:
        for _ in range(args.repeats):
            print(json.dumps(replay_searches(args.replay_searches)), flush=True)
        return
    calls = record_detector_calls() if args.record_detector is not None else None
    searches = record_searches() if args.record_searches is not None else None
    runs = []
    with tempfile.TemporaryDirectory(prefix="synapse-bench-simulate-") as tmp:
        for layout, repeat in itertools.product(args.layouts.split(","), range(args.repeats)):
            replicas, stages = (int(x) for x in layout.split("x"))
            start = args.steps // 2
            fault = f"injection.faults=[{{kind:slow_compute,rank:5,start:{start},end:{start + 500},factor:3}}]"
            overrides = [f"trainer.devices={replicas * stages}", f"trainer.replicas={replicas}",
                         f"trainer.max_steps={args.steps}", f"data.batch_size={replicas * 4 * 32}",
                         "pipeline.microbatches=4", "partition=auto", f"policy={args.policy}", "injection.name=bench",
                         fault, "failover.max_restarts=100"]
            result = simulate(overrides, Path(tmp) / f"{layout}_{repeat}")
            if calls is not None:
                args.record_detector.mkdir(parents=True, exist_ok=True)
                recording = args.record_detector / f"{layout}_{repeat}.json.gz"
                recording.write_bytes(gzip.compress(json.dumps(calls).encode()))
                calls.clear()
            if searches is not None:
                args.record_searches.mkdir(parents=True, exist_ok=True)
                recording = args.record_searches / f"{layout}_{repeat}.json.gz"
                recording.write_bytes(gzip.compress(json.dumps(searches).encode()))
                searches.clear()
            runs.append({"layout": layout, "steps": result["steps"], "total_s": result["total_s"],
                         "cpu_s": result["cpu_s"], "load_average": os.getloadavg()[0],
                         "steps_s": result["simulate_s"], "decisions": result["decisions"],
                         "ms_per_step": 1e3 * result["simulate_s"] / max(1, result["steps"])})
            print(json.dumps(runs[-1]), flush=True)
    record = {"command": " ".join(["python experiments/bench_simulate.py", *sys.argv[1:]]), "runs": runs,
              "machine": f"{os.cpu_count()} cores (shared), load average {os.getloadavg()[0]:.2f} at the end",
              "target": "10,000 steps x 64 GPUs under 30 s on one core"}
    args.out.write_text(json.dumps(record, indent=1))
    def decided(run: dict) -> str:
        return ", ".join(f"{d['action']}@{d['step']}" for d in run["decisions"]) or "-"

    rows = "\n".join(f"| {r['layout']} | {r['steps']} | {r['total_s']:.1f} s | {r['cpu_s']:.1f} s | "
                     f"{r['steps_s']:.1f} s | {r['ms_per_step']:.2f} | {r['load_average']:.1f} | {decided(r)} |"
                     for r in runs)
    args.out.with_suffix(".md").write_text(
        f"# mode=simulate speed: {args.devices} simulated H200s, ViT-L -> ResNet-152\n\n`{record['command']}`; "
        f"{record['machine']}; {args.repeats} run(s) per layout (n={args.repeats})\n\n"
        f"| layout (R x K) | steps | total (wall) | total (CPU) | "
        f"steps alone (wall) | ms/step (wall) | load average after | decisions |\n"
        f"| --- | --- | --- | --- | --- | --- | --- | --- |\n{rows}\n")


if __name__ == "__main__":
    main()
