"""synapse.analysis on fresh, real outputs of train.py: a failover run and a 2x2 Hydra multirun.

The run: 3 CPU ranks, tiny models, partition=auto (so the plan is compared with the run), a 4x
compute slowdown on rank 2 from step 12 (detection events) and a DEGRADE drill at step 25 (a
restart, deterministically). The sweep: batch size 16/32 x policy keep/degrade with the same
slowdown. Every figure is drawn from these outputs and checked for its series and markers;
the report is written, and both notebooks are executed headless.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from synapse.analysis import (
    SWEEP_METRICS,
    NoDataError,
    decision_outcomes,
    load_run,
    load_sweep,
    plot_decision_etas,
    plot_plan_vs_measured,
    plot_rank_heatmap,
    plot_regret,
    plot_sweep,
    plot_timeline,
    policy_regret,
    write_report,
)
from tests.conftest import REPO_ROOT, run_train_py

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

STEPS = 40
TINY = ["trainer=cpu", "trainer.devices=3", "trainer.threads=1", "teacher=resnet_micro", "student=resnet_micro",
        f"trainer.max_steps={STEPS}", "trainer.progress=false",
        "injection.faults=[{kind:slow_compute,rank:2,start:12,factor:4.0}]",
        # ++: set whether or not the failover.detector dict already has the key
        "++failover.detector.baseline_window=5", "++failover.detector.warmup_steps=3", "report=false",
        "partition.profile_warmup=1", "partition.profile_repeats=2"]  # rough profiles are enough here
RUN_FIGURES = ("timeline", "timeline_time", "rank_heatmap", "decision_etas", "plan_vs_measured")


def train(args: list[str], timeout: float) -> None:
    result = run_train_py(args, timeout=timeout)
    assert result.returncode == 0, f"train.py {args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, teacher_file) -> Path:
    run_dir = tmp_path_factory.mktemp("analysis_run")
    # teacher.checkpoint: a random teacher is enough for KD, and skips training one with labels.
    # policy=keep and the drill's device named: the drill is the one restart, and it drops device 2
    # (a DEGRADE drill without a device drops the one the run's timings judge slowest: on a loaded
    # machine that was device 0 once, and the ETA policy once acted before the drill).
    train([f"hydra.run.dir={run_dir}", *TINY, f"teacher.checkpoint={teacher_file}", "partition=auto",
           "data.batch_size=16", "policy=keep", "failover.drills=[{step:25,action:degrade,device:2}]"], timeout=300)
    return run_dir


@pytest.fixture(scope="module")
def run(run_dir):
    return load_run(run_dir)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, teacher_file) -> Path:
    sweep_dir = tmp_path_factory.mktemp("analysis_sweep")
    train(["-m", f"hydra.sweep.dir={sweep_dir}", "data.batch_size=16,32", "policy=keep,degrade", *TINY,
           f"teacher.checkpoint={teacher_file}", "partition=even"], timeout=500)
    return sweep_dir


def gids(artists) -> Counter:
    return Counter(a.get_gid() for a in artists)


def events_named(run, name: str):
    return run.events[run.events["event"] == name]


# ---------------------------------------------------------------- one run
def test_loaders_on_a_real_failover_run(run):
    steps = run.steps
    assert list(steps["step"]) == list(range(1, STEPS + 1)) and set(steps["attempts"]) == {1}
    first_segment1 = steps[steps["segment"] == 1]["step"].min()
    assert steps[steps["segment"] == 0]["step"].max() < first_segment1
    devices = {segment: set(steps[steps["segment"] == segment]["num_devices"]) for segment in (0, 1)}
    assert devices == {0: {3}, 1: {2}}
    ranks = run.rank_timings.groupby("segment")["rank"].nunique()
    assert ranks.to_dict() == {0: 3, 1: 2}
    assert {"teacher_fwd", "student_bwd", "compute", "comm"} <= set(run.rank_timings["part"])
    assert {"fault_injected", "slowdown_detected", "decision", "checkpoint_saved", "first_step_after_restart"} <= set(
        run.events["event"])
    drill = run.decisions[run.decisions["chosen"] & (run.decisions["action"] == "degrade")]
    assert list(drill["step"]) == [25] and drill["devices"].iloc[0] == (0, 1)
    assert set(run.decisions["option"]) >= {"keep", "replan", "degrade"}
    restart = run.restarts.iloc[0]
    assert len(run.restarts) == 1 and restart["action"] == "degrade" and restart["recovery_s"] > restart["launch_s"] > 0
    assert list(run.segments["reason"]) == ["start", "degrade"] and run.segments["devices"].iloc[1] == (0, 1)
    assert run.evals["step"].iloc[-1] == STEPS and run.summary["steps"] == STEPS
    assert len(run.plan) == 3 and run.plan_step["predicted_step_s"] > 0 and run.plan["measured_compute_s"].gt(0).all()


def test_the_timeline_marks_fault_detection_decisions_checkpoints_and_the_restart(run):
    fig = plot_timeline(run)
    ax_time, ax_rate = fig.axes[:2]
    lines = gids(ax_time.lines)
    assert lines["step_time"] == 2 and gids(ax_rate.lines)["throughput"] == 2  # one per segment
    assert lines["fault_onset"] == len(events_named(run, "fault_injected")) == 1
    assert lines["detection"] == len(events_named(run, "slowdown_detected")) >= 1
    decisions = events_named(run, "decision")
    assert lines["decision"] == (decisions["action"] != "keep").sum() == 1
    assert lines["keep"] == (decisions["action"] == "keep").sum()
    assert lines["checkpoint"] == events_named(run, "checkpoint_saved")["step"].nunique() >= 2
    assert gids(ax_time.patches)["restart"] == 1
    legend = [t.get_text() for t in ax_time.get_legend().get_texts()]
    assert any(t.startswith("segment 0: devices 0,1,2 (start)") for t in legend)
    assert any(t.startswith("segment 1: devices 0,1 (degrade)") for t in legend)
    assert "fault injected" in [t.get_text() for t in ax_rate.get_legend().get_texts()]
    written = [t.get_text() for t in ax_time.texts]
    assert "DEGRADE" in written and any(t.startswith("restart ") for t in written)
    assert ax_time.get_ylabel() == "step time (s)" and ax_rate.get_ylabel() == "throughput (images/s)"
    assert ax_rate.get_xlabel() == "optimizer step"


def test_over_wall_time_the_restart_spans_its_recovery(run):
    ax = plot_timeline(run, x="time").axes[0]
    span = next(p for p in ax.patches if p.get_gid() == "restart")
    assert span.get_width() == pytest.approx(run.restarts["recovery_s"].iloc[0])
    assert ax.get_xlabel() == "" and "time since the run started" in plot_timeline(run, x="time").axes[1].get_xlabel()


def test_the_rank_heatmap_has_a_cell_per_rank_and_step_and_a_segment_boundary(run):
    fig = plot_rank_heatmap(run)
    ax = fig.axes[0]
    cells = np.ma.asarray(ax.collections[0].get_array())
    assert cells.size == 3 * STEPS
    assert cells.reshape(3, STEPS)[2].mask.sum() == (run.steps["segment"] == 1).sum()  # rank 2 left at the restart
    assert gids(ax.lines)["segment_boundary"] == 1
    assert fig.axes[1].get_ylabel() == "compute per step (s)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]


def test_the_decision_figure_shows_every_option_and_the_realised_time(run):
    fig = plot_decision_etas(run)
    ax = fig.axes[0]
    decisions = run.decisions["decision"].nunique()
    bars = gids(ax.patches)
    for option in set(run.decisions["option"]):
        assert bars[f"eta_{option}"] == decisions
    assert sum(1 for p in ax.patches if p.get_hatch()) == decisions  # the chosen option of each
    realised = next(line for line in ax.lines if line.get_gid() == "realised")
    expected = decision_outcomes(run)["realised_remaining_s"]
    assert np.allclose(realised.get_ydata(), expected) and (expected >= 0).all()
    assert ax.get_ylabel() == "time to finish the run (s)"


def test_the_plan_figure_compares_each_stage_and_the_step_time(run):
    fig = plot_plan_vs_measured(run)
    ax_stage, ax_step = fig.axes[:2]
    bars = gids(ax_stage.patches)
    assert bars["predicted_compute"] == bars["measured_compute"] == 3
    heights = [p.get_height() for p in ax_stage.patches if p.get_gid() == "measured_compute"]
    assert np.allclose(heights, run.plan["measured_compute_s"])
    predicted = next(line for line in ax_step.lines if line.get_gid() == "predicted_step")
    assert predicted.get_ydata()[0] == pytest.approx(run.plan_step["predicted_step_s"])
    assert gids(ax_step.lines)["measured_step"] == 1


def test_the_run_report_has_every_figure_and_the_tables(run_dir):
    report = write_report(run_dir)
    assert report == run_dir / "report" / "report.md"
    for name in RUN_FIGURES:
        for fmt in ("png", "svg"):
            assert (report.parent / f"{name}.{fmt}").stat().st_size > 1000, f"{name}.{fmt}"
    text = report.read_text()
    for heading in ("## Summary", "## Segments", "## Decisions", "## Restarts", "## Time lost",
                    "## Counterfactual: predicted vs realised", "## Figures"):
        assert heading in text
    assert "drill at step 25" in text and "not drawn" not in text and "](timeline.svg)" in text


# ---------------------------------------------------------------- the sweep
# A real 4-job sweep (a minute); -m extended. The default suite sweeps through train.py in
# test_sweeps.py, and loads and draws recorded sweeps in tests/unit (test_analysis_load, test_sweep_figures).
on_a_real_sweep = pytest.mark.extended


@on_a_real_sweep
def test_load_sweep_on_a_real_multirun(sweep_dir):
    sweep = load_sweep(sweep_dir)
    assert len(sweep) == 4 and set(sweep["status"]) == {"finished"}
    assert set(zip(sweep["batch_size"], sweep["policy"])) == {(16, "keep"), (16, "degrade"), (32, "keep"),
                                                              (32, "degrade")}
    assert list(sweep["data.batch_size"]) == list(sweep["batch_size"])
    keep = sweep[sweep["policy"] == "keep"]
    assert set(keep["restarts"]) == {0} and set(keep["decisions"]) == {0} and set(keep["recovery_s"]) == {0.0}
    assert set(sweep["scenario"]) == {"data.batch_size=16", "data.batch_size=32"}
    assert set(sweep["slowdown"]) == {"slow_compute r2@12 x4"} and (sweep["steps"] == STEPS).all()
    regret = policy_regret(sweep)
    assert len(regret) == 4 and (regret.groupby("scenario")["regret_s"].min() == 0).all()


@on_a_real_sweep
def test_the_sweep_figures_have_a_bar_per_policy_and_group(sweep_dir):
    sweep = load_sweep(sweep_dir)
    fig = plot_sweep(sweep)
    panels = [ax for ax in fig.axes if ax.containers]
    assert len(panels) == len(SWEEP_METRICS)
    for ax, (metric, label) in zip(panels, SWEEP_METRICS):
        assert ax.get_ylabel() == label
        for container in ax.containers:
            jobs = sweep[sweep["policy"] == container.get_label()].sort_values("batch_size")
            assert np.allclose([bar.get_height() for bar in container], jobs[metric])
            assert {bar.get_gid() for bar in container} == {metric}
    # One job per policy and scenario: a regret figure would rank single noisy runs, so none is drawn.
    with pytest.raises(NoDataError, match="no scenario was repeated"):
        plot_regret(policy_regret(sweep))


@on_a_real_sweep
def test_the_sweep_report_from_the_command_line(sweep_dir):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run([sys.executable, "-m", "synapse.analysis", "report", str(sweep_dir)], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    report = sweep_dir / "report"
    assert f"report: {report / 'report.md'}" in result.stdout
    assert (report / "sweep_comparison.png").stat().st_size > 1000 and (report / "sweep_comparison.svg").is_file()
    text = (report / "report.md").read_text()
    assert "## Jobs" in text and "## Regret" in text and text.count("| data.batch_size=") >= 8
    assert "`policy_regret` not drawn: no scenario was repeated" in text
    assert text.count("[train.log](../") == 4, "every job's log is linked from the sweep report"
    assert len((report / "jobs.csv").read_text().splitlines()) == 5


# ---------------------------------------------------------------- the notebooks
# The sweep notebook needs the real 4-job sweep (-m extended, with its tests above): in the default
# suite it alone would cost that sweep's minute against the 20-minute budget.
@pytest.mark.parametrize("notebook, variable, fixture, min_images", [
    ("failover_story", "SYNAPSE_RUN_DIR", "run_dir", 5),
    pytest.param("sweep_comparison", "SYNAPSE_SWEEP_DIR", "sweep_dir", 1, marks=on_a_real_sweep)])
def test_the_notebooks_run_headless_on_fresh_outputs(request, monkeypatch, notebook, variable, fixture, min_images):
    monkeypatch.setenv(variable, str(request.getfixturevalue(fixture)))
    path = REPO_ROOT / "notebooks" / f"{notebook}.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= min_images
    assert any(str(request.getfixturevalue(fixture)) in o.get("text", "") for o in outputs)
