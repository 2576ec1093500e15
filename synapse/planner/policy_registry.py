"""Every policy by name, with its settings type: what ``policy=<name>`` in the config makes.

``make_policy`` validates the parameters against the policy's settings dataclass
before building it, and ``POLICY_SETTINGS`` lets the config schema type them all.
Kept apart from the policies so each policy module imports only the shape it extends.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from synapse.planner.decision import PolicyConfigError
from synapse.planner.eta_policy import EtaPolicy, EtaPolicyConfig
from synapse.planner.policy import DegradePolicy, KeepPolicy, Policy, ReplanPolicy, SkiRentalConfig, SkiRentalPolicy

_POLICIES: dict[str, tuple[type[Policy], type | None]] = {
    EtaPolicy.name: (EtaPolicy, EtaPolicyConfig),
    KeepPolicy.name: (KeepPolicy, None),
    ReplanPolicy.name: (ReplanPolicy, None),
    DegradePolicy.name: (DegradePolicy, None),
    SkiRentalPolicy.name: (SkiRentalPolicy, SkiRentalConfig),
}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)


# The settings dataclasses of the policies that take parameters (the config schema types them all).
POLICY_SETTINGS = tuple(config for _, config in _POLICIES.values() if config is not None)


def make_policy(name: str, **params: Any) -> Policy:
    """The policy called ``name``, configured with ``params`` (validated; a None is the policy's default)."""
    params = {key: value for key, value in params.items() if value is not None}
    if name not in _POLICIES:
        raise PolicyConfigError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    policy_cls, config_cls = _POLICIES[name]
    if config_cls is None:
        if params:
            raise PolicyConfigError(f"policy {name!r} takes no parameters, got {sorted(params)}")
        return policy_cls()
    valid = [f.name for f in fields(config_cls)]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise PolicyConfigError(f"policy {name!r} has no parameter(s) {unknown}; valid parameters: {valid}")
    return policy_cls(config_cls(**params))
