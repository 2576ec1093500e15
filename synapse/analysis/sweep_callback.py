"""A Hydra callback that writes a multirun's sweep report when the sweep ends, and says where.

Wired in ``conf/config.yaml`` (``hydra.callbacks.sweep_report``), so every
``python train.py -m ...`` ends with ``<sweep dir>/report/report.md`` (jobs table, policy
comparison, regret, figures) instead of leaving the reader to run
``python -m synapse.analysis report <sweep dir>`` by hand. A report that cannot be drawn is
said, never a failed sweep: the jobs and their records are complete. Jobs that failed (each
recorded by synapse.app with its error) are listed at the end, and the sweep exits 1.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from synapse.analysis.files import AnalysisError
from synapse.analysis.report import write_report
from synapse.analysis.sweep import failed_jobs, job_dirs
from synapse.rundir import LOG


class SweepReport(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            print(f"sweep report: {write_report(sweep_dir)}", flush=True)
        except Exception as exc:  # noqa: BLE001  (any plotting or reading error; the jobs are done)
            print(f"sweep report: not written ({type(exc).__name__}: {exc}); the jobs' records are in {sweep_dir}. "
                  f"Retry with: python -m synapse.analysis report {sweep_dir}", file=sys.stderr, flush=True)
        try:
            failed = failed_jobs(sweep_dir)
        except AnalysisError:
            return  # no job folder at all: nothing ran, and Hydra said why
        if failed:
            # every job ran; the exit status still says that some failed (Hydra's sweeper would have raised)
            listed = "; ".join(f"job {job}: {error[:300]}" for job, error in failed)
            print(f"sweep: {len(failed)} of {len(job_dirs(sweep_dir))} jobs failed ({listed}); every other job ran to "
                  f"its end. Each failed job's error is in the report's job table and in its folder's {LOG.template}",
                  file=sys.stderr, flush=True)
            raise SystemExit(1)  # Hydra lets a SystemExit through its callbacks (other exceptions become warnings)
