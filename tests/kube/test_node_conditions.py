"""The GPUHealthy NodeCondition (issue 24 item 3): written through ``nodes/status`` in observe mode
(no other write), read back from the fake API server, whose status subresource changes status only;
the kubelet's own conditions are kept, an unchanged condition is not written again, and a flip moves
``lastTransitionTime``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fake_kube_api import CORE, FakeKubeAPI
from kube_fleet import node

from gpuwarden.remediation import Actuator, AuditLog, Mode, SafetyLimits, plan_from_findings
from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
KUBELET_READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2026-12-01T09:59:00Z", "lastTransitionTime": "2026-11-20T00:00:00Z"}


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def conditions(api: FakeKubeAPI, name: str) -> dict[str, dict]:
    return {c["type"]: c for c in api.get(CORE, "nodes", name)["status"].get("conditions") or ()}


def test_observe_mode_writes_gpuhealthy_through_the_status_subresource_and_reads_it_back(api, tmp_path):
    for name in ("n0", "n1"):
        node(api, name)
        api.store[(CORE, "nodes")][("", name)]["status"]["conditions"] = [dict(KUBELET_READY)]
    api.add(CORE, "nodes", {"metadata": {"name": "cpu-0"}, "spec": {}, "status": {"capacity": {"cpu": "8"}}})
    clock = FakeClock(NOW)
    client = load_client(api.kubeconfig(tmp_path / "kubeconfig.json"), timeout_seconds=2.0)
    cluster = KubeCluster(KubeApi(client, backoff_seconds=0.01), clock=clock)
    actuator = Actuator(cluster, Mode.OBSERVE, audit=AuditLog(tmp_path / "audit.jsonl"), clock=clock,
                        node_conditions=True)
    bad = [Finding(FindingKind.ROW_REMAP_FAILURE, Severity.CRITICAL, "n1", "GPU-n1-2", {}, ActionKind.DRAIN, 0.99,
                   NOW - timedelta(minutes=5), NOW),
           Finding(FindingKind.HIGH_SBE_RATE, Severity.WARNING, "n1", "GPU-n1-5", {}, ActionKind.CORDON, 0.9,
                   NOW - timedelta(minutes=5), NOW)]
    snapshot = cluster.snapshot()
    actuator.execute(plan_from_findings(bad, snapshot), snapshot)

    # Observe mode: the only writes are the two status PATCHes (the CPU node is not a GPU node).
    writes = [c for c in api.requests if c.method in ("PATCH", "POST", "PUT", "DELETE")]
    assert sorted(c.path for c in writes) == ["/api/v1/nodes/n0/status", "/api/v1/nodes/n1/status"]
    healthy, sick = conditions(api, "n0"), conditions(api, "n1")
    assert healthy["Ready"] == KUBELET_READY and sick["Ready"] == KUBELET_READY  # the kubelet's own kept
    assert (healthy["GPUHealthy"]["status"], healthy["GPUHealthy"]["reason"]) == ("True", "GPUsHealthy")
    assert (sick["GPUHealthy"]["status"], sick["GPUHealthy"]["reason"]) == ("False", "high-sbe-rate,row-remap-failure")
    assert sick["GPUHealthy"]["message"] == ("gpuwarden: GPU-n1-2: row-remap-failure (critical); "
                                             "GPU-n1-5: high-sbe-rate (warning)")
    assert sick["GPUHealthy"]["lastTransitionTime"] == "2026-12-01T10:00:00Z"
    assert "unschedulable" not in api.get(CORE, "nodes", "n1")["spec"]  # observe: nothing else changed

    # The same findings: nothing is written again. n1 recovers: its condition flips and moves its time.
    clock.advance(120)
    actuator.execute(plan_from_findings(bad, cluster.snapshot()))
    assert len([c for c in api.requests if c.method == "PATCH"]) == 2
    actuator.execute(plan_from_findings([], cluster.snapshot()))
    recovered = conditions(api, "n1")["GPUHealthy"]
    assert (recovered["status"], recovered["lastTransitionTime"]) == ("True", "2026-12-01T10:02:00Z")
    assert conditions(api, "n0")["GPUHealthy"]["lastTransitionTime"] == "2026-12-01T10:00:00Z"


def test_a_status_patch_that_loses_a_race_is_re_read_and_a_failure_never_stops_the_round(api, tmp_path):
    node(api, "n0")
    clock = FakeClock(NOW)
    client = load_client(api.kubeconfig(tmp_path / "kubeconfig.json"), timeout_seconds=2.0)
    cluster = KubeCluster(KubeApi(client, backoff_seconds=0.01, attempts=1), clock=clock)
    api.inject("PATCH", "/nodes/n0/status$", 409)
    assert cluster.publish_conditions({}) == 1
    assert len(api.calls("GET", "/nodes/n0$")) == 1 and conditions(api, "n0")["GPUHealthy"]["status"] == "True"
    api.inject("PATCH", "/nodes/n0/status$", 403)
    actuator = Actuator(cluster, Mode.OBSERVE, SafetyLimits(max_cordoned_node_ratio=1.0), clock=clock,
                        node_conditions=True)
    finding = Finding(FindingKind.OFF_THE_BUS, Severity.CRITICAL, "n0", "GPU-n0-0", {}, ActionKind.CORDON, 0.99, NOW, NOW)
    entries = actuator.execute(plan_from_findings([finding], cluster.snapshot()))
    assert [e.outcome.value for e in entries] == ["planned"]  # the round went on without its condition
