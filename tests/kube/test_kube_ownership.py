"""Cordons and taints with an owner, and drain modes (issue 24 items 2 and 4), on the fake API
server with the official client: a cordon or taint someone else set survives gpuwarden's undo,
untaint and repair flow; drains suspend, wait or evict by label and severity, and never touch a pod
on another node whatever a list returned."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import fake_kube_api
import pytest
from fake_kube_api import BATCH, CORE, FakeKubeAPI
from kube_fleet import job, job_with_pods, namespace, node, pod

from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, PlanningPolicy, SafetyLimits, plan_from_findings
from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.kube.ownership import CORDON_ANNOTATION, DRAINING_ANNOTATION, TAINTS_ANNOTATION
from gpuwarden.fleet import Action, ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
ROOMY = SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0)
OURS = "gpuwarden.io/unhealthy=true:NoSchedule"


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def connect(api: FakeKubeAPI, tmp_path, clock: FakeClock) -> KubeCluster:
    client = load_client(api.kubeconfig(tmp_path / "kubeconfig.json"), timeout_seconds=2.0)
    return KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05), clock=clock)


def finding(node_name: str, action: ActionKind, severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding(FindingKind.ROW_REMAP_FAILURE, severity, node_name, f"GPU-{node_name}-1", {"count": 1}, action, 0.99,
                   NOW - timedelta(minutes=10), NOW)


def annotations(api: FakeKubeAPI, name: str) -> dict:
    return api.get(CORE, "nodes", name)["metadata"].get("annotations") or {}


def unschedulable(api: FakeKubeAPI, name: str) -> bool:
    return bool(api.get(CORE, "nodes", name)["spec"].get("unschedulable"))


def test_a_cordon_someone_else_set_survives_undo_and_the_repair_flow(api, tmp_path):
    node(api, "n0", unschedulable=True)  # kubectl cordon n0, by a person, before gpuwarden saw anything
    node(api, "n1")
    namespace(api, "ml")
    job_with_pods(api, "ml", "train", ["n0"])  # n0 still runs work: the drain is planned
    clock = FakeClock(NOW)
    cluster = connect(api, tmp_path, clock)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=clock,
                        repair_after_healthy_seconds=600)
    snapshot = cluster.snapshot()
    entries = actuator.execute(plan_from_findings([finding("n0", ActionKind.DRAIN), finding("n1", ActionKind.CORDON)],
                                                  snapshot), snapshot)
    assert [(e.kind, e.target, e.outcome) for e in entries] == [("drain", "n0", Outcome.APPLIED),
                                                                ("cordon", "n1", Outcome.APPLIED)]
    # gpuwarden records its own cordon on n1 (who, which finding, when) and does not claim n0's.
    owner = json.loads(annotations(api, "n1")[CORDON_ANNOTATION])
    assert owner == {"by": "gpuwarden", "finding": "row-remap-failure on GPU-n1-1", "at": NOW.isoformat()}
    assert CORDON_ANNOTATION not in annotations(api, "n0") and DRAINING_ANNOTATION in annotations(api, "n0")
    assert api.get(CORE, "pods", "train-0", "ml") is None  # the drain itself went ahead

    # Undo of the drain: refused, saying whose cordon it is; n0 stays cordoned.
    drained = next(e for e in entries if e.target == "n0")
    undone = actuator.undo(drained.entry_id, by="alice")
    assert undone.outcome == Outcome.REFUSED
    assert "n0 was cordoned by someone else" in undone.message and "kubectl uncordon n0" in undone.message
    assert unschedulable(api, "n0")

    # The repair flow: both nodes healthy (no finding, Ready) for 600 s; only n1 is uncordoned.
    quiet = []
    for _ in range(3):
        snapshot = cluster.snapshot()
        quiet += actuator.execute(plan_from_findings([], snapshot), snapshot)
        clock.advance(300)
    assert [(e.kind, e.target, e.outcome, e.by) for e in quiet] == [("uncordon", "n1", Outcome.APPLIED, "repair")]
    assert not unschedulable(api, "n1") and CORDON_ANNOTATION not in annotations(api, "n1")
    assert unschedulable(api, "n0")


def test_the_repair_flow_asks_once_about_a_cordon_that_turned_out_to_be_someone_elses(api, tmp_path):
    node(api, "n0")
    clock = FakeClock(NOW)
    cluster = connect(api, tmp_path, clock)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=clock,
                        repair_after_healthy_seconds=0)
    snapshot = cluster.snapshot()
    actuator.execute(plan_from_findings([finding("n0", ActionKind.CORDON)], snapshot), snapshot)
    # A person takes the cordon over: their own annotation replaces gpuwarden's record.
    api.store[(CORE, "nodes")][("", "n0")]["metadata"]["annotations"] = {CORDON_ANNOTATION: '{"by": "ops-team"}'}
    rounds = []
    for _ in range(3):
        snapshot = cluster.snapshot()
        rounds.append(actuator.execute(plan_from_findings([], snapshot), snapshot))
    assert [(e.kind, e.outcome) for e in rounds[0]] == [("uncordon", Outcome.REFUSED)]
    assert "cordoned by someone else" in rounds[0][0].message
    assert rounds[1] == [] and rounds[2] == [] and unschedulable(api, "n0")


def test_untaint_removes_only_the_taints_gpuwarden_set(api, tmp_path):
    theirs = {"key": "maintenance", "value": "true", "effect": "NoSchedule"}
    node(api, "n0", taints=[theirs])
    node(api, "n1", taints=[{"key": "gpuwarden.io/unhealthy", "value": "true", "effect": "NoSchedule"}])  # set by hand
    clock = FakeClock(NOW)
    cluster = connect(api, tmp_path, clock)
    result = cluster.apply(Action(ActionKind.TAINT, "n0", "row-remap-failure on GPU-n0-1", {"taint": OURS}))
    assert result.ok and result.undo is not None
    assert set(json.loads(annotations(api, "n0")[TAINTS_ANNOTATION])) == {"gpuwarden.io/unhealthy:NoSchedule"}
    everything = cluster.apply(Action(ActionKind.UNTAINT, "n0", "undo"))  # no taint named: all of gpuwarden's
    assert everything.ok and "left maintenance:NoSchedule (set by someone else)" in everything.message
    assert api.get(CORE, "nodes", "n0")["spec"]["taints"] == [theirs]
    assert TAINTS_ANNOTATION not in annotations(api, "n0")

    # The same taint put on by hand is not claimed by a taint action, and not lifted by an untaint.
    claimed = cluster.apply(Action(ActionKind.TAINT, "n1", "x", {"taint": OURS}))
    assert claimed.ok and claimed.undo is None and "set by someone else; left as theirs" in claimed.message
    refused = cluster.apply(Action(ActionKind.UNTAINT, "n1", "undo", {"taint": OURS}))
    assert not refused.ok and "was set by someone else" in refused.message
    assert api.get(CORE, "nodes", "n1")["spec"]["taints"][0]["key"] == "gpuwarden.io/unhealthy"


# -- drain modes --------------------------------------------------------------------------------------

def _drain(cluster: KubeCluster, name: str, **params) -> object:
    return cluster.apply(Action(ActionKind.DRAIN, name, "row-remap-failure on GPU-x", params))


def test_a_warning_drain_cordons_and_lets_pods_finish_until_the_timeout(api, tmp_path):
    node(api, "n0")
    namespace(api, "ml")
    job_with_pods(api, "ml", "train", ["n0"])
    clock = FakeClock(NOW)
    cluster = connect(api, tmp_path, clock)
    snapshot = cluster.snapshot()
    plan = plan_from_findings([finding("n0", ActionKind.DRAIN, Severity.WARNING)], snapshot,
                              PlanningPolicy(drain_completion_seconds=1800))
    assert plan.actions[0].action.params == {"mode": "allow-completion", "timeout_seconds": 1800.0, "severity": "warning"}
    first = cluster.apply(plan.actions[0].action)
    assert not first.ok and first.temporary and "1 pod(s) allowed to finish" in first.message
    assert unschedulable(api, "n0") and api.get(CORE, "pods", "train-0", "ml") is not None
    clock.advance(1799)
    assert not cluster.apply(plan.actions[0].action).ok
    clock.advance(1)
    done = cluster.apply(plan.actions[0].action)
    assert done.ok and "1 pod(s) evicted" in done.message and api.get(CORE, "pods", "train-0", "ml") is None


def test_suspend_first_suspends_checkpointable_jobs_and_evicts_the_rest_namespace_label_over_node(api, tmp_path):
    node(api, "n0", labels={"gpuwarden.io/drain-mode": "allow-completion"})
    namespace(api, "ml", labels={"gpuwarden.io/drain-mode": "suspend-first"})
    job(api, "ml", "ckpt", annotations={"gpuwarden.io/checkpointable": "true"})
    pod(api, "ml", "ckpt-0", "n0", owner=("Job", "ckpt"))
    job_with_pods(api, "ml", "plain", ["n0"])
    namespace(api, "web")
    pod(api, "web", "notebook", "n0")  # the node's label applies here: allowed to finish
    clock = FakeClock(NOW)
    cluster = connect(api, tmp_path, clock)
    first = _drain(cluster, "n0", mode="immediate", timeout_seconds=600, grace_seconds=120)
    assert not first.ok and first.temporary
    assert "1 pod(s) evicted, 1 checkpointable Job(s) suspended" in first.message
    assert api.get(BATCH, "jobs", "ckpt", "ml")["spec"]["suspend"] is True
    assert api.get(CORE, "pods", "plain-0", "ml") is None  # not checkpointable: evicted now
    assert api.get(CORE, "pods", "ckpt-0", "ml") and api.get(CORE, "pods", "notebook", "web")
    clock.advance(600)  # past the suspend grace and the node's completion timeout: what is left goes
    done = _drain(cluster, "n0", mode="immediate", timeout_seconds=600, grace_seconds=120)
    assert done.ok, done.message
    assert api.get(CORE, "pods", "ckpt-0", "ml") is None and api.get(CORE, "pods", "notebook", "web") is None


def test_a_bad_drain_mode_label_is_refused_naming_it_before_anything_is_touched(api, tmp_path):
    node(api, "n0", labels={"gpuwarden.io/drain-mode": "gently"})
    namespace(api, "ml")
    job_with_pods(api, "ml", "train", ["n0"])
    cluster = connect(api, tmp_path, FakeClock(NOW))
    result = _drain(cluster, "n0")
    assert not result.ok and not result.temporary
    assert "gpuwarden.io/drain-mode='gently' is not one of: immediate, allow-completion, suspend-first" in result.message
    assert api.calls("PATCH") == [] and api.calls("POST") == []


def test_a_drain_never_evicts_a_pod_on_another_node_whatever_the_list_returned(api, tmp_path, monkeypatch):
    node(api, "n0")
    node(api, "n1")
    namespace(api, "ml")
    job_with_pods(api, "ml", "here", ["n0"])
    job_with_pods(api, "ml", "elsewhere", ["n1"])
    monkeypatch.setattr(fake_kube_api, "_fields_match", lambda obj, selector: True)  # a server ignoring the selector
    cluster = connect(api, tmp_path, FakeClock(NOW))
    result = _drain(cluster, "n0")
    assert result.ok and "1 pod(s) evicted" in result.message and "1 pod(s) listed on other nodes not touched" in result.message
    assert [c.path for c in api.calls("POST", "/eviction$")] == ["/api/v1/namespaces/ml/pods/here-0/eviction"]
    assert api.get(CORE, "pods", "elsewhere-0", "ml") is not None
