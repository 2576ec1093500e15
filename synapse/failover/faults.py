"""Which configured faults a restarted stage still injects, and on which of its ranks.

A fault in ``injection.faults`` names a rank of the run as the user started it; what it
models is a *device* (that rank's device) misbehaving. After a restart the devices may be
renumbered (DEGRADE drops one, REPLACE swaps one), so each fault follows its device to the
rank that now runs it, and disappears with the device. An instant fault (kill, hang, ...)
that already fired stays fired: resuming from a checkpoint taken before its step must not
kill the device a second time. Pure.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from synapse.monitor.fault_spec import INSTANT_KINDS


def fault_id(fault: Mapping[str, Any], position: int) -> int:
    given = fault.get("fault_id")  # unset (None) in the typed config: the fault's place in the list
    return int(position if given is None else given)


def faults_for_stage(faults: Sequence[Mapping[str, Any]], first_devices: Sequence[int],
                     stage_devices: Sequence[int], fired: set[int]) -> list[dict[str, Any]]:
    """The faults of a stage on ``stage_devices``: ranks remapped, each tagged with its ``fault_id``.

    ``faults`` is the user's list (ranks refer to ``first_devices``); ``fired`` holds the ids of
    instant faults that already fired.
    """
    staged = []
    for position, fault in enumerate(faults):
        ident = fault_id(fault, position)
        if fault["kind"] in INSTANT_KINDS and ident in fired:
            continue
        device = first_devices[int(fault["rank"])]
        if device not in stage_devices:
            continue  # the device is gone, and its fault with it
        given = {key: value for key, value in fault.items() if value is not None}  # unset keys stay unset
        staged.append({**given, "rank": list(stage_devices).index(device), "fault_id": ident})
    return staged


def dropped_faults(faults: Sequence[Mapping[str, Any]], first_devices: Sequence[int],
                   stage_devices: Sequence[int], fired: set[int]) -> list[int]:
    """Ids of the faults ``faults_for_stage`` leaves out (fired, or their device dropped)."""
    kept = {f["fault_id"] for f in faults_for_stage(faults, first_devices, stage_devices, fired)}
    return [fault_id(f, i) for i, f in enumerate(faults) if fault_id(f, i) not in kept]
