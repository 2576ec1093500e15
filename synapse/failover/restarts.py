"""One restart of a run: why, when, and what it cost, measured from the run's own events.

Apart from the supervisor's loop because a restart is a record (the experiment summary lists
them, the restart-cost model learns from their parts) and measuring it is arithmetic on the
events the workers wrote, not part of running segments.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synapse.decision import Decision


@dataclass
class Restart:
    """One restart: why, when, and what it cost (filled in as its pieces are seen)."""

    segment: int  # the segment it starts
    action: str
    trigger_time: float  # decision, or failure detection
    trigger_step: int
    resume_step: int
    relaunch_time: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    recovery_s: float | None = None
    first_step: int | None = None
    cause: str | None = None
    decision: Decision | None = None
    resume_path: Path | None = None
    trigger: str = "decision"  # or "failure"
    mode: str = "restart"  # or "live" (a REPLAN without stopping the workers)
    last_step_time: float | None = None  # end of the last step on the old partition
    downtime_s: float | None = None  # last step on the old partition -> first on the new, less one healthy step

    def measure(self, first_record: dict[str, Any], events: Sequence[dict[str, Any]], ended_at: float | None,
                baseline_step_s: float) -> None:
        """Split the restart's wall time into its parts, from the events the workers wrote
        (``ended_at``: when the segment before it ended, the supervisor's own fact)."""
        saved = [e for e in events if e["event"] == "checkpoint_saved" and e.get("for_stop")
                 and e.get("segment") == self.segment - 1]
        ready = [e for e in events if e["event"] == "launch_ready" and e.get("segment") == self.segment]
        first_end = float(first_record["time"])
        parts = {}
        if saved:
            parts["checkpoint_save_s"] = saved[-1]["seconds"]
        if ended_at is not None:
            teardown_from = saved[-1]["time"] if saved else self.trigger_time
            parts["teardown_s"] = max(0.0, ended_at - teardown_from)
        if ready:
            r = ready[-1]
            parts["launch_s"] = max(0.0, r["process_started"] + r["build_s"] - self.relaunch_time)
            parts["checkpoint_load_s"] = r["checkpoint_load_s"]
            warm = first_end - r["time"] - baseline_step_s
            parts["warmup_s"] = max(0.0, warm)
        self.components = parts
        self.first_step = int(first_record["step"])
        self.recovery_s = first_end - self.trigger_time
        self.downtime_s = self.downtime(first_record, baseline_step_s)

    def downtime(self, first_record: dict[str, Any], baseline_step_s: float) -> float | None:
        """Wall time the pipeline did no useful step: from the end of the last step on the old
        partition to the end of the first on the new, less one healthy step (the first step's
        own work). What a restart path really costs, whatever the step time."""
        if self.last_step_time is None:
            return None
        gap = float(first_record["time"]) - self.last_step_time - baseline_step_s
        return max(0.0, gap)
