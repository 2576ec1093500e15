"""mode=simulate (issue #35): the real controller on simulated step timings, the real records.

Every run here simulates ViT-L -> ResNet-152 on the shared block profiles (tests/data), GPUs that
need not exist, a few hundred steps: under a second of simulation each.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from synapse.app import run
from synapse.config import ConfigError
from synapse.rundir import EVENTS, EXPERIMENT_SUMMARY, PERFORMANCE, read_events, read_jsonl
from tests.conftest import compose_config

PROFILES = Path(__file__).resolve().parents[1] / "data" / "synapse_profiles"
SIMULATED = (
    "mode=simulate",
    "report=false",
    "teacher=vit_large",
    "student=resnet152",
    "trainer.accelerator=cuda",
    "trainer.devices=4",
    "trainer.max_steps=300",
    "injection=none",
    f"simulate.teacher_profile={PROFILES / 'tnet_vit_large.csv'}",
    f"simulate.student_profile={PROFILES / 'snet_resnet152.csv'}",
)


def simulate(run_dir: Path, *overrides: str) -> dict:
    return run(compose_config([*SIMULATED, *overrides], run_dir), log=lambda line: None)["simulation"]


def actions(run_dir: Path) -> list[dict]:
    return [e for e in read_events(run_dir, "decision") if e["action"] != "keep"]


def test_a_fault_free_simulated_run_makes_no_decision(tmp_path):
    result = simulate(tmp_path)
    assert result["completed"] and result["steps"] == 300
    assert len(read_jsonl(PERFORMANCE.path(tmp_path))) == 300
    assert not read_events(tmp_path, "slowdown_detected")
    assert not actions(tmp_path) and result["decisions"] == []
    assert json.loads(EXPERIMENT_SUMMARY.path(tmp_path).read_text())["segments"][0]["outcome"] == "finished"


@pytest.mark.parametrize("policy", ["eta", "degrade"])
def test_a_slowdown_injected_at_a_step_is_detected_and_acted_on(tmp_path, policy):
    simulate(tmp_path, f"policy={policy}", "injection.faults=[{kind:slow_compute,rank:1,start:120,factor:4}]")
    detected = read_events(tmp_path, "slowdown_detected")
    assert detected and detected[0]["rank"] == 1 and detected[0]["onset_step"] == 120
    acted = actions(tmp_path)
    assert acted and 120 <= acted[0]["step"] <= 140, acted
    summary = json.loads(EXPERIMENT_SUMMARY.path(tmp_path).read_text())
    assert len(summary["segments"]) >= 2 and summary["restarts"][0]["recovery_s"] > 0


def test_keep_rides_the_slowdown_out_and_takes_longer(tmp_path):
    fault = "injection.faults=[{kind:slow_compute,rank:1,start:120,factor:4}]"
    keep = simulate(tmp_path / "keep", "policy=keep", fault)
    eta = simulate(tmp_path / "eta", "policy=eta", fault)
    assert keep["decisions"] == [] and eta["decisions"]
    assert eta["wall_time_s"] < keep["wall_time_s"]


def test_the_same_seed_gives_the_same_records_and_another_seed_other_ones(tmp_path):
    fault = "injection.faults=[{kind:slow_compute,rank:2,start:100,factor:3}]"
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        simulate(tmp_path / name, f"seed={seed}", fault)
    files = {name: (PERFORMANCE.path(tmp_path / name).read_text(), EVENTS.path(tmp_path / name).read_text())
             for name in "abc"}
    assert files["a"] == files["b"]
    assert files["a"][0] != files["c"][0]


def test_a_killed_device_is_dropped_and_its_steps_since_the_checkpoint_redone(tmp_path):
    result = simulate(tmp_path, "checkpoint.every=50", "checkpoint.at_epoch_end=false",
                      "injection.faults=[{kind:kill,rank:3,step:130}]")
    assert result["completed"] and result["steps"] == 300
    assert read_events(tmp_path, "rank_dead")[0]["device"] == 3
    restart = json.loads(EXPERIMENT_SUMMARY.path(tmp_path).read_text())["restarts"][0]
    assert restart["trigger"] == "failure" and restart["resume_step"] == 100 and restart["action"] == "degrade"
    records = read_jsonl(PERFORMANCE.path(tmp_path))
    steps = [r["step"] for r in records]
    assert steps.count(120) == 2 and steps.count(131) == 1 and 3 not in records[-1]["devices"]


def test_replicas_run_on_a_mesh_and_a_slow_replica_is_acted_on(tmp_path):
    result = simulate(tmp_path, "trainer.devices=8", "trainer.replicas=2", "policy=eta",
                      "injection.faults=[{kind:slow_compute,rank:5,start:120,factor:4}]")
    assert len(read_jsonl(PERFORMANCE.path(tmp_path))[0]["compute_s"]) == 8
    assert result["decisions"] and result["completed"]


def test_faults_from_a_trace_act_on_their_device_and_step(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("device,kind,start_step,end_step,factor\n2,slow_compute,150,,4\n")
    simulate(tmp_path / "run", f"simulate.trace={trace}")
    detected = read_events(tmp_path / "run", "slowdown_detected")
    assert detected and detected[0]["device"] == 2 and detected[0]["onset_step"] == 150


def test_random_fail_stops_from_rates_kill_devices(tmp_path):
    result = simulate(tmp_path, "simulate.fail_stop_mtbf_h=0.05", "checkpoint.every=20", "trainer.devices=8",
                      "failover.max_restarts=20")
    assert read_events(tmp_path, "rank_dead"), "a device MTBF of 3 min over a run of hours kills devices"
    assert result["restarts"] >= 1


def test_the_report_builds_from_simulated_records(tmp_path):
    from synapse.analysis import write_report

    result = simulate(tmp_path, "injection.faults=[{kind:slow_compute,rank:1,start:120,factor:4}]")
    report = Path(write_report(tmp_path, ("png",)))
    action = result["decisions"][0]["action"]
    assert report.is_file() and action.upper() in report.read_text()


@pytest.mark.parametrize(("override", "named"), [
    ("trainer.replicas=3", "trainer.replicas"),
    ("simulate.fail_stop_mtbf_h=-1", "simulate.fail_stop_mtbf_h"),
    ("simulate.fail_slow_factor=0.5", "simulate.fail_slow_factor"),
    ("trainer.devices=0", "trainer.devices"),
    ("simulate.trace=/nonexistent.csv", "simulate.trace"),
])
def test_bad_input_is_refused_before_any_step_naming_the_key_and_a_fix(tmp_path, override, named):
    with pytest.raises(ConfigError, match="Fix") as error:
        simulate(tmp_path, override)
    assert named in str(error.value)
    assert not PERFORMANCE.path(tmp_path).exists()


def test_more_simulated_cpu_ranks_than_a_node_starts_are_refused_naming_the_gpu_form(tmp_path):
    """The issue's sweep `trainer.devices=8,...,256` without trainer.accelerator=cuda simulates CPU worker
    processes; past 64 a node it was refused deep in the planner as a real run's "CPU slots requested"."""
    with pytest.raises(ConfigError, match="trainer.accelerator=cuda") as error:
        simulate(tmp_path, "trainer.accelerator=cpu", "trainer.devices=128")
    assert "at most 64 a node" in str(error.value) and "trainer.nodes" in str(error.value)
    assert not PERFORMANCE.path(tmp_path).exists()


def test_a_trace_with_bad_columns_is_refused_naming_the_columns_it_needs(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("gpu,what,when\n1,slow,10\n")
    with pytest.raises(ConfigError, match="start_s or start_step") as error:
        simulate(tmp_path / "run", f"simulate.trace={trace}")
    assert "gpu" in str(error.value)
    assert not PERFORMANCE.path(tmp_path / "run").exists()


def test_simulated_devices_need_not_exist_and_may_be_many(tmp_path):
    result = simulate(tmp_path, "trainer.devices=256", "trainer.replicas=32", "trainer.max_steps=20",
                      "pipeline.microbatches=2")
    assert result["completed"] and len(read_jsonl(PERFORMANCE.path(tmp_path))[0]["compute_s"]) == 256


def test_a_simulated_run_writes_only_files_the_run_directory_layout_declares(tmp_path):
    from synapse.rundir import declared

    simulate(tmp_path, "injection.faults=[{kind:kill,rank:3,step:130}]")
    written = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()]
    assert written and [p for p in written if declared(p) is None] == []


@pytest.mark.slow
def test_a_hydra_multirun_sweep_of_simulations_runs_every_job(tmp_path):
    """``python train.py -m mode=simulate trainer.devices=8,16 policy=eta,keep`` (Hydra's basic launcher)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    settings = [o for o in SIMULATED if not o.startswith(("mode=", "trainer.devices="))]
    command = [sys.executable, "train.py", "-m", "mode=simulate", "trainer.devices=8,16", "policy=eta,keep",
               *settings, "trainer.max_steps=120", "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path}",
               "injection.faults=[{kind:slow_compute,rank:1,start:60,factor:4}]"]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.name.isdigit())
    assert len(jobs) == 4
    summaries = [json.loads(EXPERIMENT_SUMMARY.path(job).read_text()) for job in jobs]
    assert sorted(s["policy"] for s in summaries) == ["eta", "eta", "keep", "keep"]
    assert sorted(len(read_jsonl(PERFORMANCE.path(job))[0]["compute_s"]) for job in jobs) == [8, 8, 16, 16]


def test_node_losses_from_a_rate_take_a_whole_node_at_once(tmp_path):
    """Rates give node losses too (simulate.node_loss_mtbf_h, per node): two nodes of 4 simulated GPUs,
    a mean of 0.02 h per node, so at least one node goes within the run; every device of a lost node
    dies at the same step, and the run goes on without them. Seeded: the same seed, the same losses."""
    overrides = ("trainer.devices=8", "simulate.gpus_per_node=4", "simulate.node_loss_mtbf_h=0.02",
                 "checkpoint.every=50", "checkpoint.at_epoch_end=false", "failover.max_restarts=2")
    result = simulate(tmp_path / "run", *overrides)
    dead = read_events(tmp_path / "run", "rank_dead")
    assert dead, "no node was lost"
    by_step: dict[int, set[int]] = {}
    for event in dead:
        by_step.setdefault(event["step"], set()).add(event["device"])
    assert all(devices in ({0, 1, 2, 3}, {4, 5, 6, 7}) for devices in by_step.values()), by_step
    again = simulate(tmp_path / "again", *overrides)
    assert [(e["step"], e["device"]) for e in read_events(tmp_path / "again", "rank_dead")] == \
        [(e["step"], e["device"]) for e in dead]
    assert again["steps"] == result["steps"]


def test_a_node_loss_rate_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="simulate.node_loss_mtbf_h"):
        simulate(tmp_path, "simulate.node_loss_mtbf_h=0")


def test_a_node_loss_from_a_trace_takes_all_its_devices_at_once(tmp_path):
    """Two simulated nodes of 4 GPUs; the trace loses the node of device 5 at step 130: devices 4-7 die
    together, one failure, and the run degrades to node 0's devices from the checkpoint at step 100."""
    trace = tmp_path / "trace.csv"
    trace.write_text("device,kind,start_step,end_step,factor\n5,node_loss,130,,\n")
    result = simulate(tmp_path / "run", "trainer.devices=8", "simulate.gpus_per_node=4", f"simulate.trace={trace}",
                      "checkpoint.every=50", "checkpoint.at_epoch_end=false", "failover.max_restarts=1")
    assert result["completed"] and result["steps"] == 300
    dead = read_events(tmp_path / "run", "rank_dead")
    assert sorted(e["device"] for e in dead) == [4, 5, 6, 7] and {e["step"] for e in dead} == {130}
    restarts = json.loads(EXPERIMENT_SUMMARY.path(tmp_path / "run").read_text())["restarts"]
    assert len(restarts) == 1 and restarts[0]["resume_step"] == 100 and restarts[0]["action"] == "degrade"
    assert "node" in restarts[0]["cause"]
    assert read_jsonl(PERFORMANCE.path(tmp_path / "run"))[-1]["devices"] == [0, 1, 2, 3]


def test_a_shrink_re_cuts_the_slow_replica_over_its_other_devices_and_the_run_goes_on(tmp_path):
    """Replicas cut differently, simulated as a real run applies a SHRINK: a restart on the decision's
    placement (the slow device's replica re-cut over its other device, shares so both finish together)."""
    result = simulate(tmp_path, "trainer.devices=4", "trainer.replicas=2", "policy=shrink", "data.batch_size=64",
                      "injection.faults=[{kind:slow_compute,rank:1,start:100,factor:4}]")
    assert [d["action"] for d in result["decisions"]] == ["shrink"] and result["completed"]
    segment = json.loads((tmp_path / "segments" / "1" / "segment.json").read_text())
    assert segment["devices"] == [0, 2, 3] and segment["replica_stages"] == [1, 2]
    assert sum(segment["shares"]) == 64 and segment["shares"][0] < segment["shares"][1]  # one device: fewer images
    after = [r for r in read_jsonl(PERFORMANCE.path(tmp_path)) if r["step"] > segment["start_step"]]
    assert after and all(r["devices"] == [0, 2, 3] and len(r["compute_s"]) == 3 for r in after)


def test_a_slow_link_under_data_parallelism_slows_every_step_by_its_all_reduce(tmp_path):
    """K = 1 has no pipeline links: a link's fail-slow (Greyhound's communication fail-slows) shows as the
    gradients' all-reduce, at the pace of its ring's slowest link, from the fault's step on."""
    simulate(tmp_path, "trainer.replicas=4", "partition=even", "pipeline.microbatches=1", "policy=keep",
             "partition.link_bandwidth_gbps=100", "simulate.step_noise=none",
             "injection.faults=[{kind:slow_comm,rank:3,start:150,factor:50}]")
    records = read_jsonl(PERFORMANCE.path(tmp_path))
    before = {round(r["step_seconds"], 9) for r in records if 10 <= r["step"] < 150}
    after = {round(r["step_seconds"], 9) for r in records if r["step"] >= 150}
    assert len(before) == 1 and len(after) == 1, "no noise: one step time before the fault and one after"
    # ResNet-152's 233 MB of gradients in a ring of 4 at 100 GB/s: 3.5 ms, at 2 GB/s 175 ms
    assert after.pop() - before.pop() == pytest.approx(49 * 1.5 * 227924.640625 * 1024 / 100e9, rel=1e-3)


def test_a_rebalance_and_a_replan_of_replicas_are_simulated_live_and_as_restarts_under_replan_mode_restart(tmp_path):
    """The simulator carries a decision out as the supervisor does (``failover.live``): a REBALANCE of
    replicas and a REPLAN of replicas (every replica re-cut on its own ranks) in place, and with
    failover.replan_mode=restart through a restart, as the controller prices them."""
    slow = "injection.faults=[{kind:slow_compute,rank:3,start:100,factor:4}]"
    simulate(tmp_path / "rebalance", "trainer.replicas=4", "partition=even", "pipeline.microbatches=1",
             "policy=rebalance", slow)
    firsts = read_events(tmp_path / "rebalance", "first_step_after_restart")
    assert firsts and firsts[0]["action"] == "rebalance" and firsts[0]["mode"] == "live"
    summary = json.loads(EXPERIMENT_SUMMARY.path(tmp_path / "rebalance").read_text())
    assert summary["segments"][0]["outcome"] == "rebalanced live"
    for mode in ("live", "restart"):
        simulate(tmp_path / f"replan_{mode}", "trainer.replicas=2", "partition=even", "pipeline.microbatches=2",
                 "policy=replan", f"failover.replan_mode={mode}", slow)
        firsts = read_events(tmp_path / f"replan_{mode}", "first_step_after_restart")
        assert firsts and firsts[0]["action"] == "replan" and firsts[0]["mode"] == mode


def test_the_h200_preset_sweeps_scale_at_256_images_per_gpu(tmp_path):
    """`python train.py -m experiment=simulate_h200 trainer.devices=8,...,256 policy=...`: each job's global
    batch is 256 images per simulated GPU (``${synapse.times:...}``), on the H200 profiles in the repository."""
    for devices, nodes, count in (("16", 1, 16), ("8", 2, 16), ("[0,1,2]", 1, 3)):
        cfg = compose_config(["experiment=simulate_h200", f"trainer.devices={devices}", f"trainer.nodes={nodes}"],
                             tmp_path / f"compose{count}_{nodes}")
        assert cfg.data.batch_size == 256 * count
    result = run(compose_config(["experiment=simulate_h200", "trainer.devices=8", "trainer.max_steps=30",
                                 "report=false"], tmp_path / "run"), log=lambda line: None)["simulation"]
    assert result["completed"] and result["steps"] == 30
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert len(plan["placement"]["devices"]) == 8
