# python experiments/bench_restart_cost.py [--accelerator cpu] [--out synapse/failover/priors/restart_cost_cpu.json]
"""What one restart costs, measured: checkpoint save, teardown, launch, checkpoint load, warm-up.

Runs the default models through ``train.py`` with failover drills (forced REPLAN and DEGRADE
restarts at fixed steps, no fault), reads each restart's measured parts from
failover_events.jsonl, and writes their medians in the form ``RestartCostModel.from_benchmark``
reads. The supervisor loads this file as its prior (failover.restart_cost_file, default: this
repository's result for the accelerator) and corrects it with the run's own restarts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from synapse.decision import RESTART_COMPONENTS  # noqa: E402
from synapse.rundir import read_events  # noqa: E402

DRILLS = "[{step:20,action:replan},{step:40,action:degrade},{step:60,action:replan},{step:80,action:replan}]"


def run_drills(run_dir: Path, accelerator: str, devices: str) -> list[dict]:
    command = [sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", f"trainer.accelerator={accelerator}",
               f"trainer.devices={devices}", "trainer.max_steps=100", "injection=none", "trainer.progress=false",
               f"failover.drills={DRILLS}", "failover.max_restarts=10",
               # a REPLAN is done live by default (no restart at all): this prior is what a restart costs
               "failover.replan_mode=restart",
               # the prior does not matter for drills; use the fallback so an old result cannot leak in
               "failover.restart_cost_file=null"]
    subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True)
    return read_events(run_dir / "failover_events.jsonl", "first_step_after_restart")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", default="3")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or REPO / "synapse" / "failover" / "priors" / f"restart_cost_{args.accelerator}.json"
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        restarts = run_drills(Path(tmp) / "run", args.accelerator, args.devices)
        seconds = time.time() - started
    medians = {c: statistics.median(r["components"][c] for r in restarts if c in r["components"])
               for c in RESTART_COMPONENTS}
    result = {
        "command": "python experiments/bench_restart_cost.py " + " ".join(sys.argv[1:]),
        "what": "medians over forced restarts (failover.drills) of the default models, train.py end to end",
        "accelerator": args.accelerator, "devices": args.devices, "benchmark_wall_s": seconds,
        "paths": {"restart": medians}, "prior_weight": 1.0,
        "restarts": [{"action": r["action"], "recovery_s": r["recovery_s"], **r["components"]} for r in restarts],
    }
    out.write_text(json.dumps(result, indent=1))
    total = sum(medians.values())
    print(f"{len(restarts)} restarts; median parts: " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items())
          + f"; sum {total:.2f} s -> {out}")


if __name__ == "__main__":
    main()
