"""Which accelerator and which device ids a run uses, checked against the machine."""
from __future__ import annotations

from typing import TYPE_CHECKING, Union

from omegaconf import DictConfig, ListConfig

from synapse.config.errors import fail
from synapse.partitioning import NodeTopology

if TYPE_CHECKING:
    from synapse.config.schema import TrainerConfig

# The trainer group, composed (validate reads it so) or typed (the rest of Synapse).
TrainerSettings = Union["TrainerConfig", DictConfig]


def resolve_accelerator(trainer: TrainerSettings) -> str:
    if trainer.accelerator != "auto":
        return str(trainer.accelerator)
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_devices(trainer: TrainerSettings) -> list[int]:
    """The device ids the run uses: CPU slots 0..n-1, or GPU ids checked against the machine."""
    accelerator = resolve_accelerator(trainer)
    devices = trainer.devices
    if trainer.node_devices:  # a failover segment across nodes: this node's own devices
        devices = trainer.node_devices[trainer.node_rank]
    if isinstance(devices, (list, tuple, ListConfig)):
        ids = [int(d) for d in devices]
    elif isinstance(devices, int) and not isinstance(devices, bool):
        ids = list(range(devices))
    else:
        fail("trainer.devices", f"{devices!r} is neither a count nor a list of ids",
             "use trainer.devices=2 or trainer.devices=[0,1]")
    if not ids:
        fail("trainer.devices", "no devices given", "use at least one device, e.g. trainer.devices=1")
    if len(set(ids)) != len(ids):
        fail("trainer.devices", f"duplicate device ids in {ids}", "list each device once")
    if min(ids) < 0:
        fail("trainer.devices", f"negative device id in {ids}", "device ids start at 0")
    if accelerator == "cuda" and trainer.shared_gpu is None:
        check_gpu_ids(ids)
    elif max(ids) >= 64:  # CPU slots, or ranks sharing one GPU
        fail("trainer.devices", f"{len(ids)} {'ranks on one GPU' if accelerator == 'cuda' else 'CPU slots'} "
             f"requested", "use at most 64 worker processes")
    return ids


def shares_a_gpu(trainer: TrainerSettings) -> bool:
    """Whether every rank runs on one GPU (trainer.shared_gpu): the stages' wire is host memory."""
    return trainer.shared_gpu is not None and resolve_accelerator(trainer) == "cuda"


def cuda_index(trainer: TrainerSettings, device_id: int) -> int:
    """The CUDA device a device id runs on: itself, or the one shared GPU (trainer.shared_gpu)."""
    return int(trainer.shared_gpu) if trainer.shared_gpu is not None else int(device_id)


def num_ranks(trainer: TrainerSettings) -> int:
    """Worker processes in the run: devices per node times nodes (R replicas x K stages)."""
    if trainer.node_devices:
        return sum(len(devices) for devices in trainer.node_devices)
    return len(resolve_devices(trainer)) * int(trainer.nodes)


def fixed_replicas(trainer: TrainerSettings) -> int | None:
    """trainer.replicas as a count; None for auto (partition=auto chooses it)."""
    return None if trainer.replicas == "auto" else int(trainer.replicas)


def num_stages(trainer: TrainerSettings) -> int | None:
    """K: pipeline stages per replica (the run's ranks over its replicas); None while trainer.replicas=auto."""
    replicas = fixed_replicas(trainer)
    return None if replicas is None else num_ranks(trainer) // replicas


def run_topology(trainer: TrainerSettings) -> NodeTopology:
    """The run's nodes and their devices (run-wide device ids: ``synapse.partitioning.topology``)."""
    return NodeTopology(int(trainer.nodes), tuple(resolve_devices(trainer)))


def check_gpu_ids(ids: list[int]) -> None:
    import torch

    if not torch.cuda.is_available():
        fail("trainer.accelerator", "cuda requested but no CUDA device is visible", "use trainer.accelerator=cpu")
    count = torch.cuda.device_count()
    missing = [i for i in ids if i >= count]
    if missing:
        fail("trainer.devices", f"GPU ids {missing} do not exist (this machine has {count}: 0..{count - 1})",
              f"choose ids below {count}")
