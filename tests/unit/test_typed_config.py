"""The typed config: frozen at the root, choices checked by Hydra, one schema per policy, and a
YAML form that types again to the same config."""
from __future__ import annotations

import dataclasses

import pytest
from hydra.errors import ConfigCompositionException

from synapse.config import (
    DataName,
    DrillAction,
    KDMode,
    PipelineSchedule,
    PolicyName,
    SynapseConfig,
    TrackerName,
    config_from_yaml,
    config_yaml,
    typed_config,
    with_settings,
)
from synapse.data import dataset_names
from synapse.decision import POLICY_NAMES, EtaPolicyConfig, SkiRentalConfig
from synapse.kd import KD_MODES
from synapse.trackers import TRACKERS


def test_the_choice_enums_name_exactly_what_their_owners_accept():
    assert [p.value for p in PolicyName] == list(POLICY_NAMES)
    assert sorted(t.value for t in TrackerName) == sorted(TRACKERS)
    assert sorted(d.value for d in DataName) == sorted(dataset_names())
    assert sorted(k.value for k in KDMode) == sorted(KD_MODES)


def test_a_choice_compares_hashes_and_prints_as_its_value():
    schedule = PipelineSchedule.one_f_one_b
    assert schedule == "1f1b" and {"1f1b": 1}[schedule] == 1 and f"{schedule}" == "1f1b"
    assert PipelineSchedule["1f1b"] is schedule and DrillAction["replace"] is DrillAction("replace")
    assert DrillAction("replace").replace("e", "a") == "raplaca"  # still a str (no member hides its methods)


def test_the_typed_config_is_frozen_with_tuples(make_config, tiny_run):
    cfg = typed_config(make_config(*tiny_run, "trainer.spare_devices=[3]", "failover.drills=[{step:3,action:replace}]"))
    assert isinstance(cfg, SynapseConfig) and cfg.trainer.spare_devices == (3,)
    assert cfg.failover.drills[0].action == "replace" and cfg.trainer.local_ranks_filter == (0,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.pipeline.microbatches = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.trainer = cfg.trainer  # type: ignore[misc]


@pytest.mark.parametrize("policy, params", [("eta", EtaPolicyConfig()), ("ski_rental", SkiRentalConfig()),
                                             ("keep", None)])
def test_each_policy_carries_its_own_settings_type(make_config, tiny_run, policy, params):
    cfg = typed_config(make_config(*tiny_run, f"policy={policy}"))
    assert cfg.policy.name == policy
    assert cfg.policy.params == params if params is not None else dataclasses.fields(cfg.policy.params) == ()


def test_another_policy_s_parameter_fails_while_composing(make_config, tiny_run):
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'policy\.params\.sustain'"):
        make_config(*tiny_run, "policy=keep", "policy.params.sustain=4")
    with pytest.raises(ConfigCompositionException, match="Error merging override policy.params.ladder"):
        make_config(*tiny_run, "policy=ski_rental", "policy.params.ladder=7")


def test_a_config_written_as_yaml_types_again_to_the_same_config(make_config, tiny_run):
    cfg = typed_config(make_config(*tiny_run, "policy=ski_rental", "pipeline=gpipe", "injection=demo",
                                   "trainer.devices=3", "failover.detector.window=5"))
    text = config_yaml(cfg)
    assert "schedule: gpipe" in text and "kind: slow_compute" in text  # as users type them
    assert config_from_yaml(text) == cfg
    one_f_one_b = with_settings(cfg, {"pipeline.schedule": "1f1b"})
    assert "schedule: 1f1b" in config_yaml(one_f_one_b)


def test_with_settings_makes_a_new_config_checked_as_hydra_would(make_config, tiny_run):
    cfg = typed_config(make_config(*tiny_run))
    changed = with_settings(cfg, {"trainer.devices": [0, 2], "policy.params.sustain": 5})
    assert changed.trainer.devices == (0, 2) and changed.policy.params.sustain == 5
    assert cfg.trainer.devices == 1 and cfg.policy.params.sustain == 3  # the original is untouched
    with pytest.raises(Exception, match="sustain"):
        with_settings(cfg, {"policy.params.sustain": "often"})
