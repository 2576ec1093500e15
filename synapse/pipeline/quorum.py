"""torchft carries the replica level (``failover.replica_engine=torchft``): inside a worker.

Each replica of the run is an elastic launch of its own (``synapse.launch.replica_groups``); its K stage
ranks form a torchft replica group (group rank = stage), and the supervisor runs torchft's lighthouse.
Every step starts with a quorum of the replicas alive (``Manager.start_quorum``, synchronous, so a
returning replica heals from a peer before its step). The step's global batch is then cut among the
quorum's participants (``quorum_share``: participant i of n trains on its part, micro-batches whole),
and after the step's last backward each stage rank sums its gradients, weighted by share / batch, with
the same stage of the other replicas through its Manager's process group, with the BatchNorm statistics'
merge, the loss and the stop flag (a stop request seen by any replica stops every one after the same
step). The Manager's commit vote comes before the optimizer step: a step whose reduction met a dead peer
is not committed and runs again on the next quorum, with the same global batch, so every committed step
sees the whole batch whatever the replicas alive.

A replica that comes back (its elastic agent respawns its workers) asks for a quorum before its first
step (``join``); torchft sends it a peer's state (the stage's tensors, optimizer and schedule, by name)
and the committed step, and it goes on from there: no checkpoint is read, the others never stop.

Replicas that are pipelines (K > 1 stages) need nothing more of this module, for three reasons that hold
by construction: a replica's K ranks are one elastic launch, so its agent respawns all of them when one
dies (its pipeline's process group is the launch's); torchft's commit vote is a collective of the replica
group, so the stages of a replica all commit a step or none does; and the quorum is the replica group's,
so all its stages get the same participants and the same cut. What a pipeline did need: a cut that changes
size needs a stage of its own (``PipelineRuntime.use_share``), and a respawned replica's ranks must meet
under a store prefix of their own attempt (``respawn_store``).
"""
from __future__ import annotations

import io
import os
import socket
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from synapse import checkpoint as ckpt
from synapse.engine import Checkpointer, HeldState
from synapse.injection import fired_fault_indices
from synapse.pipeline.clock import COMPUTE_PARTS, SEND_PARTS
from synapse.pipeline.replicas import apply_statistics, set_gradients, statistics_additions, weighted_gradients
from synapse.rundir import ForeignRecordError, open_bytes, seal_bytes

# A rank's step timing (StageClock) carried to the other replicas with the next step's reduction, so that
# replica 0's last rank writes one performance record of every replica's ranks, as one launch does
TIMING_KEYS = (*COMPUTE_PARTS, "compute", "comm", *SEND_PARTS, "send", "wait", "wall")
STALL_WINDOW = 20  # committed steps whose median is a normal step (a stall is measured against it)


@dataclass(frozen=True)
class ReplicaMeeting:
    """Where a segment's replicas meet: torchft's lighthouse (http://host:port), the store of their first quorum
    (host:port, with a key prefix of the segment's own where the store is shared: across nodes, the run's), and
    which replicas the node it is given to launches (empty: every one). Served by ``synapse.launch``'s
    ``serve_replica_meeting``; across nodes the decider sends it in each node's launch order."""

    lighthouse: str
    start_store: str = ""  # "": no meeting before the first quorum
    start_prefix: str = ""
    replicas: tuple[int, ...] = ()


@dataclass(frozen=True)
class ReplicaGroupSpec:
    """What a worker of a replica launch is told: which replica it is, of how many, where the replicas meet."""

    replica: int
    replicas: int
    meeting: ReplicaMeeting
    timeout_s: float  # the cross-replica collectives' and the commit vote's timeout
    run_devices: tuple[int, ...] = ()  # the devices of every replica, replica after replica (performance records)
    # the one address this node's replica group listens on (its store, its heal server; torchft's manager says it
    # to the others): loopback on one node, across nodes the node's address on its route to the rendezvous host
    address: str = "127.0.0.1"


class SealedStateTransport:
    """How a returning replica's rank receives a peer's state (torchft's checkpoint transport), sealed with the
    run's key and served on the node's address only.

    torchft's own HTTP transport listens on every interface, serves the stage's weights and optimizer state to
    whoever asks, and its receiver unpickles whatever the address it was told answers: anyone who reached a
    node (or told a quorum a forged address) could run code in a healing worker. Here the sender seals the
    serialized state (``synapse.rundir.seal_bytes``: an HMAC of the run key, over the step too) and the
    receiver refuses what is not sealed with its run's key before loading it, tensors and plain values only
    (``weights_only``). A request may come before the sender has put its state out (both leave the quorum
    at once): it waits for that step's state up to the timeout, as torchft's does; then it is answered 404
    and the healing rank's quorum fails and is asked again."""

    def __init__(self, host: str, key: bytes, timeout: timedelta):
        import http.server
        import threading

        self.host, self.key, self.timeout = host, key, timeout
        self._served: tuple[int, bytes] | None = None  # (step, sealed state) while a peer may fetch it
        self._changed = threading.Condition()
        transport = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                step = self.path.removeprefix("/state/")
                sealed = transport._state_of(int(step)) if step.isdigit() else None
                if sealed is None:
                    self.send_error(404, "no state of that step is served")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(sealed)))
                self.end_headers()
                self.wfile.write(sealed)

            def log_message(self, *args: Any) -> None:  # requests are not this rank's output
                pass

        self._server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="synapse-heal-state", daemon=True)
        self._thread.start()

    def _state_of(self, step: int) -> bytes | None:
        with self._changed:
            self._changed.wait_for(lambda: self._served is not None and self._served[0] == step,
                                   timeout=self.timeout.total_seconds())
            return self._served[1] if self._served is not None and self._served[0] == step else None

    def _serve(self, served: tuple[int, bytes] | None) -> None:
        with self._changed:
            self._served = served
            self._changed.notify_all()

    def metadata(self) -> str:
        return f"http://{self.host}:{self._server.server_address[1]}/state/"

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        buffer = io.BytesIO()
        torch.save(state_dict, buffer)  # the tensors as they are now: the next update cannot reach the copy
        self._serve((step, seal_bytes(self.key, f"torchft state {step}", "heal", buffer.getvalue())))

    def disallow_checkpoint(self) -> None:
        self._serve(None)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        import urllib.request

        with urllib.request.urlopen(f"{metadata}{step}", timeout=timeout.total_seconds()) as answer:
            sealed = answer.read()
        try:
            payload = open_bytes(self.key, f"torchft state {step}", "heal", sealed)
        except ForeignRecordError as exc:
            raise ForeignRecordError(f"the state of step {step} from replica rank {src_rank} at {metadata} is not "
                                     f"sealed with this run's key: refused, not loaded") from exc
        return torch.load(io.BytesIO(payload), weights_only=True)

    def shutdown(self, wait: bool = True) -> None:
        self._serve(None)
        self._server.shutdown()
        self._server.server_close()


class StepNotCommitted(RuntimeError):
    """The replicas did not commit this step (a peer was lost during it): it runs again on a new quorum."""


def quorum_share(index: int, participants: int, batch: int, microbatches: int) -> range:
    """Participant ``index`` of ``participants``: its images of the step's global batch, in whole
    micro-batches, as equal as the micro-batches allow (the first ones take one more)."""
    units = batch // microbatches
    if participants < 1 or not 0 <= index < participants or participants > units:
        raise ValueError(f"participant {index} of {participants}: a batch of {batch} images in micro-batches of "
                         f"{microbatches} gives {units} micro-batches to share out")
    base, extra = divmod(units, participants)
    start = (index * base + min(index, extra)) * microbatches
    return range(start, start + (base + (index < extra)) * microbatches)


class QuorumReplicas:
    """This stage rank's place among the replicas under torchft: the runtime's replica reduction
    (``synapse.pipeline.replicas.ReplicaReduction``) and the step driver (``run_step``)."""

    pipeline_group = None  # a replica's pipeline is its own launch: the default group
    replica = 0  # the replica's index within its launch (each replica is a launch of its own)
    share = None  # every step's whole batch is loaded; the quorum cuts it (``step_share``)
    evaluation_shard = (0, 1)  # each replica evaluates the whole split: no collective outside a step's quorum

    @property
    def evaluation_batch(self) -> int:
        """The whole batch: each replica evaluates the whole split alone."""
        return self.batch

    def __init__(self, spec: ReplicaGroupSpec, stage: int, stages: int, batch: int, microbatches: int,
                 record: Callable[..., Any], key: bytes, log: Callable[[str], None] = print):
        from torchft import Manager  # type: ignore[import-untyped]
        from torchft.process_group import ProcessGroupGloo  # type: ignore[import-untyped]

        self.spec, self.stage, self.batch, self.microbatches = spec, stage, batch, microbatches
        self.record, self.log = record, log
        timeout = timedelta(seconds=spec.timeout_s)
        host, port = _replica_group_store(stage, spec.address)
        self.manager = Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=None, state_dict=None,
                               min_replica_size=1, use_async_quorum=False, init_sync=False, timeout=timeout,
                               quorum_timeout=timeout, rank=stage, world_size=stages, store_addr=host,
                               store_port=port, lighthouse_addr=spec.meeting.lighthouse,
                               replica_id=f"replica_{spec.replica}", hostname=host,
                               checkpoint_transport=SealedStateTransport(host, key, timeout))
        self.step_share = range(0)
        self.participants = 0
        self.index = 0
        self._quorum_started = False  # join() started the first step's quorum
        self._before: dict[str, torch.Tensor] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self._durations: deque[float] = deque(maxlen=STALL_WINDOW)
        self.stop_seen = False  # a stop request this replica saw, told to the others with the next step
        self.stop_agreed = False  # some replica saw one: every replica stops after this step
        self.carried: dict[str, float] | None = None  # this rank's timing of its last committed step
        # every replica's timing (None: not in the quorum) of the step before the last committed one
        self.replica_timings: list[dict[str, float] | None] = [None] * spec.replicas

    # ---------------------------------------------------------------- healing
    def register_state(self, state: Callable[[], dict[str, Any]], load: Callable[[dict[str, Any]], None]) -> None:
        """What a returning replica receives from a peer (``state``) and how it takes it (``load``)."""
        self.manager.register_state_dict_fn("synapse", load, state)

    def align_step(self, step: int) -> None:
        """The committed step count torchft compares across replicas = the loop's (after a checkpoint load)."""
        self.manager.load_state_dict({"step": step, "batches_committed": step * self.spec.replicas})

    def join(self, step: int, started: float) -> int:
        """The first step's quorum, before the loop starts: a replica behind the others (respawned) heals
        from a peer here. Returns the committed step to go on from."""
        if self.spec.meeting.start_store and not respawned():
            self._meet_every_replica()
        self._start_quorum()
        self._quorum_started = True
        committed = self.manager.current_step()
        if committed != step:
            self.record("replica_healed", step=committed, from_step=step, replica=self.spec.replica,
                        participants=self.participants, since_start_s=time.time() - started, pid=os.getpid())
            self.log(f"replica {self.spec.replica}: healed from a peer at step {committed} (was at {step})")
        return committed

    def _meet_every_replica(self) -> None:
        """A segment's first quorum holds every replica: each waits here for the others to be built (without
        it, one built late under load joined a later quorum by healing, and its first steps had no records).
        A respawned worker does not wait: the others are training."""
        host, port = self.spec.meeting.start_store.rsplit(":", 1)
        store: Any = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=self.spec.timeout_s))
        if self.spec.meeting.start_prefix:
            store = dist.PrefixStore(self.spec.meeting.start_prefix, store)
        store.set(f"replica_{self.spec.replica}_stage_{self.stage}", "built")
        store.wait([f"replica_{r}_stage_{self.stage}" for r in range(self.spec.replicas)])

    # ---------------------------------------------------------------- a step
    def run_step(self, step: int, train: Callable[[range], torch.Tensor | None],
                 undo: Callable[[], None]) -> torch.Tensor | None:
        """Step ``step`` on this replica's share of the quorum's cut; again on a new quorum until committed.
        ``undo``: what a step that was not committed leaves behind is dropped (gradients)."""
        started, attempts = time.perf_counter(), 0
        before = self.participants
        while True:
            attempts += 1
            if not self._quorum_started:
                self._start_quorum()
            self._quorum_started = False
            try:
                loss = train(self.step_share)
            except StepNotCommitted:
                self.log(f"replica {self.spec.replica}: step {step} not committed by the quorum of "
                         f"{self.participants}; again on a new quorum")
                self._restore_statistics()
                undo()
                continue
            break
        if self.manager.current_step() != step:
            raise RuntimeError(f"replica {self.spec.replica}: the loop is at step {step} but torchft committed "
                               f"{self.manager.current_step()}")
        seconds = time.perf_counter() - started
        self._note_quorum_change(step, before, seconds, attempts)
        self._durations.append(seconds)
        return loss

    def _start_quorum(self) -> None:
        self.manager.start_quorum()
        index = self.manager.participating_rank()
        if index is None:
            raise RuntimeError(f"replica {self.spec.replica} is not a participant of its quorum")
        self.index, self.participants = index, self.manager.num_participants()
        self.step_share = quorum_share(index, self.participants, self.batch, self.microbatches)

    def _note_quorum_change(self, step: int, before: int, seconds: float, attempts: int) -> None:
        """By the first stage of the step's first participant (one record a change, whatever K), with the stall
        against a normal step: ``replica_lost`` when a peer was lost (the step ran again, or the quorum
        shrank), ``replica_back`` when the quorum grew."""
        if self.index != 0 or self.stage != 0 or before == 0:
            return
        normal = statistics.median(self._durations) if self._durations else 0.0
        fields = dict(step=step, participants=self.participants, participants_before=before,
                      stall_s=max(0.0, seconds - normal), step_s=seconds, attempts=attempts,
                      share=len(self.step_share), pid=os.getpid())
        if attempts > 1 or self.participants < before:
            self.record("replica_lost", **fields)
        if self.participants > before:
            self.record("replica_back", **fields)

    # ---------------------------------------------------------------- the runtime's reduction
    @property
    def writes_checkpoints(self) -> bool:
        """The step's first participant writes the checkpoints (every replica holds the same state)."""
        return self.index == 0

    def remember_statistics(self, student: torch.nn.Module) -> None:
        self._buffers = dict(student.named_buffers())
        self._before = {name: b.detach().clone() for name, b in self._buffers.items()}

    def _restore_statistics(self) -> None:
        """A step not committed: its BatchNorm statistics are dropped with it."""
        with torch.no_grad():
            for name, saved in self._before.items():
                self._buffers[name].copy_(saved)

    def reduce_step(self, student: torch.nn.ModuleList, loss: torch.Tensor | None,
                    microbatches: int) -> torch.Tensor | None:
        """The global batch's gradient, merged statistics and loss on every participant, then the commit vote;
        raises ``StepNotCommitted`` when the replicas did not commit (before any update)."""
        from torch.distributed import ReduceOp

        weight = len(self.step_share) / self.batch
        params = [p for p in student.parameters() if p.requires_grad]
        # a stage of parameter-free blocks sends an empty tensor (the same stage of every replica does)
        grads = weighted_gradients(params, weight) if params else torch.zeros(0)
        parts, offsets = statistics_additions(student, range(len(student)), self._before, microbatches,
                                              self.index, self.participants)
        extras = [torch.tensor([float(loss) * weight if loss is not None else 0.0, float(self.stop_seen)],
                               dtype=torch.float64), self._timing_slots()]
        extra = torch.cat([*[t.reshape(-1) for t in parts], *extras])
        self.manager.allreduce(grads, reduce_op=ReduceOp.SUM).wait()
        self.manager.allreduce(extra, reduce_op=ReduceOp.SUM).wait()
        if not self.manager.should_commit():
            raise StepNotCommitted(f"replica {self.spec.replica}: the quorum of {self.participants} did not commit")
        set_gradients(params, grads)
        used = sum(t.numel() for t in parts)
        apply_statistics(extra[:used], parts, offsets)
        self.stop_agreed = bool(extra[used + 1] > 0)
        self._read_timing_slots(extra[used + 2:])
        if loss is None:
            return None
        return torch.tensor(float(extra[used]), dtype=loss.dtype)

    def _timing_slots(self) -> torch.Tensor:
        """One slot per replica (present, then TIMING_KEYS); this replica fills its own with its last step's."""
        slots = torch.zeros(self.spec.replicas, 2 + len(TIMING_KEYS), dtype=torch.float64)
        if self.carried is not None:
            told = [1.0, self.carried["step"], *(self.carried[k] for k in TIMING_KEYS)]
            slots[self.spec.replica] = torch.tensor(told, dtype=torch.float64)
        return slots.reshape(-1)

    def _read_timing_slots(self, flat: torch.Tensor) -> None:
        slots = flat.reshape(self.spec.replicas, 2 + len(TIMING_KEYS)).tolist()
        self.replica_timings = [{"step": int(slot[1]), **dict(zip(TIMING_KEYS, slot[2:]))} if slot[0] > 0 else None
                                for slot in slots]

    def after_update(self, student: torch.nn.ModuleList, microbatches: int) -> None:
        """Nothing: the statistics were merged before the vote (a collective after it would be outside it)."""

    def add_up(self, counts: Sequence[float], device: torch.device) -> list[float]:
        """Each replica evaluated the whole split: its counts are the run's."""
        return list(counts)

    def shutdown(self) -> None:
        self.manager.shutdown(wait=True)


class FirstParticipantCheckpointer(Checkpointer):
    """The engine's checkpointer, saving only on the replica that is the step's first participant (every
    replica holds the same state; the first participant is alive whichever replica was lost)."""

    def __init__(self, quorum: QuorumReplicas, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.quorum = quorum

    def save(self, step: int, held: HeldState, sampler_state: Any) -> Path:
        if self.quorum.writes_checkpoints:
            return super().save(step, held, sampler_state)
        return self.root / ckpt.step_dir_name(step)


def respawned() -> bool:
    """Whether torch's elastic agent started this worker again after its first one died (under torchft a
    replica's agent respawns its workers; Synapse's own restarts are new launches)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def respawn_store(timeout: timedelta) -> dict[str, Any]:
    """``init_process_group``'s store for a respawned worker: the agent's store, under a prefix of its own
    attempt (empty for a first worker: torch's env:// as usual).

    The agent serves its workers one store for all its attempts, and torch's env:// sets the default group
    up on it with no prefix per attempt. Under torchft a replica of K > 1 ranks is respawned in place, and
    its new ranks found the dead ones' gloo addresses still there: rank 0 connected to a rank of the
    attempt before ("Gloo connectFullMesh failed ... Connection refused"), failed, and the agent spent
    its respawns on this until the replica was gone. A replica of one rank connects to nobody."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restarts == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}  # a first worker, or a store of this attempt's own (served by its rank 0)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return {"store": dist.PrefixStore(f"synapse_attempt_{restarts}", store),
            "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}


def faults_not_fired(faults: tuple[Any, ...], events: Any) -> tuple[Any, ...]:
    """``injection.faults`` without those the run's events say were injected: a respawned worker does not
    kill itself again at the step it heals back to."""
    fired = fired_fault_indices(events)
    return tuple(f for i, f in enumerate(faults) if (i if f.fault_id is None else f.fault_id) not in fired)


def sampler_state_at(sampler: Any, step: int) -> dict[str, int]:
    """The sampler's position after optimizer step ``step`` (>= 1) of the run."""
    per_epoch = sampler.steps_per_epoch
    return sampler.state_after((step - 1) // per_epoch, (step - 1) % per_epoch)


def _replica_group_store(stage: int, host: str) -> tuple[str, int]:
    """The replica group's own TCP store (torchft's Manager finds its rank 0's server there, and the other
    replicas' ranks form the cross-replica group on it when this replica leads a quorum): hosted by stage 0
    on ``host`` only (torch's own server would listen on every interface), its port told to the other
    stages over the launch's default group."""
    store = None
    if stage == 0:
        listening = socket.create_server((host, 0))
        store = dist.TCPStore(host, listening.getsockname()[1], is_master=True, wait_for_workers=False,
                              master_listen_fd=listening.detach())  # the store owns the descriptor from here on
    box = [store.port if store is not None else None]
    dist.broadcast_object_list(box, src=0)
    _STORES.append(store)  # kept open for the worker's life
    return host, int(cast(int, box[0]))


_STORES: list[Any] = []
