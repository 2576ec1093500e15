"""Every float setting has a sane range, checked before any work starts (issue #33, item 12).

``kd.T=1e200`` passed validation (it is > 0), then the loss was non-finite at step 1 after the
launch, and the message blamed the learning rate, the data or the teacher. Now each float of the
schema, however deep (detector, estimator, policy parameters, injected faults), has a range in
synapse/config/ranges.py, and a value outside it is refused naming the key, the range and a fix.
"""
from __future__ import annotations

import dataclasses
import typing

import pytest
from test_bad_inputs import assert_names, refused_before_launch

from synapse.config import ConfigError, FaultSettings, SynapseConfig
from synapse.config.ranges import FLOAT_RANGES
from synapse.decision import POLICY_NAMES, policy_settings_type


def _float_keys(settings: type, prefix: str) -> list[str]:
    """The float fields of a settings dataclass, as FLOAT_RANGES spells them ([] for list items)."""
    keys = []
    hints = typing.get_type_hints(settings)
    for f in dataclasses.fields(settings):
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = args[0] if len(args) == 1 else hint  # Optional[X] -> X
        if typing.get_origin(inner) is tuple:
            item = typing.get_args(inner)[0]
            if dataclasses.is_dataclass(item):
                keys += _float_keys(item, f"{prefix}{f.name}[].")
            elif item is float:
                keys.append(f"{prefix}{f.name}[]")
        elif dataclasses.is_dataclass(inner):
            keys += _float_keys(inner, f"{prefix}{f.name}.")
        elif inner is float or float in args:
            keys.append(prefix + f.name)
    return keys


def schema_float_keys() -> set[str]:
    keys = set(_float_keys(SynapseConfig, ""))
    for name in POLICY_NAMES:  # policy.params is typed by the chosen policy
        settings = policy_settings_type(name)
        if settings is not None:
            keys |= set(_float_keys(settings, "policy.params."))
    return keys


def test_every_float_of_the_schema_has_a_range():
    keys = schema_float_keys()
    assert "injection.faults[].factor" in keys and "failover.detector.threshold" in keys  # the walk goes deep
    assert keys <= set(FLOAT_RANGES), f"floats without a sane range: {sorted(keys - set(FLOAT_RANGES))}"
    assert set(FLOAT_RANGES) <= keys, f"ranges of no setting: {sorted(set(FLOAT_RANGES) - keys)}"
    assert dataclasses.fields(FaultSettings)  # (the fault fields are FaultSettings')


def test_a_temperature_of_1e200_is_refused_before_launch(make_config, tiny_run, tmp_path):
    message = refused_before_launch(make_config, tiny_run, tmp_path, "kd.T=1e200", error=ConfigError)
    assert message == "kd.T: 1e+200 is outside its sane range (0, 100]. Fix: set kd.T within (0, 100], e.g. kd.T=4"


def _beyond(key: str) -> tuple[str, str]:
    """An override putting ``key`` just past its range's upper bound, and the key the error names."""
    limit = FLOAT_RANGES[key].high
    value = limit * 10 if limit else 1.0
    if key == "partition.alphas[]":
        return f"partition.alphas=[1.0,{value}]", "partition.alphas[1]"
    if key.startswith("injection.faults[]."):
        field = key.rsplit(".", 1)[1]
        kind = "slow_comm" if field == "bytes_per_s" else "slow_compute"
        return f"injection.faults=[{{kind:{kind},rank:0,start:1,{field}:{value}}}]", f"injection.faults[0].{field}"
    return f"{key}={value}", key


@pytest.mark.parametrize("key", sorted(FLOAT_RANGES))
def test_a_float_beyond_its_range_is_refused_naming_key_and_range(make_config, tiny_run, tmp_path, key):
    override, named = _beyond(key)
    message = refused_before_launch(make_config, tiny_run, tmp_path, override, error=ConfigError)
    assert "Fix:" in message, message
    if message.startswith(f"{named}: ") and "sane range" in message:  # the range table's refusal
        assert_names(message, f"outside its sane range {FLOAT_RANGES[key]}")
    else:  # a component whose own check has a tighter bound (the estimator's min_alpha <= 1) said it first
        assert named.rsplit(".", 1)[-1].split("[")[0] in message, message


@pytest.mark.parametrize("override", ["kd.T=100", "optim.weight_decay=10", "monitor.hang_timeout_s=604800",
                                      "failover.detector.threshold=1000", "optim.lr=1000"])
def test_the_bounds_themselves_are_accepted(make_config, tiny_run, override):
    from synapse.config import validate

    validate(make_config(*tiny_run, override))
