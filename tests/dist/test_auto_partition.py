"""partition=auto: profile, plan, run the plan, and compare prediction with measurement."""
from __future__ import annotations

import json

import pytest
import yaml

from synapse.app import run

from .helpers import compose_config

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def test_auto_partition_plans_runs_and_records_prediction_against_measurement(tmp_path, teacher_file):
    cfg = compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", "trainer.devices=2", "partition=auto",
                                    "partition.alphas=[1,4]", "trainer.max_steps=6",
                                    "partition.profile_repeats=3", "partition.profile_warmup=1"])
    run(cfg, log=lambda m: None)
    plan = json.loads((tmp_path / "plan.json").read_text())["plan"]
    used = json.loads((tmp_path / "partition.json").read_text())
    assert used == {"devices": [0, 1], "teacher": list(plan["teacher_counts"]), "student": list(plan["student_counts"])}
    # Device 1 is planned 4x slower: it must get the smaller share of the predicted compute.
    assert plan["stage_compute_s"][1] < 4 * plan["stage_compute_s"][0]
    assert sum(used["teacher"]) == 11 and sum(used["student"]) == 11
    comparison = json.loads((tmp_path / "plan_vs_measured.json").read_text())
    assert comparison["measured_step_s"] > 0 and len(comparison["measured_stage_compute_s"]) == 2
    assert comparison["step_error"] == pytest.approx(comparison["predicted_step_s"] / comparison["measured_step_s"] - 1)


def test_profile_mode_writes_both_profiles_to_the_cache(tmp_path):
    cfg = compose_config(tmp_path, ["mode=profile", "partition.profile_repeats=2", "partition.profile_warmup=1"])
    result = run(cfg, log=lambda m: None)
    for key in ("teacher_profile", "student_profile"):
        assert str(tmp_path / "cache" / "profiles") in result[key]
        assert (tmp_path / "cache" / "profiles").is_dir()


@pytest.mark.extended  # auto cuts run in the default suite; auto micro-batches are a further run
def test_auto_microbatches_are_chosen_with_the_cuts_and_kept_by_every_stage(tmp_path, teacher_file):
    # Two CPU ranks, batch 16: candidates 2, 4 and 8 micro-batches, each priced with profiles measured
    # at its own micro-batch size; a forced restart shows the next segment keeps the chosen count. The run
    # goes on well past the drill: a stop that lands after the last step restarts nothing (a 6-step run raced).
    cfg = compose_config(tmp_path, [f"teacher.checkpoint={teacher_file}", "trainer.devices=2", "partition=auto",
                                    "pipeline.microbatches=auto", "trainer.max_steps=12",
                                    "partition.profile_repeats=2", "partition.profile_warmup=1",
                                    "failover.replan_mode=restart", "failover.drills=[{step:3,action:replan}]"])
    run(cfg, log=lambda m: None)
    choice = json.loads((tmp_path / "microbatches.json").read_text())
    assert choice["candidates"] == [2, 4, 8]
    times = {int(m): t for m, t in choice["predicted_step_s"].items()}
    assert choice["chosen"] == min(times, key=times.get)
    assert json.loads((tmp_path / "plan.json").read_text())["plan"]["microbatches"] == choice["chosen"]
    # The count lives in the run's plan, not in the user's config: each segment records it, segment 0's
    # config says what the user asked (auto), and a later segment's is composed with the count.
    for segment in (0, 1):
        record = json.loads((tmp_path / "segments" / str(segment) / "segment.json").read_text())
        assert record["microbatches"] == choice["chosen"]
    first, second = (yaml.safe_load((tmp_path / "segments" / str(s) / "config.yaml").read_text()) for s in (0, 1))
    assert first["pipeline"]["microbatches"] == "auto" and second["pipeline"]["microbatches"] == choice["chosen"]
    profiles = {p.name for p in (tmp_path / "cache" / "profiles").glob("*student*.csv")}
    assert {f"mb{16 // m}" for m in (2, 4, 8)} <= {part for name in profiles for part in name.split("_")}
