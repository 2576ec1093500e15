"""Markdown tables from DataFrames (no extra dependency: pandas' to_markdown needs tabulate)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

MISSING = "–"


def cell(value: Any, digits: int | None = None) -> str:
    """One table cell: numbers rounded (``digits`` decimals, else 1 from 100, 2 from 1, 3 significant digits below),
    sequences joined, missing values as a dash; text made inert (``escape``)."""
    return escape(_formatted(value, digits))


def escape(text: str) -> str:
    """Text from records (an error, a cause, a reason: anything a damaged or planted record may hold) as inert
    Markdown: no HTML (a ``<script>``), no link or image (``[x](javascript:...)``), no table cell or row broken."""
    # A backslash first (it must not escape ours); then "&" and "<", which are all a tag or an entity
    # needs ("&gt;=" in a message would only be harder to read)
    text = text.replace("\\", "\\\\").replace("&", "&amp;").replace("<", "&lt;")
    return text.replace("[", "\\[").replace("]", "\\]").replace("|", "\\|").replace("\n", " ")


def _formatted(value: Any, digits: int | None) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return _number(value, digits)
    if isinstance(value, (list, tuple)):
        return ",".join(_formatted(v, digits) for v in value) or MISSING
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_formatted(v, digits)}" for k, v in value.items()) or MISSING
    return str(value)


def _number(value: float, digits: int | None) -> str:
    if digits is not None:
        return f"{value:.{digits}f}"
    if value == 0 or abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def _integral(series: pd.Series) -> bool:
    """A float column that only holds whole numbers (steps with gaps read as NaN): print it as ints."""
    values = series.dropna()
    return series.dtype.kind == "f" and len(values) > 0 and bool((values == values.round()).all())


def markdown_table(df: pd.DataFrame, columns: Mapping[str, str] | Sequence[str] | None = None,
                   digits: int | None = None, empty: str = "_(none)_") -> str:
    """``df`` as a Markdown table; ``columns``: which to show, optionally renamed ({column: header})."""
    if columns is None:
        columns = list(df.columns)
    headers = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}
    shown = [c for c in headers if c in df.columns]
    if df.empty or not shown:
        return empty
    table = df[shown].copy()
    for column in shown:
        if _integral(table[column]):
            table[column] = table[column].astype("Int64")
    lines = ["| " + " | ".join(headers[c] for c in shown) + " |", "|" + "---|" * len(shown)]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v, digits) for v in row) + " |")
    return "\n".join(lines)


def key_value_table(items: Mapping[str, Any], digits: int | None = None) -> str:
    """A two-column table (what, value) of ``items``."""
    # formatted here (digits), escaped once by markdown_table
    return markdown_table(pd.DataFrame({"what": list(items),
                                        "value": [_formatted(v, digits) for v in items.values()]}))
