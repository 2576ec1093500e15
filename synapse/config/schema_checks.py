"""Checks of the whole config tree: no key outside the schema, no NaN or inf anywhere.

Apart from the per-group checks of `synapse.config.validation` because they walk every node of
the tree, free-form dicts included, before any group's range checks run (NaN passes them all).
"""
from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig, OmegaConf

from synapse.config.errors import fail, finite


def _unknown_keys(node: DictConfig, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Keys outside the schema, each with its closest valid spelling.

    Hydra rejects ``trainer.epoch=3`` but then suggests ``+trainer.epoch=3``, which it accepts
    silently even on a typed node: a misspelt setting would be ignored without a word.
    """
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return []  # free-form dicts (policy.params) take any key
    allowed = sorted(f.name for f in dataclasses.fields(schema))
    unknown: list[tuple[str, list[str]]] = []
    for key in node.keys():
        if key not in allowed:
            unknown.append((f"{prefix}{key}", difflib.get_close_matches(str(key), allowed, n=1)))
        elif dataclasses.is_dataclass(OmegaConf.get_type(node, key)):
            unknown += _unknown_keys(node[key], f"{prefix}{key}.")
    return unknown


def validate_finite(node, prefix: str = "") -> None:
    """Every float of the config, however deep (lists, free-form dicts such as policy.params and
    failover.detector): finite. Before any range check, since NaN passes them all."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        path = f"{prefix}[{key}]" if isinstance(node, list) else f"{prefix}{'.' if prefix else ''}{key}"
        if isinstance(value, (dict, list)):
            validate_finite(value, path)
        else:
            finite(path, value)


def validate_known_keys(cfg: DictConfig) -> None:
    for key, close in _unknown_keys(cfg):
        parent = key.rpartition(".")[0]
        suggestion = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
        fail(key, "is not a Synapse setting (added with a '+' override?)",
              f"remove the override{suggestion or '.'} Valid keys are the fields in synapse/config/schema.py")
