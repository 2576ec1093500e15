"""Sweep figures a reader can read (issue #18, item 4): a row per slowdown pattern, no empty panel,
'Policies compared' only with several policies, regret only with repeats and their spread,
decision figures of bounded width, and per-job logs linked from the sweep report."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from synapse.analysis import (
    PER_ROW,
    NoDataError,
    describe_faults,
    job_log_lines,
    plot_regret,
    plot_sweep,
    policy_regret,
    scenario_labels,
    shown_decisions,
)

INTERMITTENT = "slow_compute r1@30 x3 intermittent 10 on/10 off"


def jobs(rows) -> pd.DataFrame:
    """A load_sweep-like frame: (batch, slowdown, policy, seed, wall, recovery)."""
    frame = pd.DataFrame(rows, columns=["batch_size", "slowdown", "policy", "seed", "wall_time_s", "recovery_s"])
    frame["time_lost_s"] = frame["wall_time_s"] / 10
    frame["scenario"] = scenario_labels([{"data.batch_size": r.batch_size, "slowdown": r.slowdown, "seed": r.seed,
                                          "policy": r.policy} for r in frame.itertuples()])
    return frame


def test_the_seed_repeats_a_scenario_and_an_intermittent_fault_is_named():
    assert scenario_labels([{"a": 1, "seed": 0}, {"a": 1, "seed": 1}, {"a": 2, "seed": 0}]) == ["a=1", "a=1", "a=2"]
    assert describe_faults([{"kind": "slow_compute", "rank": 1, "start": 30, "factor": 3.0, "on_steps": 10,
                             "off_steps": 10}]) == INTERMITTENT


def test_one_policy_no_recoveries_and_two_patterns_make_one_row_each_without_an_empty_panel():
    frame = jobs([(b, p, "keep", 0, w, 0.0) for b in (32, 64) for p, w in ((INTERMITTENT, 10.0), ("slow r2", 12.0))])
    fig = plot_sweep(frame)
    title = fig.get_suptitle()
    assert title.startswith("Policy keep: 4 jobs, one job each") and "no recoveries" in title
    assert "compared" not in title
    assert (sorted(sub.get_suptitle() for sub in fig.subfigs)
            == sorted([f"slowdown: {INTERMITTENT}", "slowdown: slow r2"]))
    panels = [ax for ax in fig.axes if ax.containers]
    assert len(panels) == 4 and {ax.get_ylabel() for ax in panels} == {"total wall time (s)", "time lost (s)"}
    assert all([t.get_text() for t in ax.get_xticklabels()] == ["32", "64"] for ax in panels)
    assert all(ax.get_legend() is None for ax in fig.axes), "no legend for a single policy"


def test_repeats_show_their_mean_and_spread():
    frame = jobs([(32, "slow", policy, seed, wall, 1.0) for policy, walls in (("keep", (10.0, 14.0)),
                                                                             ("eta", (9.0, 10.0)))
                  for seed, wall in enumerate(walls)])
    fig = plot_sweep(frame)
    assert fig.get_suptitle() == "Policies compared over 4 jobs, 2 jobs each (seeds; whiskers: min to max)"
    wall = next(ax for ax in fig.axes if ax.get_ylabel() == "total wall time (s)")
    heights = {c.get_label(): [bar.get_height() for bar in c] for c in wall.containers}
    assert heights == {"eta": [9.5], "keep": [12.0]}
    whiskers = sorted((np.nanmin(line.get_ydata()), np.nanmax(line.get_ydata())) for line in wall.lines)
    assert whiskers == [(9.0, 10.0), (10.0, 14.0)]


def test_regret_is_drawn_only_for_repeated_scenarios_with_each_policys_spread():
    single = jobs([(32, "slow", "keep", 0, 10.0, 0.0), (32, "slow", "eta", 0, 8.0, 1.0)])
    with pytest.raises(NoDataError, match="no scenario was repeated"):
        plot_regret(policy_regret(single))
    repeated = jobs([(32, "slow", policy, seed, wall, 0.0) for policy, walls in (("keep", (10.0, 14.0)),
                                                                                ("eta", (9.0, 10.0)))
                     for seed, wall in enumerate(walls)])
    regret = policy_regret(repeated).set_index("policy")
    assert regret.loc["keep", "regret_s"] == 2.5 and regret.loc["eta", "regret_s"] == 0.0
    assert (regret.loc["keep", "regret_min_s"], regret.loc["keep", "regret_max_s"]) == (0.5, 4.5)
    assert (regret.loc["eta", "regret_min_s"], regret.loc["eta", "regret_max_s"]) == (-0.5, 0.5)
    ax = plot_regret(policy_regret(repeated)).axes[0]
    spread = {line.get_gid(): line for line in ax.collections if str(line.get_gid()).startswith("spread_")}
    keep = spread["spread_keep"].get_segments()[0]
    assert np.allclose(sorted(keep[:, 1]), [0.5, 4.5])


def test_a_run_with_many_decisions_shows_at_most_three_rows_of_ten_every_acting_one_included():
    decisions = pd.DataFrame({"step": range(43), "action": ["replan" if s in (5, 40) else "keep" for s in range(43)]})
    shown = shown_decisions(decisions)
    assert len(shown) == 3 * PER_ROW and {5, 40} <= set(shown["step"]) and shown["step"].is_monotonic_increasing
    assert shown["step"].iloc[0] == 0 and shown["step"].iloc[-1] == 42, "KEEPs spread over the whole run"
    assert len(shown_decisions(decisions.head(12))) == 12


def test_the_sweep_report_links_each_jobs_logs_that_exist(tmp_path):
    for job, job_id in ((0, "4242"), (1, None)):
        folder = tmp_path / str(job)
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"id": job_id}}}))
    (tmp_path / "0" / "train.log").write_text("a line\n")
    (tmp_path / "0" / "logs").mkdir()
    (tmp_path / ".submitit" / "4242").mkdir(parents=True)
    for suffix in ("out", "err"):
        (tmp_path / ".submitit" / "4242" / f"4242_0_log.{suffix}").write_text("")
    lines = job_log_lines(tmp_path, pd.DataFrame({"job": [0, 1]}))
    assert lines == [("- job 0: [folder](../0/) · [train.log](../0/train.log) · "
                      "[console err](../.submitit/4242/4242_0_log.err) · "
                      "[console out](../.submitit/4242/4242_0_log.out)"
                      " · [rank logs](../0/logs/)"),
                     "- job 1: [folder](../1/)"]
