"""The console's progress: milestone lines off a terminal, one redrawn bar on one, lines above the bar,
the supervisor's bar read from real record files, and the worker-log helpers."""
from __future__ import annotations

import io
import logging
import os
import select
import sys

import pytest

from synapse.config import ConfigError, validate
from synapse.engine import CLEAR_LINE, ConsoleBar, Milestones, Progress, format_seconds, lines_above, progress_text
from synapse.failover import RunProgress
from synapse.launch import failed_rank_tail, last_lines, rank_log_files
from synapse.partitioning import Placement
from synapse.rundir import JsonlWriter


def test_milestones_fire_once_per_quarter_even_when_steps_jump():
    marks = Milestones(90)
    hits = [step for step in range(1, 91) if marks.reached(step)]
    assert hits == [22, 45, 68, 90]
    jumping = Milestones(100)
    assert [s for s in (10, 60, 61, 99, 100, 100) if jumping.reached(s)] == [60, 99, 100]
    resumed = Milestones(100, start_step=50)
    assert [s for s in range(51, 101) if resumed.reached(s)] == [75, 100]


def test_progress_text_names_what_is_known():
    assert progress_text(57, 264, loss=0.93944, images_per_s=1629.4, eta_s=83, val_top1=97.77, prefix="segment 1") == \
        "segment 1 | step 57/264 (22%) | loss 0.9394 | 1,629 img/s | val 97.8% | ETA 1:23"
    assert progress_text(3, 0) == "step 3"
    assert format_seconds(3725) == "1:02:05"


def test_single_process_progress_off_a_terminal_logs_a_line_per_quarter_and_no_bar():
    stream, lines = io.StringIO(), []
    progress = Progress(40, 0, log=lines.append, stream=stream)
    for step in range(1, 41):
        progress.update(step, loss=1.0 / step, images_per_s=100.0)
    progress.close()
    assert stream.getvalue() == "", "no bar drawn into a pipe or file"
    assert [line.split(" |")[0] for line in lines] == ["step 10/40 (25%)", "step 20/40 (50%)", "step 30/40 (75%)",
                                                      "step 40/40 (100%)"]


@pytest.fixture
def terminal():
    """A real pseudo-terminal: what is written to its slave end is read back from the master."""
    master, slave = os.openpty()
    stream = os.fdopen(slave, "w")

    def read_all() -> str:  # a pty hands its data over in pieces
        data = b""
        while select.select([master], [], [], 1.0)[0]:
            data += os.read(master, 65536)
        return data.decode()

    yield stream, read_all
    stream.close()
    os.close(master)


def test_lines_written_while_the_bar_is_shown_land_above_it_and_the_bar_is_redrawn(terminal):
    stream, read = terminal
    assert stream.isatty()
    bar = ConsoleBar(stream)
    handler = logging.StreamHandler(sys.stdout)
    logger = logging.getLogger("synapse.test_progress")
    logger.addHandler(handler)
    try:
        bar.show("step 1/10")
        with lines_above(bar):
            assert handler.stream is not sys.__stdout__
            print("a supervisor line")
            sys.stderr.write("a warn")  # a partial line waits for its end
            sys.stderr.write("ing\n")
            logger.warning("a logged line")
            bar.show("step 2/10")
        assert handler.stream is sys.stdout, "the handler's stream is put back"
        bar.close()
    finally:
        logger.removeHandler(handler)
    out = read().replace("\r\n", "\n")  # the terminal's own newline translation
    assert out.count(CLEAR_LINE + "step 1/10") == 4, "drawn, then redrawn after each of three lines"
    assert CLEAR_LINE + "a supervisor line\n" in out and CLEAR_LINE + "a warning\n" in out
    assert CLEAR_LINE + "a logged line\n" in out
    assert out.endswith(CLEAR_LINE + "step 2/10\n"), "the last state stays as a plain line"


def test_single_process_bar_keeps_log_lines_above_it_and_gives_the_streams_back(terminal):
    stream, read = terminal
    handler = logging.StreamHandler(sys.stdout)
    logger = logging.getLogger("synapse.test_progress_single")
    logger.addHandler(handler)
    try:
        progress = Progress(10, 0, log=lambda line: pytest.fail(f"logged {line!r}"), stream=stream)
        progress.update(1, loss=0.5, images_per_s=100.0)
        logger.warning("epoch 0: val top-1 50.0%")
        progress.update(2, loss=0.25, images_per_s=100.0)
        progress.close()
        assert handler.stream is sys.stdout and type(sys.stdout).__name__ != "_LinesAboveBar", "streams given back"
    finally:
        logger.removeHandler(handler)
    out = read().replace("\r\n", "\n")
    assert CLEAR_LINE + "epoch 0: val top-1 50.0%\n" in out, "the log line is printed above the bar"
    assert out.count(CLEAR_LINE + "step 1/10 (10%) | loss 0.5000 | 100 img/s") == 2, "drawn, redrawn after the line"
    assert out.endswith("\n") and "step 2/10 (20%) | loss 0.2500" in out.splitlines()[-1]
    assert "ETA" in out.splitlines()[-1], "two steps give a rate, so the time left"


def _records(run_dir, steps, total, segment=0, start=1):
    metrics, performance = JsonlWriter(run_dir / "metrics.jsonl"), JsonlWriter(run_dir / "performance.jsonl")
    for step in range(start, start + steps):
        metrics.write({"kind": "train", "step": step, "loss": 1.0, "images_per_s": 500.0, "time": 1000.0 + step})
        performance.write({"step": step, "segment": segment, "total_steps": total})
        if step % 10 == 0:
            metrics.write({"kind": "eval", "step": step, "student_top1": 50.0 + step})
    metrics.close()
    performance.close()


def test_supervisor_progress_off_a_terminal_is_a_line_per_quarter_from_the_records(tmp_path):
    lines = []
    placement = Placement((0, 1, 2), (4, 4, 3), (5, 3, 3))
    progress = RunProgress(tmp_path, lines.append, None, segment=lambda: (1, placement))
    for first, count in ((1, 5), (6, 5), (11, 12), (23, 11), (34, 7)):  # what each refresh finds
        _records(tmp_path, count, total=40, start=first)
        progress._poll()
    assert [line.split(" | ")[1] for line in lines] == ["step 10/40 (25%)", "step 22/40 (55%)", "step 33/40 (82%)",
                                                        "step 40/40 (100%)"]
    assert lines[-1] == ("segment 1 on [0, 1, 2]: teacher [4, 4, 3] / student [5, 3, 3] | step 40/40 (100%) | "
                         "loss 1.0000 | 500 img/s | val 90.0% | ETA 0:00")


def test_supervisor_bar_on_a_terminal_redraws_one_line(tmp_path, terminal):
    stream, read = terminal
    bar = ConsoleBar(stream)
    progress = RunProgress(tmp_path, lambda line: pytest.fail(f"logged {line!r}"), bar)
    _records(tmp_path, 20, total=40, segment=2)
    progress._poll()
    bar.close()
    out = read().replace("\r\n", "\n")
    assert out.count("\n") == 1, "one line on the screen"
    assert out.endswith(CLEAR_LINE + "segment 2 | step 20/40 (50%) | loss 1.0000 | 500 img/s | val 70.0% | "
                                     "ETA 0:20\n")


def test_failed_rank_tail_reads_the_agents_layout(tmp_path):
    folder = tmp_path / "abc_x1" / "attempt_0" / "2"
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text("".join(f"line {i}\n" for i in range(30)) + "\n")
    (folder / "stderr.log").write_text("")
    assert rank_log_files(tmp_path, 2) == [folder / "stdout.log", folder / "stderr.log"]
    assert last_lines(folder / "stdout.log", 3) == ["line 27", "line 28", "line 29"]
    tail = failed_rank_tail(tmp_path, 2)
    assert tail.splitlines()[0].startswith("--- last 15 line(s) of rank 2's stdout.log")
    assert tail.splitlines()[-1] == "  line 29" and "stderr.log" not in tail
    assert failed_rank_tail(tmp_path, 1) is None and failed_rank_tail(tmp_path, None) is None


@pytest.mark.parametrize("ranks", ["[3]", "[-1]"])
def test_local_ranks_filter_outside_the_nodes_ranks_is_refused(make_config, ranks):
    cfg = make_config("trainer.devices=3", f"trainer.local_ranks_filter={ranks}")
    with pytest.raises(ConfigError, match=r"trainer.local_ranks_filter.*0\.\.2"):
        validate(cfg)
