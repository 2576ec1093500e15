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
first hard-failure event to the end of the first step on the new stage), with its measured parts.
On one machine the "nodes" share its cores and loopback: this measures the protocol's cost
(orders, reports, a rendezvous per stage across two agents), not a network.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import REPO, machine_load, markdown_table, read_jsonl, write_results

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
    restart = json.loads((run_dir / "experiment_summary.json").read_text())["restarts"][0]
    return {"recovery_s": restart["recovery_s"], "components": restart["components"], "action": restart["action"],
            "cause": restart["cause"], "trigger_step": restart["trigger_step"], "resume_step": restart["resume_step"]}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default="one_node,two_nodes,node_lost")
    parser.add_argument("--out", default=str(RESULTS / "recovery_nodes_cpu.json"))
    args = parser.parse_args()
    cases = args.cases.split(",")
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
    parts = ("teardown_s", "launch_s", "checkpoint_load_s", "warmup_s")
    rows = []
    for case in cases:
        recovery = [r["recovery_s"] for r in runs[case]]
        row = [case, runs[case][0]["action"], spread(recovery)]
        row += [spread([r["components"].get(p, 0.0) for r in runs[case]]) for p in parts]
        rows.append(row)
    result = {"what": "Recovery time, one node vs two nodes (CPU, 4 ranks, a kill or a lost node)",
              "command": "python experiments/bench_recovery_nodes.py " + " ".join(sys.argv[1:]),
              "repeats": args.repeats, "steps": STEPS, "kill_step": KILL_STEP, "runs": runs,
              "load_before": load_before, "load_after": machine_load()}
    table = markdown_table(["case", "action", "recovery s, median (min-max)", *[f"{p} (median, min-max)" for p in parts]],
                           rows)
    write_results(Path(args.out), result, table, runs_note=f"n={args.repeats} per case, interleaved; ")
    print(table)


if __name__ == "__main__":
    main()
