"""One home for a fault's action: the fault catalogue's ``FAULT_ACTIONS`` names one action (or none)
per health finding kind; the rules' findings carry it, and the remediation planner plans exactly it
(it ranks and limits, it never picks an action by kind)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from builders import node, snapshot

from gpuwarden.analytics.health.catalogue import (EARLY_WARNING_KINDS, FAULT_ACTIONS, NODE_KINDS, NVML_RECOVERY,
                                                  RECOVERY_ACTION_KIND, XID_RULES, action_for, recommended_action)
from gpuwarden.analytics.health.features import GpuSeries
from gpuwarden.analytics.health.finding_builder import FindingBuilder
from gpuwarden.analytics.health.scan_config import HealthConfig
from gpuwarden.fleet import ActionKind, FindingKind, Severity
from gpuwarden.fleet.node_actions import CORDONING_ACTIONS, NODE_ACTIONS
from gpuwarden.remediation import PlanningPolicy, plan_from_findings

NOT_HEALTH = {FindingKind.HOARDED, FindingKind.QUOTA_RECLAIM, FindingKind.QUEUE_ORDER}
HEALTH_KINDS = [kind for kind in FindingKind if kind not in NOT_HEALTH]
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def test_every_health_kind_has_exactly_one_action_in_the_catalogue():
    assert set(FAULT_ACTIONS) == set(HEALTH_KINDS)  # a dict: one row, so one action, per kind
    ruled = ([rule.kind for rule in XID_RULES.values()] + [kind for kind, _ in NVML_RECOVERY.values()]
             + list(EARLY_WARNING_KINDS) + list(NODE_KINDS) + [FindingKind.XID_OTHER, FindingKind.XID_STORM, FindingKind.DOMAIN_EVENT,
                                                       FindingKind.DRA_DEVICES_GONE])  # device_taint_rules
    assert FAULT_ACTIONS[FindingKind.XID_STORM].action is None  # a workload's crash: never a node action
    assert sorted(ruled) == sorted(FAULT_ACTIONS)  # every rule table's kind, once
    for kind, fault in FAULT_ACTIONS.items():
        assert fault.action is None or fault.action in NODE_ACTIONS, kind
        assert fault.recovery in RECOVERY_ACTION_KIND, kind
        assert recommended_action(kind) is fault.action
    # XID and NVML faults act as NVIDIA's recovery wording says; precursors never drain on a warning
    for kind in [rule.kind for rule in XID_RULES.values()] + [kind for kind, _ in NVML_RECOVERY.values()]:
        assert FAULT_ACTIONS[kind].action == action_for(FAULT_ACTIONS[kind].recovery), kind
    for code, rule in XID_RULES.items():
        assert (rule.recovery, rule.action) == (FAULT_ACTIONS[rule.kind].recovery, FAULT_ACTIONS[rule.kind].action)
        if not rule.implicates_gpu:
            assert rule.action is None, code  # application faults never act on the node
    for kind in NODE_KINDS:
        assert FAULT_ACTIONS[kind].action is None
    for kind, severity in EARLY_WARNING_KINDS.items():
        assert severity is Severity.CRITICAL or FAULT_ACTIONS[kind].action != ActionKind.DRAIN, kind
    assert CORDONING_ACTIONS == {ActionKind.CORDON, ActionKind.DRAIN}


def _series(kinds: list[FindingKind]) -> GpuSeries:
    """One sample per kind, each on its own GPU and node (so per-node ranking keeps them apart)."""
    n = len(kinds)
    index = np.arange(n)
    ts = np.full(n, int(T0.timestamp()) * 1_000_000_000, dtype=np.int64)
    cols = {"ts": ts, "gpu": index, "node": index, "model": np.zeros(n, dtype=np.int64),
            "pool": np.zeros(n, dtype=np.int64)}
    return GpuSeries(cols, np.array([f"GPU-{i}" for i in index]), np.array([f"node-{i}" for i in index]),
                     np.array(["NVIDIA H100 80GB HBM3"]), np.array(["train"]), key=index.astype(np.int64),
                     first=index, step_s=60.0)


def test_the_planner_plans_the_catalogues_action_for_every_fault():
    """Through the production path: the rules' finding builder makes one finding per kind, the
    planner plans them; each node gets exactly its fault's catalogue action, or none."""
    series = _series(HEALTH_KINDS)
    builder = FindingBuilder(series, HealthConfig(), int(series["ts"].max()))
    for i, kind in enumerate(HEALTH_KINDS):
        flag = np.zeros(len(HEALTH_KINDS), dtype=bool)
        flag[i] = True
        builder.emit(kind, flag, Severity.CRITICAL, lambda rows: {}, lambda rows: 0.99)
    findings = builder.findings
    assert [f.kind for f in findings] == HEALTH_KINDS
    assert [f.recommended_action for f in findings] == [FAULT_ACTIONS[k].action for k in HEALTH_KINDS]

    cluster = snapshot([node(f"node-{i}") for i in range(len(HEALTH_KINDS))], taken_at=T0)
    plan = plan_from_findings(findings, cluster, PlanningPolicy())
    planned = {p.action.target: p.action.kind for p in plan.actions}
    skipped = {f.node: why for f, why in plan.skipped}
    for i, kind in enumerate(HEALTH_KINDS):
        expected = FAULT_ACTIONS[kind].action
        if expected is None:
            assert f"node-{i}" not in planned and skipped[f"node-{i}"] == "recommends no node action", kind
        else:
            assert planned[f"node-{i}"] == expected, kind


@pytest.mark.parametrize("kind", [k for k in HEALTH_KINDS if FAULT_ACTIONS[k].action in CORDONING_ACTIONS])
def test_a_short_episode_of_a_sustained_rule_only_taints(kind):
    """The one instance-level adjustment: a sustained rule's brief episode taints instead."""
    series = _series([kind])
    builder = FindingBuilder(series, HealthConfig(), int(series["ts"].max()))
    builder.emit(kind, np.ones(1, dtype=bool), Severity.WARNING, lambda rows: {}, lambda rows: 0.9, sustain_s=600.0)
    assert builder.findings[0].recommended_action == ActionKind.TAINT
