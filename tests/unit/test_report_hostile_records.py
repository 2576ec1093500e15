"""The report command over records of the wrong type, and text from records in report.md (issue #33, item 15).

Before: ``python -m synapse.analysis report`` on records of valid syntax but the wrong types (a
string where a number or a table belongs, nesting deeper than any writer makes) raised a bare
``ValueError``/``TypeError``/``RecursionError`` with a stack of pandas frames; and text a record
held (a restart's cause, a decision's reason) reached ``report.md`` as it was: raw ``<script>``
and ``[..](javascript:..)`` links.

Real files and processes: the run directory of ``test_analysis_load.failover_run``, damaged, and
the report command run as a user runs it.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from test_analysis_load import failover_run  # noqa: F401  (the fixture)

from tests.conftest import REPO_ROOT, repo_env

SCRIPT = "<script>alert(1)</script>"
LINK = "[click me](javascript:alert(1))"


def report_command(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "synapse.analysis", "report", str(run_dir), "--formats", "png"],
                          cwd=REPO_ROOT, env=repo_env(), capture_output=True, text=True, timeout=180)


def test_text_from_records_is_inert_in_the_report(failover_run):  # noqa: F811
    summary_path = failover_run / "experiment_summary.json"
    summary = json.loads(summary_path.read_text())
    summary["restarts"][0]["cause"] = f"{SCRIPT} {LINK} a|b"
    summary["decisions"][0]["reason"] = LINK
    summary_path.write_text(json.dumps(summary))
    done = report_command(failover_run)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (failover_run / "report" / "report.md").read_text()
    # no HTML, and no link: each bracket is escaped (an unescaped "](" would make one)
    assert "<script>" not in report and not re.search(r"(?<!\\)\]\(javascript:", report), report
    assert "&lt;script>alert(1)&lt;/script> \\[click me\\](javascript:alert(1)) a\\|b" in report, report


@pytest.mark.parametrize("damage", ["a string for the segments", "a string for a number", "nesting too deep"])
def test_records_of_the_wrong_type_are_one_clear_error(failover_run, damage):  # noqa: F811
    summary_path = failover_run / "experiment_summary.json"
    summary = json.loads(summary_path.read_text())
    if damage == "a string for the segments":
        summary["segments"] = "abc"
    elif damage == "a string for a number":
        summary["restarts"][0]["recovery_s"] = "fast"
        summary["time_lost_s"] = "none"
    summary_path.write_text(json.dumps(summary))
    if damage == "nesting too deep":
        with open(failover_run / "failover_events.jsonl", "a") as events:
            events.write('{"event": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    done = report_command(failover_run)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {failover_run}: the report was not written: a record there holds a value of the "
                           f"wrong type or shape ("), line
    assert "Fix: repair or remove the damaged record" in line, line
