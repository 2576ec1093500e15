"""Deciding: every option open to the run (KEEP, REPLAN, DEGRADE, REPLACE; with replicas REBALANCE) priced by its
estimated time to completion, what a restart costs, and the policies that choose. Pure: no torch.
"""
from synapse.decision.eta import (
    EtaModelError,
    LayoutPricer,
    Option,
    OptionKind,
    RunningPartition,
    build_options,
    replica_options,
)
from synapse.decision.policies import (
    POLICY_NAMES,
    Decision,
    DecisionContext,
    DegradePolicy,
    EtaPolicy,
    EtaPolicyConfig,
    KeepPolicy,
    NoViableOptionError,
    Policy,
    PolicyConfigError,
    PolicyError,
    RebalancePolicy,
    ReplanPolicy,
    SkiRentalConfig,
    SkiRentalPolicy,
    make_policy,
    policy_settings_type,
)
from synapse.decision.restart_cost import RESTART_COMPONENTS, RestartCost, RestartCostModel

__all__ = ["Decision", "DecisionContext", "DegradePolicy", "EtaModelError", "EtaPolicy", "EtaPolicyConfig",
           "KeepPolicy", "LayoutPricer", "NoViableOptionError", "Option", "OptionKind", "POLICY_NAMES", "Policy",
           "PolicyConfigError", "PolicyError", "RESTART_COMPONENTS", "RebalancePolicy", "ReplanPolicy", "RestartCost",
           "RestartCostModel", "RunningPartition", "SkiRentalConfig", "SkiRentalPolicy", "build_options",
           "make_policy", "policy_settings_type", "replica_options"]
