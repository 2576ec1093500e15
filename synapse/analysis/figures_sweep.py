"""Figures of a sweep (``load_sweep``'s frame): policies side by side, and their regret.

Groups on the x axis are batch size x slowdown pattern; bars within a group are policies.
Each bar (patch) carries the metric name as ``gid``; each bar container (``ax.containers``)
is labelled with its policy.
"""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from .style import NoDataError, new_figure, themed

SWEEP_METRICS = (("wall_time_s", "total wall time (s)"), ("time_lost_s", "time lost (s)"),
                 ("recovery_s", "restart recovery time (s)"))


def sweep_groups(sweep: pd.DataFrame) -> pd.Series:
    """Each job's x-axis group: its batch size, and its slowdown pattern when the sweep has several."""
    several = sweep["slowdown"].nunique(dropna=False) > 1
    return sweep.apply(lambda r: f"batch {r['batch_size']}" + (f"\n{r['slowdown']}" if several else ""), axis=1)


def plot_sweep(sweep: pd.DataFrame, metrics=SWEEP_METRICS) -> Figure:
    """One panel per metric (default: total time, time lost, recovery time): grouped bars by
    batch size x slowdown pattern, one bar per policy (the mean over repeated jobs, with its range)."""
    if sweep.empty:
        raise NoDataError("the sweep has no jobs")
    data = sweep.assign(group=sweep_groups(sweep)).sort_values(["batch_size", "slowdown", "policy"])
    policies = sorted(data["policy"].dropna().unique())
    patterns = data["slowdown"].dropna().unique()
    with themed():
        fig, axes = new_figure(4.3 * len(metrics), 4.4, 1, len(metrics))
        axes = list(axes) if len(metrics) > 1 else [axes]
        for ax, (column, label) in zip(axes, metrics):
            sns.barplot(data, x="group", y=column, hue="policy", hue_order=policies, ax=ax, palette="deep",
                        errorbar=("pi", 100), err_kws={"linewidth": 1.2}, capsize=0.1)
            _label_bars(ax, column, policies)
            ax.set(xlabel="batch size" + (" x slowdown" if len(patterns) > 1 else ""), ylabel=label,
                   title=label.split(" (")[0])
            ax.margins(y=0.12)
            if ax is not axes[-1]:
                ax.get_legend().remove()
        axes[-1].legend(axes[-1].containers, policies, title="policy", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        fontsize="small")
        subtitle = f" (slowdown: {patterns[0]})" if len(patterns) == 1 else ""
        fig.suptitle(f"Policies compared over {len(sweep)} jobs{subtitle}", fontweight="bold")
    return fig


def plot_regret(regret: pd.DataFrame) -> Figure:
    """Per scenario, each policy's regret: how much longer its run took than the best policy's."""
    if regret.empty:
        raise NoDataError("no scenario was run under two or more policies: there is no regret to show")
    with themed():
        fig, ax = new_figure(max(6.0, 2.0 + 1.6 * regret["scenario"].nunique()), 4.2)
        sns.barplot(regret, x="scenario", y="regret_s", hue="policy", hue_order=sorted(regret["policy"].unique()),
                    ax=ax, palette="deep", errorbar=None)
        policies = sorted(regret["policy"].unique())
        _label_bars(ax, "regret_s", policies)
        ax.set(xlabel="scenario (the overrides that differ, policy aside)", ylabel="regret (s)",
               title="Realised regret: wall time over the best policy of the same scenario")
        ax.margins(y=0.12)
        ax.legend(ax.containers, policies, title="policy", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize="small")
    return fig


def _label_bars(ax, metric: str, policies: list[str]) -> None:
    """Write each bar's value on it; name the bars (gid: the metric) and their containers (label: the policy).
    seaborn draws one container per hue level, in hue order."""
    for container, policy in zip(ax.containers, policies):
        container.set_label(policy)
        for bar in container:
            bar.set_gid(metric)
        ax.bar_label(container, fmt="%.1f", fontsize=7.5, padding=2)
