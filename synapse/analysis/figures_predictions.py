"""Figures of predictions against what happened: each decision's ETAs, and the planner's plan.

Bars and lines carry a ``gid`` (``eta_<option>``, ``realised``, ``predicted_compute``, ...)
so tests and notebooks can find the series.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from synapse.analysis.counterfactual import OPTION_ORDER, decision_outcomes
from synapse.analysis.figures import draw_markers
from synapse.analysis.load import Run
from synapse.analysis.markers import FAULT_ONSET, timeline_markers
from synapse.analysis.style import OPTION_COLORS, NoDataError, new_figure_grid, themed
from synapse.rundir import EVENTS, PLAN_VS_MEASURED

PLAN_COLORS = {"compute": "#4c72b0", "noncompute": "#a1c4e8"}


PER_ROW, MAX_ROWS = 10, 3  # decisions per panel row, and rows at most: the figure stays a page wide


def shown_decisions(decisions: pd.DataFrame, limit: int = PER_ROW * MAX_ROWS) -> pd.DataFrame:
    """At most ``limit`` decisions (one row each, by step): every acting one (the latest if even those
    are too many), then KEEPs evenly spread over the run."""
    if len(decisions) <= limit:
        return decisions
    acting = decisions[decisions["action"] != "keep"].tail(limit)
    keeps = decisions[decisions["action"] == "keep"]
    room = limit - len(acting)
    picked = keeps.iloc[np.linspace(0, len(keeps) - 1, room).round().astype(int)] if room > 0 else keeps.iloc[:0]
    return pd.concat([acting, picked]).sort_index()


def plot_decision_etas(run: Run) -> Figure:
    """Per logged decision: every option's predicted time to finish (bars; the chosen one hatched
    and outlined) and the remaining time the run actually took from that moment (black diamond).
    At most 10 decisions per row and 3 rows: beyond 30, every acting decision and KEEPs spread
    over the run (the title says how many are shown)."""
    d = run.decisions
    if d.empty:
        raise NoDataError(f"{run.path} logged no failover decision ({EVENTS.template}): nothing was detected, "
                          f"or the run had no failover")
    every = d.drop_duplicates("decision").set_index("decision")
    decisions = shown_decisions(every)
    kinds = [k for k in OPTION_ORDER if k in set(d["option"])] + sorted(set(d["option"]) - set(OPTION_ORDER))
    chunks = [decisions.iloc[i:i + PER_ROW] for i in range(0, len(decisions), PER_ROW)]
    with themed():
        fig, axes = new_figure_grid(max(6.0, 1.6 + 1.3 * len(chunks[0])), 0.6 + 3.6 * len(chunks), len(chunks), 1)
        for ax, chunk in zip(axes, chunks):
            _decision_bars(ax, run, d[d["decision"].isin(chunk.index)], chunk, kinds)
        shown = "" if len(decisions) == len(every) else (
            f" ({len(decisions)} of {len(every)} decisions shown: every acting one, KEEPs spread over the run)")
        axes[0].set_title(f"{run.name}: predicted ETA per option (hatched: chosen)\nvs the realised remaining "
                          f"time{shown}")
        axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="option")
        axes[-1].set_xlabel("decision (step, action taken)")
    return fig


def _decision_bars(ax, run: Run, d: pd.DataFrame, decisions: pd.DataFrame, kinds: list[str]) -> None:
    width = 0.8 / len(kinds)
    positions = {index: i for i, index in enumerate(decisions.index)}
    for k, kind in enumerate(kinds):
        rows = d[d["option"] == kind]
        x = np.array([positions[i] for i in rows["decision"]]) + (k - (len(kinds) - 1) / 2) * width
        chosen = rows["chosen"].astype(bool).to_numpy()
        ax.bar(x, rows["eta_s"], width=width, color=OPTION_COLORS.get(kind, "#8c8c8c"), label=kind.upper(),
               edgecolor=np.where(chosen, "black", "none").tolist(), linewidth=np.where(chosen, 1.8, 0).tolist(),
               hatch=None, gid=f"eta_{kind}")
        for bar, is_chosen in zip(ax.containers[-1], chosen):
            bar.set_hatch("//" if is_chosen else None)
    _plot_realised(ax, run, positions)
    ax.set_xticks(range(len(decisions)), [f"step {int(r.step)}\n{str(r.action).upper()}"
                                          for r in decisions.itertuples()])
    ax.set_xlim(-0.6, max(len(decisions), 3) - 0.4)  # a short last row keeps the others' bar width
    ax.set(ylabel="time to finish the run (s)")


def _plot_realised(ax, run: Run, positions: dict[int, int]) -> None:
    outcomes = decision_outcomes(run).dropna(subset=["realised_remaining_s"])
    outcomes = outcomes[outcomes["decision"].isin(positions)]  # this row's decisions
    if outcomes.empty:
        return
    x = [positions[i] for i in outcomes["decision"]]
    ax.plot(x, outcomes["realised_remaining_s"], ls="none", marker="D", ms=8, color="black", gid="realised",
            label="realised remaining time")
    for xi, row in zip(x, outcomes.itertuples()):
        ax.annotate(f"chosen off by {row.error_frac:+.0%}", xy=(xi, row.realised_remaining_s), xytext=(0, 9),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.6", "alpha": 0.9})
    ax.set_ylim(top=max(ax.get_ylim()[1], outcomes["realised_remaining_s"].max() * 1.15))


def plot_plan_vs_measured(run: Run) -> Figure:
    """Left: per pipeline stage, the planner's compute and non-compute seconds per step against the
    measured medians. Right: the measured step time of every step of the planned segment against the
    predicted step time (plan_vs_measured.json, written by partition=auto runs)."""
    plan = run.plan
    if plan.empty:
        raise NoDataError(f"{run.path} has no {PLAN_VS_MEASURED.template}: only partition=auto runs plan, then "
                          f"compare")
    with themed():
        fig, (ax_stage, ax_step) = new_figure_grid(12, 4.4, 1, 2, width_ratios=[1, 1.5])
        _stage_bars(ax_stage, plan)
        _step_series(ax_step, run)
        fig.suptitle(f"{run.name}: planner prediction vs measurement (uncalibrated)", fontweight="bold")
    return fig


def _stage_bars(ax, plan: pd.DataFrame) -> None:
    x = plan["rank"].to_numpy(dtype=float)
    for offset, source in ((-0.2, "predicted"), (0.2, "measured")):
        compute, rest = plan[f"{source}_compute_s"], plan[f"{source}_noncompute_s"].fillna(0.0)
        hatch = "//" if source == "predicted" else None
        ax.bar(x + offset, compute, width=0.38, color=PLAN_COLORS["compute"], hatch=hatch, edgecolor="white",
               label=f"{source}: compute", gid=f"{source}_compute")
        ax.bar(x + offset, rest, width=0.38, bottom=compute, color=PLAN_COLORS["noncompute"], hatch=hatch,
               edgecolor="white", label=f"{source}: comm + waiting", gid=f"{source}_noncompute")
    ax.set_xticks(x, [f"stage {int(r)}\npred | meas" for r in plan["rank"]])
    ax.set(ylabel="seconds per step", title="per pipeline stage (hatched: predicted)")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(0.0, -0.18), ncol=2)


def _step_series(ax, run: Run) -> None:
    planned = run.steps[run.steps["segment"] == 0]
    ax.plot(planned["step"], planned["step_s"], color="#4c72b0", lw=1.0, gid="measured_step", label="measured step")
    predicted, measured = run.plan_step.get("predicted_step_s"), run.plan_step.get("measured_step_s")
    if predicted is not None:
        ax.axhline(predicted, color="#dd8452", lw=2.0, gid="predicted_step", label=f"predicted {predicted:.3f} s")
    if measured is not None:
        ax.axhline(measured, color="black", ls="--", lw=1.2, gid="measured_median",
                   label=f"measured median {measured:.3f} s")
    markers = timeline_markers(run)
    faults = markers[(markers["kind"] == FAULT_ONSET) & (markers["step"] <= planned["step"].max())]
    draw_markers(ax, faults)  # measured steps after a fault are not what the plan was made for
    error = run.plan_step.get("step_error")
    title = "step time of the planned segment (segment 0)"
    ax.set(xlabel="optimizer step", ylabel="step time (s)",
           title=title + (f": prediction {error:+.0%}" if error is not None else ""))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small", loc="upper right")
