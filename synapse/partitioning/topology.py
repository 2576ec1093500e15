"""Which node each device of a run is on: run-wide device ids for runs across nodes. Pure.

On one node a device id is the device's own id (a CPU slot, a GPU id). Across nodes the same
local id exists on every node, so the planner, the controller and the stage records use a
*run-wide* id: ``node * stride + local id``, with ``stride = max(local ids) + 1``. Two nodes of
``trainer.devices=2`` CPU slots are run-wide devices ``0, 1`` (node 0) and ``2, 3`` (node 1);
two nodes of GPUs ``[0,1,2,3]`` are ``0..3`` and ``4..7``. A node's workers are the run's ranks
in node order (node 0's first): ``synapse.launch.rendezvous`` orders the ranks by node_rank.

Spare devices (``trainer.spare_devices``) are local ids too, the same on every node, and the stride
counts them, so no node's spare shares a run-wide id with another node's device: two nodes of
``trainer.devices=[0,1] trainer.spare_devices=[2]`` run devices ``0, 1 | 3, 4`` with spares ``2``
(node 0) and ``5`` (node 1).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class TopologyError(ValueError):
    """A device id that belongs to no node of the run, or spares that are not idle devices."""


@dataclass(frozen=True)
class NodeTopology:
    nodes: int
    local_devices: tuple[int, ...]  # the devices of every node (trainer.devices is the same on each)
    local_spares: tuple[int, ...] = ()  # the idle devices of every node a REPLACE may take (trainer.spare_devices)

    def __post_init__(self) -> None:
        if self.nodes < 1 or not self.local_devices:
            raise TopologyError(f"a topology needs >= 1 node and >= 1 device per node, got nodes={self.nodes}, "
                                f"devices={list(self.local_devices)}")
        busy = sorted(set(self.local_spares) & set(self.local_devices))
        if busy or len(set(self.local_spares)) != len(self.local_spares):
            raise TopologyError(f"spares {list(self.local_spares)} repeat an id or are devices of the run "
                                f"{list(self.local_devices)}: a spare is an idle device, listed once")

    @property
    def stride(self) -> int:
        return max((*self.local_devices, *self.local_spares)) + 1

    @property
    def spares(self) -> list[int]:
        """Every spare of the run, run-wide ids, node 0's first."""
        return [s for node in range(self.nodes) for s in self.spares_on(node)]

    def spares_on(self, node: int) -> list[int]:
        return [node * self.stride + s for s in self.local_spares]

    @property
    def devices(self) -> list[int]:
        """Every device of the run, run-wide ids, node 0's first (the first stage's devices)."""
        return [node * self.stride + d for node in range(self.nodes) for d in self.local_devices]

    def node_of(self, device: int) -> int:
        if self.nodes == 1:  # any id is this node's (one node's ids are its own)
            return 0
        node, local = divmod(int(device), self.stride)
        if not 0 <= node < self.nodes or (local not in self.local_devices and local not in self.local_spares):
            spares = f", spares {self.spares}" if self.local_spares else ""
            raise TopologyError(f"device {device} is on no node of this run (nodes={self.nodes}, devices per node "
                                f"{list(self.local_devices)}, run-wide ids {self.devices}{spares})")
        return node

    def local_id(self, device: int) -> int:
        if self.nodes == 1:
            return int(device)
        self.node_of(device)
        return int(device) % self.stride

    def nodes_of(self, devices: Sequence[int]) -> list[int]:
        """The nodes that run some of ``devices``, in pipeline order (node order when ranks are node-ordered)."""
        seen: list[int] = []
        for device in devices:
            node = self.node_of(device)
            if node not in seen:
                seen.append(node)
        return seen

    def local_devices_of(self, node: int, devices: Sequence[int]) -> list[int]:
        """The local ids of ``node``'s devices among ``devices``, in pipeline order."""
        return [self.local_id(d) for d in devices if self.node_of(d) == node]

    def node_ordered(self, devices: Sequence[int]) -> bool:
        """Whether ``devices`` list each node's devices together, nodes ascending (``check_node_ordered``)."""
        nodes = [self.node_of(d) for d in devices]
        return nodes == sorted(nodes)

    def check_node_ordered(self, devices: Sequence[int]) -> None:
        """The ranks of a launch are node-ordered, so a placement must list each node's devices together,
        nodes ascending: otherwise rank r would not run on devices[r]."""
        if not self.node_ordered(devices):
            nodes = [self.node_of(d) for d in devices]
            raise TopologyError(f"devices {list(devices)} are not grouped by node in ascending order (nodes {nodes}); "
                                f"a multi-node launch numbers node 0's ranks first")

    def crosses_node(self, a: int, b: int) -> bool:
        return self.node_of(a) != self.node_of(b)

    def devices_on(self, node: int) -> list[int]:
        return [node * self.stride + d for d in self.local_devices]


def single_node(devices: Sequence[int]) -> NodeTopology:
    return NodeTopology(1, tuple(int(d) for d in devices))
