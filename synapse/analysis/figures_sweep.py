"""Figures of a sweep (``load_sweep``'s frame): outcomes by batch size and slowdown, and regret.

``plot_sweep``: one row of panels per slowdown pattern (the row says which, intermittent ones
included), one panel per metric; the x axis is the batch size, bars within it are policies
(the mean over repeated jobs, whiskers from the smallest to the largest). A metric no job has
(e.g. no job restarted) gets no panel; the title says so. Each bar (patch) carries the metric
name as ``gid``; each bar container (``ax.containers``) is labelled with its policy.

``plot_regret``: only where a scenario ran under two or more policies *and* each of them was
repeated (over seeds): a single noisy run per policy says nothing about which is better.
"""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from synapse.analysis.style import NoDataError, new_figure, themed

SWEEP_METRICS = (("wall_time_s", "total wall time (s)"), ("time_lost_s", "time lost (s)"),
                 ("recovery_s", "restart recovery time (s)"))
PANEL_WIDTH, ROW_HEIGHT = 4.0, 3.4


def sweep_groups(sweep: pd.DataFrame) -> pd.Series:
    """Each job's x-axis group: its batch size (the slowdown pattern is the panel row)."""
    return sweep["batch_size"].map(lambda b: f"{b}")


def shown_metrics(sweep: pd.DataFrame, metrics=SWEEP_METRICS) -> tuple[list, list[str]]:
    """The metrics some job has a non-zero value of, and a note for each left out."""
    shown, notes = [], []
    for column, label in metrics:
        values = pd.to_numeric(sweep[column], errors="coerce").dropna() if column in sweep else pd.Series([])
        if values.empty or (values == 0).all():
            notes.append(f"no {label.split(' (')[0]} in any job" if column != "recovery_s" else "no recoveries")
        else:
            shown.append((column, label))
    return shown, notes


def repeats_text(sweep: pd.DataFrame) -> str:
    """How many jobs each (scenario, policy) ran: its repeats over seeds."""
    counts = sweep.groupby(["scenario", "policy"], dropna=False).size()
    low, high = (int(counts.min()), int(counts.max())) if len(counts) else (0, 0)
    if high <= 1:
        return "one job each"
    each = f"{low} jobs each" if low == high else f"{low} to {high} jobs each"
    return f"{each} (seeds; whiskers: min to max)"


def plot_sweep(sweep: pd.DataFrame, metrics=SWEEP_METRICS) -> Figure:
    """Rows: slowdown patterns; columns: metrics (total time, time lost, recovery time) that any job
    has; bars: policies by batch size (mean over repeats, whiskers from min to max)."""
    if sweep.empty:
        raise NoDataError("the sweep has no jobs")
    data = sweep.assign(group=sweep_groups(sweep), slowdown=sweep["slowdown"].fillna("none"))
    data = data.sort_values(["batch_size", "slowdown", "policy"])
    shown, notes = shown_metrics(data, metrics)
    if not shown:
        raise NoDataError(f"no job has any of {[c for c, _ in metrics]}")
    policies = sorted(data["policy"].dropna().unique())
    patterns = list(dict.fromkeys(data["slowdown"]))
    groups = list(dict.fromkeys(data["group"]))
    with themed():
        fig = Figure(figsize=(PANEL_WIDTH * len(shown) + (1.3 if len(policies) > 1 else 0),
                              ROW_HEIGHT * len(patterns) + 0.7), layout="constrained")
        rows = fig.subfigures(len(patterns), 1, squeeze=False)[:, 0]
        for row, (subfig, pattern) in enumerate(zip(rows, patterns)):
            subfig.suptitle(f"slowdown: {pattern}", fontsize="medium", fontweight="bold", color="0.25")
            axes = subfig.subplots(1, len(shown), squeeze=False)[0]
            for ax, (column, label) in zip(axes, shown):
                _bars(ax, data[data["slowdown"] == pattern], column, groups, policies)
                ax.set(xlabel="batch size", ylabel=label, title=label.split(" (")[0])
            if len(policies) > 1 and row == 0:
                axes[-1].legend(axes[-1].containers, policies, title="policy", loc="upper left",
                                bbox_to_anchor=(1.01, 1.0), fontsize="small")
        fig.suptitle(_sweep_title(data, policies, notes), fontweight="bold")
    return fig


def _bars(ax, rows: pd.DataFrame, column: str, groups: list[str], policies: list[str]) -> None:
    several = len(policies) > 1
    sns.barplot(rows, x="group", y=column, order=groups, hue="policy" if several else None,
                hue_order=policies if several else None, ax=ax, palette="deep" if several else None,
                color=None if several else sns.color_palette("deep")[0],
                errorbar=("pi", 100), err_kws={"linewidth": 1.2}, capsize=0.1)
    _label_bars(ax, column, policies)
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    ax.margins(y=0.15)


def _sweep_title(data: pd.DataFrame, policies: list[str], notes: list[str]) -> str:
    what = (f"Policies compared over {len(data)} jobs" if len(policies) > 1
            else f"Policy {policies[0] if policies else '?'}: {len(data)} jobs")
    return f"{what}, {repeats_text(data)}" + (f"\n({'; '.join(notes)})" if notes else "")


def plot_regret(regret: pd.DataFrame) -> Figure:
    """Per scenario, each policy's regret (mean over its repeats, whiskers from its best to its
    worst job): how much longer its runs took than the best policy's on average."""
    if regret.empty:
        raise NoDataError("no scenario was run under two or more policies: there is no regret to show")
    repeated = regret[regret.groupby("scenario")["jobs"].transform("min") >= 2]
    if repeated.empty:
        raise NoDataError("no scenario was repeated (one job per policy): regret from single noisy runs is not "
                          "shown. Repeat the jobs, e.g. add seed=0,1,2 to the sweep")
    policies = sorted(repeated["policy"].unique())
    scenarios = list(dict.fromkeys(repeated["scenario"]))
    with themed():
        fig, ax = new_figure(min(12.0, max(6.5, 2.5 + 1.5 * len(scenarios))), 4.4)
        sns.barplot(repeated, x="scenario", y="regret_s", order=scenarios, hue="policy", hue_order=policies, ax=ax,
                    palette="deep", errorbar=None)
        _label_bars(ax, "regret_s", policies)
        bars = list(ax.containers)  # one per policy; the whiskers below add containers of their own
        for container, policy in zip(bars, policies):
            rows = repeated[repeated["policy"] == policy].set_index("scenario").reindex(scenarios)
            x = [bar.get_x() + bar.get_width() / 2 for bar in container]
            ax.errorbar(x, rows["regret_s"], yerr=[rows["regret_s"] - rows["regret_min_s"],
                                                   rows["regret_max_s"] - rows["regret_s"]],
                        fmt="none", ecolor="0.2", elinewidth=1.2, capsize=3, gid=f"spread_{policy}")
        ax.axhline(0, color="0.3", linewidth=0.8)
        ax.set_xticks(range(len(scenarios)), [s.replace(", ", "\n") for s in scenarios], fontsize="small")
        jobs = int(repeated["jobs"].min())
        ax.set(xlabel="scenario (the overrides that differ, policy and seed aside)", ylabel="regret (s)",
               title=f"Regret against the best policy ({jobs}+ seeds each)\n"
                     f"bars: mean over seeds; whiskers: fastest to slowest job")
        ax.margins(y=0.12)
        ax.legend(bars, policies, title="policy", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def _label_bars(ax, metric: str, policies: list[str]) -> None:
    """Write each bar's value on it; name the bars (gid: the metric) and their containers (label: the policy).
    seaborn draws one container per hue level, in hue order."""
    for container, policy in zip(ax.containers, policies):
        container.set_label(policy)
        for bar in container:
            bar.set_gid(metric)
        # inside the bar: a label on its top would sit under the whisker of the spread
        ax.bar_label(container, labels=[f"{v:.1f}" if v else "" for v in container.datavalues], fontsize=7.5,
                     label_type="center", color="white", fontweight="bold")
