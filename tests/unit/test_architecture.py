"""The layer contracts of ARCHITECTURE.md, as import-linter checks them (contracts in pyproject.toml):
app -> failover -> launch -> pipeline/profiling -> engine -> config/analysis/control -> the leaves ->
records, siblings independent (so no package imports another in a circle), and no torch in the
planner or the slowdown detector. ``lint-imports`` in the checkout runs the same check."""
from __future__ import annotations

import os
from pathlib import Path

from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    exit_code = lint_imports(config_filename=os.fspath(REPO / "pyproject.toml"), no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert exit_code == 0, report[-4000:]
    assert report.count("KEPT") == 2 and "BROKEN" not in report
