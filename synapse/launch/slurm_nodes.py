"""One pipeline over the nodes of one Slurm job (``hydra/launcher=slurm_nodes``), its decider on the batch host.

The job's batch script runs on the batch host (the allocation's first node). It starts the decider
there as a process of its own (``trainer.role=decider``: the run's store and the decider, no device,
outside any job step) and then one agent per node as the job step (``srun``, ``trainer.role=agent``,
the batch host's node included). Both run the very job submitit pickled for the sweep point: the
decider loads it here (``main``) and only its environment differs (``NODE_ROLE``).

Why this shape: a GPU node lost, node 0's included, is then an ordinary DEGRADE, since the decider and
the store do not die with it; Slurm must not end the allocation when that node fails (``--no-kill`` for
the job, ``SLURM_NO_KILL`` for the step). Losing the batch host loses the decider's launcher and the
store: ``--requeue`` puts the job back in the queue, and the ``resume=auto`` every process of the job
runs with continues it from the newest checkpoint.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The decider's process reads its role from here; the batch shell never exports it, so the agents (the
# job step inherits the batch shell's environment) stay agents.
NODE_ROLE = "SYNAPSE_NODE_ROLE"
# The run's store: the batch host's address and a port; exported by the batch script for the step.
DECIDER_ENDPOINT = "SYNAPSE_DECIDER_ENDPOINT"
# Optional, set before sbatch: the network interface the store binds (its IPv4 address), e.g. ib0.
# Unset: the batch host's name, which every node resolves (the store then listens on every interface).
DECIDER_INTERFACE = "SYNAPSE_DECIDER_INTERFACE"
DECIDER_PORT = 29500  # the store's port; SYNAPSE_DECIDER_PORT set before sbatch chooses another

# What every process of the job runs with, besides the sweep point's own overrides. The job sets them
# itself, so a user who names one would be overridden silently: refused instead (``node_overrides``).
JOB_SETTINGS = {
    "trainer.role": f"${{oc.env:{NODE_ROLE},agent}}",
    "trainer.node_rank": "${oc.env:SLURM_NODEID,0}",
    "trainer.rdzv_endpoint": f"${{oc.env:{DECIDER_ENDPOINT}}}",
}


class SlurmNodesSettingError(ValueError):
    """A sweep point names a setting the slurm_nodes launcher sets itself."""


def node_overrides(overrides: Sequence[str]) -> list[str]:
    """``overrides`` (one sweep point's) plus what puts each process of the job in its place, and
    ``resume=auto`` unless the point chose how to resume (a requeued job must continue, not restart)."""
    named = {override.split("=", 1)[0].lstrip("+~") for override in overrides}
    taken = sorted(named & set(JOB_SETTINGS))
    if taken:
        raise SlurmNodesSettingError(
            f"hydra/launcher=slurm_nodes sets {', '.join(taken)} itself (the decider on the batch host, one agent "
            f"per node, the store at the batch host's address). Fix: leave {', '.join(taken)} out of the command "
            f"(to bind the store to one interface, export {DECIDER_INTERFACE}=<name> before submitting)")
    resume = [] if "resume" in named else ["resume=auto"]
    return [*overrides, *(f"{key}={value}" for key, value in JOB_SETTINGS.items()), *resume]


def batch_script_lines(python: str, submitit_folder: str) -> tuple[list[str], list[str]]:
    """The batch script's lines before the job step (submitit's ``setup``) and after it (``teardown``):
    keep the job and its step when a node fails, publish the store's address, start the decider."""
    interface = f"${{{DECIDER_INTERFACE}}}"
    address = (f'$(if [ -n "{interface}" ]; then ip -4 -o addr show dev "{interface}" | '
               f"awk '{{split($4, a, \"/\"); print a[1]; exit}}'; else hostname; fi)")
    decider = " ".join([shlex.quote(python), "-u", "-m", __name__, shlex.quote(submitit_folder)])
    setup = [
        "export SLURM_NO_KILL=1  # the job step (srun) too keeps running when a node fails",
        f"export {DECIDER_ENDPOINT}={address}:${{SYNAPSE_DECIDER_PORT:-{DECIDER_PORT}}}",
        f"{decider} &  # the decider on the batch host, outside the job step",
        "SYNAPSE_DECIDER_PID=$!",
    ]
    teardown = ["wait $SYNAPSE_DECIDER_PID  # it leaves once every agent acknowledged the end"]
    return setup, teardown


def main(argv: Sequence[str] | None = None) -> int:
    """The batch host's decider: run the job submitit pickled for this Slurm job, as ``trainer.role=decider``.
    Its lines go to ``<submitit folder>/<job id>_decider_log.out``; submitit's own result file stays the
    job step's (task 0's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(f"usage: python -m {__name__} <submitit folder>", file=sys.stderr)
        return 2
    os.environ[NODE_ROLE] = "decider"
    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
    os.environ["SUBMITIT_FOLDER"] = args[0]
    for variable in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"):  # the batch step is task 0 of node 0
        os.environ.setdefault(variable, "0")
    from submitit import JobEnvironment
    from submitit.core.utils import DelayedSubmission

    environment = JobEnvironment()
    paths = environment.paths
    paths.folder.mkdir(parents=True, exist_ok=True)
    _write_to(paths.folder / f"{environment.job_id}_decider_log.out")
    deadline = time.monotonic() + 60.0  # submitit moves the pickle into place once sbatch has answered
    while not paths.submitted_pickle.exists():
        if time.monotonic() > deadline:
            print(f"slurm_nodes: no job at {paths.submitted_pickle} after 60 s; the decider cannot start",
                  file=sys.stderr)
            return 1
        time.sleep(1.0)
    returned: Any = DelayedSubmission.load(paths.submitted_pickle).result()
    status = getattr(returned, "status", None)
    return 1 if status is not None and status.name == "FAILED" else 0


def _write_to(path: Path) -> None:
    """This process's stdout and stderr (and its children's) appended to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)


if __name__ == "__main__":
    sys.exit(main())
