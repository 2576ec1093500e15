"""A hydra/launcher=slurm_nodes job run for real, Slurm itself stood in for (issue #36, item 4).

No Slurm here, so ``tests/dist/fake_slurm`` stands in for its two commands on PATH: ``sbatch`` runs the batch
script at once with the batch host's environment, ``srun`` runs the step's one task per node, every "node" on
this machine. Everything else is the real thing: ``python train.py -m hydra/launcher=slurm_nodes`` writes the
job through submitit and submits it; the batch script starts the decider on the batch host from the job
submitit pickled (``python -m synapse.launch.slurm_nodes``), outside the step, and the step runs one agent per
node; they meet on the store at the address the script published, train, and the sweep collects the job.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from synapse.failover import read_segments
from synapse.launch import free_port
from synapse.rundir import read_events

from .helpers import BASE_OVERRIDES

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]
FAKE_SLURM = Path(__file__).parent / "fake_slurm"
STEPS = 6


@pytest.mark.slow  # three processes of train.py, each through submitit, and their workers: ~1.5-2.5 min here
@pytest.mark.long  # as the submitit sweep of test_sweeps.py: the default suite keeps the script-reading test
def test_a_slurm_nodes_job_runs_the_decider_on_the_batch_host_and_one_agent_per_node(tmp_path, teacher_file, train_py):
    sweep, jobs = tmp_path / "sweep", tmp_path / "jobs"
    result = train_py(
        ["-m", "hydra/launcher=slurm_nodes", f"hydra.sweep.dir={sweep}", "hydra.launcher.timeout_min=10",
         *BASE_OVERRIDES, f"teacher.checkpoint={teacher_file}", f"cache_dir={tmp_path}/cache",
         "trainer.devices=1", "trainer.nodes=2", f"trainer.max_steps={STEPS}", "report=false", "logger=none"],
        timeout=500, PATH=f"{FAKE_SLURM}{os.pathsep}{os.environ['PATH']}", FAKE_SLURM_JOBS=str(jobs),
        # the store on the loopback interface's address, at a free port (a user exports these before sbatch)
        SYNAPSE_DECIDER_INTERFACE="lo", SYNAPSE_DECIDER_PORT=str(free_port()))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [pid_file] = jobs.glob("*.pid")
    job, batch = pid_file.stem, int(pid_file.read_text())
    deadline = time.monotonic() + 120  # the batch script waits for its decider, which waits for the exit acks
    while Path(f"/proc/{batch}").exists():
        assert time.monotonic() < deadline, "the batch script did not end"
        time.sleep(0.2)

    logs = sweep / ".submitit" / job
    decider = (logs / f"{job}_decider_log.out").read_text()
    agents = [(logs / f"{job}_{task}_log.out").read_text() + (logs / f"{job}_{task}_log.err").read_text()
              for task in (0, 1)]
    assert "launcher: decider of epoch 1 started" in decider and "decider: nodes [0, 1] joined" in decider, decider
    assert "on local devices" not in decider, "the batch host's decider runs no worker"
    for node, output in enumerate(agents):
        assert f"agent: node {node} joined the run at 127.0.0.1:" in output and "on local devices" in output, output
        assert "decider of epoch" not in output, "the step's tasks are agents only"

    job_dir = sweep / "0"  # the sweep point's run directory, shared by the decider and both agents
    [segment] = read_segments(job_dir)
    assert (segment.outcome, segment.end_step, segment.devices) == ("finished", STEPS, [0, 1]), segment
    [started] = read_events(job_dir / "failover_events.jsonl", "decider_started")
    assert started["epoch"] == 1
    summary = json.loads((job_dir / "experiment_summary.json").read_text())
    assert summary["steps"] == STEPS, summary
