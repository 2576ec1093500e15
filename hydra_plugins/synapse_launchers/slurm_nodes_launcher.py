"""``hydra/launcher=slurm_nodes``: each sweep point is one Slurm job over ``trainer.nodes`` nodes, its decider
on the batch host and one agent per node (the script's lines and the decider's entry: synapse/launch/slurm_nodes.py).

submitit's Slurm launcher writes and submits the job; this one adds what a pipeline across nodes needs:
``--no-kill`` and ``--requeue`` on the job, ``SLURM_NO_KILL`` for its step, the decider started before the
step and waited for after it, and each process's role, node rank and the store's address."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher


class SlurmNodesLauncher(SlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from synapse.launch.slurm_nodes import batch_script_lines, node_overrides

        # Built from the user's parameters as first given: a sweeper calls launch once per batch of jobs, and
        # building on the last call's params added a second decider's lines to every later job.
        users = self.__dict__.setdefault("_users_params", dict(self.params))
        setup, teardown = batch_script_lines(sys.executable, str(users["submitit_folder"]))
        self.params = {
            **users,
            "additional_parameters": {**(users.get("additional_parameters") or {}), "no_kill": True, "requeue": True},
            "setup": [*(users.get("setup") or []), *setup],
            "teardown": [*(users.get("teardown") or []), *teardown],
        }
        return super().launch([node_overrides(overrides) for overrides in job_overrides], initial_job_idx)
