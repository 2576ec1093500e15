# python experiments/bench_recovery_nodes.py [--repeats 3] [--cases one_node,two_nodes,node_lost]
"""Recovery time (failure -> end of the first step after it) on one node vs across two nodes.

The same 4 CPU ranks of the same job, micro models, even split, checkpoint.every=4:

* ``one_node``: one ``train.py``, ``trainer.devices=4``; rank 2 SIGKILLed in its backward pass of step 8.
* ``two_nodes``: two ``train.py`` launchers on this machine as 2 nodes x 2 ranks (node 0 the decider,
  node 1 an agent); the same rank 2, node 1's first, killed at the same step: DEGRADE to 3 ranks
  over both nodes.
* ``node_lost``: the two-node run, but all of node 1 (agent, fork server, workers) SIGKILLed after
  step 6: DEGRADE to node 0's 2 ranks once node 1 has been silent for failover.node_timeout_s=3.

recovery_s comes from each run's experiment_summary.json (the supervisor measures it from the
moment it learnt of the failure to the end of the first step on the new segment), with its measured
parts; failure_to_step_s starts at the failure itself: the kill's ``fault_injected`` event, or for a
lost node its last beat (the ``node_lost`` event's time less ``silent_s``), so it includes the time
to notice (for node_lost, failover.node_timeout_s). ``--recompute DIR`` rebuilds the table from the
run directories a previous invocation left in DIR.
On one machine the "nodes" share its cores and loopback: this measures the protocol's cost
(orders, reports, a rendezvous per stage across two agents), not a network.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import REPO, machine_load, markdown_table, read_jsonl, spread, write_results

RESULTS = REPO / "experiments" / "results"
STEPS, KILL_STEP = 16, 8
COMMON = ["trainer=cpu", "partition=even", "injection=none", "trainer.accelerator=cpu", "trainer.threads=1",
          "trainer.progress=false", f"trainer.max_steps={STEPS}", "data.batch_size=16", "data.augment=false",
          "pipeline.microbatches=4", "teacher=resnet_micro", "student=resnet_micro", "checkpoint.every=4",
          "report=false", "logger=none"]
KILL = [f"injection.faults=[{{kind:kill,rank:2,step:{KILL_STEP},phase:backward}}]"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(run_dir: Path, extra: list[str], node: int | None = None, port: int = 0) -> subprocess.Popen:
    nodes = [] if node is None else ["trainer.devices=2", "trainer.nodes=2", f"trainer.node_rank={node}",
                                     f"trainer.rdzv_endpoint=127.0.0.1:{port}"]
    command = [sys.executable, "train.py", *COMMON, f"run_dir={run_dir}", *extra, *nodes]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def last_step(run_dir: Path) -> int:
    path = run_dir / "performance.jsonl"
    return max((r["step"] for r in read_jsonl(path)), default=0) if path.is_file() else 0


def run_case(case: str, run_dir: Path, shared: list[str]) -> dict:
    if case == "one_node":
        procs = [start(run_dir, [*shared, "trainer.devices=4", *KILL])]
    else:
        port = free_port()
        extra = [*shared, *(KILL if case == "two_nodes" else ["failover.node_timeout_s=3"])]
        procs = [start(run_dir, extra, node, port) for node in (0, 1)]
        if case == "node_lost":
            while last_step(run_dir) < 6:
                if procs[0].poll() is not None:
                    raise RuntimeError(f"node 0 ended before step 6: {procs[0].communicate()[0][-2000:]}")
                time.sleep(0.02)
            os.killpg(procs[1].pid, signal.SIGKILL)
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    if procs[0].returncode != 0:
        raise RuntimeError(f"{case} failed:\n{outputs[0][-3000:]}")
    return measured(run_dir)


def measured(run_dir: Path) -> dict:
    restart = json.loads((run_dir / "experiment_summary.json").read_text())["restarts"][0]
    events = read_jsonl(run_dir / "failover_events.jsonl")
    first_step_at = restart["trigger_time"] + restart["recovery_s"]
    lost = [e for e in events if e["event"] == "node_lost"]
    killed = [e for e in events if e["event"] == "fault_injected"]
    failed_at = lost[0]["time"] - lost[0]["silent_s"] if lost else killed[0]["time"]
    return {"recovery_s": restart["recovery_s"], "failure_to_step_s": first_step_at - failed_at,
            "components": restart["components"], "action": restart["action"], "cause": restart["cause"],
            "trigger_step": restart["trigger_step"], "resume_step": restart["resume_step"], "run_dir": str(run_dir)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default="one_node,two_nodes,node_lost")
    parser.add_argument("--out", default=str(RESULTS / "recovery_nodes_cpu.json"))
    parser.add_argument("--recompute", default=None, help="a work directory of an earlier invocation")
    args = parser.parse_args()
    cases = args.cases.split(",")
    if args.recompute:
        work = Path(args.recompute)
        runs = {case: [measured(work / f"{case}_{i}") for i in range(args.repeats)] for case in cases}
        report(args, cases, runs, json.loads(Path(args.out).read_text())["load_before"])
        return
    work = Path(tempfile.mkdtemp(prefix="bench_recovery_nodes_"))
    import torch  # a random teacher: recovery does not depend on what the teacher knows

    from synapse.models import build_model

    torch.manual_seed(0)
    torch.save(build_model("resnet_micro", 10, 1, 32).state_dict(), work / "teacher.pt")
    shared = [f"teacher.checkpoint={work / 'teacher.pt'}", f"cache_dir={work / 'cache'}"]
    load_before = machine_load()
    runs: dict[str, list[dict]] = {case: [] for case in cases}
    for repeat in range(args.repeats):  # interleaved, so a change in the machine's load hits every case
        for case in cases:
            runs[case].append(run_case(case, work / f"{case}_{repeat}", shared))
            print(case, repeat, f"{runs[case][-1]['recovery_s']:.2f} s", flush=True)
    report(args, cases, runs, load_before)


def report(args, cases: list[str], runs: dict[str, list[dict]], load_before: dict) -> None:
    parts = ("teardown_s", "launch_s", "checkpoint_load_s", "warmup_s")
    rows = []
    for case in cases:
        row = [case, runs[case][0]["action"], spread([r["failure_to_step_s"] for r in runs[case]]),
               spread([r["recovery_s"] for r in runs[case]])]
        row += [spread([r["components"].get(p, 0.0) for r in runs[case]]) for p in parts]
        rows.append(row)
    result = {"what": "Recovery time, one node vs two nodes (CPU, 4 ranks, a kill or a lost node)",
              "command": "python experiments/bench_recovery_nodes.py " + " ".join(sys.argv[1:]),
              "repeats": args.repeats, "steps": STEPS, "kill_step": KILL_STEP, "runs": runs,
              "load_before": load_before, "load_after": machine_load()}
    table = markdown_table(["case", "action", "failure -> first step s", "recovery_s (supervisor)",
                            *parts], rows)
    table += ("\nEach cell: median (min-max) over the runs, seconds. recovery_s starts when the supervisor "
              "learnt of the failure; failure -> first step starts at the failure itself.\n")
    write_results(Path(args.out), result, table, runs_note=f"n={args.repeats} per case, interleaved; ")
    print(table)


if __name__ == "__main__":
    main()
