"""Faults and drills the run never reaches, and a cache that cannot be written (issue #33, item 15).

A fault or a drill at a step beyond the run was accepted and never fired: a test or a drill that
silently did nothing. An unwritable ``SYNAPSE_CACHE`` surfaced as a raw ``OSError`` from the
first write there. Each is now refused before any work, naming the key, the run's length and the fix.
"""
from __future__ import annotations

import os
import stat

import pytest
from test_bad_inputs import assert_names, refused_before_launch

from synapse.config import ConfigError, validate
from synapse.data import digits_split_indices

SHORT = "trainer.max_steps=10"


@pytest.mark.parametrize("fault, key", [
    ("{kind:kill,rank:1,step:11}", "injection.faults[0].step"),
    ("{kind:slow_compute,rank:0,start:11,factor:2.0}", "injection.faults[0].start"),
])
def test_a_fault_beyond_the_last_step_is_refused(make_config, tiny_run, tmp_path, fault, key):
    message = refused_before_launch(make_config, tiny_run, tmp_path, SHORT, f"injection.faults=[{fault}]",
                                    error=ConfigError)
    assert_names(message, f"{key}: 11 is beyond the run's last step 10 (trainer.max_steps=10)", "would never fire",
                 "Fix: choose a step in 1..10, or lengthen the run")


def test_the_run_length_is_the_epochs_of_the_data_when_max_steps_is_unset(make_config, tiny_run, tmp_path):
    per_epoch = len(digits_split_indices("train")) // 64
    total = 6 * per_epoch  # trainer=cpu: 6 epochs; data.batch_size=64
    message = refused_before_launch(make_config, tiny_run, tmp_path, "trainer.epochs=6", "data.batch_size=64",
                                    f"injection.faults=[{{kind:kill,rank:1,step:{total + 1}}}]", error=ConfigError)
    assert_names(message, f"beyond the run's last step {total} (trainer.epochs=6 x {per_epoch} steps of "
                          f"data.batch_size=64 over")
    validate(make_config(*tiny_run, "trainer.devices=2", "trainer.epochs=6", "data.batch_size=64",
                         f"injection.faults=[{{kind:kill,rank:1,step:{total}}}]"))  # the last step itself fires


def test_a_drill_at_or_beyond_the_last_step_is_refused(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, SHORT, "failover.drills=[{step:10,action:replan}]",
                                    error=ConfigError)
    assert_names(message, "failover.drills[0].step: 10 is not before the run's last step 10", "nothing is left to run",
                 "Fix: choose a step in 1..9")
    validate(make_config(*tiny_run, SHORT, "trainer.devices=2", "failover.drills=[{step:9,action:replan}]"))


def test_an_unwritable_cache_is_refused_naming_synapse_cache(train_py, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    run_dir = tmp_path / "run"
    result = train_py([f"hydra.run.dir={run_dir}", "trainer=cpu", "injection=none", "trainer.progress=false"],
                      timeout=180, SYNAPSE_CACHE=str(a_file / "cache"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert_names(result.stderr, f"synapse: cache_dir: {a_file / 'cache'} cannot be written (Not a directory",
                 "Fix: point SYNAPSE_CACHE (or cache_dir=...) at a writable directory")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not (run_dir / "logs").exists(), "refused before any worker started"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a mode without the write bit")
def test_a_cache_in_a_read_only_folder_is_refused(make_config, tiny_run, tmp_path):
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(stat.S_IRUSR | stat.S_IXUSR)
    with pytest.raises(ConfigError) as refused:
        validate(make_config(*tiny_run, f"cache_dir={readonly / 'cache'}"))
    assert_names(str(refused.value), "cache_dir:", "Permission denied", "SYNAPSE_CACHE")


def test_a_cache_on_a_read_only_filesystem_is_refused(make_config, tiny_run):
    # /proc refuses new folders to everyone, root included: a read-only place that needs no mount rights
    with pytest.raises(ConfigError) as refused:
        validate(make_config(*tiny_run, "cache_dir=/proc/synapse-cache"))
    assert_names(str(refused.value), "cache_dir: /proc/synapse-cache cannot be written", "SYNAPSE_CACHE")
