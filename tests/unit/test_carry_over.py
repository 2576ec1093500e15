"""How detector baselines follow the devices over a re-partition (synapse.detection.rebase)."""
from __future__ import annotations

import pytest

from synapse.detection import carry_over


def test_each_rank_maps_to_its_devices_old_rank_with_the_predicted_change_as_scale():
    carried = carry_over([0, 1, 2], [1.0, 2.0, 4.0], [0, 1, 2], [1.5, 1.0, 4.0])
    assert carried.previous_rank == [0, 1, 2]
    assert carried.compute_scale == pytest.approx([1.5, 0.5, 1.0])


def test_a_dropped_device_leaves_its_rank_and_a_spare_takes_over_the_place_of_the_device_it_replaces():
    degraded = carry_over([0, 1, 2], [1.0, 1.0, 1.0], [0, 2], [1.5, 1.5])
    assert degraded.previous_rank == [0, 2] and degraded.compute_scale == pytest.approx([1.5, 1.5])
    replaced = carry_over([0, 1, 2], [1.0, 2.0, 1.0], [0, 3, 2], [1.0, 1.0, 1.0])
    assert replaced.previous_rank == [0, 1, 2] and replaced.compute_scale == pytest.approx([1.0, 0.5, 1.0])


@pytest.mark.parametrize("slow, relearn", [((), [0, 1, 2]), ((2,), [0, 1]), ((0, 1), [2])])
def test_every_device_relearns_its_baseline_but_one_found_slow(slow, relearn):
    assert carry_over([0, 1, 2], [1.0] * 3, [0, 1, 2], [1.4, 1.5, 0.1], slow_old_ranks=slow).relearn == relearn


def test_slow_ranks_are_old_ranks_followed_through_a_dropped_device():
    # old rank 2 (device 2) was slow; device 1 is dropped, so device 2 is new rank 1 and keeps its baseline
    assert carry_over([0, 1, 2], [1.0] * 3, [0, 2], [1.5, 1.5], slow_old_ranks={2}).relearn == [0]


def test_a_spare_relearns_its_baseline_even_in_the_place_of_a_slow_device():
    """The spare replaced a slow device: the slowdown was the old device's, not the spare's."""
    replaced = carry_over([0, 1, 2], [1.0] * 3, [0, 3, 2], [1.0] * 3, slow_old_ranks={1})
    assert replaced.fresh == [1] and replaced.relearn == [0, 1, 2]
    assert carry_over([0], [1.0], [1], [1.0], slow_old_ranks={0}).fresh == [0]
    assert carry_over([0, 1, 2], [1.0] * 3, [0, 2], [1.5, 1.5], slow_old_ranks={2}).fresh == []
