"""What a node's agent says of its host's devices (``NodeDevices``), as a decider on a host of its own
(``trainer.role=decider``) judges it; and that such a decider never resolves ``trainer.accelerator=auto``
on its own host. The processes that meet are in ``tests/dist/test_decider_devices.py``."""
from __future__ import annotations

import pytest

from synapse.config import ConfigError, NodeDevices, resolve_accelerator, resolve_devices, typed_config

GB = 1e9


def test_a_node_whose_host_lacks_the_gpus_or_runs_another_accelerator_is_unfit_with_the_fix():
    two = NodeDevices("cuda", 2, [0, 1], ["gpu-a", "gpu-a"], [8 * GB, 8 * GB])
    assert two.unfit("cuda") is None and two.memory_of(1) == 8 * GB
    one = NodeDevices("cuda", 1, [0, 1], ["gpu-a"], [8 * GB])
    assert one.unfit("cuda") == ("its host sees 1 CUDA device(s), and trainer.devices=[0, 1] needs 2 (GPU ids up to "
                                 "1). Fix: give trainer.devices ids below 1 (the same on every node), or start that "
                                 "node on a host with at least 2 GPU(s)")
    cpu = NodeDevices("cpu", 0, [0, 1], ["cpu:0", "cpu:1"], [float("inf")] * 2)
    assert cpu.unfit("cpu") is None and "needs 2" in str(cpu.unfit("cuda"))
    assert NodeDevices("cuda", 4, [0], ["gpu-a"], [8 * GB]).unfit("cpu") == (
        "it runs trainer.accelerator=cuda, the decider plans for cpu. Fix: the same trainer.accelerator on every "
        "node and the decider (cuda or cpu)")
    assert NodeDevices.of({}) is None and NodeDevices.of({"unknown": 1}) is None


def test_ranks_sharing_one_gpu_need_that_gpu_not_one_per_rank():
    """trainer.shared_gpu: trainer.devices are rank slots on one GPU, so a host with that GPU fits (it was
    refused: 'sees 1 CUDA device(s) ... needs 4'); a hello from before the field still reads."""
    shared = NodeDevices("cuda", 1, [0, 1, 2, 3], ["gpu-a"] * 4, [2 * GB] * 4, gpus=[0, 0, 0, 0])
    assert shared.unfit("cuda") is None
    assert "needs 2" in str(NodeDevices("cuda", 1, [0, 1], ["gpu-a"] * 2, [2 * GB] * 2, gpus=[1, 1]).unfit("cuda"))
    older = NodeDevices.of({"accelerator": "cuda", "visible_gpus": 2, "devices": [0, 1], "names": ["gpu-a"] * 2,
                            "memory_bytes": [8 * GB] * 2})
    assert older is not None and older.unfit("cuda") is None


def test_a_decider_on_a_host_of_its_own_neither_resolves_auto_nor_checks_gpu_ids_here(make_config, tiny_run):
    """This machine has no GPU: a decider elsewhere does not look (auto is refused naming the fix, and GPU ids
    are left to the nodes' agents); under role=auto the same config is checked against this host, as before."""
    decider = typed_config(make_config(*tiny_run, "trainer.role=decider", "trainer.nodes=2",
                                       "trainer.rdzv_endpoint=127.0.0.1:29999", "trainer.devices=[0,1]",
                                       "trainer.accelerator=auto"))
    with pytest.raises(ConfigError, match="trainer.accelerator: auto looks for a CUDA device on this host.*"
                                          "Fix: set trainer.accelerator=cuda or trainer.accelerator=cpu"):
        resolve_accelerator(decider.trainer)
    gpus = typed_config(make_config(*tiny_run, "trainer.role=decider", "trainer.nodes=2",
                                    "trainer.rdzv_endpoint=127.0.0.1:29999", "trainer.devices=[0,1]",
                                    "trainer.accelerator=cuda"))
    assert resolve_devices(gpus.trainer) == [0, 1]
    node = typed_config(make_config(*tiny_run, "trainer.nodes=2", "trainer.rdzv_endpoint=127.0.0.1:29999",
                                    "trainer.devices=[0,1]", "trainer.accelerator=cuda"))
    with pytest.raises(ConfigError, match="cuda requested but no CUDA device is visible"):
        resolve_devices(node.trainer)


def test_a_decider_on_a_host_of_its_own_trains_no_teacher_there(make_config, tiny_run, tmp_path):
    """With no teacher weights given or cached, a decider elsewhere refuses, naming the fix, before any
    work (it would train the teacher on a host without the run's devices)."""
    from synapse.engine.teacher import teacher_weights

    decider = typed_config(make_config(*tiny_run, "trainer.role=decider", "trainer.nodes=2",
                                       "trainer.rdzv_endpoint=127.0.0.1:29999", "trainer.accelerator=cpu",
                                       f"cache_dir={tmp_path / 'cache'}", "teacher.checkpoint=null",
                                       "teacher.auto_train=true"))
    lines: list[str] = []
    with pytest.raises(ConfigError, match="trainer.role=decider trains no teacher on its own host.*Fix: train it "
                                          "where the devices are first"):
        teacher_weights(decider, tmp_path / "run", lines.append)
    assert lines == [] and not (tmp_path / "run").exists()
