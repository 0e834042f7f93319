"""The failure-domain breaker wired into the applier (issue 35 item 2), on the fake API server with
the official client (no real API server runs here; the fake speaks its HTTP protocol).

A rack's event (all five of its nodes faulty at once) cordons one node and holds the rest; the
rack's breaker opens in the audit log and as an Event; a restart keeps it open; after the cool-down
one probe goes; once the rack has room again it closes on that evidence and the next repair goes.
Observe mode says "would be held" and writes nothing of the breaker.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fake_kube_api import CORE, FakeKubeAPI
from kube_fleet import node

from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, SafetyLimits, plan_from_findings
from gpuwarden.remediation.domains import DOMAIN_BREAKER_KIND, DomainPolicy, domain_states

NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
RACK_R0 = [f"n{i}" for i in range(5)]  # rack r0; n5..n14 are rack r1; all one pool of 15
POLICY = DomainPolicy(max_unhealthy_ratio=0.2, cooldown_seconds=1800)


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


class Fleet:
    def __init__(self, api: FakeKubeAPI, tmp_path, mode: Mode = Mode.AUTO) -> None:
        for i in range(15):
            node(api, f"n{i}", labels={"gpuwarden.io/pool": "h100", "gpuwarden.io/rack": "r0" if i < 5 else "r1"})
        self.api, self.clock, self.path, self.mode = api, FakeClock(NOW), tmp_path / "audit.jsonl", mode
        client = load_client(api.kubeconfig(tmp_path / "kubeconfig.json"), timeout_seconds=2.0)
        self.cluster = KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05), clock=self.clock)
        self.actuator = self.restart()

    def restart(self) -> Actuator:
        self.actuator = Actuator(self.cluster, self.mode, SafetyLimits(100, 1.0), AuditLog(self.path), clock=self.clock,
                                 domains=POLICY)
        return self.actuator

    def round(self, nodes: list[str], after_seconds: float = 0.0) -> list:
        self.clock.advance(after_seconds)
        snapshot = self.cluster.snapshot()
        at = self.clock.now()
        findings = [Finding(FindingKind.NVLINK_ERROR, Severity.CRITICAL, n, f"GPU-{n}-0", {"count": 3},
                            ActionKind.CORDON, 0.95, at - timedelta(minutes=5), at) for n in nodes]
        return self.actuator.execute(plan_from_findings(findings, snapshot), snapshot)

    def cordoned(self) -> list[str]:
        return sorted(f"n{i}" for i in range(15)
                      if (self.api.get(CORE, "nodes", f"n{i}") or {}).get("spec", {}).get("unschedulable"))

    def uncordon(self, name: str) -> None:
        stored = next(n for n in self.api.objects(CORE, "nodes", copy=False) if n["metadata"]["name"] == name)
        stored["spec"].pop("unschedulable", None)

    def rack_state(self) -> str | None:
        state = domain_states(self.actuator.audit.records()).get("rack:r0")
        return state.state if state else None

    def events(self) -> list[str]:
        return [e.get("reason") for e in self.api.objects(CORE, "events")]


def targets(entries, outcome: Outcome) -> list[str]:
    return sorted(e.target for e in entries if e.outcome == outcome and e.kind == "cordon")


def test_a_rack_event_repairs_one_node_holds_the_rest_probes_and_closes_on_evidence(api, tmp_path):
    fleet = Fleet(api, tmp_path)
    first = fleet.round(RACK_R0)
    assert fleet.cordoned() == ["n0"], "one node of five: the rack's share (20%, at least one)"
    assert targets(first, Outcome.HELD) == ["n1", "n2", "n3", "n4"]
    assert fleet.rack_state() == "open"
    breaker = [e for e in first if e.kind == DOMAIN_BREAKER_KIND]
    assert [e.target for e in breaker] == ["rack:r0"] and breaker[0].params["allowed"] == 1
    assert "FailureDomainBreaker" in fleet.events(), "never silent: an Event says the domain's breaker opened"

    fleet.restart()  # the state lives in the audit log
    again = fleet.round(RACK_R0, after_seconds=60)
    assert fleet.cordoned() == ["n0"] and not targets(again, Outcome.APPLIED)
    assert not [e for e in again if e.kind == DOMAIN_BREAKER_KIND], "a standing hold is recorded once"

    probe = fleet.round(RACK_R0, after_seconds=1800)
    assert fleet.cordoned() == ["n0", "n1"], "one probe after the cool-down"
    states = [e.params["state"] for e in probe if e.kind == DOMAIN_BREAKER_KIND]
    assert states == ["half-open", "open"], "the probe, then open again for another cool-down"

    for name in ("n0", "n1"):  # repaired and given back
        fleet.uncordon(name)
    closed = fleet.round(["n2", "n3"], after_seconds=60)
    assert [e.params["state"] for e in closed if e.kind == DOMAIN_BREAKER_KIND][0] == "closed"
    assert fleet.cordoned() == ["n2"], "closed on evidence: the next repair goes, the one after it is held again"
    assert fleet.rack_state() == "open"


def test_other_racks_are_repaired_while_one_rack_is_held(api, tmp_path):
    fleet = Fleet(api, tmp_path)
    fleet.round([*RACK_R0, "n7"])
    assert fleet.cordoned() == ["n0", "n7"]


def test_observe_mode_says_would_be_held_and_records_no_breaker(api, tmp_path):
    fleet = Fleet(api, tmp_path, Mode.OBSERVE)
    entries = fleet.round(RACK_R0)
    assert fleet.cordoned() == []
    assert targets(entries, Outcome.PLANNED) == ["n0"]
    held = [e for e in entries if e.outcome == Outcome.HELD]
    assert sorted(e.target for e in held) == ["n1", "n2", "n3", "n4"]
    assert all("would be held: domain rack:r0" in e.message for e in held)
    assert not [r for r in fleet.actuator.audit.records() if r.get("kind") == DOMAIN_BREAKER_KIND]
