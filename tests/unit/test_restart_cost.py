"""Unit tests for synapse.decision.restart_cost: restart costs by component, and the model that learns them."""
from __future__ import annotations

import json
import math

import pytest

from synapse.decision import EtaModelError, OptionKind, RestartCost, RestartCostModel

# --------------------------------------------------------------------------- RestartCost


def test_restart_cost_total_is_sum_of_components():
    cost = RestartCost(checkpoint_save_s=1.5, teardown_s=2.0, launch_s=10.0, checkpoint_load_s=0.5, warmup_s=6.0)
    assert cost.total_s == pytest.approx(20.0)
    assert RestartCost().total_s == 0.0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "3"])
def test_restart_cost_rejects_bad_seconds(bad):
    with pytest.raises(EtaModelError, match="launch_s"):
        RestartCost(launch_s=bad)


def test_restart_cost_from_dict_names_unknown_component():
    with pytest.raises(EtaModelError, match="launch_sec"):
        RestartCost.from_dict({"launch_sec": 3.0})
    assert RestartCost.from_dict({"launch_s": 3.0}).total_s == 3.0


# --------------------------------------------------------------------------- RestartCostModel

DEFAULT = RestartCost(checkpoint_save_s=4.0, teardown_s=2.0, launch_s=20.0, checkpoint_load_s=4.0, warmup_s=10.0)


def test_model_without_observations_returns_default():
    model = RestartCostModel(DEFAULT)
    assert model.estimate() == DEFAULT
    assert model.seconds_for(OptionKind.REPLAN) == pytest.approx(40.0)
    assert model.seconds_for("keep") == 0.0
    assert model.observations() == 0


def test_model_pseudo_count_mean_moves_towards_observations():
    model = RestartCostModel(DEFAULT, prior_weight=1.0)
    model.observe("restart", {"launch_s": 40.0})
    assert model.estimate().launch_s == pytest.approx(30.0)  # (1*20 + 40) / 2
    model.observe("restart", {"launch_s": 40.0})
    model.observe("restart", {"launch_s": 40.0})
    assert model.estimate().launch_s == pytest.approx(35.0)  # (20 + 120) / 4
    assert model.estimate().warmup_s == DEFAULT.warmup_s  # never observed: default kept
    assert model.observations() == 3


def test_model_zero_prior_weight_trusts_observations():
    model = RestartCostModel(DEFAULT, prior_weight=0.0)
    model.observe("restart", RestartCost(launch_s=8.0, warmup_s=2.0))
    assert model.estimate() == RestartCost(launch_s=8.0, warmup_s=2.0)


def test_model_paths_are_learned_separately_and_mapped_to_kinds():
    live = RestartCost(warmup_s=3.0)
    model = RestartCostModel({"restart": DEFAULT, "live": live}, kind_paths={"replan": "live"})
    model.observe("live", {"warmup_s": 5.0})
    assert model.seconds_for(OptionKind.REPLAN) == pytest.approx(4.0)
    assert model.seconds_for(OptionKind.DEGRADE) == pytest.approx(DEFAULT.total_s)
    costs = model.costs_by_kind()
    assert set(costs) == set(OptionKind)
    assert costs[OptionKind.KEEP] == 0.0 and costs[OptionKind.REPLACE] == pytest.approx(DEFAULT.total_s)


def test_model_rejects_unknown_path_and_keep_path():
    model = RestartCostModel(DEFAULT)
    with pytest.raises(EtaModelError, match="'live'.*known paths"):
        model.observe("live", {"launch_s": 1.0})
    with pytest.raises(EtaModelError, match="KEEP"):
        RestartCostModel(DEFAULT, kind_paths={"keep": "restart"})
    with pytest.raises(EtaModelError, match="unknown option kind 'rebuild'"):
        RestartCostModel(DEFAULT, kind_paths={"rebuild": "restart"})
    with pytest.raises(EtaModelError, match="unknown restart path 'nope'"):
        RestartCostModel(DEFAULT, kind_paths={"degrade": "nope"})


def test_model_state_dict_round_trips_through_json():
    model = RestartCostModel({"restart": DEFAULT, "live": RestartCost(warmup_s=3.0)}, prior_weight=2.0)
    model.observe("restart", {"launch_s": 50.0, "teardown_s": 1.0})
    model.observe("live", {"warmup_s": 1.0})
    restored = RestartCostModel(RestartCost())
    restored.load_state_dict(json.loads(json.dumps(model.state_dict())))
    assert restored.state_dict() == model.state_dict()
    for path in ("restart", "live"):
        assert restored.estimate(path) == model.estimate(path)
    assert restored.prior_weight == 2.0


def test_model_load_state_dict_names_missing_key():
    state = RestartCostModel(DEFAULT).state_dict()
    del state["observed_count"]
    model = RestartCostModel(DEFAULT)
    with pytest.raises(EtaModelError, match="observed_count"):
        model.load_state_dict(state)


def test_model_from_benchmark_paths_and_flat_forms():
    bench = {"device": "h200", "prior_weight": 3.0, "paths": {"restart": DEFAULT.to_dict(), "live": {"warmup_s": 2}}}
    model = RestartCostModel.from_benchmark(bench)
    assert model.paths == ("restart", "live") and model.prior_weight == 3.0
    assert model.estimate("live").total_s == 2.0
    flat = RestartCostModel.from_benchmark({"launch_s": 7.0, "warmup_s": 1.0})
    assert flat.seconds_for("degrade") == pytest.approx(8.0)
    with pytest.raises(EtaModelError, match="launch"):
        RestartCostModel.from_benchmark({"launch": 7.0})
