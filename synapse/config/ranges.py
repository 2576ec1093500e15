"""The sane range of every float setting, in one table, checked before any work starts.

A finite float can still be absurd: ``kd.T=1e200`` passed every check (``> 0``) and made the
loss non-finite at step 1, after the launch, with a message that blamed the learning rate, the
data or the teacher. Each float of the schema (the detector's, the estimator's, each policy's
parameters and each injected fault's included) has its range here; a test walks the schema and
fails on a float without one, so a new float setting cannot be added unbounded.

The components keep their own checks (a ``DetectorConfig`` is built and checked outside a run
too); these ranges are the run's outer bounds, with the reason for each bound beside it. A lower
bound a component already checks is repeated so that the range reads whole in the message.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from synapse.config.errors import fail

DAY_S = 86400.0
WEEK_S = 7 * DAY_S


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    low_open: bool = False  # (low, ...: low itself is refused
    high_open: bool = False  # ..., high): high itself is refused
    example: str = ""  # a value a user would write

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


# key -> range. ``[]`` stands for every item of a list (partition.alphas[], injection.faults[].seconds).
FLOAT_RANGES: dict[str, Range] = {
    "teacher.auto_train_lr": Range(0, 10, low_open=True, example="2e-3"),
    "student.drop_rate": Range(0, 1, high_open=True, example="0.1"),
    "data.gpu_decode_share": Range(0, 1, example="0.5"),
    # softmax(z / T) is uniform to float precision long before T = 100, and the loss is scaled by T^2:
    # 1e200 overflows it to inf at the first step
    "kd.T": Range(0, 100, low_open=True, example="4"),
    "kd.lambda_kd": Range(0, 1, example="0.9"),
    "optim.lr": Range(0, 1e3, low_open=True, example="2e-3"),  # 1e300 cannot even be cast to float32
    "optim.momentum": Range(0, 1, high_open=True, example="0.9"),
    "optim.weight_decay": Range(0, 10, example="5e-4"),  # each step scales weights by 1 - lr * wd
    "optim.gamma": Range(0, 1, low_open=True, example="0.1"),
    # timeouts: beyond a week a hang is never found; torch's timedelta overflows long before 1e200
    "trainer.collective_timeout_s": Range(0, WEEK_S, low_open=True, example="120"),
    "partition.alphas[]": Range(0, 1e3, low_open=True, example="1.0"),  # a device 1000x slower is gone
    "partition.link_bandwidth_gbps": Range(0, 1e5, low_open=True, example="25"),  # GB/s; NVLink is ~900
    "partition.node_link_bandwidth_gbps": Range(0, 1e5, low_open=True, example="12.5"),
    "monitor.period_s": Range(0, 3600, low_open=True, example="5"),
    "monitor.hang_timeout_s": Range(0, WEEK_S, low_open=True, example="300"),
    "monitor.probe_every_s": Range(0, DAY_S, low_open=True, example="60"),
    "monitor.probe_timeout_s": Range(0, DAY_S, low_open=True, example="30"),
    # detector ratios: a step 1000x its baseline is a failure, not a slowdown to weigh
    "failover.detector.compute_noise_z": Range(0, 1e3, example="5"),
    "failover.detector.prior_threshold": Range(1, 1e3, low_open=True, example="4"),
    "failover.detector.alone_threshold": Range(1, 1e3, low_open=True, example="1.5"),
    "failover.detector.replica_threshold": Range(1, 1e3, low_open=True, example="2"),
    "failover.detector.probe_threshold": Range(1, 1e3, low_open=True, example="1.3"),
    "failover.detector.threshold": Range(1, 1e3, low_open=True, example="1.25"),
    "failover.detector.peer_threshold": Range(1, 1e3, example="1.15"),
    "failover.detector.peer_wander_z": Range(0, 1e3, example="5"),
    "failover.detector.min_comm_s": Range(0, 3600, example="0.005"),
    "failover.detector.wait_explain_factor": Range(0, 1e3, example="2"),
    "failover.estimator.ema_weight": Range(0, 1, low_open=True, example="0.2"),
    "failover.estimator.min_alpha": Range(0, 1, low_open=True, example="0.25"),
    "failover.estimator.max_alpha": Range(1, 1e6, example="20"),
    "failover.estimator.min_beta": Range(0, 1, low_open=True, example="0.25"),
    "failover.estimator.max_beta": Range(1, 1e6, example="1000"),
    "failover.estimator.min_predicted_s": Range(0, 3600, low_open=True, example="1e-6"),
    "failover.estimator.min_predicted_share": Range(0, 1, high_open=True, example="0.1"),
    "failover.node_timeout_s": Range(0, DAY_S, low_open=True, example="10"),
    "failover.decider_grace_s": Range(0, DAY_S, low_open=True, example="120"),
    "failover.replica_heartbeat_timeout_s": Range(0, 3600, low_open=True, example="1.0"),
    "policy.params.min_saving_s": Range(0, 1e7, example="0"),  # 1e7 s is 116 days
    "policy.params.min_saving_frac": Range(0, 1, high_open=True, example="0.1"),
    "policy.params.min_saving_restart_frac": Range(0, 10, example="0.5"),
    "policy.params.min_estimated_factor": Range(1, 10, example="1.1"),
    "injection.faults[].seconds": Range(0, DAY_S, example="0.05"),
    "injection.faults[].factor": Range(0, 1e4, low_open=True, example="2.0"),
    "injection.faults[].bytes_per_s": Range(0, 1e13, low_open=True, example="2.0e6"),
    # mode=simulate: hours between events per device (1e7 h: over a thousand years), a fail-slow's length
    # and factor, the time from a death to the decision, a simulated GPU's memory
    "simulate.fail_slow_mtbf_h": Range(0, 1e7, low_open=True, example="27400"),
    "simulate.comm_fail_slow_mtbf_h": Range(0, 1e7, low_open=True, example="27400"),
    "simulate.fail_stop_mtbf_h": Range(0, 1e7, low_open=True, example="8090"),
    "simulate.node_loss_mtbf_h": Range(0, 1e7, low_open=True, example="60000"),
    "simulate.fail_slow_duration_s": Range(0, WEEK_S, low_open=True, example="600"),
    "simulate.comm_fail_slow_duration_s": Range(0, WEEK_S, low_open=True, example="1440"),
    "simulate.fail_slow_factor": Range(1, 1e4, low_open=True, example="2.0"),
    "simulate.comm_fail_slow_factor": Range(1, 1e4, low_open=True, example="2.0"),
    "simulate.failure_detect_s": Range(0, DAY_S, example="5"),
    "simulate.gpu_memory_gb": Range(0, 1e5, low_open=True, example="141"),
}


def _values(node: Any, parts: list[str], prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted key as the user writes it, value) of every value ``parts`` reaches in plain ``node``."""
    if not parts:
        yield prefix, node
        return
    head, rest = parts[0], parts[1:]
    is_list = head.endswith("[]")
    name = head[:-2] if is_list else head
    if not isinstance(node, dict) or node.get(name) is None:
        return  # unset (an optional setting), or another policy's parameters
    value = node[name]
    key = f"{prefix}.{name}" if prefix else name
    if is_list:
        for i, item in enumerate(value if isinstance(value, list) else []):
            yield from _values(item, rest, f"{key}[{i}]")
    else:
        yield from _values(value, rest, key)


def check_float_ranges(plain: dict[str, Any]) -> None:
    """Every float setting of a composed config (as plain containers) inside its range; ConfigError otherwise."""
    for pattern, allowed in FLOAT_RANGES.items():
        for key, value in _values(plain, pattern.split("."), ""):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # a wrong type is the component's to name
            if math.isfinite(value) and value not in allowed:
                example = allowed.example if "[" in key else f"{key}={allowed.example}"
                fail(key, f"{value:g} is outside its sane range {allowed}",
                     f"set {key} within {allowed}, e.g. {example}")
