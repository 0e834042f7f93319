"""Remediation paced by outcome (issue 24 item 1), on the fake API server with the official client.

A fleet-wide event (half the nodes' findings of one detector at once) starts one cordon, holds the
rest, doubles the pace after a proven success, falls back to one after a flap, and stays inside the
breaker; a flapping detector on another node is paced on its own and reset by its flap. Every start,
verdict and hold is in the audit log; the pace is a metric and survives a restart.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fake_kube_api import CORE, FakeKubeAPI
from kube_fleet import node

from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, SafetyLimits, plan_from_findings
from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.remediation.pacing import PacingPolicy, pace_from_records
from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock

NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
POOL = "h100"
EVENT = FindingKind.NVLINK_ERROR  # the fleet-wide event's detector
FLAPPY = FindingKind.PCIE_REPLAY_STORM  # the flapping detector
PACE = PacingPolicy(proven_after_seconds=300, give_up_after_seconds=3600, cooldown_seconds=60, jitter_ratio=0.5, seed=3)


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


class Fleet:
    def __init__(self, api: FakeKubeAPI, tmp_path, limits: SafetyLimits, nodes: int = 10) -> None:
        for i in range(nodes):
            node(api, f"n{i}", labels={"gpuwarden.io/pool": POOL})
        self.api, self.clock, self.path = api, FakeClock(NOW), tmp_path / "audit.jsonl"
        client = load_client(api.kubeconfig(tmp_path / "kubeconfig.json"), timeout_seconds=2.0)
        self.cluster = KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05), clock=self.clock)
        self.limits = limits
        self.actuator = self.restart()

    def restart(self) -> Actuator:
        self.actuator = Actuator(self.cluster, Mode.AUTO, self.limits, AuditLog(self.path), clock=self.clock, pacing=PACE)
        return self.actuator

    def round(self, findings: list[Finding], after_seconds: float = 0.0) -> list:
        self.clock.advance(after_seconds)
        snapshot = self.cluster.snapshot()
        return self.actuator.execute(plan_from_findings(findings, snapshot), snapshot)

    def finding(self, node_name: str, kind: FindingKind) -> Finding:
        at = self.clock.now()
        return Finding(kind, Severity.CRITICAL, node_name, f"GPU-{node_name}-0", {"count": 3}, ActionKind.CORDON, 0.95,
                       at - timedelta(minutes=5), at)

    def cordoned(self) -> list[str]:
        return sorted(n for n in (f"n{i}" for i in range(10))
                      if (self.api.get(CORE, "nodes", n) or {}).get("spec", {}).get("unschedulable"))


def applied(entries) -> list[str]:
    return [e.target for e in entries if e.outcome == Outcome.APPLIED]


def held(entries) -> list[str]:
    return [e.target for e in entries if e.outcome == Outcome.HELD]


def verdicts(entries) -> list[tuple[str, str, int]]:
    return [(e.params["node"], e.params["verdict"], e.params["window"]) for e in entries if e.outcome == Outcome.PACED]


def pace_metric(fleet: Fleet, detector: FindingKind) -> float | None:
    """The pace gauge on the registry the fleet's actuator fills (its own, never the global one)."""
    return fleet.actuator.metrics.registry.get_sample_value(
        "gpuwarden_remediation_pace", {"pool": POOL, "detector": str(detector)})


def test_a_fleet_wide_event_and_a_flapping_detector_are_paced_by_outcome_inside_the_breaker(api, tmp_path):
    fleet = Fleet(api, tmp_path, SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=0.4))
    half = [f"n{i}" for i in range(5)]

    # t=0: half the fleet at once, and a flapping detector on n7. One in flight per pool and detector.
    first = fleet.round([fleet.finding(n, EVENT) for n in half] + [fleet.finding("n7", FLAPPY)])
    assert applied(first) == ["n0", "n7"]
    assert held(first) == ["n1", "n2", "n3", "n4"]
    assert all(e.message.startswith(f"pace: 1 of 1 in flight for {EVENT} in pool {POOL}") for e in first
               if e.outcome == Outcome.HELD)
    assert verdicts(first) == [("n0", "started", 1), ("n7", "started", 1)]
    assert fleet.cordoned() == ["n0", "n7"] and not fleet.actuator.breaker_open
    assert pace_metric(fleet, EVENT) == 1.0

    # t=60 s: n0 repaired (its finding gone), n7's detector quiet for a round; nothing new starts and
    # the holds are not written again.
    second = fleet.round([fleet.finding(n, EVENT) for n in half[1:]], 60)
    assert applied(second) == [] and held(second) == [] and verdicts(second) == []

    # t=120 s: the flapping detector fires again on n7 before it was proven: a failure, back to one.
    third = fleet.round([fleet.finding(n, EVENT) for n in half[1:]] + [fleet.finding("n7", FLAPPY)], 60)
    assert verdicts(third) == [("n7", "failed", 1)]
    assert "back on n7 after it had gone quiet" in next(e.reason for e in third if e.outcome == Outcome.PACED)

    # t=360 s: n0 Ready with no finding for 300 s: proven, the window doubles, two more start.
    fourth = fleet.round([fleet.finding(n, EVENT) for n in half[1:]], 240)
    assert verdicts(fourth)[0] == ("n0", "proven", 2)
    assert applied(fourth) == ["n1", "n2"]
    assert verdicts(fourth)[1:] == [("n1", "started", 2), ("n2", "started", 2)]
    assert pace_metric(fleet, EVENT) == 2.0

    # The pace survives a restart: the audit log folds back into the same windows and flights.
    restarted = fleet.restart()
    assert restarted.pacer is not None
    assert restarted.pacer.state.window((POOL, str(EVENT)), PACE) == 2
    assert sorted(restarted.pacer.state.in_flight) == ["n1", "n2"]

    # n1 and n2 go quiet; n1 flaps back: a failure resets the window to one while n2 is still in
    # flight, so nothing starts.
    fleet.round([fleet.finding(n, EVENT) for n in half[3:]], 120)
    fifth = fleet.round([fleet.finding(n, EVENT) for n in ["n1", *half[3:]]], 120)
    assert verdicts(fifth) == [("n1", "failed", 1)]
    assert applied(fifth) == [] and held(fifth) == []  # n3, n4 were already recorded as held
    assert pace_metric(fleet, EVENT) == 1.0

    # n2 proven (quiet 300 s): window 2, and the next start meets the breaker, which stays the outer
    # limit: 5 of 10 nodes out would pass the 40% share (n0, n1, n2, n7 are cordoned).
    sixth = fleet.round([fleet.finding(n, EVENT) for n in ["n1", *half[3:]]], 200)
    assert verdicts(sixth)[0] == ("n2", "proven", 2)
    assert [e.outcome for e in sixth if e.target == "n3"] == [Outcome.BLOCKED]
    assert fleet.actuator.breaker_open
    assert any(e.outcome == Outcome.BREAKER_OPEN for e in sixth)
    assert fleet.cordoned() == ["n0", "n1", "n2", "n7"]

    # Every decision and its pace is in the audit log, in order.
    records = AuditLog.read(fleet.path)
    state = pace_from_records(records)
    assert state.window((POOL, str(EVENT)), PACE) == 2 and state.window((POOL, str(FLAPPY)), PACE) == 1
    outcomes = {r["outcome"] for r in records}
    assert {"applied", "held-by-pace", "paced", "blocked-by-limit", "breaker-open"} <= outcomes


def test_observe_mode_reports_what_the_pace_would_hold(api, tmp_path):
    fleet = Fleet(api, tmp_path, SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0))
    fleet.actuator = Actuator(fleet.cluster, Mode.OBSERVE, fleet.limits, AuditLog(fleet.path), clock=fleet.clock,
                              pacing=PACE)
    entries = fleet.round([fleet.finding(n, EVENT) for n in ("n0", "n1", "n2")])
    assert [(e.outcome, e.target) for e in entries] == [
        (Outcome.PLANNED, "n0"), (Outcome.HELD, "n1"), (Outcome.HELD, "n2")]
    assert entries[1].message.startswith("would be held: pace: 1 of 1 in flight")
    assert api.calls("PATCH") == []


def test_a_refused_action_is_a_failure_and_a_cooldown_follows_each_start(api, tmp_path):
    fleet = Fleet(api, tmp_path, SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0))
    api.inject("PATCH", "/nodes/n0$", 403)
    first = fleet.round([fleet.finding("n0", EVENT)])
    assert [e.outcome for e in first if e.target == "n0"] == [Outcome.REFUSED]
    assert verdicts(first) == [("n0", "failed", 1)]
    cooldown_end = datetime.fromisoformat(next(e for e in first if e.outcome == Outcome.PACED).params["next_at"])
    assert NOW + timedelta(seconds=60) <= cooldown_end <= NOW + timedelta(seconds=90)  # 60 s stretched by 0..50%
    second = fleet.round([fleet.finding("n1", EVENT)], 30)
    assert held(second) == ["n1"] and "cooldown" in second[0].message
    third = fleet.round([fleet.finding("n1", EVENT)], (cooldown_end - fleet.clock.now()).total_seconds())
    assert applied(third) == ["n1"]


@pytest.mark.parametrize("field, value", [("initial_in_flight", 0), ("cooldown_seconds", -1.0)])
def test_bad_pacing_settings_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        PacingPolicy(**{field: value})


def test_the_actions_page_shows_the_pace_the_audit_log_leaves(api, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from gpuwarden.remediation import audit_report as av
    from gpuwarden.remediation.pacing import pace_rows
    from gpuwarden.dashboards.launch import APP_PATH

    store = tmp_path / "store"
    (store / "actuator").mkdir(parents=True)
    fleet = Fleet(api, tmp_path, SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0))
    fleet.path = store / "actuator" / "audit.jsonl"
    fleet.restart()
    fleet.round([fleet.finding(n, EVENT) for n in ("n0", "n1", "n2")])
    (row,) = pace_rows(AuditLog.read(fleet.path))
    assert (row["pool"], row["detector"], row["window"], row["in_flight"], row["nodes_in_flight"]) == (
        POOL, str(EVENT), 1, 1, "n0")
    assert row["last"].startswith("started on n0")

    monkeypatch.delenv(av.AUDIT_ENV, raising=False)
    monkeypatch.setenv("GPUWARDEN_STORE", str(store))
    app = AppTest.from_file(str(APP_PATH.parent / "views" / "actions.py"), default_timeout=30).run()
    assert not app.exception
    assert "Pace" in [h.value for h in app.subheader]
    assert "2 action(s) held by the pace in this log." in " ".join(c.value for c in app.caption)
    table = app.dataframe[0].value
    assert list(table["detector"]) == [str(EVENT)] and list(table["window"]) == [1]


def test_a_repair_not_proven_in_time_is_a_failure_and_a_not_ready_node_is_never_proven(api, tmp_path):
    fleet = Fleet(api, tmp_path, SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0))
    assert applied(fleet.round([fleet.finding("n0", EVENT), fleet.finding("n1", FLAPPY)])) == ["n0", "n1"]
    # n1's finding clears but its node goes NotReady (the node lifecycle controller's taint): not proven.
    node_n1 = api.store[(CORE, "nodes")][("", "n1")]
    node_n1["spec"].setdefault("taints", []).append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    assert verdicts(fleet.round([fleet.finding("n0", EVENT)], 1800)) == []
    late = fleet.round([fleet.finding("n0", EVENT)], 1800)
    assert sorted(verdicts(late)) == [("n0", "failed", 1), ("n1", "failed", 1)]
    reasons = {e.params["node"]: e.reason for e in late if e.outcome == Outcome.PACED}
    assert reasons == {"n0": "n0 not proven within 3600 s (1 finding(s) still open)",
                       "n1": "n1 not proven within 3600 s (not Ready)"}


def test_approve_mode_is_paced_like_auto_a_person_approving_a_fleet_wide_event_gets_the_slow_start(api, tmp_path):
    """Approve mode on the fake API server: four cordons wait for a person; all four are approved in
    one go, yet the pace lets one go, holds the rest approved (recorded once, applied later), and
    the next ones start only after the first is proven, the window doubled."""
    fleet = Fleet(api, tmp_path, SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0))
    fleet.actuator = Actuator(fleet.cluster, Mode.APPROVE, fleet.limits, AuditLog(fleet.path), clock=fleet.clock,
                              pacing=PACE)
    event = [f"n{i}" for i in range(4)]
    queued = fleet.round([fleet.finding(n, EVENT) for n in event])
    assert [e.outcome for e in queued] == [Outcome.AWAITING_APPROVAL] * 4 and fleet.cordoned() == []

    # A person approves all four at once: the first goes at once, the others are held by the pace.
    answers = [fleet.actuator.approve(e.approval_id, by="alice") for e in queued]
    assert [a.outcome for a in answers] == [Outcome.APPLIED, Outcome.HELD, Outcome.HELD, Outcome.HELD]
    assert answers[1].message.startswith("approved; pace: 1 of 1 in flight") and answers[1].by == "alice"
    assert fleet.cordoned() == ["n0"]
    assert fleet.actuator.awaiting == {}  # decided: nobody is asked again

    # Rounds while n0 proves itself: nothing more starts, and the holds are not written again.
    for _ in range(2):
        quiet = fleet.round([fleet.finding(n, EVENT) for n in event[1:]], 120)
        assert applied(quiet) == [] and held(quiet) == []
        assert not any(e.outcome == Outcome.AWAITING_APPROVAL for e in quiet)  # approved, held: not asked again
    assert fleet.cordoned() == ["n0"]

    # n0 quiet for 300 s since the first round that saw it (t=120 s): proven, the window doubles and
    # two approved cordons go, carrying their approver.
    proven = fleet.round([fleet.finding(n, EVENT) for n in event[1:]], 200)
    assert verdicts(proven)[0] == ("n0", "proven", 2)
    assert applied(proven) == ["n1", "n2"]
    assert {e.by for e in proven if e.outcome == Outcome.APPLIED} == {"alice"}
    assert [e.approval_id for e in proven if e.outcome == Outcome.APPLIED] == [queued[1].approval_id,
                                                                               queued[2].approval_id]
    assert fleet.cordoned() == ["n0", "n1", "n2"]
    assert pace_metric(fleet, EVENT) == 2.0

    # A restart keeps n3 approved and held (the proving time starts again after a restart): it is
    # applied once n1 and n2 are proven, and nobody is asked again.
    fleet.actuator = Actuator(fleet.cluster, Mode.APPROVE, fleet.limits, AuditLog(fleet.path), clock=fleet.clock,
                              pacing=PACE)
    waiting = fleet.round([fleet.finding("n3", EVENT)], 60)
    assert applied(waiting) == [] and held(waiting) == ["n3"]
    later = fleet.round([fleet.finding("n3", EVENT)], 300)
    assert verdicts(later)[:2] == [("n1", "proven", 4), ("n2", "proven", 8)]  # doubled after each
    assert applied(later) == ["n3"]
    assert not any(e.outcome == Outcome.AWAITING_APPROVAL for e in later)
