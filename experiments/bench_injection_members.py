# python experiments/bench_injection_members.py [--members slow_compute,...] [--policies keep,eta]
"""Every shipped injection member, run with its own documented command: detected where and when,
what the policy decided, and the time saved against policy=keep (issue #15).

For each ``conf/injection/<member>.yaml`` with a slowdown, the command is the ``python train.py``
line of the file's header, as a user would copy it, plus ``policy=<p>`` (and no progress bar or
report). Expected: the first detection names the fault's rank and kind (compute for
``slow_compute``/``background_load``, comm for ``slow_comm``) within 10 steps of its start.

Time saved is compared on the **training span**: from the start of the first step to the end of
the last (``performance.jsonl``; restarts and live re-plans inside it count), not the process's
wall time, whose start-up and shutdown (imports, spawning ranks, the final report) no policy
changes and which, on a loaded 2-core machine, varied by 7-8 s between two runs of the same
command. ``--repeats`` runs each member's policies interleaved (keep, eta, keep, eta, ...) so that
a change in the machine's load hits both; the table gives the median with the min-max spread,
and a saving inside the spread is a tie.
"""
from __future__ import annotations

import argparse
import re
import shlex
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import (
    REPO,
    machine_load,
    markdown_table,
    read_events,
    read_jsonl,
    spread,
    train_py_summary,
    write_results,
)

from synapse.conf import CONF_DIR
from synapse.detection import DetectorConfig, SlowdownDetector, StepTiming

INJECTION_DIR = Path(CONF_DIR) / "injection"

MEMBERS = ("slow_compute", "intermittent", "slow_ramp", "slow_comm", "background_load", "cascade", "demo")
SLOW_KINDS = {"slow_compute": "compute", "background_load": "compute", "slow_comm": "comm"}
RUN_TIMEOUT_S = 1200.0


def documented_overrides(member: str) -> tuple[str, list[str]]:
    """The member's documented command (its first '#   python train.py ...' line) as overrides."""
    text = (INJECTION_DIR / f"{member}.yaml").read_text()
    line = next(m.group(1) for m in re.finditer(r"^#\s+(python train\.py.*?)\s*(?:#.*)?$", text, re.MULTILINE))
    overrides = shlex.split(line)[2:]
    if not any(o.startswith("injection=") for o in overrides):
        overrides.append(f"injection={member}")  # the demo's command is plain `python train.py`
    return line, overrides


def first_slowdown_fault(member: str) -> dict:
    faults = yaml.safe_load((INJECTION_DIR / f"{member}.yaml").read_text())["faults"]
    fault = min((f for f in faults if f["kind"] in SLOW_KINDS), key=lambda f: f["start"])
    return {"rank": fault["rank"], "kind": SLOW_KINDS[fault["kind"]], "start": fault["start"]}


def run_member(member: str, policy: str, run_dir: Path) -> dict:
    command, overrides = documented_overrides(member)
    summary, process_s = train_py_summary(run_dir, [*overrides, f"policy={policy}", "trainer.progress=false",
                                                    "report=false"], RUN_TIMEOUT_S)
    expected = first_slowdown_fault(member)
    detections = [{k: d[k] for k in ("rank", "kind", "ratio", "onset_step", "detected_step")}
                  for d in read_events(run_dir, "slowdown_detected")]
    first = detections[0] if detections else None
    return {"member": member, "policy": policy, "command": command, "expected": expected,
            "wall_time_s": summary["wall_time_s"], "process_s": process_s, "steps": summary.get("steps"),
            "training_span_s": training_span_s(run_dir),
            "detections": detections,
            "right_rank_in_10": bool(first and first["rank"] == expected["rank"] and first["kind"] == expected["kind"]
                                     and first["detected_step"] - expected["start"] <= 10),
            "decisions": [{k: d.get(k) for k in ("step", "action", "reason")} for d in summary["decisions"]],
            "controller_errors": len(read_events(run_dir, "controller_error")),
            "median_only_first_detection": median_only_first_detection(run_dir)}


def median_only_first_detection(run_dir: Path) -> dict | None:
    """What the detector would have found first on this run's own steps judging the window median
    alone (``failover.detector.trend=false``): the launch's steps before any action, replayed with
    the run's detector settings (without the plan's expected times, which only matter from the start)."""
    settings = yaml.safe_load((run_dir / "config.yaml").read_text())["failover"]["detector"]
    detector = SlowdownDetector(DetectorConfig(**{**settings, "trend": False}))
    records = [r for r in read_jsonl(run_dir / "performance.jsonl") if "step_seconds" in r]
    for record in records:
        if record.get("segment", 0) != records[0].get("segment", 0):
            return None
        for event in detector.update(StepTiming.from_dict(record)):
            if event.event == "slowdown":
                return {"rank": event.rank, "kind": event.kind, "ratio": event.ratio,
                        "detected_step": event.detected_step}
    return None


def training_span_s(run_dir: Path) -> float:
    """Seconds from the start of the run's first step to the end of its last (all segments)."""
    steps = [r for r in read_jsonl(run_dir / "performance.jsonl") if "step_seconds" in r]
    return steps[-1]["time"] - (steps[0]["time"] - steps[0]["step_seconds"])


def saving(keep: list[float], eta: list[float]) -> str:
    """Median saving; a tie when the medians differ by less than the runs' own spread."""
    saved = statistics.median(keep) - statistics.median(eta)
    noise = max(max(keep) - min(keep), max(eta) - min(eta)) if len(keep) > 1 and len(eta) > 1 else 0.0
    return f"{saved:+.1f} s" + (" (tie: inside the spread)" if abs(saved) <= noise else "")


def table(runs: list[dict], policies: list[str]) -> str:
    by: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        by.setdefault((r["member"], r["policy"]), []).append(r)
    rows = []
    for member in dict.fromkeys(r["member"] for r in runs):
        keeps, etas = by.get((member, "keep"), []), by.get((member, "eta"), [])
        keep, eta = (keeps or [None])[0], (etas or [None])[0]
        ref = keep or eta  # detection as seen without any action changing the pipeline
        first = ref["detections"][0] if ref["detections"] else None
        expected = ref["expected"]
        seen = (f"step {first['detected_step']} (rank {first['rank']} {first['kind']}, {first['ratio']:.1f}x)"
                if first else "not detected")
        alone = ref.get("median_only_first_detection")
        seen += (f"; median alone: step {alone['detected_step']} (rank {alone['rank']})" if alone
                 else "; median alone: -")
        decided = ", ".join(f"{d['action']}@{d['step']}" for d in eta["decisions"]) if eta else "-"
        spans = [[r["training_span_s"] for r in group] for group in (keeps, etas)]
        saved = saving(*spans) if keep and eta else "-"
        walls = f"{spread(spans[0], 1)} / {spread(spans[1], 1)} s" if keep and eta else "-"
        rows.append([member, f"rank {expected['rank']} {expected['kind']} from step {expected['start']}", seen,
                     "yes" if ref["right_rank_in_10"] else "no", decided or "keep", f"{len(keeps)} / {len(etas)}",
                     walls, saved])
    return markdown_table(["member", "fault", "first detection (first keep run)", "right rank, <= 10 steps",
                           "eta decisions (first eta run)", "runs", "training span keep / eta, median (min-max)",
                           "saved vs keep"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", default=",".join(MEMBERS))
    parser.add_argument("--policies", default="keep,eta")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "injection_members_cpu.json")
    parser.add_argument("--repeats", type=int, default=1, help="runs per member and policy, interleaved")
    args = parser.parse_args()
    members, policies = args.members.split(","), args.policies.split(",")
    load_before, started, runs = machine_load(), time.time(), []
    with tempfile.TemporaryDirectory() as tmp:
        for member in members:
            for repeat in range(args.repeats):
                for policy in policies:
                    run = run_member(member, policy, Path(tmp) / f"{member}_{policy}_{repeat}")
                    runs.append(run)
                    print(f"{member:16s} {policy:5s} span {run['training_span_s']:6.1f} s"
                          f" wall {run['wall_time_s']:6.1f} s  first detection {run['detections'][:1]}"
                          f" (median alone: {run['median_only_first_detection']})"
                          f"  decisions {run['decisions']}", flush=True)
    result = {"what": "Shipped injection members, each with its documented command: detection, decision, "
                      "time saved vs policy=keep (CPU)",
              "command": "python experiments/bench_injection_members.py", "load_before": load_before,
              "load_after": machine_load(), "seconds": time.time() - started, "runs": runs}
    write_results(args.out, result, table(runs, policies),
                  runs_note=f"{args.repeats} run(s) per member and policy, interleaved (a shared machine: see the "
                            f"load); ")


if __name__ == "__main__":
    main()
