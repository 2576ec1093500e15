"""Where a report goes, and the figures drawn into it (shared by run and sweep reports)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from synapse.analysis.style import FORMATS, NoDataError, save_figure

REPORT_DIR = "report"
REPORT_FILE = "report.md"


@dataclass
class FigureSet:
    """Figures drawn into one folder, and why the others could not be."""

    directory: Path
    formats: tuple[str, ...] = FORMATS
    written: dict[str, str] = field(default_factory=dict)  # name -> caption
    missing: dict[str, str] = field(default_factory=dict)  # name -> reason

    def draw(self, name: str, caption: str, plot: Callable[[], Figure]) -> None:
        try:
            fig = plot()
        except NoDataError as exc:
            self.missing[name] = str(exc)
            return
        save_figure(fig, self.directory, name, self.formats)
        self.written[name] = caption

    def markdown(self) -> str:
        lines = []
        for name, caption in self.written.items():
            links = " · ".join(f"[{fmt.upper()}]({name}.{fmt})" for fmt in self.formats)
            lines += [f"### {caption}", "", f"![{caption}]({name}.{self.formats[0]})", "", links, ""]
        for name, reason in self.missing.items():
            lines.append(f"- `{name}` not drawn: {reason}")
        return "\n".join(lines)
