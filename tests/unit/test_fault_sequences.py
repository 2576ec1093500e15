"""The random fault sequences of the real-run property test (tests/dist/test_random_faults_real.py)
are valid injection configs, cover every fault kind and phase, and spare one device."""
from __future__ import annotations

import pytest
from hypothesis import given, settings

from synapse.injection import PHASES, parse_faults
from tests.dist.fault_sequences import KINDS, STEPS, hydra_list, injection_faults, sequences


@pytest.mark.slow  # 300 drawn sequences
@settings(max_examples=300, deadline=None, derandomize=True)
@given(sequence=sequences())
def test_every_drawn_sequence_is_a_valid_injection_config_that_spares_a_device(sequence):
    specs = parse_faults(injection_faults(sequence), world_size=3)
    assert 1 <= len(specs) <= 3
    assert sequence.spared not in {f.rank for f in specs}
    assert all(1 <= f.start <= STEPS for f in specs)


@pytest.mark.slow  # draws until every kind and phase was seen
def test_the_strategy_reaches_every_kind_and_phase_and_the_first_step():
    seen_kinds, seen_phases, starts = set(), set(), set()

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(sequence=sequences())
    def collect(sequence):
        for fault in sequence.faults:
            seen_kinds.add(fault.kind)
            starts.add(fault.start)
            if fault.hard:
                seen_phases.add(fault.phase)

    collect()
    assert seen_kinds == set(KINDS) and seen_phases == set(PHASES) and 0 in starts


def test_the_injection_config_reads_as_a_hydra_override():
    assert hydra_list([{"kind": "kill", "rank": 1, "step": 3, "phase": "forward"},
                       {"kind": "slow_compute", "rank": 2, "start": 2, "factor": 1.5}]) == \
        "[{kind:kill,rank:1,step:3,phase:forward},{kind:slow_compute,rank:2,start:2,factor:1.5}]"
