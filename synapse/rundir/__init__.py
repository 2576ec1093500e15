"""The run directory, the processes' shared medium: the JSONL records and their one writer
and reader, the failover event log, the lock that keeps one run per directory, and a full disk
said as such.
"""
from synapse.rundir.disk import DiskFullError, disk_full_error, filesystem_full, is_disk_full, read_json_record
from synapse.rundir.events import EventLog, EventLogError, events_path, read_events
from synapse.rundir.lock import RunDirInUseError, RunDirUnusableError, hold_as_worker, hold_run_dir
from synapse.rundir.records import JsonlTail, JsonlWriter, NullWriter, RecordFileError, iter_jsonl, read_jsonl

__all__ = ["DiskFullError", "EventLog", "EventLogError", "JsonlTail", "JsonlWriter", "NullWriter", "RecordFileError",
           "RunDirInUseError", "RunDirUnusableError", "disk_full_error", "events_path", "filesystem_full",
           "hold_as_worker", "hold_run_dir", "is_disk_full", "iter_jsonl", "read_events", "read_json_record",
           "read_jsonl"]
