"""One look for every figure, without touching the caller's global matplotlib state.

Figures are built as ``matplotlib.figure.Figure`` objects (no pyplot), so the library works
headless, leaks no open figures, and leaves a notebook's backend and style alone; the
seaborn theme applies only while a figure is drawn (``themed``).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from synapse.analysis.files import AnalysisError

FORMATS = ("png", "svg")
DPI = 110

# Colour of each timeline marker kind (markers.MARKER_KINDS); line style says point vs action.
MARKER_COLORS = {
    "fault_onset": "#d62728", "fault_cleared": "#ff9896", "detection": "#ff7f0e", "recovery": "#2ca02c",
    "keep": "#9467bd", "decision": "#9467bd", "checkpoint": "#7f7f7f", "failure": "#000000", "restart": "#1f77b4",
}
OPTION_COLORS = {"keep": "#4c72b0", "replan": "#dd8452", "degrade": "#55a868", "replace": "#c44e52"}


class NoDataError(AnalysisError):
    """The run (or sweep) has no records for this figure; the message says which file is missing."""


@contextmanager
def themed() -> Iterator[None]:
    """seaborn's whitegrid look for the figures drawn inside, restored afterwards."""
    rc = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook", font_scale=0.9),
          "axes.titleweight": "bold", "legend.framealpha": 0.9, "figure.dpi": DPI, "savefig.dpi": DPI,
          "svg.fonttype": "none"}
    with matplotlib.rc_context(rc):
        yield


def new_figure(width: float, height: float, **kwargs) -> tuple[Figure, Axes]:
    """A Figure with one Axes, laid out by matplotlib's constrained layout."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes: Axes = fig.subplots(1, 1, squeeze=True, **kwargs)
    return fig, axes


def new_figure_grid(width: float, height: float, nrows: int, ncols: int, **kwargs) -> tuple[Figure, list[Axes]]:
    """A Figure with nrows x ncols Axes (listed row by row), laid out by matplotlib's constrained layout.
    A list, not matplotlib's squeezed array, so that its items are typed as Axes."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kwargs)
    return fig, list(axes.flat)


def save_figure(fig: Figure, directory: Path, name: str, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Write ``<directory>/<name>.<format>`` for each format; return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = directory / f"{name}.{fmt}"
        fig.savefig(path, format=fmt, bbox_inches="tight")
        paths.append(path)
    return paths
