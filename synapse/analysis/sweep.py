"""``load_sweep(dir)``: a Hydra multirun directory as one row per job.

``python train.py -m data.batch_size=16,32 policy=keep,degrade`` writes
``<sweep>/multirun.yaml`` and one run directory per job, ``<sweep>/<n>/``, whose
``.hydra/overrides.yaml`` lists the job's overrides. Each override becomes a column named by
its key (``data.batch_size``, ``policy``; values as numbers where they are numbers), next to
friendly columns read from the job's config (``batch_size``, ``policy``, ``injection``,
``slowdown``) and the outcome of the job (wall time, time lost, recovery, accuracy, ...).

``scenario`` names what the job ran apart from its policy and its seed: the overrides that differ
between jobs, policy and seed ones left out. Jobs with the same scenario are the same experiment
under different policies (compared by ``counterfactual.policy_regret``), repeated over seeds.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from synapse.analysis import files
from synapse.analysis.load import Run, load_run
from synapse.rundir import HYDRA_OVERRIDES, MULTIRUN

POLICY_KEYS = ("policy",)  # override keys (and their sub-keys) that choose the policy
REPEAT_KEYS = ("seed",)  # override keys that repeat a scenario (same experiment, other random draws)
JOB_COLUMNS = ["job", "path", "status", "batch_size", "policy", "seed", "injection", "slowdown", "scenario",
               "wall_time_s",
               "steps", "total_steps", "segments", "restarts", "decisions", "decisions_logged", "time_lost_s",
               "slow_steps_s", "restart_downtime_s", "recovery_s", "final_top1", "images_per_s"]


def job_dirs(sweep_dir: str | Path) -> list[Path]:
    """The job folders of a sweep (``0``, ``1``, ...) in job order; SweepDirError if there are none."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise SweepDirError(f"sweep directory {root} does not exist. Fix: pass hydra.sweep.dir of the multirun "
                            f"(e.g. outputs/multirun/<date>/<time>)")
    jobs = sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not jobs:
        hint = (" It is one run: use load_run." if files.is_run_dir(root)
                else f" Fix: pass the folder that holds {MULTIRUN.template} and the job folders 0, 1, ...")
        raise SweepDirError(f"{root} is not a sweep directory: it has no numbered job folders.{hint}")
    return jobs


def load_sweep(sweep_dir: str | Path) -> pd.DataFrame:
    """One row per job of a multirun: its overrides as columns, its outcome, its scenario.

    A job that wrote nothing usable keeps its row with ``status`` saying why. The override
    keys are in ``frame.attrs["overrides"]``.
    """
    rows, keys = [], []
    for job in job_dirs(sweep_dir):
        overrides = job_overrides(job)
        keys += [k for k in overrides if k not in keys]
        rows.append({**overrides, **job_outcome(job)})  # the config's names win over override text
    df = pd.DataFrame.from_records(rows)
    df["scenario"] = scenario_labels([{k: r.get(k) for k in keys} for r in rows])
    df = df[[*JOB_COLUMNS, *[k for k in keys if k not in JOB_COLUMNS]]]
    df.attrs["overrides"] = keys
    return df


SweepDirError = files.SweepDirError


def job_overrides(job: Path) -> dict[str, Any]:
    """``{key: value}`` of the job's ``.hydra/overrides.yaml`` ({} if it has none)."""
    listed = files.read_yaml(HYDRA_OVERRIDES.path(job)) or []
    if not isinstance(listed, list):
        raise files.RecordFileError(f"{HYDRA_OVERRIDES.path(job)} must be a list of overrides, got {listed!r}")
    overrides = {}
    for item in listed:
        key, _, value = str(item).partition("=")
        overrides[key.lstrip("+~")] = override_value(value)
    return overrides


def override_value(text: str) -> Any:
    """An override's value as a number or boolean where it is one (``16`` -> 16), else the text."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def scenario_labels(overrides: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per job, the overrides that differ between jobs, without the policy and seed ones ("all" if none differ)."""
    keys = {k for o in overrides for k in o}
    varying = sorted(k for k in keys if not _is_policy_key(k) and k not in REPEAT_KEYS
                     and len({repr(o.get(k)) for o in overrides}) > 1)
    return [", ".join(f"{k}={o.get(k)}" for k in varying) or "all" for o in overrides]


def _is_policy_key(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in POLICY_KEYS)


def job_outcome(job: Path) -> dict[str, Any]:
    """The friendly columns of one job; ``status`` says 'finished', 'incomplete', 'failed: <its error>'
    or why it is unreadable."""
    try:
        run = load_run(job)
    except files.AnalysisError as exc:
        return {"job": int(job.name), "path": str(job), "status": f"unreadable: {exc}"}
    outcome = {"job": int(job.name), "path": str(job), **run_outcome(run)}
    failed = run.events[run.events["event"] == "run_failed"] if "event" in run.events else run.events.iloc[:0]
    if outcome["status"] != "finished" and len(failed):  # the error that ended it (synapse.app records it)
        outcome["status"] = f"failed: {failed['error'].iloc[-1]}"
    return outcome


def failed_jobs(sweep_dir: str | Path) -> list[tuple[int, str]]:
    """(job, error) of each job of a sweep that ended in an error."""
    outcomes = (job_outcome(job) for job in job_dirs(sweep_dir))
    return [(o["job"], o["status"].removeprefix("failed: ")) for o in outcomes if str(o["status"]).startswith("failed")]


def run_outcome(run: Run) -> dict[str, Any]:
    """What one run cost and achieved, in the sweep table's columns."""
    summary, config = run.summary, run.config
    lost = summary.get("time_lost_s") or {}
    steps = summary.get("steps", run.run_summary.get("steps"))
    total = summary.get("total_steps", run.run_summary.get("total_steps"))
    return {
        "status": "finished" if steps is not None and total is not None and steps >= total else "incomplete",
        "batch_size": _get(config, "data", "batch_size"), "policy": _get(config, "policy", "name"),
        "seed": _get(config, "seed"),
        "injection": _get(config, "injection", "name"),
        "slowdown": describe_faults(_get(config, "injection", "faults") or []),
        "wall_time_s": run.wall_time_s, "steps": steps, "total_steps": total,
        "segments": max(1, len(run.segments)), "restarts": len(run.restarts),
        "decisions": len(summary.get("decisions") or []),
        "decisions_logged": int(run.decisions["decision"].nunique()),
        "time_lost_s": lost.get("total_s", 0.0 if run.has_failover else math.nan),
        "slow_steps_s": lost.get("slow_steps_s", math.nan),
        "restart_downtime_s": lost.get("restart_downtime_s", math.nan),
        "recovery_s": float(run.restarts["recovery_s"].sum()),
        "final_top1": final_top1(run),
        "images_per_s": float(run.steps["images_per_s"].median()) if len(run.steps) else math.nan,
    }


def final_top1(run: Run) -> float:
    for final in (run.summary.get("final_eval"), run.run_summary.get("final_eval")):
        if final and "student_top1" in final:
            return float(final["student_top1"])
    return float(run.evals["student_top1"].iloc[-1]) if len(run.evals) else math.nan


def describe_faults(faults: Sequence[Mapping[str, Any]]) -> str:
    """A short name for an injection: 'slow_compute r2@12 x4' per fault ('..., 10 on/10 off' for an
    intermittent one), '+' between, 'none'."""
    parts = []
    for fault in faults:
        text = f"{fault.get('kind', 'fault')} r{fault.get('rank', '?')}@{fault.get('start', '?')}"
        if fault.get("end") is not None:
            text += f"-{fault['end']}"
        if fault.get("factor") is not None:
            text += f" x{fault['factor']:g}"
        if fault.get("on_steps"):
            text += f" intermittent {fault['on_steps']} on/{fault.get('off_steps', '?')} off"
        parts.append(text)
    return " + ".join(parts) or "none"


def _get(mapping: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, Mapping) or key not in mapping:
            return None
        mapping = mapping[key]
    return mapping
