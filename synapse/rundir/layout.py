"""The run directory's protocol: every file and folder a run writes, who writes and reads it, and how.

The run directory is the medium the processes of a run talk through (the supervisor, its K
workers, the health monitor, a supervisor resumed later, synapse.analysis). Each ``Entry`` here
declares one file or folder: its path as a template relative to the run directory (a folder
ends with ``/``; ``{field}`` parts are filled by ``Entry.path``), its writer and readers, its
format, how it is written so that a reader never takes half of it for the whole, and whether it
is a *channel*: another process of the run acts on it while the run goes on (or a supervisor
resumed later does). ``torn`` says where a reader can still meet a half-written file today.

Every other module gets its paths from here (``Entry.path``, ``name``, ``glob``), so a name is
spelled once; tests/unit/test_run_directory.py holds synapse/ to that, checks that a real run
writes nothing undeclared, and that docs/run_directory.md is ``markdown_table()``'s output.

A checkpoint's own files (manifest.json, state.pt, the DCP files) are the checkpoint format's,
named by synapse.checkpoint: a checkpoint can live anywhere (``resume=<path>``), and a pinned
copy sits under ``segments/<n>/resume/``. Only where checkpoints go in a run directory, and
how their folders are named, is said here.

A leaf module: the standard library only.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from string import Formatter

RUN = "run"  # an entry of a run directory (hydra.run.dir, or one job of a sweep)
SWEEP = "sweep"  # an entry of a Hydra multirun directory (hydra.sweep.dir), which holds one run directory per job
NESTED_RUN = "a run directory of its own (this layout again)"  # ``inside`` of a folder that is a run directory


class LayoutError(ValueError):
    """A path asked of the layout with missing, unknown or unsafe fields."""


@dataclass(frozen=True)
class Field:
    pattern: str  # what a filled-in value looks like (a regular expression; it never matches "/")
    meaning: str


FIELDS = {
    "rank": Field(r"\d+", "a global pipeline rank (0 .. K-1)"),
    "segment": Field(r"\d+", "a segment's index: 0 for the first placement, +1 at every restart and live re-partition"),
    "node": Field(r"[1-9]\d*", "a node's rank (node 0's locks carry no number)"),
    "attempt": Field(r"\d+(?:_node\d+|_replica\d+)?", "a launch's name: the segment it runs, <segment>_node<n> for "
                                                      "the agent of node n, or <segment>_replica<r> for replica r's "
                                                      "launch under failover.replica_engine=torchft"),
    "step": Field(r"\d{8}", "an optimizer step, zero-padded to 8 digits"),
    "nonce": Field(r"[^/]+", "random letters shared by the ranks of one checkpoint save"),
    "token": Field(r"[^/]+", "the writer's pid (or random letters): two writers never share a temporary"),
    "role": Field(r"[a-z_]+", "who writes a tracker's files: train, supervisor"),
    "kind": Field(r"[a-z_]+", "a record kind: train, eval, markers"),
    "agent": Field(r"[^/]+_[a-z0-9_]{8}", "torch elastic's folder of one agent: <rendezvous run id>_<8 random>"),
    "restart": Field(r"\d+", "torch elastic's restart count (0, but for a replica's respawned workers under "
                               "failover.replica_engine=torchft)"),
    "local_rank": Field(r"\d+", "a rank's number on its node"),
    "figure": Field(r"[a-z_]+", "a figure's name"),
    "ext": Field(r"[a-z]+", "a figure format (png, svg)"),
    "job": Field(r"\d+", "a sweep job's number"),
    "job_id": Field(r"[^/]+", "submitit's id of a job"),
    "task": Field(r"\d+", "submitit's task number"),
    "stream": Field(r"out|err", "which console stream"),
}
_UNSAFE = re.compile(r"^\.{1,2}$|[/\\\0]")


def _parts(template: str) -> Iterator[tuple[str, str | None, str]]:
    for literal, field, spec, _ in Formatter().parse(template):
        yield literal, field, spec or ""


def _pattern(template: str, named: bool) -> str:
    """``template`` as a regular expression: its fields as groups (named, or plain and numbered)."""
    out, seen = [], set()
    for literal, field, _ in _parts(template):
        out.append(re.escape(literal))
        if field is None:
            continue
        if field not in FIELDS:
            raise LayoutError(f"{template}: unknown field {{{field}}}; the fields are {sorted(FIELDS)}")
        if named and field in seen:
            out.append(f"(?P={field})")
        else:
            out.append(f"(?P<{field}>{FIELDS[field].pattern})" if named else f"({FIELDS[field].pattern})")
        seen.add(field)
    return "".join(out)


def _last(template: str) -> str:
    return template.rstrip("/").rsplit("/", 1)[-1]


def _stem(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name


@dataclass(frozen=True)
class Entry:
    """One file or folder of a run (or sweep) directory."""

    template: str  # relative to the directory; a folder ends with "/"
    holds: str  # what it is, in a few words
    writer: str  # which process writes it, and when
    readers: str  # which processes read it, and when
    format: str
    written: str  # how a reader never takes half of it for the whole
    channel: bool = False  # another process of the run acts on it while the run goes on (or a resumed supervisor)
    torn: str = ""  # where a reader can meet it half-written today, and what it then does
    temp: str = ""  # the temporary it is written under, beside it, then renamed: "{name}", "{stem}", "{token}"
    inside: str = ""  # a folder whose files are another format's (not declared here): whose; NESTED_RUN: a run dir
    root: str = RUN  # RUN or SWEEP: the directory the template is relative to

    # ---------------------------------------------------------------- shape
    @property
    def is_folder(self) -> bool:
        return self.template.endswith("/")

    @property
    def fields(self) -> tuple[str, ...]:
        """The template's fields in order, each once."""
        return tuple(dict.fromkeys(field for _, field, _ in _parts(self.template) if field is not None))

    @property
    def shown(self) -> str:
        """The template as people write it (``segments/<segment>/segment.json``), for messages."""
        return "".join(literal + (f"<{field}>" if field is not None else "") for literal, field, _ in
                       _parts(self.template))

    @property
    def regex(self) -> re.Pattern[str]:
        """Matches the whole relative path (without a folder's trailing /); fields as named groups."""
        return re.compile(_pattern(self.template.rstrip("/"), named=True))

    @property
    def name_regex(self) -> re.Pattern[str]:
        """Matches the last part of the path alone, from ^ to $; fields as numbered groups."""
        return re.compile(f"^{_pattern(_last(self.template), named=False)}$")

    @property
    def temp_template(self) -> str:
        """The template of the temporary this entry is written under ("" if it is not renamed into place)."""
        if not self.temp:
            return ""
        name = _last(self.template)
        folder = self.template.rstrip("/")[:-len(name)]
        return folder + self.temp.format(name=name, stem=_stem(name), token="{token}")

    # ---------------------------------------------------------------- paths
    def path(self, root: Path | str, **fields: object) -> Path:
        """This entry in the directory ``root``, its fields filled (``HEARTBEAT.path(run_dir, rank=2)``)."""
        return Path(root) / self._render(self.template.rstrip("/"), fields)

    def name(self, **fields: object) -> str:
        """The last part of the path alone, for code handed the folder that holds it (``rank_2.json``)."""
        return self._render(_last(self.template), fields)

    def glob(self, within: Entry | None = None, **fields: object) -> str:
        """A glob pattern of this entry, relative to the directory (or to the folder entry ``within``,
        which holds it); fields not given match anything (``HEARTBEAT.glob()`` is ``live/rank_*.json``)."""
        template = self.template.rstrip("/")
        if within is not None:
            if not (within.is_folder and template.startswith(within.template)):
                raise LayoutError(f"{self.template} is not inside the folder {within.template}")
            template = template[len(within.template):]
        unknown = set(fields) - set(self.fields)
        if unknown:
            raise LayoutError(f"{self.template} has no field(s) {sorted(unknown)}; its fields are {list(self.fields)}")
        out = []
        for literal, field, spec in _parts(template):
            out.append(literal)
            if field is not None:
                out.append(self._value(field, spec, fields[field]) if field in fields else "*")
        return "".join(out)

    def temp_path(self, final: Path | str, token: object = "") -> Path:
        """The temporary that ``final`` (a path of this entry) is written under before the rename."""
        if not self.temp:
            raise LayoutError(f"{self.template} is not written under a temporary name")
        final = Path(final)
        return final.with_name(self.temp.format(name=final.name, stem=_stem(final.name), token=token))

    def _render(self, template: str, fields: dict[str, object]) -> str:
        wanted = [field for _, field, _ in _parts(template) if field is not None]
        missing, unknown = set(wanted) - set(fields), set(fields) - set(wanted)
        if missing or unknown:
            raise LayoutError(f"{template} needs the field(s) {sorted(set(wanted))}; got {sorted(fields)}")
        return "".join(literal + (self._value(field, spec, fields[field]) if field is not None else "")
                       for literal, field, spec in _parts(template))

    def _value(self, field: str, spec: str, value: object) -> str:
        text = format(value, spec)
        if _UNSAFE.search(text) or not re.fullmatch(FIELDS[field].pattern, text):
            raise LayoutError(f"{self.template}: {field}={value!r} is not a {field} ({FIELDS[field].meaning}); "
                              f"a path of the layout stays inside its directory")
        return text


# ---------------------------------------------------------------------------------------------------------- the run
_JSONL = "JSON Lines: one JSON object per line"
_APPENDED = ("appended a whole line at a time by its one writer, flushed per record; a reader takes an unterminated "
             "last line as not yet written, and a writer reopening the file cuts off a line a killed one tore "
             "(synapse.rundir.records)")
_WHOLE = "written whole (write_text), not renamed into place"
_CHECKPOINT_FORMAT = ("a checkpoint (synapse.checkpoint's format: DCP tensor files, state.pt, manifest.json with "
                      "every file's sha256)")

CONFIG = Entry(
    "config.yaml", "the run's composed config, resolved",
    "the supervisor process (synapse.app), at the start of every run or resume",
    "synapse.analysis; a later run refusing this run's checkpoint names it", "YAML",
    f"{_WHOLE}; no other process reads it while the run goes on")
HYDRA = Entry(
    ".hydra/", "Hydra's record of the job: config.yaml, hydra.yaml, overrides.yaml",
    "Hydra (python train.py), before the job starts", "synapse.analysis (the two entries below); people", "YAML",
    "Hydra's", inside="Hydra's")
HYDRA_OVERRIDES = Entry(
    ".hydra/overrides.yaml", "the command line's overrides", "Hydra", "synapse.analysis (a sweep job's settings)",
    "YAML list of override strings", "Hydra's")
HYDRA_JOB = Entry(
    ".hydra/hydra.yaml", "Hydra's own settings of the job", "Hydra",
    "synapse.analysis (a sweep job's id, to find its console logs)", "YAML", "Hydra's")
LOG = Entry(
    "train.log", "the supervisor process's log (the console's lines)",
    "Hydra's job logging in the supervisor process (hydra.job.name=train)", "people; a sweep report links it",
    "text lines", "appended by the logging module")
METRICS = Entry(
    "metrics.jsonl", "per step: loss, learning rate, step time, images/s; per evaluation: accuracy",
    "the process that has the loss: the last pipeline rank, or the single-device trainer",
    "the supervisor's console (tails it while the run goes on); synapse.analysis", _JSONL, _APPENDED)
PERFORMANCE = Entry(
    "performance.jsonl", "per step and rank: compute and communication seconds (the controller's input)",
    "the last pipeline rank, once every rank's timing of the step is in",
    "the supervisor's launch watcher and failover controller (tail it while the run goes on), its console; "
    "synapse.planning (plan vs measured, at the end); synapse.analysis", _JSONL, _APPENDED, channel=True)
EVENTS = Entry(
    "failover_events.jsonl",
    "the run's event log: faults, health events, detections, decisions, checkpoints, restarts",
    "every process of the run: workers, injector, health monitor, controller, supervisor",
    "the supervisor (faults already fired -> the next segment's config; restart timings); synapse.analysis",
    _JSONL, "one os.write of a whole line on an O_APPEND descriptor per record, so lines of concurrent writers never "
            "interleave; read by the same torn-line policy as the other JSONL files (synapse.rundir.events)",
    channel=True)
HEALTH = Entry(
    "health.jsonl", "the health monitor's samples (liveness of every rank; NVML on GPUs)",
    "the health monitor (a thread of the supervisor process)", "people", _JSONL, _APPENDED)
RUN_SUMMARY = Entry(
    "summary.json", "the last launch's summary: steps, throughput, final evaluation",
    "the process that has the loss, at the end of every launch; synapse.app after a single-device run",
    "synapse.app (mode=teacher|baseline, in the same process); synapse.analysis", "JSON object",
    f"{_WHOLE}; read only after its writer ended")
EXPERIMENT_SUMMARY = Entry(
    "experiment_summary.json", "the whole run: segments, decisions with every option's ETA, restarts, time lost",
    "the supervisor, at the end of the run", "synapse.analysis; a supervisor resumed later (the earlier restarts)",
    "JSON object", f"{_WHOLE}; a resumed supervisor that finds it cut short says so and lists only its own restarts")
FAILOVER = Entry(
    "failover/", "the failover controller's own files", "the supervisor", "a supervisor resumed later", "folder",
    "created with its first file")
CONTROLLER_STATE = Entry(
    "failover/controller_state.json", "what the failover controller learnt: step-time baselines, restart costs",
    "the supervisor, after every segment", "a supervisor resumed with resume=auto (its controller starts from it)",
    "JSON object", "written to a temporary beside it, then renamed into place", channel=True, temp="{stem}.tmp")
DECIDER_EPOCH = Entry(
    "failover/decider_epoch.json", "the decider's epoch across nodes: raised by one at every start of a decider "
    "(the first and each restart), so whatever an earlier decider ordered or its workers committed is refused",
    "node 0's launcher, before it starts a decider (synapse.failover.epoch)",
    "the decider it starts (its orders carry the epoch); a worker about to commit a checkpoint; tests",
    "JSON object: epoch, pid, host, started", "written to a temporary beside it, fsynced, then renamed into place",
    channel=True, temp="{stem}.{token}.tmp")
PARTITION = Entry(
    "partition.json", "the first placement: devices and blocks per stage",
    "synapse.app, before the first launch (mode=simulate: synapse.simulation, before the first simulated step)",
    "people; tests", "JSON object", f"{_WHOLE}; read only after the run")
PLAN = Entry(
    "plan.json", "the planner's first plan and the profiles it used (partition=auto; mode=simulate: the simulated "
    "placement, its predicted step, the step noise and every fault)",
    "synapse.planning, before the first launch; synapse.simulation in mode=simulate",
    "synapse.planning (plan vs measured, at the end); synapse.analysis",
    "JSON object", f"{_WHOLE}; read later by the same process")
PLAN_VS_MEASURED = Entry(
    "plan_vs_measured.json", "the plan's predicted step and stage times against the measured ones",
    "synapse.planning, at the end of a partition=auto run", "synapse.analysis", "JSON object",
    f"{_WHOLE}; read only after the run")
MICROBATCHES = Entry(
    "microbatches.json", "pipeline.microbatches=auto: every candidate count and its predicted step",
    "synapse.planning, before the first launch", "people; tests", "JSON object", f"{_WHOLE}; read only after the run")
MODEL = Entry(
    "model.pt", "the weights of a model trained with labels (mode=teacher|baseline)",
    "the label trainer, at its end", "synapse.engine (copies a teacher into the teacher cache); teacher.checkpoint=",
    "torch.save state dict", "written to a temporary beside it, then renamed into place", temp="{stem}.tmp")
TEACHER_TRAINING = Entry(
    "teacher_training/", "the run that trained the teacher with labels first (no teacher.checkpoint given)",
    "the supervisor process, before distilling", "synapse.engine (its model.pt); people", "a run directory",
    "each file as in any run directory", inside=NESTED_RUN)
SUPERVISOR_LOCK = Entry(
    ".synapse.lock", "held (flock, exclusive) by the supervisor of node 0 for its whole run; holds its pid",
    "the supervisor", "a second supervisor started on the same directory (refused, told the holder's pid)",
    "flock; JSON {pid, started}", "the lock is the kernel's; the pid is rewritten in place after locking",
    channel=True, torn="a second supervisor may read the pid while it is rewritten: its message then says pid ?")
WORKERS_LOCK = Entry(
    ".synapse.workers.lock", "held (flock, shared) by every worker of node 0 for its whole life",
    "every worker", "a starting supervisor probes it: workers an earlier run left behind refuse the directory",
    "flock; empty", "the lock is the kernel's", channel=True)
NODE_SUPERVISOR_LOCK = Entry(
    ".synapse.node{node}.lock", "node n's supervisor lock (several nodes sharing the directory)",
    "the supervisor of node n", "a second supervisor of node n", "flock; JSON {pid, started}",
    "as .synapse.lock", channel=True, torn="as .synapse.lock")
NODE_WORKERS_LOCK = Entry(
    ".synapse.node{node}.workers.lock", "node n's workers lock", "every worker of node n",
    "a starting supervisor of node n", "flock; empty", "the lock is the kernel's", channel=True)
RUN_KEY = Entry(
    "run.key", "the run's secret: every value the run's processes put on a c10d store is sealed with it "
               "(HMAC-SHA256), so a value another process wrote there is refused (synapse.rundir.run_key)",
    "the first process of the run that needs one (a supervisor, or a node's agent), once per run directory; "
    "kept on resume", "the supervisor and agent of every node; rank 0 (the stop requests across nodes)",
    "64 hex digits (32 random bytes); mode 0600, refused if another user owns it or can read it",
    "written to a temporary beside it (mode 0600), then linked into place: the first of two racing writers "
    "wins and both read its key", channel=True, temp=".{name}.{token}.tmp")
LIVE = Entry(
    "live/", "where each worker is now", "the workers", "the health monitor; the launcher", "folder",
    "created by the first worker")
HEARTBEAT = Entry(
    "live/rank_{rank}.json", "a worker's heartbeat: pid, host (name and boot id: a pid means a process only "
    "there), device, step, phase, time",
    "worker <rank>: at its start, after every step, and at a normal exit (phase finished)",
    "the health monitor (dead and hung ranks -> teardown), the launcher (which ranks to kill, what failed), a "
    "starting supervisor (pids of workers left behind)", "JSON object",
    "written to a temporary beside it, then renamed into place", channel=True, temp="{stem}.tmp-{token}")
PROGRESS_BOARD = Entry(
    "live/rank_{rank}.progress", "where a worker is inside its step: pid, step, time, phase",
    "worker <rank>, at every phase (recv, send, forward, ...)",
    "the launcher, when a launch fails or hangs (which rank was busy, which waited)",
    "48 bytes: struct <qqd24s (pid, step, time, phase)",
    "rewritten in place through a shared memory map (a rename per phase would cost too much)", channel=True,
    torn="a reader racing a rewrite can see parts of two entries (e.g. a new phase with the old time); it is read "
         "when the launch has ended or hung, when writes have stopped")
CONTROL = Entry(
    "control/", "the control channel between the supervisor and its running workers", "the supervisor; rank 0",
    "rank 0; the supervisor", "folder", "created with the first request")
STOP_REQUEST = Entry(
    "control/stop.json", "the supervisor's request: after the current step stop (checkpoint, exit) or re-partition",
    "the supervisor (a decision, a first Ctrl-C); removed before every launch (across nodes the request goes "
    "through the rendezvous store instead)", "rank 0, after every step",
    "JSON object (synapse.control.StopRequest)", "written to a temporary beside it, then renamed into place",
    channel=True, temp=".{name}.{token}.tmp")
STOP_ACK = Entry(
    "control/ack.json", "rank 0's answer: the step after which every rank acted on the request",
    "rank 0", "the supervisor", "JSON object (synapse.control.StopAck)",
    "written to a temporary beside it, then renamed into place", channel=True, temp=".{name}.{token}.tmp")
SEGMENTS = Entry(
    "segments/", "one folder per segment of the run", "the supervisor", "see below", "folder",
    "created with the first segment")
SEGMENT = Entry(
    "segments/{segment}/", "one segment: one placement from one step to another", "the supervisor",
    "see below", "folder", "created before the segment's launch")
SEGMENT_RECORD = Entry(
    "segments/{segment}/segment.json", "why the segment exists, its devices and partition, start and end",
    "the supervisor, when the segment starts (before its launch, or at a live re-partition) and when it ends",
    "a supervisor resumed later (the run's history); synapse.analysis (without an experiment summary)",
    "JSON object (synapse.failover.segments.Segment)", "written to a temporary beside it, then renamed into place",
    channel=True, temp="{name}.tmp")
SEGMENT_CONFIG = Entry(
    "segments/{segment}/config.yaml", "the segment's composed config, resolved", "the supervisor, when the segment "
    "starts", "people (what ran); tests", "YAML", f"{_WHOLE}; the launch gets its config from memory")
SEGMENT_OVERRIDES = Entry(
    "segments/{segment}/overrides.yaml", "the override list that composes the segment's config",
    "the supervisor, when the segment starts", "people (python train.py <those> reruns it); tests",
    "YAML list of override strings", f"{_WHOLE}; the launch gets its config from memory")
SEGMENT_RESUME = Entry(
    "segments/{segment}/resume/", "the checkpoint the segment resumes from, pinned (hard links, or a copy)",
    "the supervisor, before the segment's launch", "the segment's workers (they load it)", _CHECKPOINT_FORMAT,
    "complete before the launch that reads it starts", channel=True, inside=_CHECKPOINT_FORMAT)
CHECKPOINTS = Entry(
    "checkpoints/", "the run's checkpoints", "the workers (rank 0 commits)",
    "the supervisor (which one the next segment resumes from); resume=auto", "folder",
    "each checkpoint is committed by a rename (below)")
CHECKPOINT = Entry(
    "checkpoints/step_{step:08d}/", "a finished checkpoint at a step",
    "every worker writes its part into a staging folder; rank 0 commits it",
    "the supervisor, resume=auto (the newest that verifies); the next launch's workers", _CHECKPOINT_FORMAT,
    "every file fsync'ed in the staging folder, the manifest written last, then the folder renamed into place",
    channel=True, inside=_CHECKPOINT_FORMAT)
CHECKPOINT_STAGING = Entry(
    "checkpoints/step_{step:08d}.tmp-{nonce}/", "a checkpoint being written", "every worker (one nonce per save)",
    "nobody: the next save removes one a failed or killed save left", _CHECKPOINT_FORMAT,
    "renamed to step_<step>/ once complete", inside=_CHECKPOINT_FORMAT)
CHECKPOINT_RUN_IDENTITY = Entry(
    "checkpoints/run_identity.json", "which run the checkpoints belong to: pruning deletes only its own, and a "
    "fresh run refuses a directory holding another's", "rank 0, at the run's first commit",
    "rank 0 (pruning); the supervisor before a fresh run starts", "JSON: {run: <hex>}",
    "a temporary file renamed into place")
CHECKPOINT_SET_ASIDE = Entry(
    "checkpoints/step_{step:08d}.corrupt-{nonce}/", "a checkpoint of a step saved again that no longer verified",
    "rank 0, when it commits the same step again", "nobody: the next save removes it", _CHECKPOINT_FORMAT,
    "renamed aside before the new one is renamed into place", inside=_CHECKPOINT_FORMAT)
LOGS = Entry(
    "logs/", "the workers' output, per launch", "torch's elastic agent; failing workers", "see below", "folder",
    "created by the first launch")
LAUNCH_LOGS = Entry(
    "logs/launch_{attempt}/", "one launch's worker output and failure records",
    "torch's elastic agent; failing workers", "the launcher; people", "folder", "created by the launch")
WORKER_LOGS = Entry(
    "logs/launch_{attempt}/{agent}/", "torch elastic's folder of one agent: attempt_<n>/<local rank>/ of every rank",
    "torch's elastic agent (redirected stdout and stderr of each rank)", "the launcher; people",
    "torch elastic's", "torch's", inside="torch elastic's")
WORKER_RANK_LOGS = Entry(
    "logs/launch_{attempt}/{agent}/attempt_{restart}/{local_rank}/", "one rank's redirected output",
    "torch's elastic agent", "the launcher (a failed rank's last lines)", "folder", "torch's")
WORKER_STDOUT = Entry(
    "logs/launch_{attempt}/{agent}/attempt_{restart}/{local_rank}/stdout.log", "a rank's standard output",
    "torch's elastic agent", "the launcher (the last lines of a failed rank); people", "text",
    "appended as the rank writes")
WORKER_STDERR = Entry(
    "logs/launch_{attempt}/{agent}/attempt_{restart}/{local_rank}/stderr.log", "a rank's standard error",
    "torch's elastic agent", "the launcher (the last lines of a failed rank); people", "text",
    "appended as the rank writes")
FAILURES = Entry(
    "logs/launch_{attempt}/failures/", "the failure records of one launch", "failing workers", "the launcher",
    "folder", "created by the first failing worker")
FAILURE_RECORD = Entry(
    "logs/launch_{attempt}/failures/rank_{rank}.json", "why a worker failed: exception type, message, traceback",
    "worker <rank>, as it fails", "the launcher, once the launch has ended (the root cause: which rank, which device)",
    "JSON object", "written to a temporary beside it, then renamed into place; none on a full disk", channel=True,
    temp="{stem}.tmp-{token}")
TENSORBOARD = Entry(
    "tensorboard/", "TensorBoard's folders, one per role (logger=tensorboard)", "synapse.trackers", "TensorBoard",
    "folder", "created with the first role's folder")
TENSORBOARD_EVENTS = Entry(
    "tensorboard/{role}/", "TensorBoard event files (logger=tensorboard)",
    "synapse.trackers: the process that has the loss (train), the supervisor (supervisor)", "TensorBoard",
    "TensorBoard's", "TensorBoard's (records appended; TensorBoard reads what is complete)",
    inside="TensorBoard's (events.out.tfevents.*)")
CSV_TRACKER = Entry(
    "csv/", "CSV files of the run's scalars (logger=csv)", "synapse.trackers", "spreadsheets; people", "folder",
    "created with the first file")
CSV_TABLE = Entry(
    "csv/{role}_{kind}.csv", "one record kind's scalars, one row per record",
    "synapse.trackers: the process that has the loss (train), the supervisor (supervisor)", "spreadsheets; people",
    "CSV with a header row", "appended a row at a time (line-buffered)")
REPORT = Entry(
    "report/", "the run's figures and report", "synapse.analysis (at the end of the run, or python -m "
    "synapse.analysis report)", "people", "folder", "created by the report")
REPORT_MARKDOWN = Entry(
    "report/report.md", "the run's report", "synapse.analysis", "people", "Markdown", _WHOLE)
REPORT_FIGURE = Entry(
    "report/{figure}.{ext}", "one figure of the report", "synapse.analysis", "people", "PNG, SVG", "matplotlib's")

# ---------------------------------------------------------------------------------------------------------- a sweep
MULTIRUN = Entry(
    "multirun.yaml", "Hydra's record of a multirun (what makes a directory a sweep)", "Hydra (python train.py -m)",
    "synapse.analysis (tells a sweep from a run)", "YAML", "Hydra's", root=SWEEP)
SWEEP_JOB = Entry(
    "{job}/", "one job of the sweep", "the job's run", "synapse.analysis", "a run directory",
    "each file as in any run directory", inside=NESTED_RUN, root=SWEEP)
SUBMITIT = Entry(
    ".submitit/", "submitit's files of the jobs (hydra/launcher=local_sequential or slurm)", "submitit",
    "synapse.analysis (the sweep report links each job's console)", "submitit's", "submitit's", inside="submitit's",
    root=SWEEP)
SUBMITIT_LOG = Entry(
    ".submitit/{job_id}/{job_id}_{task}_log.{stream}", "a job's console as submitit kept it", "submitit",
    "synapse.analysis (the sweep report links it)", "text", "submitit's", root=SWEEP)
SWEEP_REPORT = Entry(
    "report/", "the sweep's figures, job table and report", "synapse.analysis (the sweep_report Hydra callback, or "
    "python -m synapse.analysis report)", "people", "folder", "created by the report", root=SWEEP)
SWEEP_REPORT_MARKDOWN = Entry(
    "report/report.md", "the sweep's report", "synapse.analysis", "people", "Markdown", _WHOLE, root=SWEEP)
SWEEP_JOBS = Entry(
    "report/jobs.csv", "one row per job: its overrides and outcome", "synapse.analysis", "people; spreadsheets",
    "CSV with a header row", "written whole by pandas", root=SWEEP)
SWEEP_FIGURE = Entry(
    "report/{figure}.{ext}", "one figure of the sweep's report", "synapse.analysis", "people", "PNG, SVG",
    "matplotlib's", root=SWEEP)

ENTRIES = (
    CONFIG, HYDRA, HYDRA_OVERRIDES, HYDRA_JOB, LOG, METRICS, PERFORMANCE, EVENTS, HEALTH, RUN_SUMMARY,
    EXPERIMENT_SUMMARY, FAILOVER, CONTROLLER_STATE, DECIDER_EPOCH, PARTITION, PLAN, PLAN_VS_MEASURED, MICROBATCHES,
    MODEL,
    TEACHER_TRAINING, SUPERVISOR_LOCK, WORKERS_LOCK, NODE_SUPERVISOR_LOCK, NODE_WORKERS_LOCK, RUN_KEY, LIVE, HEARTBEAT,
    PROGRESS_BOARD, CONTROL, STOP_REQUEST, STOP_ACK, SEGMENTS, SEGMENT, SEGMENT_RECORD, SEGMENT_CONFIG,
    SEGMENT_OVERRIDES, SEGMENT_RESUME, CHECKPOINTS, CHECKPOINT, CHECKPOINT_STAGING, CHECKPOINT_SET_ASIDE,
    CHECKPOINT_RUN_IDENTITY, LOGS,
    LAUNCH_LOGS, WORKER_LOGS, WORKER_RANK_LOGS, WORKER_STDOUT, WORKER_STDERR, FAILURES, FAILURE_RECORD, TENSORBOARD,
    TENSORBOARD_EVENTS, CSV_TRACKER, CSV_TABLE, REPORT, REPORT_MARKDOWN, REPORT_FIGURE,
    MULTIRUN, SWEEP_JOB, SUBMITIT, SUBMITIT_LOG, SWEEP_REPORT, SWEEP_REPORT_MARKDOWN, SWEEP_JOBS, SWEEP_FIGURE,
)


def entries(root: str = RUN) -> tuple[Entry, ...]:
    """The entries of one kind of directory (RUN or SWEEP)."""
    return tuple(e for e in ENTRIES if e.root == root)


def declared(relative: str | PurePosixPath, root: str = RUN) -> Entry | None:
    """The entry that declares ``relative`` (a path inside a run or sweep directory), or None.

    A path inside a folder whose files are another format's (a checkpoint, Hydra's, torch's) is
    that folder's; inside a nested run directory, the run's layout applies again. A temporary a
    killed writer left is its entry's."""
    relative = PurePosixPath(relative).as_posix()
    for entry in entries(root):
        if entry.regex.fullmatch(relative) or (entry.temp and re.fullmatch(_pattern(entry.temp_template, True),
                                                                               relative)):
            return entry
    for entry in entries(root):
        if not entry.inside:
            continue
        beneath = re.fullmatch(_pattern(entry.template, named=True) + "(?P<_beneath>.+)", relative)
        if beneath:
            return declared(beneath.group("_beneath"), RUN) if entry.inside == NESTED_RUN else entry
    return None


# ---------------------------------------------------------------------------------------------------------- the docs
def _cell(text: str) -> str:
    """Text for a table cell: a | would end the cell, a <word> would be taken for HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _table(root: str) -> list[str]:
    lines = ["| path | holds | written by | read by | format | written how | channel |",
             "|---|---|---|---|---|---|---|"]
    for entry in entries(root):
        how = entry.written + (f"; temporary: `{entry.temp_template}`" if entry.temp else "")
        if entry.torn:
            how += f". **Can be read half-written:** {entry.torn}"
        lines.append("| " + " | ".join(_cell(cell) for cell in (
            f"`{entry.template}`", entry.holds + (f" (inside: {entry.inside})" if entry.inside else ""), entry.writer,
            entry.readers, entry.format, how, "yes" if entry.channel else "")) + " |")
    return lines


def markdown_table() -> str:
    """The layout as Markdown: docs/run_directory.md is this (a test holds the file to it)."""
    lines = [
        "# The run directory",
        "",
        "<!-- Generated by synapse.rundir.layout.markdown_table(); edit synapse/rundir/layout.py, then rewrite this "
        "file with: python -c \"from synapse.rundir import markdown_table; print(markdown_table(), end='')\" > "
        "docs/run_directory.md -->",
        "",
        "The processes of a run (the supervisor, its workers, the health monitor, a supervisor resumed later, "
        "synapse.analysis) talk through the run directory. Every file and folder a run writes is below: its path "
        "relative to the run directory (`{field}` parts are filled in; a folder ends with `/`), who writes and reads "
        "it, its format and how it is written so that no reader takes half of it for the whole. A *channel* is a "
        "file another process of the run acts on while the run goes on (or a supervisor resumed later does).",
        "",
        "## Fields",
        "",
        "| field | looks like | meaning |",
        "|---|---|---|",
        *(f"| `{{{name}}}` | `{_cell(field.pattern)}` | {_cell(field.meaning)} |" for name, field in FIELDS.items()),
        "",
        "## A run directory",
        "",
        "`hydra.run.dir` (by default `outputs/<date>/<time>_<mode>/`), or one job of a sweep.",
        "",
        *_table(RUN),
        "",
        "## A sweep directory",
        "",
        "`hydra.sweep.dir` of `python train.py -m ...` (by default `outputs/multirun/<date>/<time>/`).",
        "",
        *_table(SWEEP),
        "",
    ]
    return "\n".join(lines)
