"""Leader election on a coordination.k8s.io/v1 Lease, against ``tests/fake_kube_api.py`` (a fake API
server speaking the real REST protocol; the official client runs unmodified over HTTP)."""

from __future__ import annotations

from datetime import datetime, timedelta, UTC

import pytest
from fake_kube_api import COORDINATION, FakeKubeAPI
from kube_fleet import node
from polling import tick, wait_for

from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, SafetyLimits, plan_from_findings
from gpuwarden.kube import KubeApi, KubeCluster, LeaderElector, load_client
from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.fleet.runner import Runner
from gpuwarden.fleet.triggers import every

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def kube_api(api, tmp_path) -> KubeApi:
    return KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json"), timeout_seconds=1.0), attempts=1)


def test_one_leader_at_a_time_and_the_other_takes_over_after_the_lease_expires(api, tmp_path):
    clock = FakeClock(T0)
    a = LeaderElector(kube_api(api, tmp_path), "gpuwarden", "actuator", "replica-a", 15, clock=clock)
    b = LeaderElector(kube_api(api, tmp_path), "gpuwarden", "actuator", "replica-b", 15, clock=clock)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader()
    clock.advance(10)
    assert a.try_acquire_or_renew()  # renewed
    # a loses the API server: its renewals fail, and it stops acting within the lease duration.
    api.inject("*", "/leases/actuator$", 503, times=100)
    clock.advance(10)
    assert a.try_acquire_or_renew() and a.is_leader()  # still inside the lease it renewed 10 s ago
    clock.advance(6)
    assert not a.try_acquire_or_renew() and not a.is_leader()
    api.faults.clear()
    assert b.try_acquire_or_renew() and b.is_leader()
    lease = api.get(COORDINATION, "leases", "actuator", "gpuwarden")
    assert lease["spec"]["holderIdentity"] == "replica-b" and lease["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()


def test_a_stale_resource_version_loses(api, tmp_path):
    a = LeaderElector(kube_api(api, tmp_path), "gpuwarden", "actuator", "replica-a", 15)
    assert a.try_acquire_or_renew()
    api.inject("PATCH", "/leases/actuator$", 409)  # another replica wrote the Lease between our read and write
    assert not a.try_acquire_or_renew() and not a.is_leader()
    (put,) = [r for r in api.calls("PATCH", "/leases/")]
    assert put.body["metadata"]["resourceVersion"]  # the write carried the version it read


def test_an_actuator_that_lost_the_lease_applies_nothing(api, tmp_path):
    for i in range(3):
        node(api, f"n{i}")
    clock = FakeClock(T0)
    elector = LeaderElector(kube_api(api, tmp_path), "gpuwarden", "actuator", "replica-a", 15, clock=clock)
    assert elector.try_acquire_or_renew()
    cluster = KubeCluster(kube_api(api, tmp_path))
    actuator = Actuator(cluster, Mode.AUTO, SafetyLimits(max_cordoned_node_ratio=1.0), AuditLog(tmp_path / "a.jsonl"),
                        clock=clock, leader=elector.is_leader)
    clock.advance(16)  # no renewal for longer than the lease
    findings = [Finding(FindingKind.OFF_THE_BUS, Severity.CRITICAL, f"n{i}", None, {}, ActionKind.CORDON, 1.0, T0, T0) for i in range(2)]
    entries = actuator.execute(plan_from_findings(findings, cluster.snapshot()))
    assert [e.outcome for e in entries] == [Outcome.NOT_APPLIED] * 2 and "lease lost" in entries[0].message
    assert api.calls("PATCH") == []


def test_the_runner_renews_the_lease_every_third_of_its_duration_on_the_fake_clock(api, tmp_path):
    clock = FakeClock(T0)
    elector = LeaderElector(kube_api(api, tmp_path), "gpuwarden", "actuator", "replica-a", 15, clock=clock)
    runner = Runner(clock)
    job = runner.add("lease", elector.try_acquire_or_renew, every(elector.renew_interval_seconds, clock), at_once=True)
    runner.start()

    def renewed_at() -> datetime:
        return datetime.fromisoformat(api.get(COORDINATION, "leases", "actuator", "gpuwarden")["spec"]["renewTime"])

    try:
        wait_for(lambda: job.runs == 1, what="the first renewal, at once")
        assert renewed_at() == T0 and elector.is_leader()
        for n in (2, 3):
            tick(clock, 5)  # a third of 15 s
            wait_for(lambda: job.runs == n, what=f"renewal {n}")  # noqa: B023
        assert renewed_at() == T0 + timedelta(seconds=10)
        clock.advance(16)  # renewals keep it: without them the lease would have lapsed by now
        wait_for(lambda: job.runs == 4, what="the renewal at 15 s")
        assert elector.is_leader()
    finally:
        runner.stop()
    assert len(api.calls("PATCH", "/leases/actuator$")) == 3  # created once, then patched at 5, 10 and 15 s
