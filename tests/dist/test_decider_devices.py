"""A decider on a host without the run's GPUs (issue #36, item 1): with ``trainer.role=decider`` the
decider's process never calls CUDA on its own host; every fact of the run's devices (each node's
GPU count, names, memory) is what the nodes' agents said in their hellos, and a node whose host
does not have the devices its config names is refused at the meeting, before any worker starts.

This machine has no GPU, so the decider's launcher runs under a ``sitecustomize`` that makes every
call of ``torch.cuda`` from Synapse's code raise: a decider that looked at its own host would fail
there instead of at the meeting. The agents are real and honest: their host sees 0 CUDA devices.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from synapse.launch import free_port

from .helpers import BASE_OVERRIDES, outputs_of

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]

# Imported first by every Python process that has its folder on the path (the decider's launcher and
# the processes it starts): any torch.cuda function Synapse calls raises, naming itself.
NO_CUDA_HERE = '''
import sys
import torch.cuda

def _refusing(name, original):
    def refuse(*args, **kwargs):
        caller = sys._getframe(1).f_code.co_filename
        if "/synapse/" in caller:
            raise RuntimeError(f"torch.cuda.{name} called on the decider's host by {caller}")
        return original(*args, **kwargs)
    return refuse

for name in ("is_available", "device_count", "get_device_properties", "get_device_name", "current_device",
             "set_device", "mem_get_info", "init", "synchronize"):
    setattr(torch.cuda, name, _refusing(name, getattr(torch.cuda, name)))
'''


def launch(run_dir: Path, endpoint: str, *own: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    common = [*BASE_OVERRIDES, f"cache_dir={run_dir.parent}/cache", f"run_dir={run_dir}", "trainer.devices=1",
              "trainer.nodes=2", f"trainer.rdzv_endpoint={endpoint}", "trainer.rdzv_timeout_s=60", "report=false",
              "logger=none"]
    return subprocess.Popen([sys.executable, "train.py", *common, *own], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_a_cuda_decider_on_a_host_without_gpus_asks_the_agents_and_refuses_a_node_without_the_gpus(tmp_path):
    """trainer.accelerator=cuda, trainer.role=decider on a host where CUDA must not be touched, and two agent
    nodes whose hosts see no GPU: the decider validates its config, serves the store and meets the agents
    without calling CUDA, and refuses the nodes by their own word (0 CUDA devices for trainer.devices=[0]),
    naming the node, the setting and the fix; no worker starts. With the decider still looking at its own
    host (resolve_devices' GPU check), it fails in torch.cuda instead; without the agents' facts it is not
    refused at the meeting and goes on to launch."""
    run_dir, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    no_cuda = tmp_path / "no_cuda"
    no_cuda.mkdir()
    (no_cuda / "sitecustomize.py").write_text(NO_CUDA_HERE)
    decider_env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(no_cuda), str(REPO),
                                                                           os.environ.get("PYTHONPATH")])))
    launchers = [launch(run_dir, endpoint, "trainer.role=decider", "trainer.accelerator=cuda", env=decider_env),
                 *(launch(run_dir, endpoint, "trainer.role=agent", f"trainer.node_rank={n}") for n in (0, 1))]
    outputs = outputs_of(launchers, timeout=240)
    decider, node0, node1 = outputs
    assert "called on the decider's host" not in decider, decider[-4000:]
    assert launchers[0].returncode != 0, decider[-4000:]
    for node in (0, 1):  # refused by its own host's facts, named with the setting and the fix
        assert f"node_rank {node}: its host sees 0 CUDA device(s), and trainer.devices=[0] needs 1 (GPU ids up to " \
               f"0). Fix: start that node on a host with at least 1 GPU(s)" in decider, decider[-4000:]
    for node, output in ((0, node0), (1, node1)):
        assert launchers[1 + node].returncode != 0 and f"node_rank {node}: node 0 refused this node: its host sees " \
            f"0 CUDA device(s)" in output, output[-4000:]
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    assert "segment_started" not in ((run_dir / "failover_events.jsonl").read_text()
                                     if (run_dir / "failover_events.jsonl").is_file() else "")


# The decider's side of a meeting, in a process where Synapse's torch.cuda calls raise: it hosts the run's store,
# two agents (threads with channels of their own) say hello with what their hosts have (node 0: two 8 GB GPUs,
# node 1: two 24 GB GPUs; this machine has none), and the planner's device facts are printed.
DECIDER_MEETS = '''
import dataclasses, json, sys, threading
from hydra import compose, initialize_config_dir
from synapse.conf import CONF_DIR
from synapse.config import NodeDevices, resolve_devices, typed_config
from synapse.failover import NodeChannel, NodeHello
from synapse.failover.decider import NodeDecider
from synapse.planning import device_facts, device_memory_told_by

run_dir, endpoint = sys.argv[1], sys.argv[2]
with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = typed_config(compose("config", overrides=[
        f"run_dir={run_dir}", "trainer.accelerator=cuda", "trainer.role=decider", "trainer.nodes=2",
        "trainer.devices=[0,1]", f"trainer.rdzv_endpoint={endpoint}", "trainer.rdzv_timeout_s=30"]))
GB = 1e9
told = {0: NodeDevices("cuda", 2, [0, 1], ["gpu-a", "gpu-a"], [8 * GB, 8 * GB]),
        1: NodeDevices("cuda", 4, [0, 1], ["gpu-b", "gpu-b"], [24 * GB, 24 * GB])}
said = []
decider = NodeDecider(cfg.trainer, cfg.failover, run_dir, log=said.append)

def agent(node):
    channel = NodeChannel.connect(endpoint, node, 30, run_dir)
    channel.say_hello(NodeHello(node, 2, [0, 1], f"node{node}", 0, f"n{node}", epoch=0,
                                host_devices=dataclasses.asdict(told[node])))
    channel.wait_welcome(node, 30, f"n{node}")

agents = [threading.Thread(target=agent, args=(n,)) for n in (0, 1)]
for thread in agents:
    thread.start()
decider.meet_agents(resolve_devices(cfg.trainer))
for thread in agents:
    thread.join()
with device_memory_told_by(decider.device_memory):
    facts = device_facts(cfg.trainer, cfg.partition)
    specs = facts.specs(decider.topology.devices)
print(json.dumps({"devices": decider.topology.devices, "memory_gb": [s.memory_bytes / GB for s in specs],
                  "said": [line for line in said if "agent says" in line]}))
'''


def test_a_decider_on_a_host_of_its_own_sizes_each_gpu_as_its_nodes_agent_said(tmp_path):
    """The planner of a decider with trainer.role=decider sizes each run-wide GPU by the memory its node's agent
    said at the meeting (8 GB on node 0, 24 GB on node 1), in a process where CUDA must not be touched: with the
    planner asking this host's CUDA instead, the process fails in torch.cuda."""
    no_cuda = tmp_path / "no_cuda"
    no_cuda.mkdir()
    (no_cuda / "sitecustomize.py").write_text(NO_CUDA_HERE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(no_cuda), str(REPO),
                                                                   os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", DECIDER_MEETS, str(tmp_path / "run"), f"127.0.0.1:{free_port()}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["devices"] == [0, 1, 2, 3] and facts["memory_gb"] == [8.0, 8.0, 24.0, 24.0], facts
    assert facts["said"] == ["decider: node 0's agent says its host has devices [0, 1]: gpu-a 8.0 GB, gpu-a 8.0 GB",
                             "decider: node 1's agent says its host has devices [0, 1]: gpu-b 24.0 GB, gpu-b 24.0 GB"]
