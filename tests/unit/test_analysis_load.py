"""synapse.analysis on hand-written run and sweep directories: loaders, markers, counterfactuals, tables.

The records follow what the failover system writes (metrics.jsonl, performance.jsonl,
failover_events.jsonl, experiment_summary.json, segments/<n>/segment.json, .hydra/overrides.yaml);
tests/dist/test_analysis.py checks the same code on real runs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from synapse.analysis import (
    DECISION_COLUMNS,
    RANK_TIMING_COLUMNS,
    RESTART_COLUMNS,
    SEGMENT_COLUMNS,
    NoDataError,
    RecordFileError,
    RunDirError,
    SweepDirError,
    cell,
    decision_outcomes,
    describe_faults,
    latest_run_dir,
    latest_sweep_dir,
    load_run,
    load_runs,
    load_sweep,
    markdown_table,
    option_etas,
    override_value,
    plot_decision_etas,
    plot_plan_vs_measured,
    plot_rank_heatmap,
    plot_regret,
    plot_sweep,
    plot_timeline,
    policy_regret,
    scenario_labels,
    timeline_markers,
    write_report,
)

T0 = 1_000_000.0
PARTS = {"teacher_fwd": 0.01, "student_fwd": 0.01, "student_bwd": 0.02, "loss": 0.0, "optimizer": 0.001,
         "compute": 0.041, "comm": 0.02, "wall": 0.061}


def write_jsonl(path: Path, records: list[dict], torn_tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn_tail)


def perf(step: int, segment: int = 0, devices=(0, 1, 2), seconds: float = 0.1, time: float | None = None) -> dict:
    k = len(devices)
    return {"step": step, "segment": segment, "devices": list(devices), "total_steps": 10, "step_seconds": seconds,
            "compute_s": [0.04 + 0.001 * r for r in range(k)], "comm_s": [0.02] * k,
            "ranks": [dict(PARTS) for _ in range(k)], "images_per_s": 16 / seconds,
            "time": T0 + step if time is None else time}


def train(step: int, loss: float, time: float | None = None) -> dict:
    return {"kind": "train", "step": step, "epoch": 0, "loss": loss, "lr": 0.001, "step_time_s": 0.1,
            "images_per_s": 160.0, "time": T0 + step if time is None else time}


def option(kind: str, eta: float, devices=(0, 1, 2)) -> dict:
    return {"kind": kind, "devices": list(devices), "teacher_counts": [1], "student_counts": [1],
            "predicted_step_s": eta / 10, "restart_cost_s": 0.0 if kind == "keep" else 2.0, "eta_s": eta}


def decision(step: int, action: str, time: float, etas=(("keep", 9.0), ("replan", 7.0), ("degrade", 6.0))) -> dict:
    options = [option(kind, eta, (0, 1) if kind == "degrade" else (0, 1, 2)) for kind, eta in etas]
    chosen = next(o for o in options if o["kind"] == action)
    return {"time": time, "source": "controller", "event": "decision", "step": step, "action": action,
            "reason": f"{action} because", "remaining_steps": 10 - step, "eta_s": chosen["eta_s"], "chosen": chosen,
            "options": options, "baseline_step_s": 0.1, "measured_step_s": 0.3}


def summary(decisions=(), restarts=(), segments=None) -> dict:
    segments = segments if segments is not None else [
        {"index": 0, "devices": [0, 1, 2], "teacher_counts": [1, 1, 1], "student_counts": [1, 1, 1], "reason": "start",
         "resume": None, "start_step": 0, "started_at": T0 - 1, "ended_at": T0 + 5.5, "end_step": 5,
         "outcome": "stopped", "wall_s": 6.5},
        {"index": 1, "devices": [0, 1], "teacher_counts": [2, 1], "student_counts": [2, 1], "reason": "degrade",
         "resume": "r", "start_step": 5, "started_at": T0 + 6, "ended_at": T0 + 11, "end_step": 10,
         "outcome": "finished", "wall_s": 5.0}]
    return {"policy": "eta", "injection": "demo", "wall_time_s": 12.0, "steps": 10, "total_steps": 10,
            "segments": segments, "decisions": list(decisions), "restarts": list(restarts),
            "time_lost_s": {"slow_steps_s": 0.5, "restart_downtime_s": 2.0, "total_s": 2.5},
            "final_eval": {"student_top1": 42.0}}


RESTART = {"segment": 1, "action": "degrade", "trigger_time": T0 + 4.2, "trigger_step": 5, "resume_step": 3,
           "relaunch_time": T0 + 5.8, "components": {"checkpoint_save_s": 0.1, "launch_s": 1.5}, "recovery_s": 2.0,
           "first_step": 4, "cause": "degrade because", "trigger": "decision", "mode": "restart", "downtime_s": 1.9}


@pytest.fixture
def failover_run(tmp_path: Path) -> Path:
    """A degrade after step 5 that resumed from checkpoint 3, so steps 4 and 5 were done twice."""
    run = tmp_path / "run"
    run.mkdir()
    first = [perf(s, time=T0 + s) for s in range(1, 6)]
    redone = [perf(s, segment=1, devices=(0, 1), seconds=0.2, time=T0 + 6 + s) for s in range(4, 11)]
    write_jsonl(run / "performance.jsonl", first + redone)
    metrics = [train(s, 1.0, T0 + s) for s in range(1, 6)] + [train(s, 0.5, T0 + 6 + s) for s in range(4, 11)]
    metrics += [{"kind": "eval", "step": 5, "student_top1": 10.0, "time": T0 + 5.1},
                {"kind": "eval", "step": 10, "student_top1": 30.0, "time": T0 + 16.5}]
    write_jsonl(run / "metrics.jsonl", metrics, torn_tail='{"kind": "train", "st')
    events = [
        {"time": T0 + 0.5, "source": "worker", "event": "launch_ready", "segment": 0, "step": 0},
        {"time": T0 + 2.0, "source": "injector", "event": "fault_injected", "kind": "slow_compute", "rank": 2,
         "step": 2, "factor": 4.0},
        {"time": T0 + 3.05, "source": "worker", "event": "checkpoint_saved", "step": 3, "for_stop": False},
        {"time": T0 + 3.5, "source": "controller", "event": "slowdown_detected", "rank": 2, "kind": "compute",
         "ratio": 3.5, "onset_step": 2, "detected_step": 3, "latency_steps": 1, "step": 3},
        decision(3, "keep", T0 + 3.6), decision(4, "degrade", T0 + 4.2),
        {"time": T0 + 4.5, "source": "health", "event": "rank_dead", "rank": 2, "hard": True},
        {"time": T0 + 4.6, "source": "health", "event": "throttle", "rank": 1, "hard": False},
        {"time": T0 + 5.05, "source": "injector", "event": "fault_cleared", "rank": 2, "reason": "worker_exit"},
    ]
    write_jsonl(run / "failover_events.jsonl", events)
    decisions = [{"step": 4, "action": "degrade", "reason": "degrade because", "eta_s": {"keep": 9.0, "degrade": 6.0},
                  "predicted_step_s": {"keep": 0.9, "degrade": 0.6}, "restart_cost_s": {"keep": 0, "degrade": 2}}]
    (run / "experiment_summary.json").write_text(json.dumps(summary(decisions, [RESTART])))
    (run / "config.yaml").write_text(yaml.safe_dump({"data": {"batch_size": 16}, "policy": {"name": "eta"}}))
    return run


# ---------------------------------------------------------------- load_run
def test_a_redone_step_keeps_its_later_record(failover_run):
    run = load_run(failover_run)
    steps = run.steps.set_index("step")
    assert list(steps.index) == list(range(1, 11))
    assert steps.loc[3, "segment"] == 0 and steps.loc[4, "segment"] == 1 and steps.loc[5, "segment"] == 1
    assert steps.loc[4, "loss"] == 0.5 and steps.loc[4, "step_s"] == 0.2 and steps.loc[4, "time"] == T0 + 10
    assert steps.loc[3, "loss"] == 1.0 and steps.loc[3, "num_devices"] == 3 and steps.loc[4, "num_devices"] == 2
    assert steps.loc[4, "devices"] == (0, 1)
    assert steps["attempts"].tolist() == [1, 1, 1, 2, 2, 1, 1, 1, 1, 1]


def test_rank_timings_are_long_with_every_part_and_the_device_of_each_rank(failover_run):
    timings = load_run(failover_run).rank_timings
    assert list(timings.columns[:len(RANK_TIMING_COLUMNS)]) == RANK_TIMING_COLUMNS
    assert len(timings) == (3 * 3 + 7 * 2) * len(PARTS)  # steps 1-3 on 3 ranks, 4-10 on 2
    compute = timings[(timings["part"] == "compute") & (timings["step"] == 2)]
    assert list(compute["rank"]) == [0, 1, 2] and list(compute["device"]) == [0, 1, 2]
    assert set(timings[timings["step"] == 4]["segment"]) == {1}


def test_decisions_are_one_row_per_decision_and_option_with_the_chosen_one_marked(failover_run):
    d = load_run(failover_run).decisions
    assert len(d) == 6 and list(d.columns[:len(DECISION_COLUMNS)]) == DECISION_COLUMNS
    chosen = d[d["chosen"]]
    assert list(chosen["option"]) == ["keep", "degrade"] and list(chosen["step"]) == [3, 4]
    assert d[(d["decision"] == 1) & (d["option"] == "degrade")]["devices"].iloc[0] == (0, 1)
    assert d[d["option"] == "replan"]["eta_s"].tolist() == [7.0, 7.0]


def test_stages_restarts_evals_and_summary(failover_run):
    run = load_run(failover_run)
    assert list(run.segments["segment"]) == [0, 1] and run.segments["devices"].iloc[1] == (0, 1)
    r = run.restarts.iloc[0]
    assert (r["recovery_s"], r["redo_steps"], r["checkpoint_save_s"], r["mode"]) == (2.0, 2, 0.1, "restart")
    assert math.isnan(r["teardown_s"])  # a part the record lacks
    assert list(run.evals["student_top1"]) == [10.0, 30.0]
    assert run.summary["final_eval"]["student_top1"] == 42.0 and run.config["data"]["batch_size"] == 16
    assert run.has_failover and run.wall_time_s == 12.0


def test_times_count_from_the_start_of_the_first_stage(failover_run):
    run = load_run(failover_run)
    assert run.start_time == T0 - 1 and run.end_time == T0 + 16
    assert run.steps["elapsed_s"].iloc[0] == 2.0 and run.events["elapsed_s"].iloc[0] == 1.5


def test_a_torn_last_line_is_skipped_but_a_broken_middle_line_is_an_error(failover_run):
    assert len(load_run(failover_run).steps) == 10  # metrics.jsonl ends with half a record
    path = failover_run / "performance.jsonl"
    path.write_text(path.read_text().replace("\n", "\nnot json\n", 1))
    with pytest.raises(RecordFileError, match=r"performance.jsonl:2 is not JSON"):
        load_run(failover_run)


def test_the_report_leaves_a_broken_middle_line_out_and_names_it(failover_run):
    path = failover_run / "performance.jsonl"
    path.write_text(path.read_text().replace("\n", "\n<b>not json\n", 1))
    run = load_run(failover_run, skip_damaged_lines=True)
    assert len(run.skipped_lines) == 1 and "performance.jsonl:2 is not JSON" in run.skipped_lines[0]
    assert len(run.steps) == 10, "every other record is read"
    text = write_report(failover_run, formats=("svg",)).read_text()
    section = text.split("## Damaged records left out")[1].split("##")[0]
    assert "performance.jsonl:2 is not JSON" in section and "<b>" not in section  # named, inert


def test_a_single_device_run_has_empty_failover_frames_with_their_columns(tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", [train(1, 1.0), train(2, 0.9), {"kind": "eval", "step": 2,
                                                                             "student_top1": 5.0}])
    run = load_run(tmp_path)
    assert list(run.steps["step"]) == [1, 2] and set(run.steps["segment"]) == {0}
    assert run.steps["step_s"].tolist() == [0.1, 0.1]
    for df, columns in ((run.decisions, DECISION_COLUMNS), (run.segments, SEGMENT_COLUMNS),
                        (run.restarts, RESTART_COLUMNS), (run.rank_timings, RANK_TIMING_COLUMNS)):
        assert df.empty and set(columns) <= set(df.columns)
    assert run.events.empty and run.plan.empty and run.summary == {} and not run.has_failover
    assert decision_outcomes(run).empty and option_etas(run).empty and timeline_markers(run).empty


def test_without_an_experiment_summary_stages_and_restarts_come_from_their_own_records(failover_run):
    (failover_run / "experiment_summary.json").unlink()
    for index, reason, start in ((0, "start", 0), (1, "degrade", 5)):
        folder = failover_run / "segments" / str(index)
        folder.mkdir(parents=True)
        (folder / "segment.json").write_text(json.dumps({"index": index, "devices": [0, 1], "reason": reason,
                                                       "start_step": start, "started_at": T0 + start}))
    with (failover_run / "failover_events.jsonl").open("a") as f:
        f.write(json.dumps({"time": T0 + 12, "event": "first_step_after_restart", "segment": 1, "step": 4,
                            "action": "degrade", "recovery_s": 2.5, "components": {"launch_s": 1.0},
                            "redo_steps": 2}) + "\n")
    run = load_run(failover_run)
    assert list(run.segments["reason"]) == ["start", "degrade"] and math.isnan(run.segments["wall_s"].iloc[0])
    assert run.restarts[["segment", "first_step", "recovery_s", "launch_s", "redo_steps"]].iloc[0].tolist() == [
        1, 4, 2.5, 1.0, 2]
    assert run.wall_time_s == run.end_time - run.start_time


def test_decisions_fall_back_to_the_summary_when_the_event_log_is_missing(failover_run):
    (failover_run / "failover_events.jsonl").unlink()
    d = load_run(failover_run).decisions
    assert list(d["option"]) == ["keep", "degrade"] and list(d["chosen"]) == [False, True]
    assert d["time"].isna().all() and list(d["restart_cost_s"]) == [0, 2]


def test_steps_of_records_without_a_stage_take_it_from_the_stage_ranges(tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", [train(s, 1.0) for s in range(1, 11)])
    (tmp_path / "experiment_summary.json").write_text(json.dumps(summary()))
    segments = load_run(tmp_path).steps.set_index("step")["segment"]
    assert segments[5] == 0 and segments[6] == 1 and segments[10] == 1


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "is a file"),
    (lambda p: p, "is not a run directory: it has none of metrics.jsonl"),
    (lambda p: (p / "multirun.yaml").write_text("{}") and p, r"is a sweep .* use load_sweep"),
])
def test_a_directory_that_is_not_a_run_is_refused_with_the_fix(tmp_path, make, message):
    with pytest.raises(RunDirError, match=message):
        load_run(make(tmp_path))


def test_load_runs_loads_each(failover_run, tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", [train(1, 1.0)])
    runs = load_runs([failover_run, tmp_path])
    assert [len(r.steps) for r in runs] == [10, 1]


# ---------------------------------------------------------------- markers and counterfactuals
def test_markers_tell_the_story_in_time_order(failover_run):
    markers = timeline_markers(load_run(failover_run))
    kinds = list(markers["kind"])
    assert kinds == ["fault_onset", "checkpoint", "detection", "keep", "decision", "restart", "failure"]
    by_kind = markers.set_index("kind")
    assert by_kind.loc["detection", "step"] == 3  # the step it was detected at, not its onset
    assert by_kind.loc["restart", "end_step"] == 4 and by_kind.loc["restart", "end_time"] == T0 + 6.2
    # A health event has no step: the last one finished before it (its first run: step 4 was redone later).
    assert by_kind.loc["failure", "step"] == 4
    assert by_kind.loc["decision", "short"] == "DEGRADE" and "x4" in by_kind.loc["fault_onset", "label"]


def test_decision_outcomes_compare_the_chosen_eta_with_the_realised_remaining_time(failover_run):
    outcomes = decision_outcomes(load_run(failover_run)).set_index("step")
    # The run's last step ended at T0 + 16; the decisions were taken at T0 + 3.6 and T0 + 4.2.
    assert outcomes.loc[3, "realised_remaining_s"] == pytest.approx(12.4)
    assert outcomes.loc[4, "predicted_eta_s"] == 6.0
    assert outcomes.loc[4, "error_s"] == pytest.approx(6.0 - 11.8)
    assert outcomes.loc[4, "error_frac"] == pytest.approx((6.0 - 11.8) / 11.8)
    assert list(outcomes["later_actions"]) == [1, 0]


def test_a_decision_logged_after_the_last_step_s_record_had_nothing_left_to_run(failover_run):
    """The controller decides on a step's record, so a decision on the last step is logged after
    the run's end: its realised remaining time is 0, not a negative one, and its error is unscaled."""
    with (failover_run / "failover_events.jsonl").open("a") as f:
        f.write(json.dumps(decision(10, "keep", T0 + 16.02)) + "\n")
    last = decision_outcomes(load_run(failover_run)).set_index("step").loc[10]
    assert last["realised_remaining_s"] == 0.0 and last["error_s"] == 9.0 and math.isnan(last["error_frac"])


def test_option_etas_has_one_column_per_option_in_order(failover_run):
    etas = option_etas(load_run(failover_run))
    assert list(etas.columns) == ["decision", "step", "action", "eta_keep_s", "eta_replan_s", "eta_degrade_s"]
    assert etas["eta_degrade_s"].tolist() == [6.0, 6.0]


def sweep_frame(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["scenario", "policy", "wall_time_s"])


def test_policy_regret_is_measured_against_the_best_policy_of_each_scenario():
    regret = policy_regret(sweep_frame([("a", "keep", 10.0), ("a", "degrade", 12.0), ("a", "degrade", 14.0),
                                        ("b", "keep", 20.0), ("b", "eta", 15.0), ("c", "keep", 1.0)]))
    table = regret.set_index(["scenario", "policy"])
    assert table.loc[("a", "degrade"), "value"] == 13.0 and table.loc[("a", "degrade"), "jobs"] == 2
    assert table.loc[("a", "degrade"), "regret_s"] == 3.0 and table.loc[("a", "keep"), "regret_s"] == 0.0
    assert table.loc[("b", "keep"), "regret_frac"] == pytest.approx(5 / 15) and table.loc[("b", "keep"),
                                                                                          "best_policy"] == "eta"
    assert "c" not in set(regret["scenario"])  # one policy only: nothing to compare


def test_policy_regret_needs_a_sweep_frame():
    with pytest.raises(ValueError, match="needs a 'scenario' column"):
        policy_regret(pd.DataFrame({"policy": ["keep"], "wall_time_s": [1.0]}))


# ---------------------------------------------------------------- sweeps
def make_job(sweep: Path, job: int, overrides: list[str], wall: float, policy: str, batch: int) -> Path:
    folder = sweep / str(job)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    write_jsonl(folder / "metrics.jsonl", [train(1, 1.0)])
    faults = [{"kind": "slow_compute", "rank": 2, "start": 12, "factor": 4.0}]
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": {"batch_size": batch}, "policy": {"name": policy},
                                                        "injection": {"name": "demo", "faults": faults}}))
    restarts = [RESTART] if policy == "degrade" else []
    (folder / "experiment_summary.json").write_text(json.dumps({**summary(restarts=restarts), "wall_time_s": wall}))
    return folder


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for job, (batch, policy, wall) in enumerate([(16, "keep", 10.0), (16, "degrade", 8.0), (32, "keep", 7.0),
                                                 (32, "degrade", 9.0)]):
        make_job(sweep, job, [f"data.batch_size={batch}", f"policy={policy}", "trainer.threads=1",
                              "+failover.detector.warmup_steps=3"], wall, policy, batch)
    return sweep


def test_load_sweep_has_a_row_per_job_with_its_overrides_and_outcome(sweep_dir):
    sweep = load_sweep(sweep_dir)
    assert list(sweep["job"]) == [0, 1, 2, 3] and list(sweep["data.batch_size"]) == [16, 16, 32, 32]
    assert list(sweep["policy"]) == ["keep", "degrade", "keep", "degrade"]
    assert list(sweep["failover.detector.warmup_steps"]) == [3] * 4  # the '+' is not part of the key
    assert list(sweep["scenario"]) == ["data.batch_size=16"] * 2 + ["data.batch_size=32"] * 2
    assert list(sweep["restarts"]) == [0, 1, 0, 1] and list(sweep["recovery_s"]) == [0.0, 2.0, 0.0, 2.0]
    assert set(sweep["status"]) == {"finished"} and set(sweep["time_lost_s"]) == {2.5}
    assert set(sweep["slowdown"]) == {"slow_compute r2@12 x4"} and set(sweep["final_top1"]) == {42.0}
    assert "data.batch_size" in sweep.attrs["overrides"]
    regret = policy_regret(sweep).set_index(["scenario", "policy"])["regret_s"]
    assert regret[("data.batch_size=16", "keep")] == 2.0 and regret[("data.batch_size=32", "degrade")] == 2.0


def test_a_job_that_wrote_nothing_keeps_its_row_and_says_why(sweep_dir):
    (sweep_dir / "4" / ".hydra").mkdir(parents=True)
    sweep = load_sweep(sweep_dir)
    assert len(sweep) == 5 and sweep["status"].iloc[4].startswith("unreadable: ")
    assert math.isnan(sweep["wall_time_s"].iloc[4])


def test_a_directory_that_is_not_a_sweep_is_refused(tmp_path, failover_run):
    with pytest.raises(SweepDirError, match="does not exist"):
        load_sweep(tmp_path / "nothing")
    with pytest.raises(SweepDirError, match="It is one run: use load_run"):
        load_sweep(failover_run)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SweepDirError, match="no numbered job folders"):
        load_sweep(tmp_path / "empty")


@pytest.mark.parametrize("text, value", [("16", 16), ("4.0", 4.0), ("True", True), ("false", False),
                                         ("null", None), ("keep", "keep"), ("[{kind:x}]", "[{kind:x}]")])
def test_override_values_are_numbers_where_they_are_numbers(text, value):
    assert override_value(text) == value and type(override_value(text)) is type(value)


def test_scenario_labels_name_what_differs_apart_from_the_policy():
    jobs = [{"a": 1, "policy": "keep", "policy.params.x": 1, "same": 0}, {"a": 2, "policy": "eta", "same": 0}]
    assert scenario_labels(jobs) == ["a=1", "a=2"]
    assert scenario_labels([{"policy": "keep"}, {"policy": "eta"}]) == ["all", "all"]


def test_faults_are_described_briefly():
    assert describe_faults([]) == "none"
    assert describe_faults([{"kind": "kill", "rank": 1, "start": 5},
                            {"kind": "slow_comm", "rank": 0, "start": 3, "end": 9, "factor": 2.5}]) == \
        "kill r1@5 + slow_comm r0@3-9 x2.5"


def test_the_newest_run_and_sweep_are_found_under_outputs(tmp_path, sweep_dir):
    outputs = tmp_path / "outputs"
    for name in ("a", "b"):
        (outputs / "2026-01-01" / name).mkdir(parents=True)
        write_jsonl(outputs / "2026-01-01" / name / "metrics.jsonl", [train(1, 1.0)])
    assert latest_run_dir(outputs).name in ("a", "b")
    with pytest.raises(SweepDirError, match="no sweep under"):
        latest_sweep_dir(outputs)
    (outputs / "multirun" / "2026-01-01").mkdir(parents=True)
    sweep_dir.rename(outputs / "multirun" / "2026-01-01" / "x")
    assert latest_sweep_dir(outputs).name == "x"
    with pytest.raises(RunDirError, match="no run directory under"):
        latest_run_dir(tmp_path / "none")


# ---------------------------------------------------------------- figures without data, tables
def test_figures_without_their_records_say_which_records_are_missing(tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", [])
    run = load_run(tmp_path)
    for plot, message in ((plot_timeline, "no step records"), (plot_rank_heatmap, "no per-rank timings"),
                          (plot_decision_etas, "logged no failover decision"),
                          (plot_plan_vs_measured, "no plan_vs_measured.json")):
        with pytest.raises(NoDataError, match=message):
            plot(run)
    with pytest.raises(NoDataError, match="no scenario was run under two or more policies"):
        plot_regret(policy_regret(sweep_frame([("a", "keep", 1.0)])))
    with pytest.raises(NoDataError, match="no jobs"):
        plot_sweep(pd.DataFrame(columns=["batch_size", "slowdown", "policy"]))


def test_bad_figure_arguments_are_refused(failover_run):
    run = load_run(failover_run)
    with pytest.raises(ValueError, match="x='epoch'"):
        plot_timeline(run, x="epoch")
    with pytest.raises(ValueError, match="by='node'"):
        plot_rank_heatmap(run, by="node")
    with pytest.raises(NoDataError, match=r"no 'gpu' timings .* parts recorded: \['comm', 'compute'"):
        plot_rank_heatmap(run, part="gpu")


@pytest.mark.parametrize("value, text", [(None, "–"), (float("nan"), "–"), (pd.NA, "–"), (True, "yes"),
                                         (123.456, "123.5"), (2.345, "2.35"), (0.012345, "0.0123"), (0.0, "0.0"),
                                         ((0, 1), "0,1"), ({"a": 1.5}, "a: 1.50"), ("a|b", "a\\|b"), (7, "7")])
def test_table_cells(value, text):
    assert cell(value) == text


def test_markdown_table_renames_selects_and_prints_whole_floats_as_integers():
    df = pd.DataFrame({"step": [1.0, float("nan")], "eta": [1.234, 2.0], "hidden": [0, 0]})
    assert markdown_table(df, {"step": "at step", "eta": "ETA (s)"}) == (
        "| at step | ETA (s) |\n|---|---|\n| 1 | 1.23 |\n| – | 2.00 |")
    assert markdown_table(df.iloc[:0], empty="nothing") == "nothing"


def test_the_report_shows_the_stages_measured_for_block_calibration(failover_run):
    from synapse.analysis.report import _calibration_markdown
    assert _calibration_markdown(load_run(failover_run)).startswith("_No stage was measured")
    measured = {"time": T0 + 2.5, "source": "controller", "event": "block_calibration", "step": 2,
                "stages": [{"rank": 1, "device": 1, "profile_s": 0.02, "measured_s": 0.04, "slowdown": 1.0,
                          "ratio": 2.0}], "factors": {"teacher": [2.0], "student": [2.0], "neutral": 2.0}}
    events = failover_run / "failover_events.jsonl"
    events.write_text(events.read_text() + json.dumps(measured) + "\n")
    table = _calibration_markdown(load_run(failover_run)).splitlines()[-1]
    assert table == "| 2 | 1 | 1 | 20 | 40 | 1 | 2 |"  # whole numbers are shown as integers
