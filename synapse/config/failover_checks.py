"""Checks of the fault-tolerance groups: injection, the health monitor, failover (detector,
estimator, policy, drills, restart costs) and spare devices.

Apart from `synapse.config.validation` because these settings are checked by the components
that own them (fault specs, `HealthSettings`, `DetectorConfig`, `EstimatorConfig`, the
policies), which this module builds once from the config and turns their errors into
``ConfigError`` naming the key and a fix.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from synapse.config.devices import check_gpu_ids, num_stages, resolve_accelerator, resolve_devices
from synapse.config.errors import choice, fail, positive


def validate_injection(cfg: DictConfig) -> None:
    from synapse.monitor.injection import InjectionError, parse_faults

    try:
        parse_faults(OmegaConf.to_container(cfg.injection.faults, resolve=True), num_stages(cfg.trainer))
    except (InjectionError, KeyError, TypeError, ValueError) as exc:
        hint = ""
        if cfg.injection.name == "demo":  # the default: a user who changed the devices did not ask for it
            hint = " (the default demo slows rank 2 of 3: add injection=none for a run on fewer devices)"
        fail("injection.faults", str(exc), "see conf/injection/ for examples" + hint)


def validate_monitor(cfg: DictConfig) -> None:
    from synapse.monitor.health import HealthConfigError, HealthSettings

    try:
        HealthSettings.from_config(cfg.monitor)
    except HealthConfigError as exc:
        fail("monitor", str(exc), "see MonitorConfig in synapse/config/schema.py")


REPLAN_MODES = ("live", "restart")


def validate_failover(cfg: DictConfig) -> None:
    from synapse.monitor.detector import DetectorConfig, DetectorConfigError
    from synapse.planner.estimator import EstimatorConfig, EstimatorConfigError
    from synapse.planner.decision import PolicyConfigError
    from synapse.planner.policy_registry import make_policy

    failover = cfg.failover
    positive("failover.max_restarts", failover.max_restarts, allow_zero=True)
    positive("failover.decide_every", failover.decide_every)
    positive("failover.node_timeout_s", failover.node_timeout_s)
    if cfg.trainer.nodes > 1 and list(cfg.trainer.spare_devices):
        fail("trainer.spare_devices", f"spares are not supported across nodes yet (trainer.nodes={cfg.trainer.nodes})",
             "leave trainer.spare_devices empty: a failed device's node-mates take over its blocks (DEGRADE)")
    choice("failover.replan_mode", failover.replan_mode, REPLAN_MODES)
    for key, settings, error in (("failover.detector", DetectorConfig, DetectorConfigError),
                                 ("failover.estimator", EstimatorConfig, EstimatorConfigError)):
        try:
            settings(**OmegaConf.to_container(failover[key.split(".")[1]], resolve=True))
        except TypeError as exc:
            valid = ", ".join(f.name for f in dataclasses.fields(settings))
            fail(key, str(exc), f"use only these keys: {valid}")
        except error as exc:
            fail(key, str(exc), f"see {settings.__name__} for the ranges")
    try:
        make_policy(cfg.policy.name, **OmegaConf.to_container(cfg.policy.params, resolve=True))
    except PolicyConfigError as exc:
        fail("policy", str(exc), "choose policy=eta|keep|replan|degrade|ski_rental with its documented params")
    for i, drill in enumerate(failover.drills):
        if not isinstance(drill, DictConfig) or set(drill) - {"step", "action", "device"} or "step" not in drill \
                or drill.get("action") not in ("replan", "degrade", "replace") or int(drill.step) < 1:
            fail(f"failover.drills[{i}]", f"{drill!r} is not a drill",
                  "write {step: N (>= 1), action: replan|degrade|replace, device: D (optional)}")
    if failover.restart_cost_file is not None and not Path(failover.restart_cost_file).is_file():
        fail("failover.restart_cost_file", f"{failover.restart_cost_file!r} is not a file",
              "give the JSON written by experiments/bench_restart_cost.py, or null for the repository's default")
    spares = [int(d) for d in cfg.trainer.spare_devices]
    if spares and min(spares) < 0:
        fail("trainer.spare_devices", f"negative device id in {spares}", "device ids start at 0")
    if spares and resolve_accelerator(cfg.trainer) == "cpu" and max(spares) >= 64:
        fail("trainer.spare_devices", f"CPU slot ids {[d for d in spares if d >= 64]} are out of range (slots are "
              f"0..63)", "number CPU slots from 0")
    clash = sorted(set(spares) & set(resolve_devices(cfg.trainer)))
    if clash or len(set(spares)) != len(spares):
        fail("trainer.spare_devices", f"spares {spares} repeat a device or overlap the running devices "
              f"{resolve_devices(cfg.trainer)}", "list idle devices only, each once")
    if resolve_accelerator(cfg.trainer) == "cuda" and spares:
        check_gpu_ids(spares)
