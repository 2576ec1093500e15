# python experiments/bench_replica_engine.py --repeats 3 --out experiments/results/replica_engine_cpu.json
"""Which engine should carry the replica level: torchft's replica groups, or torch's DDP with
Synapse's restart from the newest checkpoint? Measured on CPU ranks, two replicas of one device each.

Three things decide it, each measured here with real processes:

- **The fault-free price.** torchft forms a quorum with its lighthouse and votes on every commit,
  each step. The same student loop (the CPU demo's student, synthetic 32x32 batches) is timed under
  torch's DDP and under torchft's DDP + OptimizerWrapper, both on gloo.
- **A replica lost.** torchft: replica 1 SIGKILLs itself after step ``--kill-step``; the survivor's
  longest step gap around it, less its median step, is the time the loss cost. Synapse: ``train.py``
  with two replicas and ``injection=kill_rank`` at the same step: the supervisor's measured recovery
  (``first_step_after_restart``: teardown, launch, checkpoint load, warm-up) and the steps it redid.
- **A replica back.** torchft: the killed replica is started again at once; it heals from its peer
  (the peer's state sent over torchft's HTTP transport) and joins the next quorum: the time from its
  start to its first committed step, and what its return cost the survivor. Synapse has no such path:
  a returning device is a spare for a later REPLACE (another restart).

The torchft workers are this file run with ``--worker``.
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
from datetime import timedelta
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchlib import machine_load, markdown_table, read_events, run_train_py, spread, write_results  # noqa: E402

from synapse.rundir import read_jsonl  # noqa: E402

STUDENT = "resnet_micro"  # the CPU demo's student
BATCH, IMAGE = 32, 32
# The lighthouse's heartbeat timeout bounds how long survivors wait for a dead replica: torchft's
# default (5 s), and a tighter one
HEARTBEAT_TIMEOUTS_MS = (5000, 1000)


# ----------------------------------------------------------------------------- the workers

def _student_and_batches(replica: int):
    import torch

    from synapse.models import build_model

    torch.manual_seed(0)  # the same initial weights in every replica
    model = build_model(STUDENT, num_classes=10, img_size=IMAGE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def batch(step: int):
        generator = torch.Generator().manual_seed(1000 * step + replica)  # each replica its own share
        return (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator),
                torch.randint(0, 10, (BATCH,), generator=generator))
    return model, optimizer, batch


def _record(path: Path, **fields) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"t": time.time(), **fields}) + "\n")


def worker_torchft(replica: int, steps: int, lighthouse: str, log: Path, kill_step: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    torch.set_num_threads(1)
    model, optimizer, batch = _student_and_batches(replica)
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)  # the replica group's own
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
        load_state_dict=lambda state: (model.load_state_dict(state["model"]),
                                       optimizer.load_state_dict(state["optimizer"])),
        state_dict=lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
        replica_id=f"replica_{replica}", store_addr="localhost", store_port=store.port, rank=0, world_size=1,
        lighthouse_addr=lighthouse, timeout=timedelta(seconds=10))
    ddp, wrapped = DistributedDataParallel(manager, model), OptimizerWrapper(manager, optimizer)
    _record(log, replica=replica, event="started")
    while manager.current_step() < steps:
        wrapped.zero_grad()  # starts the step's quorum
        x, y = batch(manager.current_step())
        F.cross_entropy(ddp(x), y).backward()
        committed = wrapped.step()  # the commit vote; a step that lost a peer is not committed
        _record(log, replica=replica, event="step", step=manager.current_step(),
                participants=manager.num_participants(), committed=bool(committed) if committed is not None else None)
        if replica == 1 and kill_step and manager.current_step() == kill_step:
            _record(log, replica=replica, event="killed")
            os.kill(os.getpid(), signal.SIGKILL)
    manager.shutdown(wait=True)
    # torchft's native threads can abort the interpreter's own teardown ("terminate called without an
    # active exception", in 1 of ~5 runs); every record is already closed on disk.
    os._exit(0)


def worker_ddp(replica: int, steps: int, port: int, log: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=replica, world_size=2)
    model, optimizer, batch = _student_and_batches(replica)
    ddp = DistributedDataParallel(model)
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        x, y = batch(step)
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        _record(log, replica=replica, event="step", step=step)
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the runs

def _spawn(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, __file__, "--worker", *args], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _read(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _step_times(records: list[dict], replica: int, skip: int = 5) -> list[float]:
    stamps = [r["t"] for r in records if r["replica"] == replica and r["event"] == "step"]
    return [b - a for a, b in zip(stamps[skip:], stamps[skip + 1:])]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_fault_free(tmp: Path, engine: str, steps: int) -> dict:
    log = tmp / f"{engine}.jsonl"
    if engine == "ddp":
        port = _free_port()
        procs = [_spawn("ddp", str(r), str(steps), str(port), str(log)) for r in (0, 1)]
    else:
        from torchft._torchft import LighthouseServer
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
        procs = [_spawn("torchft", str(r), str(steps), lighthouse.address(), str(log), "0") for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{engine} worker failed:\n{err[-2000:]}")
    if engine != "ddp":
        lighthouse.shutdown()
    times = _step_times(_read(log), 0)
    window = times[:-2]  # warm-up (first 5) and the end left out
    return {"engine": engine, "steps": steps, "median_step_s": statistics.median(window),
            "images_per_s": 2 * BATCH * len(window) / sum(window)}


def run_torchft_kill(tmp: Path, steps: int, kill_step: int, heartbeat_timeout_ms: int) -> dict:
    from torchft._torchft import LighthouseServer
    log = tmp / f"torchft_kill_{heartbeat_timeout_ms}.jsonl"
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000,
                                  heartbeat_timeout_ms=heartbeat_timeout_ms)
    survivor = _spawn("torchft", "0", str(steps), lighthouse.address(), str(log), str(kill_step))
    victim = _spawn("torchft", "1", str(steps), lighthouse.address(), str(log), str(kill_step))
    victim.wait(timeout=600)
    spawned = time.time()
    returned = _spawn("torchft", "1", str(steps), lighthouse.address(), str(log), "0")  # back at once
    for p in (survivor, returned):
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"torchft worker failed:\n{err[-2000:]}")
    lighthouse.shutdown()
    records = _read(log)
    killed = next(r["t"] for r in records if r["event"] == "killed")
    survivor_steps = [r for r in records if r["replica"] == 0 and r["event"] == "step"]
    median = statistics.median(_step_times(records, 0))
    back = [r for r in records if r["replica"] == 1 and r["event"] == "step" and r["t"] > spawned
            and r["participants"] == 2]
    if not back:
        raise RuntimeError(f"the returned replica never joined the survivor ({steps} steps were too few)")
    joined = [r for r in survivor_steps if r["step"] >= back[0]["step"] - 1]
    around = [(r["step"], r["t"] - killed, r["participants"]) for r in survivor_steps if -1.0 < r["t"] - killed < 10.0]
    return {"engine": "torchft", "kill_step": kill_step, "heartbeat_timeout_ms": heartbeat_timeout_ms,
            "median_step_s": median, "loss_stall_s": loss_stall(around, kill_step, median),
            "steps_alone": sum(r["participants"] == 1 for r in survivor_steps),
            "return_s": back[0]["t"] - spawned,  # spawned again to its first step in the quorum (healed)
            "returned_at_step": back[0]["step"],
            "join_stall_s": max(b["t"] - a["t"] for a, b in zip(joined, joined[1:4])) - median,
            "survivor_final_step": survivor_steps[-1]["step"],
            # (step, seconds since the kill, participants) of the survivor's steps: what the stall is read from
            "survivor_around_the_loss": [(step, round(t, 3), n) for step, t, n in around]}


def loss_stall(around: list, kill_step: int, median_step_s: float) -> float:
    """The survivor's step after the loss, less a normal step. Its step ``kill_step`` is committed with
    the victim's; a step whose all-reduce then meets the dead peer is recorded but not committed (its
    number does not advance), so the stall is the time from step ``kill_step`` to step ``kill_step + 1``."""
    at = {step: t for step, t, _ in reversed(around)}  # a step's first record
    done = {step: t for step, t, _ in around}  # and its last
    return at[kill_step + 1] - done[kill_step] - median_step_s


def run_synapse_kill(tmp: Path, steps: int, kill_step: int) -> dict:
    run_dir = tmp / f"synapse_{time.time_ns()}"
    wall = run_train_py(run_dir, ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.replicas=2",
                                  "partition=even", "pipeline.microbatches=1", f"trainer.max_steps={steps}",
                                  "injection=kill_rank", f"injection.faults.0.step={kill_step}",
                                  "trainer.progress=false"], timeout_s=900)
    # the kill's restart: on this loaded machine a run can also re-plan live before it (a false detection)
    restarts = [e for e in read_events(run_dir, "first_step_after_restart") if e["action"] != "replan"]
    if not restarts:
        raise RuntimeError(f"no restart after the kill recorded in {run_dir}")
    first = restarts[0]
    stamps = sorted(float(r["time"]) for r in read_jsonl(run_dir / "performance.jsonl"))
    step_s = statistics.median(b - a for a, b in zip(stamps, stamps[1:]))
    return {"engine": "synapse restart", "kill_step": kill_step, "wall_s": wall, "median_step_s": step_s,
            "recovery_s": first["recovery_s"], "downtime_s": first["downtime_s"], "redo_steps": first["redo_steps"],
            # what the loss cost: the stall, and the steps since the newest checkpoint done again
            "lost_s": first["downtime_s"] + first["redo_steps"] * step_s,
            "components": first["components"], "action": first["action"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--kill-step", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "replica_engine_cpu.json")
    args = parser.parse_args()
    load_before, runs = machine_load(), []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for round_ in range(args.repeats):  # interleaved, so a change of load touches every engine
            where = tmp / f"r{round_}"
            where.mkdir()
            plan = {"ddp": partial(run_fault_free, where, "ddp", args.steps),
                    "torchft": partial(run_fault_free, where, "torchft", args.steps),
                    **{f"torchft_kill_{ms}ms": partial(run_torchft_kill, where, args.steps, args.kill_step, ms)
                       for ms in HEARTBEAT_TIMEOUTS_MS},
                    "synapse_kill": partial(run_synapse_kill, where, args.steps, args.kill_step)}
            for name, run in plan.items():
                result = {"round": round_, "run": name, "loadavg": os.getloadavg()[0], **run()}
                runs.append(result)
                print(json.dumps(result), flush=True)

    result = {"what": "The replica level's engine: torchft against DDP with Synapse's restart (CPU ranks, 2 replicas)",
              "command": "python experiments/bench_replica_engine.py " + " ".join(sys.argv[1:]),
              "load_before": load_before, "load_after": machine_load(), "runs": runs}
    write_table(args.out, result)


def write_table(out: Path, result: dict) -> None:
    """The result's JSON and its markdown table (``--table-only``: the table again from the JSON)."""
    runs = result["runs"]

    def values(run: str, key: str) -> list[float]:
        return [r[key] for r in runs if r["run"] == run]
    overhead = [ft / ddp - 1.0 for ft, ddp in zip(values("torchft", "median_step_s"), values("ddp", "median_step_s"))]
    rows = [
        ["fault-free step, torch DDP (s)", spread(values("ddp", "median_step_s"))],
        ["fault-free step, torchft (s)", spread(values("torchft", "median_step_s"))],
        ["torchft's price per step, same round (%)", spread([100 * o for o in overhead])],
        # downtime: the gap between the last step before the loss and the first after, less a step
        ["a replica lost: Synapse's restart, the survivors' stall (s)", spread(values("synapse_kill", "downtime_s"))],
        ["a replica lost: Synapse's restart, noticed to first step (s)", spread(values("synapse_kill", "recovery_s"))],
        ["a replica lost: Synapse's restart, steps done again", spread(values("synapse_kill", "redo_steps"))],
        ["a replica lost: Synapse's restart, stall + steps done again (s)", spread(values("synapse_kill", "lost_s"))],
    ]
    for ms in HEARTBEAT_TIMEOUTS_MS:
        run = f"torchft_kill_{ms}ms"
        rows += [[f"a replica lost: torchft ({ms} ms heartbeat timeout), the survivor's stall (s)",
                  spread(values(run, "loss_stall_s"))],
                 [f"a replica back: torchft ({ms} ms), spawned to its first step in the quorum (s)",
                  spread(values(run, "return_s"))],
                 [f"a replica back: torchft ({ms} ms), the survivor's stall (s)", spread(values(run, "join_stall_s"))]]
    result["torchft_overhead"] = overhead
    write_results(out, result, markdown_table(["measure", "median (min-max, n)"], rows),
                  runs_note=f"{max(r['round'] for r in runs) + 1} interleaved rounds; ")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, replica, steps, where, log = sys.argv[2:7]
        if kind == "ddp":
            worker_ddp(int(replica), int(steps), int(where), Path(log))
        else:
            worker_torchft(int(replica), int(steps), where, Path(log), int(sys.argv[7]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--table-only":
        write_table(Path(sys.argv[2]), json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
