"""Hydra sweeps of train.py: the basic launcher, submitit one job at a time, and Slurm's sbatch file.

The two sweeps are real ``python train.py -m`` commands, each with two jobs of a tiny 3-rank
CPU pipeline that differ in their schedule length and restart once (a drill). Each job must
leave a run directory of its own under the sweep directory, with the configs of both its
segments (pointing at that directory) and an experiment summary that reflects the swept value.
conf/hydra/launcher/local_sequential.yaml runs submitit's jobs strictly one after another:
each job starts K workers, and two jobs at once would fight over the machine's cores or GPUs.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.plugins import Plugins
from omegaconf import OmegaConf

import synapse.config  # noqa: F401  (registers the schema)
from synapse.conf import CONF_DIR

pytestmark = pytest.mark.dist

TINY = ("trainer=cpu", "trainer.devices=3", "trainer.threads=1", "partition=even", "teacher=resnet_micro",
        "student=resnet_micro", "teacher.auto_train_epochs=0", "trainer.progress=false", "data.batch_size=16",
        "report=false", "injection=none",
        # a forced restart at step 3: segment 1's config is composed inside the sweep's job
        "failover.drills=[{step:3,action:replan}]", "failover.replan_mode=restart")
SWEPT_STEPS = (12, 16)  # trainer.max_steps of job 0 and job 1 (a drill at step 3 lands well before the end)


def run_sweep(train_py, sweep_dir: Path, *launcher: str, **env: str) -> str:
    swept = "trainer.max_steps=" + ",".join(map(str, SWEPT_STEPS))
    result = train_py(["-m", f"hydra.sweep.dir={sweep_dir}", *launcher, *TINY, swept], timeout=280, **env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def check_jobs(sweep_dir: Path) -> list[tuple[float, float]]:
    """Each job's directory holds its own run; returns each job's (start, end) from its files' times."""
    spans = []
    for job, steps in enumerate(SWEPT_STEPS):
        job_dir = sweep_dir / str(job)
        summary = json.loads((job_dir / "experiment_summary.json").read_text())
        assert f"trainer.max_steps={steps}" in yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text())
        segments = [yaml.safe_load((job_dir / "segments" / str(i) / "config.yaml").read_text()) for i in (0, 1)]
        for index, segment in enumerate(segments):
            assert segment["run_dir"] == str(job_dir), "run_dir must resolve to the job's own output dir"
            assert segment["trainer"]["max_steps"] == steps, f"segment {index} lost the job's swept value"
        assert segments[1]["resume"].startswith(str(job_dir / "segments" / "1")), segments[1]["resume"]
        assert summary["steps"] == summary["total_steps"] == steps, "each job ran its own swept value"
        assert [s["outcome"] for s in summary["segments"]] == ["stopped", "finished"]
        spans.append(((job_dir / ".hydra" / "config.yaml").stat().st_mtime,
                      (job_dir / "experiment_summary.json").stat().st_mtime))
    return spans


@pytest.mark.timeout(300)
def test_a_sweep_with_the_basic_launcher_gives_each_job_its_own_run_dir(train_py, tmp_path):
    output = run_sweep(train_py, tmp_path / "sweep")
    check_jobs(tmp_path / "sweep")
    # the sweep writes its own report when it ends, and says where
    report = tmp_path / "sweep" / "report" / "report.md"
    assert report.is_file() and f"sweep report: {report}" in output
    assert "| job |" in report.read_text()


@pytest.mark.slow  # submitit pickles each job and starts it in processes of its own: 35-55 s here
@pytest.mark.long  # the default suite ran 19:53 of its 20 minutes; the basic launcher's sweep stays in it
@pytest.mark.timeout(300)
def test_a_submitit_sweep_runs_its_jobs_one_at_a_time_each_in_its_own_run_dir(train_py, tmp_path):
    sweep = tmp_path / "sweep"
    run_sweep(train_py, sweep, "hydra/launcher=local_sequential", "hydra.launcher.timeout_min=5",
              SYNAPSE_SWEEP_LOCK=str(tmp_path / "sweep.lock"))
    (start_0, end_0), (start_1, end_1) = check_jobs(sweep)
    assert end_0 <= start_1 or end_1 <= start_0, "the two jobs ran at the same time"
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2  # both went through submitit


def hydra_config(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        return compose("config", overrides=[f"run_dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                                            *overrides], return_hydra_config=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("visible", ["2,3", None])
def test_local_sequential_jobs_hold_a_lock_and_see_the_gpus_the_sweep_saw(tmp_path, monkeypatch, visible):
    """The launcher's setup lines, run as submitit runs them: by sh, with CUDA_VISIBLE_DEVICES emptied."""
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    lock = tmp_path / "sweep.lock"
    monkeypatch.setenv("SYNAPSE_SWEEP_LOCK", str(lock))
    launcher = OmegaConf.to_container(hydra_config(tmp_path, "hydra/launcher=local_sequential").hydra.launcher,
                                      resolve=True)
    script = " && ".join([*launcher["setup"], 'echo "gpus=${CUDA_VISIBLE_DEVICES-all}"',
                          "flock -n 8 8<$SYNAPSE_SWEEP_LOCK || echo locked"])
    shown = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, CUDA_VISIBLE_DEVICES="")).stdout.split()
    assert shown == [f"gpus={visible or 'all'}", "locked"], shown  # a second holder is refused: the job has it
    assert lock.exists()


class Submitted(Exception):
    """Raised instead of calling sbatch."""


@pytest.mark.timeout(60)
def test_the_slurm_launcher_asks_for_one_node_and_one_task_per_job(tmp_path, monkeypatch):
    """The sbatch file submitit would submit for a two-job sweep with conf/hydra/launcher/slurm.yaml."""
    from submitit.slurm.slurm import SlurmExecutor

    cfg = hydra_config(tmp_path, "hydra/launcher=slurm", "hydra.launcher.partition=gpu")
    launcher = Plugins.instance().instantiate_launcher(hydra_context=None, task_function=print, config=cfg)
    files: list[str] = []

    def capture(executor: SlurmExecutor, command: str):
        files.append(executor._make_submission_file_text(command, "test"))
        raise Submitted

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # as if srun were installed
    monkeypatch.setattr(SlurmExecutor, "_submit_command", capture)
    with pytest.raises(Submitted):
        launcher.launch([["policy=keep"], ["policy=eta"]], initial_job_idx=0)
    flags = {line for line in files[0].splitlines() if line.startswith("#SBATCH")}
    for flag in ("--partition=gpu", "--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=4", "--cpus-per-task=32",
                 "--time=240", "--array=0-1%2"):
        assert f"#SBATCH {flag}" in flags, sorted(flags)


def slurm_nodes_scripts(tmp_path: Path, monkeypatch, *overrides: str, launches: int = 1) -> list[list[str]]:
    """The batch scripts submitit would hand to sbatch for one sweep point of hydra/launcher=slurm_nodes, per
    call of the launcher's ``launch`` (a sweeper calls it once per batch of jobs): written by the launcher and
    submitit for real; only sbatch itself is not called."""
    from submitit.slurm.slurm import SlurmExecutor

    cfg = hydra_config(tmp_path, "hydra/launcher=slurm_nodes", "trainer.nodes=3")
    launcher = Plugins.instance().instantiate_launcher(hydra_context=None, task_function=print, config=cfg)
    files: list[str] = []

    def capture(executor: SlurmExecutor, command: str):
        files.append(executor._make_submission_file_text(command, "test"))
        raise Submitted

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))
    monkeypatch.setattr(SlurmExecutor, "_submit_command", capture)
    for call in range(launches):
        with pytest.raises(Submitted):
            launcher.launch([list(overrides)], initial_job_idx=call)
    return [file.splitlines() for file in files]


def slurm_nodes_script(tmp_path: Path, monkeypatch, *overrides: str) -> list[str]:
    return slurm_nodes_scripts(tmp_path, monkeypatch, *overrides)[0]


@pytest.mark.timeout(60)
def test_the_slurm_nodes_job_runs_the_decider_on_the_batch_host_keeps_the_job_when_a_node_fails_and_requeues_it(
        tmp_path, monkeypatch):
    """Issue #36, item 4: by default Slurm ends the allocation when a node fails, so a lost node's DEGRADE
    could never run. The batch script of hydra/launcher=slurm_nodes asks for --no-kill (the job), exports
    SLURM_NO_KILL before srun (the step's --no-kill) and --requeue (a lost batch host, the decider's, puts
    the job back), starts the decider on the batch host before the step and waits for it after; the job it
    runs puts each process in its place (decider or agent, node rank, the store's address) with resume=auto."""
    lines = slurm_nodes_script(tmp_path, monkeypatch, "trainer.devices=2")
    for flag in ("--no-kill", "--requeue", "--nodes=3", "--ntasks-per-node=1"):  # nodes: trainer.nodes
        assert f"#SBATCH {flag}" in lines, [line for line in lines if line.startswith("#SBATCH")]
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    before, after = lines[:srun], lines[srun + 1:]
    assert any(line.startswith("export SLURM_NO_KILL=1") for line in before)
    assert any(line.startswith("export SYNAPSE_DECIDER_ENDPOINT=") for line in before)
    decider = [line for line in before if " -m synapse.launch.slurm_nodes " in line]
    assert len(decider) == 1 and decider[0].split("#")[0].rstrip().endswith("&"), decider  # beside the step
    assert any(line.startswith("wait $SYNAPSE_DECIDER_PID") for line in after)
    assert "SYNAPSE_NODE_ROLE" not in "\n".join(lines), "the step inherits the batch shell: agents must stay agents"

    # the job submitit pickled: each process of it resolves its own role, node and the store's address
    pickled = sorted((tmp_path / "sweep" / ".submitit").glob("*.pkl"))  # before sbatch gives it a job id
    assert len(pickled) == 1, pickled
    from submitit.core.utils import DelayedSubmission

    overrides = DelayedSubmission.load(pickled[0]).args[0]
    job = hydra_config(tmp_path, *overrides)
    monkeypatch.setenv("SYNAPSE_DECIDER_ENDPOINT", "batch-host:29500")
    monkeypatch.setenv("SLURM_NODEID", "2")
    assert (job.trainer.role, job.trainer.node_rank, job.trainer.rdzv_endpoint, job.resume) == \
        ("agent", 2, "batch-host:29500", "auto")
    monkeypatch.setenv("SYNAPSE_NODE_ROLE", "decider")  # what synapse.launch.slurm_nodes sets in its own process
    assert job.trainer.role == "decider"


@pytest.mark.timeout(60)
def test_every_batch_of_a_sweep_gets_one_decider_per_job(tmp_path, monkeypatch):
    """A sweeper calls the launcher once per batch: each call's job starts one decider and waits for one (the
    second call's job once started two deciders for one store port and run directory)."""
    for lines in slurm_nodes_scripts(tmp_path, monkeypatch, "trainer.devices=2", launches=3):
        assert sum(" -m synapse.launch.slurm_nodes " in line for line in lines) == 1
        assert sum(line.startswith("wait $SYNAPSE_DECIDER_PID") for line in lines) == 1


@pytest.mark.timeout(60)
def test_the_slurm_nodes_launcher_refuses_a_setting_it_sets_itself(tmp_path, monkeypatch):
    from synapse.launch.slurm_nodes import SlurmNodesSettingError, node_overrides

    with pytest.raises(SlurmNodesSettingError, match="sets trainer.role itself.*Fix: leave trainer.role out"):
        slurm_nodes_script(tmp_path, monkeypatch, "trainer.role=auto")
    chosen = node_overrides(["resume=latest"])  # a point that chose how to resume keeps its choice
    assert "resume=latest" in chosen and "resume=auto" not in chosen
