"""Counterfactuals: what each decision predicted for every option, and how it turned out.

Per run: every logged decision's predicted ETA (time to finish the remaining steps) for each
option, and, once the run is over, the error of the chosen option's prediction against the
*realised* remaining time: from the decision to the end of the last optimizer step. Only the
chosen path is ever realised; the others stay predictions. A decision followed by a later
action (``later_actions`` > 0) did not decide the rest of the run alone, so its error also
holds the later decisions' effects.

Per sweep: jobs that ran the same scenario under different policies (``load_sweep``'s
``scenario``), each policy's realised regret against the best policy of that scenario.
"""
from __future__ import annotations

import math

import pandas as pd

from synapse.analysis.files import AnalysisError
from synapse.analysis.load import Run

OPTION_ORDER = ("keep", "replan", "degrade", "replace")
OUTCOME_COLUMNS = ["decision", "step", "elapsed_s", "action", "reason", "predicted_eta_s", "realised_remaining_s",
                   "error_s", "error_frac", "later_actions"]
REGRET_COLUMNS = ["scenario", "policy", "jobs", "value", "best_policy", "best_value", "regret_s", "regret_frac",
                  "regret_min_s", "regret_max_s"]


def option_etas(run: Run) -> pd.DataFrame:
    """One row per decision, one ``eta_<option>_s`` column per option (NaN where not offered)."""
    d = run.decisions
    if d.empty:
        return pd.DataFrame(columns=["decision", "step", "action"])
    wide = d.pivot_table(index=["decision", "step", "action"], columns="option", values="eta_s", aggfunc="first")
    kinds = [k for k in OPTION_ORDER if k in wide.columns] + [k for k in wide.columns if k not in OPTION_ORDER]
    wide = wide[kinds].rename(columns=lambda kind: f"eta_{kind}_s")
    wide.columns.name = None
    return wide.reset_index()


def decision_outcomes(run: Run) -> pd.DataFrame:
    """Per logged decision: the chosen option's predicted ETA vs the realised remaining time.

    ``error_s`` = predicted - realised (negative: the run took longer than predicted);
    ``error_frac`` = error_s / realised.
    """
    d = run.decisions
    chosen = d[d["chosen"].astype(bool)].drop_duplicates("decision") if len(d) else d
    rows = []
    acting = chosen.loc[chosen["action"] != "keep", "decision"].tolist()
    for record in chosen.to_dict("records"):
        # a decision taken on the last step's record is logged after it: nothing was left to run
        realised = max(0.0, run.end_time - record["time"])
        error = record["eta_s"] - realised
        rows.append({"decision": record["decision"], "step": record["step"], "elapsed_s": record.get("elapsed_s"),
                     "action": record["action"], "reason": record["reason"], "predicted_eta_s": record["eta_s"],
                     "realised_remaining_s": realised, "error_s": error,
                     "error_frac": error / realised if realised and not math.isnan(realised) else math.nan,
                     "later_actions": sum(1 for a in acting if a > record["decision"])})
    return pd.DataFrame(rows, columns=OUTCOME_COLUMNS)


def policy_regret(sweep: pd.DataFrame, metric: str = "wall_time_s") -> pd.DataFrame:
    """Per scenario run under two or more policies: each policy's ``metric`` (mean over its jobs,
    e.g. repeats over seeds), the best policy's, and the regret (how much more this policy's run took
    than the best's on average); ``regret_min_s``/``regret_max_s``: the spread of its single jobs'
    regret against the best policy's mean (equal to ``regret_s`` for a single job)."""
    for column in ("scenario", "policy", metric):
        if column not in sweep.columns:
            raise AnalysisError(f"policy_regret needs a {column!r} column; got {list(sweep.columns)}. Fix: pass the "
                                f"frame of load_sweep(<sweep dir>)")
    usable = sweep.dropna(subset=[metric, "policy"])
    per_policy = (usable.groupby(["scenario", "policy"], sort=True)[metric].agg(["mean", "size", "min", "max"])
                  .rename(columns={"mean": "value", "size": "jobs"}).reset_index())
    rows = []
    for _scenario, group in per_policy.groupby("scenario", sort=True):
        if group["policy"].nunique() < 2:
            continue  # nothing to compare with
        best = group.loc[group["value"].idxmin()]
        for record in group.to_dict("records"):
            regret = record["value"] - best["value"]
            low, high = record.pop("min") - best["value"], record.pop("max") - best["value"]
            rows.append({**record, "best_policy": best["policy"], "best_value": best["value"], "regret_s": regret,
                         "regret_frac": regret / best["value"] if best["value"] else math.nan,
                         "regret_min_s": low, "regret_max_s": high})
    return pd.DataFrame(rows, columns=REGRET_COLUMNS)
