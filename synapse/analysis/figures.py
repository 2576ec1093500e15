"""Figures of one run over its steps: the failover timeline and the per-rank time heatmap.

Every function returns a ``matplotlib.figure.Figure`` (save it with ``style.save_figure``).
Lines and patches carry a ``gid`` naming what they show (``step_time``, ``throughput``, the
marker kinds of ``markers``, ``segment_boundary``), so a figure can be checked, not just looked at.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from synapse.analysis import markers as mk
from synapse.analysis.load import Run
from synapse.analysis.style import MARKER_COLORS, NoDataError, new_figure, new_figure_grid, themed
from synapse.rundir import METRICS, PERFORMANCE

SEGMENT_COLORS = ("#264653", "#2a9d8f", "#8c6d31", "#6d597a", "#e76f51", "#3a86ff")
MARKER_NAMES = {
    mk.FAULT_ONSET: "fault injected", mk.FAULT_CLEARED: "fault cleared", mk.DETECTION: "slowdown detected",
    mk.RECOVERY: "slowdown recovered", mk.KEEP: "KEEP decision (logged)", mk.DECISION: "decision to act",
    mk.CHECKPOINT: "checkpoint saved", mk.FAILURE: "hard failure", mk.RESTART: "restart (trigger to first step)",
}
LINE_STYLES = {mk.FAULT_ONSET: ("-", 1.6), mk.FAULT_CLEARED: ("-", 1.0), mk.DETECTION: ("--", 1.6),
               mk.RECOVERY: ("--", 1.2), mk.KEEP: (":", 1.2), mk.DECISION: ("-", 2.0), mk.FAILURE: ("-", 2.0)}
WRITTEN = (mk.FAULT_ONSET, mk.DETECTION, mk.DECISION, mk.FAILURE, mk.RESTART)  # kinds labelled on the plot
X_AXES = {"step": ("step", "end_step", "optimizer step"),
          "time": ("elapsed_s", "end_elapsed_s", "time since the run started (s)")}
SMOOTH_STEPS = 5


def segment_label(run: Run, segment: int) -> str:
    row = run.segments[run.segments["segment"] == segment]
    if row.empty:
        return f"segment {segment}"
    devices = ",".join(str(d) for d in row["devices"].iloc[0])
    return f"segment {segment}: devices {devices} ({row['reason'].iloc[0]})"


def plot_timeline(run: Run, x: str = "step", show_checkpoints: bool = True) -> Figure:
    """Step time (top) and throughput (bottom) over the run, with the failover story marked:
    fault onset, detection, decisions, checkpoints, restarts. ``x``: "step" or "time"."""
    if x not in X_AXES:
        raise ValueError(f"x={x!r}: plot_timeline draws over 'step' or 'time'")
    if run.steps.empty:
        raise NoDataError(f"{run.path} has no step records ({METRICS.template}, {PERFORMANCE.template}): nothing to "
                          f"draw")
    column, _, xlabel = X_AXES[x]
    markers = mk.timeline_markers(run)
    if not show_checkpoints:
        markers = markers[markers["kind"] != mk.CHECKPOINT]
    with themed():
        fig, (ax_time, ax_rate) = new_figure_grid(11, 6.5, 2, 1, sharex=True)
        _plot_series(run, ax_time, ax_rate, column)
        ax_time.set_ylim(bottom=0)
        ax_rate.set_ylim(bottom=0)
        for ax, write in ((ax_time, True), (ax_rate, False)):
            draw_markers(ax, markers, x, write=write)
        ax_time.set(ylabel="step time (s)", title=f"{run.name}: step time and throughput, failover events marked")
        ax_rate.set(ylabel="throughput (images/s)", xlabel=xlabel)
        handles = ax_time.get_legend_handles_labels()
        ax_time.legend(*handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="series")
        _marker_legend(ax_rate, markers)
    return fig


def _plot_series(run: Run, ax_time: Axes, ax_rate: Axes, column: str) -> None:
    """Per segment: the raw values (thin) and their rolling median (labelled)."""
    for segment, group in run.steps.groupby("segment", sort=True):
        color = SEGMENT_COLORS[int(segment) % len(SEGMENT_COLORS)]
        label = segment_label(run, int(segment))
        for ax, value, gid in ((ax_time, "step_s", "step_time"), (ax_rate, "images_per_s", "throughput")):
            ax.plot(group[column], group[value], color=color, lw=0.8, alpha=0.35, gid=f"{gid}_raw")
            smooth = group[value].rolling(SMOOTH_STEPS, center=True, min_periods=1).median()
            ax.plot(group[column], smooth, color=color, lw=1.8, gid=gid,
                    label=f"{label}, median of {SMOOTH_STEPS} steps")


def draw_markers(ax: Axes, markers: pd.DataFrame, x: str = "step", write: bool = True) -> None:
    """Vertical lines (points) and spans (restarts) for ``markers``; ``write``: their short labels too."""
    start, end, _ = X_AXES[x]
    written = []
    for row in markers.itertuples(index=False):
        at, until = getattr(row, start), getattr(row, end)
        if pd.isna(at):
            continue
        color = MARKER_COLORS[row.kind]
        if row.kind == mk.RESTART:
            until = at if pd.isna(until) else until
            ax.axvspan(at, max(until, at), color=color, alpha=0.25, lw=0, gid=row.kind)
            ax.axvline(at, color=color, lw=1.0, gid=f"{row.kind}_start")
        elif row.kind == mk.CHECKPOINT:  # frequent: a short tick at the bottom, not a full line
            ax.axvline(at, ymin=0.0, ymax=0.06, color=color, lw=1.4, gid=row.kind)
        else:
            style, width = LINE_STYLES[row.kind]
            ax.axvline(at, color=color, ls=style, lw=width, gid=row.kind)
        if write and row.kind in WRITTEN and row.short:
            written.append((at, row.short, color))
    _write_labels(ax, written)


def _write_labels(ax: Axes, labels: list[tuple[float, str, str]], lanes: int = 5) -> None:
    """Short horizontal labels at the top, each in the highest lane not taken by a nearby label."""
    if not labels:
        return
    low, high = ax.get_xlim()
    near = 0.12 * (high - low)  # about the width of a label
    lane_ends: list[float] = []
    for at, text, color in sorted(labels):
        lane = next((i for i, end in enumerate(lane_ends) if at - end > near), len(lane_ends))
        lane = min(lane, lanes - 1)
        lane_ends[lane:lane + 1] = [at]
        ax.annotate(text, xy=(at, 0.97 - 0.075 * lane), xycoords=("data", "axes fraction"), xytext=(3, 0),
                    textcoords="offset points", va="top", ha="left", fontsize=7.5, color=color,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.set_ylim(top=ax.get_ylim()[1] * (1.0 + 0.1 * (len(lane_ends) + 1)))  # head room for the lanes


def _marker_legend(ax: Axes, markers: pd.DataFrame) -> None:
    kinds = [k for k in mk.MARKER_KINDS if k in set(markers["kind"])]
    if not kinds:
        return
    handles = [_legend_handle(k) for k in kinds]
    ax.legend(handles, [MARKER_NAMES[k] for k in kinds], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize="small", title="events")


def _legend_handle(kind: str) -> Line2D:
    if kind == mk.RESTART:
        return Line2D([], [], color=MARKER_COLORS[kind], lw=8, alpha=0.35)
    style, width = LINE_STYLES.get(kind, ("-", 1.4))
    return Line2D([], [], color=MARKER_COLORS[kind], ls=style, lw=width)


def plot_rank_heatmap(run: Run, part: str = "compute", by: str = "rank") -> Figure:
    """Seconds of ``part`` (compute, comm, wall, teacher_fwd, ...) per step for each rank (or
    device, ``by="device"``): a slow device shows as a hot row; segment boundaries as white lines."""
    if by not in ("rank", "device"):
        raise ValueError(f"by={by!r}: the heatmap's rows are 'rank' or 'device'")
    timings = run.rank_timings
    if timings.empty:
        raise NoDataError(f"{run.path} has no per-rank timings ({PERFORMANCE.template}): a single-device or "
                          f"pre-pipeline run has none")
    chosen = timings[timings["part"] == part]
    if chosen.empty:
        raise NoDataError(f"no {part!r} timings in {run.path}; parts recorded: {sorted(timings['part'].unique())}")
    grid = chosen.pivot_table(index=by, columns="step", values="seconds", aggfunc="last")
    with themed():
        fig, ax = new_figure(11, 1.6 + 0.5 * len(grid))
        sns.heatmap(grid, ax=ax, cmap="rocket_r", robust=True, xticklabels=_tick_every(grid.columns),
                    yticklabels=[f"{by} {int(r)}" for r in grid.index],
                    cbar_kws={"label": f"{part} per step (s)", "pad": 0.01})
        _segment_boundaries(ax, run, list(grid.columns))
        ax.grid(False)
        ax.set_facecolor("#e8e8e8")  # cells of a rank that a segment did not have
        ax.set(xlabel="optimizer step (white lines: a new segment; grey: not in that segment)", ylabel="",
               title=f"{run.name}: {part} seconds per step on each {by} (colour clipped to the 2-98th percentile)")
        ax.tick_params(axis="y", rotation=0)
        ax.tick_params(axis="x", rotation=0)
    return fig


def _tick_every(steps: Sequence[int], target: int = 25) -> int:
    return max(1, len(steps) // target)


def _segment_boundaries(ax: Axes, run: Run, steps: list[int]) -> None:
    """A white line before the first step of each segment after the first (heatmap x = column index)."""
    firsts = run.steps.groupby("segment")["step"].min().sort_index()
    for step in firsts.iloc[1:]:
        if step in steps:
            ax.axvline(steps.index(step), color="white", lw=2.5, gid="segment_boundary")
