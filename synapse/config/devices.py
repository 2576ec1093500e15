"""Which accelerator and which device ids a run uses, checked against the machine."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from omegaconf import DictConfig, ListConfig

from synapse.config.errors import fail
from synapse.partitioning import NodeTopology

if TYPE_CHECKING:
    from synapse.config.schema import TrainerConfig

# The trainer group, composed (validate reads it so) or typed (the rest of Synapse).
TrainerSettings = Union["TrainerConfig", DictConfig]


# The worker processes a node starts at most on CPU slots (or ranks sharing one GPU): slot ids 0..63.
MAX_CPU_SLOTS = 64

def decides_elsewhere(trainer: TrainerSettings) -> bool:
    """trainer.role=decider: this host runs none of the run's workers (a login or service node, the Slurm
    batch host, a CPU component of a heterogeneous job). It never looks at its own accelerator; the
    facts of the run's devices come from the nodes' agents (``NodeDevices``)."""
    return getattr(trainer, "role", "auto") == "decider"


def resolve_accelerator(trainer: TrainerSettings) -> str:
    if trainer.accelerator != "auto":
        return str(trainer.accelerator)
    if decides_elsewhere(trainer):
        fail("trainer.accelerator", "auto looks for a CUDA device on this host, and trainer.role=decider runs on a "
             "host without the run's devices", "set trainer.accelerator=cuda or trainer.accelerator=cpu, as the "
             "nodes run")
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
        if not decides_elsewhere(trainer):  # the decider's host: each node's agent says what it has (NodeDevices)
            check_gpu_ids(ids)
    elif max(ids) >= MAX_CPU_SLOTS:  # CPU slots, or ranks sharing one GPU
        fail("trainer.devices", f"{len(ids)} {'ranks on one GPU' if accelerator == 'cuda' else 'CPU slots'} "
             f"requested", f"use at most {MAX_CPU_SLOTS} worker processes")
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
    """The run's nodes, their devices and their spares (run-wide device ids: ``synapse.partitioning.topology``)."""
    return NodeTopology(int(trainer.nodes), tuple(resolve_devices(trainer)),
                        tuple(int(d) for d in trainer.spare_devices))


def check_gpu_ids(ids: list[int], key: str = "trainer.devices") -> None:
    """``ids`` (the setting ``key``'s) are GPUs of this host."""
    import torch

    if not torch.cuda.is_available():
        fail("trainer.accelerator", "cuda requested but no CUDA device is visible", "use trainer.accelerator=cpu")
    count = torch.cuda.device_count()
    missing = [i for i in ids if i >= count]
    if missing:
        fail(key, f"GPU ids {missing} do not exist (this machine has {count}: 0..{count - 1})",
              f"choose ids below {count}")


@dataclass(frozen=True)
class NodeDevices:
    """What a node's agent says of the devices on its host, in its hello: a decider on a host of its own
    (``decides_elsewhere``) checks the node's trainer.devices against them and plans with their memory."""

    accelerator: str  # the node's resolved trainer.accelerator
    visible_gpus: int  # CUDA devices the node sees (0: none)
    devices: list[int]  # the node's trainer.devices, in order
    names: list[str]  # of each of those devices, then of each spare
    memory_bytes: list[float]  # of each device, then spare; inf for a CPU slot (the planner bounds no memory there)
    # the CUDA device each device, then spare, runs on: itself, or the one GPU all share (trainer.shared_gpu);
    # None: as devices and spares
    gpus: list[int] | None = None
    spares: list[int] = field(default_factory=list)  # the node's trainer.spare_devices, in order

    @property
    def held(self) -> list[int]:
        """The node's devices, then its spares: what ``names``, ``memory_bytes`` and ``gpus`` describe."""
        return [*self.devices, *self.spares]

    def describe(self) -> str:
        """E.g. ``devices [0, 1]: gpu-a 8.0 GB, gpu-a 8.0 GB`` (as the decider's log names a node's devices)."""
        sizes = ["" if m == float("inf") else f" {m / 1e9:.1f} GB" for m in self.memory_bytes]
        spares = f" (spares {self.spares})" if self.spares else ""
        return f"devices {self.devices}{spares}: " + ", ".join(f"{n}{size}" for n, size in zip(self.names, sizes))

    def memory_of(self, device_id: int) -> float:
        return self.memory_bytes[self.held.index(device_id)]

    def unfit(self, accelerator: str) -> str | None:
        """Why these devices cannot run a decider's ``accelerator`` run (None: they can)."""
        gpus = self.held if self.gpus is None else self.gpus  # trainer.shared_gpu: rank slots on one GPU
        if accelerator == "cuda" and gpus and self.visible_gpus <= max(gpus):
            needed = max(gpus) + 1
            which = f"trainer.devices={self.devices}" + (f" with trainer.spare_devices={self.spares}"
                                                           if self.spares else "")
            keys = "trainer.devices and trainer.spare_devices" if self.spares else "trainer.devices"
            fix = (f"give {keys} ids below {self.visible_gpus} (the same on every node), or "
                   if self.visible_gpus else "")
            return (f"its host sees {self.visible_gpus} CUDA device(s), and {which} needs "
                    f"{needed} (GPU ids up to {needed - 1}). Fix: {fix}start that node on a host with at least "
                    f"{needed} GPU(s)")
        if self.accelerator != accelerator:
            return (f"it runs trainer.accelerator={self.accelerator}, the decider plans for {accelerator}. Fix: the "
                    f"same trainer.accelerator on every node and the decider (cuda or cpu)")
        return None

    @classmethod
    def of(cls, data: Any) -> NodeDevices | None:
        """From a hello's record (None: the hello said nothing of its devices)."""
        try:
            return cls(**data) if isinstance(data, dict) and data else None
        except TypeError:
            return None


def local_devices(trainer: TrainerSettings) -> NodeDevices:
    """This host's facts of the run's devices: what a node's agent tells the decider. Only the agent calls it:
    it looks at CUDA, which the decider's host never does."""
    import torch

    accelerator, ids = resolve_accelerator(trainer), resolve_devices(trainer)
    spares = [int(d) for d in trainer.spare_devices]
    held = [*ids, *spares]
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if accelerator != "cuda":
        return NodeDevices(accelerator, visible, ids, [f"cpu:{i}" for i in held], [float("inf")] * len(held),
                           spares=spares)
    gpus = [cuda_index(trainer, i) for i in held]
    properties = [torch.cuda.get_device_properties(g) for g in gpus]
    # ranks sharing one GPU (trainer.shared_gpu) each get their share of its memory (a spare takes a lost rank's)
    share = len(ids) if trainer.shared_gpu is not None else 1
    return NodeDevices(accelerator, visible, ids, [p.name for p in properties],
                       [float(p.total_memory) / share for p in properties], gpus, spares=spares)
