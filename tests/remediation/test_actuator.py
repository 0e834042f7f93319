"""The actuator on the simulated cluster (the real ``SimCluster``): planning from findings, the three
modes, safety limits, the audit log, and a plan interrupted by an error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from builders import InterceptedCluster, node, snapshot
from polling import tick, wait_for

from gpuwarden.remediation import (
    Actuator,
    AuditLog,
    Mode,
    Outcome,
    PlanningPolicy,
    Reconciler,
    SafetyLimits,
    plan_from_findings,
)
from gpuwarden.fleet import Action, ActionKind, ActionResult, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.sim import SimConfig
from gpuwarden.fleet.runner import Runner
from gpuwarden.sim.cluster import SimCluster

T0 = datetime(2026, 11, 23, tzinfo=UTC)


@pytest.fixture
def cluster(data_dir):
    simulation = simulated_fleet(SimConfig(nodes=8, warmup_days=0.05, fault_rate_scale=0.0, data_dir=data_dir))
    return SimCluster(simulation)


def finding(node: str, kind=FindingKind.OFF_THE_BUS, action=ActionKind.CORDON, severity=Severity.CRITICAL, confidence=0.99):
    return Finding(kind, severity, node, f"GPU-{node}", {"xid": 79}, action, confidence, T0, T0)


def node_names(cluster):
    return [n.name for n in cluster.snapshot().nodes]


def test_plan_takes_the_strongest_action_per_node_and_says_why_others_are_skipped():
    a, b, c, d = "node-a", "node-b", "node-c", "node-d"
    cluster = snapshot([node(name) for name in (a, b, c, d)])
    findings = [
        finding(a, action=ActionKind.TAINT),
        finding(a, kind=FindingKind.ECC_DBE, action=ActionKind.DRAIN),
        finding(b, severity=Severity.INFO),
        finding(c, confidence=0.3),
        finding("no-such-node"),
        finding(d, action=None),
    ]
    plan = plan_from_findings(findings, cluster, PlanningPolicy())
    assert [(p.action.kind, p.action.target) for p in plan.actions] == [(ActionKind.DRAIN, a)]
    assert len(plan.actions[0].findings) == 2
    reasons = {f.node: why for f, why in plan.skipped}
    assert "below warning" in reasons[b] and "confidence 0.30" in reasons[c]
    assert "not in the cluster" in reasons["no-such-node"] and "no node action" in reasons[d]


def test_protected_and_already_cordoned_nodes_are_left_alone(cluster):
    a, b = node_names(cluster)[:2]
    cluster.apply(Action(ActionKind.CORDON, b, "test"))
    plan = plan_from_findings([finding(a), finding(b)], cluster.snapshot(), PlanningPolicy(protected_nodes=frozenset({a})))
    assert plan.actions == ()
    assert {why for _, why in plan.skipped} == {f"node {a!r} is protected", f"{b} is already cordoned"}


def test_observe_mode_records_and_changes_nothing(cluster, tmp_path):
    a = node_names(cluster)[0]
    audit = AuditLog(tmp_path / "audit.jsonl")
    actuator = Actuator(cluster, Mode.OBSERVE, SafetyLimits(max_cordoned_node_ratio=1.0), audit=audit)
    entries = actuator.execute(plan_from_findings([finding(a)], cluster.snapshot()))
    assert [e.outcome for e in entries] == [Outcome.PLANNED]
    assert a not in cluster.snapshot().cordoned
    logged = AuditLog.read(tmp_path / "audit.jsonl")
    assert logged[0]["outcome"] == "planned" and logged[0]["target"] == a and logged[0]["kind"] == "cordon"
    # A plan that stands round after round is recorded once; a new action, and one that comes back, again.
    b = node_names(cluster)[1]
    assert actuator.execute(plan_from_findings([finding(a)], cluster.snapshot())) == []
    assert [e.target for e in actuator.execute(plan_from_findings([finding(a), finding(b)], cluster.snapshot()))] == [b]
    assert actuator.execute(plan_from_findings([finding(b)], cluster.snapshot())) == []
    assert [e.target for e in actuator.execute(plan_from_findings([finding(a), finding(b)], cluster.snapshot()))] == [a]


def test_auto_mode_applies_within_the_hourly_limit(cluster):
    names = node_names(cluster)
    clock = FakeClock(T0)
    actuator = Actuator(cluster, Mode.AUTO, SafetyLimits(max_actions_per_hour=2, max_cordoned_node_ratio=1.0),
                        clock=clock)
    entries = actuator.execute(plan_from_findings([finding(n) for n in names[:3]], cluster.snapshot()))
    assert [e.outcome for e in entries] == [Outcome.APPLIED, Outcome.APPLIED, Outcome.BLOCKED, Outcome.BREAKER_OPEN]
    assert "limit 2" in entries[2].message
    assert entries[3].outcome == Outcome.BREAKER_OPEN and actuator.breaker_open
    assert cluster.snapshot().cordoned == frozenset(names[:2])
    clock.advance(timedelta(hours=1, seconds=1))  # the window moves on, but the breaker waits for a person
    held = actuator.execute(plan_from_findings([finding(names[2])], cluster.snapshot()))
    assert held == []  # blocked and recorded once already in this breaker episode
    new = actuator.execute(plan_from_findings([finding(names[3])], cluster.snapshot()))
    assert [e.outcome for e in new] == [Outcome.BLOCKED] and "circuit breaker open" in new[0].message
    actuator.reset_breaker(by="ops")
    again = actuator.execute(plan_from_findings([finding(names[2])], cluster.snapshot()))
    assert [e.outcome for e in again] == [Outcome.APPLIED] and names[2] in cluster.snapshot().cordoned


def test_auto_mode_never_cordons_more_than_the_allowed_share(cluster):
    names = node_names(cluster)  # 8 nodes; 25% allows 2
    actuator = Actuator(cluster, Mode.AUTO, SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=0.25))
    entries = actuator.execute(plan_from_findings([finding(n) for n in names[:4]], cluster.snapshot()))
    outcomes = [e.outcome for e in entries]
    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED, Outcome.BLOCKED, Outcome.BREAKER_OPEN, Outcome.BLOCKED]
    assert "3 of 8 nodes cordoned" in entries[2].message and "circuit breaker open" in entries[4].message
    assert len(cluster.snapshot().cordoned) == 2


def test_approve_mode_waits_for_an_operator(cluster):
    a, b = node_names(cluster)[:2]
    actuator = Actuator(cluster, Mode.APPROVE, SafetyLimits(max_cordoned_node_ratio=1.0))
    plan = plan_from_findings([finding(a), finding(b)], cluster.snapshot())
    entries = actuator.execute(plan)
    assert [e.outcome for e in entries] == [Outcome.AWAITING_APPROVAL] * 2
    assert actuator.execute(plan) == []  # the same actions are not queued twice
    assert cluster.snapshot().cordoned == frozenset()
    first, second = (e.approval_id for e in entries)
    assert actuator.approve(first).outcome == Outcome.APPLIED
    assert actuator.reject(second).outcome == Outcome.REJECTED
    assert cluster.snapshot().cordoned == frozenset({a})
    with pytest.raises(ValueError, match="already rejected by operator"):
        actuator.approve(second)
    with pytest.raises(ValueError, match="no action awaits approval"):
        actuator.approve("nope")


def test_a_refused_action_is_recorded_and_the_plan_goes_on(cluster):
    a, b = node_names(cluster)[:2]

    def refuse_a(action: Action) -> ActionResult | None:
        return ActionResult(action, False, "node is being upgraded") if action.target == a else None

    actuator = Actuator(InterceptedCluster(cluster, refuse_a), Mode.AUTO, SafetyLimits(max_cordoned_node_ratio=1.0))
    entries = actuator.execute(plan_from_findings([finding(a), finding(b)], cluster.snapshot()))
    assert [(e.outcome, e.target) for e in entries] == [(Outcome.REFUSED, a), (Outcome.APPLIED, b)]
    assert entries[0].message == "node is being upgraded"


def test_an_error_mid_plan_records_what_was_and_was_not_done(cluster, tmp_path):
    a, b, c = node_names(cluster)[:3]

    def fail_on_b(action: Action) -> None:
        if action.target == b:
            raise ConnectionError("API server went away")

    audit = AuditLog(tmp_path / "audit.jsonl")
    actuator = Actuator(InterceptedCluster(cluster, fail_on_b), Mode.AUTO, SafetyLimits(max_cordoned_node_ratio=1.0), audit=audit)
    actuator.execute(plan_from_findings([finding(a), finding(b), finding(c)], cluster.snapshot()))
    logged = [(e["outcome"], e["target"]) for e in AuditLog.read(tmp_path / "audit.jsonl")]
    assert logged == [("applied", a), ("error", b), ("not-applied", c)]
    assert cluster.snapshot().cordoned == frozenset({a})


def test_reconciler_runs_rounds_on_a_schedule_in_observe_mode(cluster):
    a = node_names(cluster)[0]
    seen = []

    def find(snapshot):
        seen.append(snapshot.taken_at)
        return [finding(a)]

    clock = FakeClock()
    reconciler = Reconciler(Actuator(cluster, Mode.OBSERVE, SafetyLimits(max_cordoned_node_ratio=1.0), clock=clock),
                            find, interval_seconds=60)
    runner = Runner(clock)
    reconciler.register(runner, at_once=False)
    runner.start()
    try:
        for rounds in (1, 2):  # each minute on the fake clock is one round
            tick(clock, 60)
            wait_for(lambda: len(reconciler.rounds) == rounds, what=f"reconcile round {rounds}")  # noqa: B023
    finally:
        runner.stop()
    assert len(reconciler.rounds) == 2
    assert [e.outcome for e in reconciler.rounds[0].entries] == [Outcome.PLANNED]
    assert all(r.entries == () and len(r.plan.actions) == 1 for r in reconciler.rounds[1:])  # recorded once
    assert a not in cluster.snapshot().cordoned
    # the round's end, on the actuator's clock, for GpuwardenActuatorRoundsStopped
    assert reconciler.actuator.metrics.registry.get_sample_value("gpuwarden_actuator_last_round_timestamp_seconds") == \
        clock.now().timestamp()


def test_bad_limits_name_the_setting():
    with pytest.raises(ValueError, match="max_cordoned_node_ratio"):
        SafetyLimits(max_cordoned_node_ratio=1.5)
    with pytest.raises(ValueError, match="'sometimes' is not a valid Mode"):
        Mode("sometimes")
