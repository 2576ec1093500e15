# python experiments/bench_torchft_replicas.py --repeats 3
# python experiments/bench_torchft_replicas.py --repeats 3 --stages 2     # replicas that are pipelines (2 x 2)
"""A replica lost and back through ``train.py``: ``failover.replica_engine=torchft`` against the restart path.

The run of experiments/bench_replica_engine.py's Synapse side (2 replicas of one CPU rank, the demo's models,
200 steps, rank 1 SIGKILLed at step 20, ``checkpoint.every=20`` by default... here given), once per engine and
round, interleaved. With ``--stages K`` each replica is a pipeline of K CPU ranks and the rank killed is
replica 1's last stage (rank 2K - 1):

- **torchft**: the survivor's stall on the step that met the dead peer (its ``replica_lost`` event: that step's
  time less the median step), how often that step ran (``attempts``: the steps done again are attempts - 1, each
  a part of one step), the respawned rank's heal (``replica_healed``: seconds from its start, and from the kill),
  the survivor's stall when it came back (``replica_back``, where the quorum grew after the survivor had gone on
  alone), and the whole run's wall time;
- **restart**: the supervisor's measured restart (``first_step_after_restart``: downtime and the steps redone
  since the newest checkpoint), and the wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchlib import machine_load, markdown_table, read_events, run_train_py, spread, write_results  # noqa: E402

from synapse.rundir import read_jsonl  # noqa: E402

COMMON = ["trainer.accelerator=cpu", "trainer.replicas=2", "partition=even", "trainer.progress=false",
          "checkpoint.every=20", "injection=kill_rank"]


def run_once(tmp: Path, engine: str, steps: int, kill_step: int, stages: int) -> dict:
    run_dir = tmp / f"{engine}_{time.time_ns()}"
    # one micro-batch a stage (1F1B needs at least as many as stages)
    wall = run_train_py(run_dir, [*COMMON, f"trainer.devices={2 * stages}", f"pipeline.microbatches={stages}",
                                  f"trainer.max_steps={steps}",
                                  f"injection.faults.0.step={kill_step}", f"injection.faults.0.rank={2 * stages - 1}",
                                  f"failover.replica_engine={engine}"], timeout_s=900)
    stamps = sorted(float(r["time"]) for r in read_jsonl(run_dir / "performance.jsonl"))
    step_s = statistics.median(b - a for a, b in zip(stamps, stamps[1:]))
    result = {"engine": engine, "wall_s": wall, "median_step_s": step_s}
    if engine == "restart":
        restart = next(e for e in read_events(run_dir, "first_step_after_restart") if e["action"] != "replan")
        return {**result, "stall_s": restart["downtime_s"], "redo_steps": restart["redo_steps"],
                "lost_s": restart["downtime_s"] + restart["redo_steps"] * step_s}
    lost = read_events(run_dir, "replica_lost")[0]
    killed = read_events(run_dir, "fault_injected")[0]["time"]
    healed = read_events(run_dir, "replica_healed")
    back = read_events(run_dir, "replica_back")
    return {**result, "stall_s": lost["stall_s"], "redo_steps": lost["attempts"] - 1, "lost_s": lost["stall_s"],
            "lost_step": lost["step"], "alone": lost["participants"] == 1,
            "heal_from_start_s": healed[0]["since_start_s"] if healed else None,
            "heal_from_kill_s": healed[0]["time"] - killed if healed else None,
            "healed_at": healed[0]["step"] if healed else None,
            "back_stall_s": back[0]["stall_s"] if back else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--kill-step", type=int, default=20)
    parser.add_argument("--stages", type=int, default=1, help="K: each replica a pipeline of K CPU ranks")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: experiments/results/torchft_replicas_cpu.json (K = 1), ..._cpu_2xK.json")
    args = parser.parse_args()
    layout = "" if args.stages == 1 else f"_2x{args.stages}"
    out = args.out or REPO / "experiments" / "results" / f"torchft_replicas_cpu{layout}.json"
    load_before, runs = machine_load(), []
    with tempfile.TemporaryDirectory() as tmp_name:
        for round_ in range(args.repeats):
            for engine in ("torchft", "restart"):
                result = {"round": round_, "loadavg": os.getloadavg()[0],
                          **run_once(Path(tmp_name), engine, args.steps, args.kill_step, args.stages)}
                runs.append(result)
                print(json.dumps(result), flush=True)

    def values(engine: str, key: str) -> list:
        return [r[key] for r in runs if r["engine"] == engine]
    rows = [["the survivors' stall (s)", spread(values("torchft", "stall_s")), spread(values("restart", "stall_s"))],
            ["steps done again", spread(values("torchft", "redo_steps")), spread(values("restart", "redo_steps"))],
            ["stall + steps done again (s)", spread(values("torchft", "lost_s")), spread(values("restart", "lost_s"))],
            ["the respawned rank healed, from its start (s)", spread(values("torchft", "heal_from_start_s")), "-"],
            ["the respawned rank healed, from the kill (s)", spread(values("torchft", "heal_from_kill_s")), "-"],
            ["the survivor's stall when it came back (s)", spread(values("torchft", "back_stall_s")), "-"],
            ["median step (s)", spread(values("torchft", "median_step_s")), spread(values("restart", "median_step_s"))],
            ["whole run, wall (s)", spread(values("torchft", "wall_s")), spread(values("restart", "wall_s"))]]
    result = {"what": f"A replica lost and back through train.py: torchft against the restart path (CPU ranks, "
                      f"2 x {args.stages})",
              "command": "python experiments/bench_torchft_replicas.py " + " ".join(sys.argv[1:]),
              "load_before": load_before, "load_after": machine_load(), "runs": runs}
    write_results(out, result, markdown_table(["measure", "torchft", "restart"], rows),
                  runs_note=f"{args.repeats} interleaved rounds; ")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
