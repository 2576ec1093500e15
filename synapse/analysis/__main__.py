"""``python -m synapse.analysis report <run-or-sweep-dir> [...]``: write each directory's report/."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from synapse.analysis.files import AnalysisError
from synapse.analysis.report import write_report
from synapse.rundir import EVENTS, METRICS, PERFORMANCE, REPORT, REPORT_MARKDOWN


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m synapse.analysis",
                                     description=f"Figures and {REPORT_MARKDOWN.name()} of Synapse runs and sweeps")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help=f"write <dir>/{REPORT.template} (figures as PNG and SVG, "
                                                f"{REPORT_MARKDOWN.name()})")
    report.add_argument("dirs", nargs="+",
                        help="run directories (hydra.run.dir) or sweep directories (hydra.sweep.dir)")
    report.add_argument("--formats", default="png,svg", help="figure formats, comma-separated (default: png,svg)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    status = 0
    for directory in args.dirs:
        try:
            print(f"report: {write_report(directory, formats)}")
        except AnalysisError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            # a record of the right syntax but the wrong types or shape (a string where a number or a
            # table belongs, nesting deeper than any Synapse writes): one line, not a stack of pandas frames
            print(f"error: {directory}: the report was not written: a record there holds a value of the wrong type "
                  f"or shape ({type(exc).__name__}: {str(exc)[:300]}). Fix: repair or remove the damaged record "
                  f"({EVENTS.name()}, {PERFORMANCE.name()}, {METRICS.name()} or a summary .json), then rerun",
                  file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
