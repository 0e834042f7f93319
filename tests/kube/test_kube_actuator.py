"""The actuator on Kubernetes, end to end: finding -> plan -> the request the API server received ->
the audit entry -> undo.

There is no kube-apiserver here: the official ``kubernetes`` client runs unmodified over real HTTP
against ``tests/fake_kube_api.py``, a fake API server that speaks the real REST protocol (paging,
merge patches with resourceVersion conflicts, the Eviction subresource with PDB 429s, Leases).
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, UTC

import pytest
from fake_kube_api import BATCH, CORE, KUEUE, FakeKubeAPI
from kube_fleet import job, job_with_pods, kueue_workload, namespace, node, pdb, pod
from polling import tick

from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, PlanningPolicy, SafetyLimits, plan_from_findings
from gpuwarden.remediation.approvals import decide, pending
from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.remediation.plan import NOTIFIED_ANNOTATION
from gpuwarden.fleet import Action, ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ROOMY = SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0)


@pytest.fixture
def api():
    server = FakeKubeAPI().with_kueue().start()
    yield server
    server.stop()


def connect(api: FakeKubeAPI, tmp_path, **kwargs) -> KubeCluster:
    client = load_client(api.kubeconfig(tmp_path / "kubeconfig.json"), timeout_seconds=kwargs.pop("timeout_seconds", 2.0))
    return KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05, **kwargs), clock=FakeClock(NOW))


def health(node_name: str, action=ActionKind.CORDON, kind=FindingKind.OFF_THE_BUS) -> Finding:
    return Finding(kind, Severity.CRITICAL, node_name, f"GPU-{node_name}-3", {"xid": 79, "count": 4}, action, 0.99,
                   NOW - timedelta(minutes=10), NOW)


def idle(ns: str, pod_name: str, node_name: str, hours: float = 3.0) -> Finding:
    return Finding("hoarded", Severity.WARNING, node_name, f"GPU-{node_name}-0",
                   {"namespace": ns, "pod": pod_name, "mem_used_ratio": 0.62, "sm_active_ratio": 0.0},
                   None, 1.0, NOW - timedelta(hours=hours), NOW)


def audit_of(tmp_path) -> list[dict]:
    return AuditLog.read(tmp_path / "audit.jsonl")


def small_fleet(api: FakeKubeAPI) -> None:
    for i in range(4):
        node(api, f"n{i}")
    namespace(api, "research", {"gpuwarden.io/reclaim-idle": "true", "gpuwarden.io/team": "research"})
    namespace(api, "prod", {"gpuwarden.io/team": "prod"})


# -- Must show -------------------------------------------------------------------------------------

def test_a_health_finding_cordons_the_node_is_audited_with_its_findings_and_undone(api, tmp_path):
    small_fleet(api)
    cluster = connect(api, tmp_path)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=FakeClock(NOW))
    snapshot = cluster.snapshot()
    entries = actuator.execute(plan_from_findings([health("n1")], snapshot), snapshot)

    assert [(e.outcome, e.kind, e.target) for e in entries] == [(Outcome.APPLIED, "cordon", "n1")]
    (patch,) = api.calls("PATCH", "/nodes/")
    # issue 24: the cordon carries its owner (gpuwarden, the finding, when) in the same PATCH
    owner = json.loads(patch.body["metadata"]["annotations"]["gpuwarden.io/cordoned"])
    assert owner == {"by": "gpuwarden", "finding": "off-the-bus on GPU-n1-3", "at": NOW.isoformat()}
    assert (patch.path, patch.body["spec"], patch.content_type) == ("/api/v1/nodes/n1", {"unschedulable": True},
                                                                    "application/merge-patch+json")
    assert api.get(CORE, "nodes", "n1")["spec"]["unschedulable"] is True
    (logged,) = audit_of(tmp_path)
    assert logged["findings"][0]["kind"] == "off-the-bus" and logged["findings"][0]["gpu_uuid"] == "GPU-n1-3"
    assert logged["findings"][0]["evidence"] == {"xid": 79, "count": 4}
    assert logged["snapshot_at"] == NOW.isoformat() and logged["undo"]["kind"] == "uncordon"

    undone = actuator.undo(logged["entry_id"], by="alice")
    assert undone.outcome == Outcome.UNDONE and undone.kind == "uncordon"
    assert api.calls("PATCH", "/nodes/")[-1].body["spec"] == {"unschedulable": None}
    assert "unschedulable" not in api.get(CORE, "nodes", "n1")["spec"]
    assert "gpuwarden.io/cordoned" not in api.get(CORE, "nodes", "n1")["metadata"].get("annotations", {})
    with pytest.raises(ValueError, match="already undone"):
        actuator.undo(logged["entry_id"], by="alice")


def test_a_hoarding_finding_in_an_opted_in_namespace_notifies_then_suspends_and_is_undone(api, tmp_path):
    small_fleet(api)
    job_with_pods(api, "research", "sweep", ["n0"], gpus=2)
    job_with_pods(api, "prod", "serve", ["n2"], gpus=2)  # same finding, namespace did not opt in
    cluster = connect(api, tmp_path)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=FakeClock(NOW))
    policy = PlanningPolicy(notify_grace_seconds=3600, reclaim_grace_seconds=3600)

    # First: a notice (an Event on the pod and an annotation), nothing else.
    snapshot = cluster.snapshot()
    plan = plan_from_findings([idle("research", "sweep-0", "n0"), idle("prod", "serve-0", "n2")], snapshot, policy)
    assert [(p.action.kind, p.action.target) for p in plan.actions] == [(ActionKind.NOTIFY, "research/sweep")]
    assert any("has not opted in" in why for _, why in plan.skipped)
    actuator.execute(plan, snapshot)
    (event,) = api.calls("POST", "/namespaces/research/events")
    assert event.body["involvedObject"]["name"] == "sweep-0" and event.body["reason"] == "GpuIdle"
    assert api.get(CORE, "pods", "sweep-0", "research")["metadata"]["annotations"][NOTIFIED_ANNOTATION] == NOW.isoformat()

    # Within the second grace: nothing. After it: suspend (a Job can be suspended).
    later = NOW + timedelta(minutes=30)
    assert plan_from_findings([idle("research", "sweep-0", "n0")], cluster.snapshot(), policy, now=later).actions == ()
    later = NOW + timedelta(hours=2)
    snapshot = cluster.snapshot()
    plan = plan_from_findings([idle("research", "sweep-0", "n0", hours=5)], snapshot, policy, now=later)
    assert [(p.action.kind, p.action.target) for p in plan.actions] == [(ActionKind.SUSPEND, "research/sweep")]
    entries = actuator.execute(plan, snapshot)
    assert [e.outcome for e in entries] == [Outcome.APPLIED]
    assert api.calls("PATCH", "/jobs/sweep")[-1].body == {  # who suspended it: only its owner's notice resumes it
        "spec": {"suspend": True}, "metadata": {"annotations": {"gpuwarden.io/suspended-by": "idle-reclaim"}}}
    suspended = [r for r in audit_of(tmp_path) if r["kind"] == "suspend"][0]
    assert suspended["findings"][0]["kind"] == "hoarded" and suspended["findings"][0]["evidence"]["pod"] == "sweep-0"
    assert suspended["params"]["grace_seconds"] == policy.suspend_grace_seconds
    assert suspended["params"]["by"] == "idle-reclaim"  # the scheduler resumes it only once its owner asks

    actuator.undo(suspended["entry_id"], by="bob")
    assert api.get(BATCH, "jobs", "sweep", "research")["spec"]["suspend"] is False


def test_a_quota_reclaim_preempts_the_borrower_through_the_scheduling_round(api, tmp_path):
    """Quota reclaim is the scheduling round's (the actuator no longer plans scheduling, issue 21):
    the borrower is suspended, marked as the scheduler's to resume."""
    node(api, "n0", gpus=8)
    namespace(api, "team-a", {"gpuwarden.io/queue": "team-a"}, {"gpuwarden.io/guaranteed-gpus": "8"})
    namespace(api, "team-b", {"gpuwarden.io/queue": "team-b"},
              {"gpuwarden.io/guaranteed-gpus": "0", "gpuwarden.io/burst-gpus": "8"})
    job_with_pods(api, "team-b", "borrower", ["n0"], gpus=8)  # team-b runs on team-a's lent guarantee
    job_with_pods(api, "team-a", "owner", [None], gpus=8, phase="Pending", gated=True)  # team-a wants it back
    results = SchedulingRound(connect(api, tmp_path)).run_round()
    (stop,) = [r for r in results if r.action.kind == ActionKind.PREEMPT]
    assert (stop.ok, stop.action.target, stop.action.params["by"]) == (True, "team-b/borrower", "scheduler")
    assert "preempted for team-a/owner" in stop.action.reason
    (suspend,) = [c.body for c in api.calls("PATCH", "/jobs/borrower") if "spec" in c.body]
    assert suspend == {"spec": {"suspend": True}, "metadata": {"annotations": {"gpuwarden.io/suspended-by": "scheduler"}}}


def test_taint_counts_as_a_conflict_retry_and_untaint_removes_only_ours(api, tmp_path):
    node(api, "n0", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    api.inject("PATCH", "/nodes/n0$", 409)  # someone else wrote the node between our read and our write
    result = cluster.apply(Action(ActionKind.TAINT, "n0", "test", {"taint": "gpuwarden.io/unhealthy=true:NoSchedule"}))
    assert result.ok, result.message
    assert len(api.calls("GET", "/nodes/n0$")) == 2  # re-read after the conflict
    taints = api.get(CORE, "nodes", "n0")["spec"]["taints"]
    assert {t["key"] for t in taints} == {"nvidia.com/gpu", "gpuwarden.io/unhealthy"}
    assert cluster.apply(result.undo).ok
    assert [t["key"] for t in api.get(CORE, "nodes", "n0")["spec"]["taints"]] == ["nvidia.com/gpu"]


def test_drain_evicts_through_the_eviction_api_skips_daemonsets_and_mirrors_and_a_pdb_says_retry_later(api, tmp_path):
    node(api, "n0")
    job_with_pods(api, "prod", "train", ["n0"], gpus=1)
    pod(api, "prod", "guarded", "n0", 1, labels={"app": "guarded"})
    pod(api, "kube-system", "dcgm", "n0", 0, owner=("DaemonSet", "dcgm"))
    pod(api, "kube-system", "static", "n0", 0, annotations={"kubernetes.io/config.mirror": "x"})
    pdb(api, "prod", "keep-one", {"app": "guarded"}, allowed=0)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    result = cluster.apply(Action(ActionKind.DRAIN, "n0", "test"))
    assert not result.ok and result.temporary and "blocked by a PodDisruptionBudget" in result.message
    evicted = sorted(c.path for c in api.calls("POST", "/eviction$"))
    assert evicted == ["/api/v1/namespaces/prod/pods/guarded/eviction", "/api/v1/namespaces/prod/pods/train-0/eviction"]
    assert api.get(CORE, "pods", "train-0", "prod") is None and api.get(CORE, "pods", "dcgm", "kube-system")
    assert api.get(CORE, "nodes", "n0")["spec"]["unschedulable"] is True
    actuator = Actuator(cluster, Mode.AUTO, ROOMY)
    snapshot = cluster.snapshot()
    (entry,) = actuator.execute(plan_from_findings([health("n0", ActionKind.DRAIN)], snapshot), snapshot)
    assert entry.outcome == Outcome.RETRY  # not a failure: the PDB will allow it later


def test_set_priority_goes_through_kueue_and_a_bare_pod_is_refused_with_the_reason(api, tmp_path):
    node(api, "n0")
    namespace(api, "ml")
    job_with_pods(api, "ml", "train", ["n0"])
    kueue_workload(api, "ml", "job-train-abc", "train", "low")
    api.add(KUEUE, "workloadpriorityclasses", {"metadata": {"name": "high"}, "value": 10000})
    api.add(KUEUE, "workloadpriorityclasses", {"metadata": {"name": "low"}, "value": 10})
    pod(api, "ml", "notebook", "n0")
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    result = cluster.apply(Action(ActionKind.SET_PRIORITY, "ml/train", "queue order", {"priority_class": "high"}))
    assert result.ok, result.message
    spec = api.get(KUEUE, "workloads", "job-train-abc", "ml")["spec"]
    assert (spec["priorityClassName"], spec["priority"]) == ("high", 10000)
    assert result.undo.params == {"priority_class": "low"}
    bare = cluster.apply(Action(ActionKind.SET_PRIORITY, "ml/notebook", "queue order", {"priority_class": "high"}))
    assert not bare.ok and not bare.temporary and "spec.priority is immutable" in bare.message
    # Kueue-managed suspend goes through spec.active, not the Job.
    assert cluster.apply(Action(ActionKind.SUSPEND, "ml/train", "test")).ok
    assert api.get(KUEUE, "workloads", "job-train-abc", "ml")["spec"]["active"] is False
    assert api.calls("PATCH", "/jobs/train") == []


def test_preempting_a_bare_pod_evicts_it_with_the_grace_period_and_cannot_be_undone(api, tmp_path):
    node(api, "n0")
    pod(api, "ml", "notebook", "n0")
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    result = cluster.apply(Action(ActionKind.PREEMPT, "ml/notebook", "reclaim", {"grace_seconds": 30}))
    assert result.ok and result.undo is None
    (eviction,) = api.calls("POST", "/eviction$")
    assert eviction.body["deleteOptions"] == {"gracePeriodSeconds": 30}
    again = cluster.apply(Action(ActionKind.EVICT, "ml/notebook", "again"))
    assert again.ok and "already gone" in again.message  # 404: it is gone, which is what we wanted


def test_a_suspended_job_is_in_the_snapshot_and_resumes(api, tmp_path):
    node(api, "n0")
    job(api, "ml", "paused", gpus=4, suspend=True)
    cluster = connect(api, tmp_path)
    (state,) = cluster.snapshot().workloads
    assert state.phase.value == "suspended" and state.workload.gpus.count == 4
    assert cluster.apply(Action(ActionKind.RESUME, "ml/paused", "capacity returned")).ok
    assert api.get(BATCH, "jobs", "paused", "ml")["spec"]["suspend"] is False


def _placed(*nodes: str) -> dict:
    """RESUME params as the planner writes them (planner.actions_for): one entry per GPU."""
    return {"placements": tuple({"node": n, "gpu_uuid": f"GPU-{n}-{i}", "milli": 1000} for i, n in enumerate(nodes))}


def _terms(api: FakeKubeAPI, name: str) -> list[dict]:
    affinity = api.get(BATCH, "jobs", name, "ml")["spec"]["template"]["spec"]["affinity"]
    return affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


def _edit_job(api: FakeKubeAPI, name: str, edit) -> None:
    """Someone else changes the stored Job (its owner, its controller): a new resourceVersion."""
    stored = api.get(BATCH, "jobs", name, "ml")
    edit(stored)
    api.add(BATCH, "jobs", stored)


def _name(node_name: str) -> dict:
    return {"key": "metadata.name", "operator": "In", "values": [node_name]}


H100 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}
H200 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H200"]}
OWN_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [H100]}, {"matchExpressions": [H200]}]}}}


def test_a_resume_pins_the_job_to_the_planned_nodes_in_one_patch_and_pins_never_pile_up(api, tmp_path):
    for i in range(4):
        node(api, f"n{i}")
    job(api, "ml", "paused", gpus=4, suspend=True, affinity=OWN_AFFINITY)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    result = cluster.apply(Action(ActionKind.RESUME, "ml/paused", "admitted", _placed("n2", "n2", "n1", "n1")))
    assert result.ok and "pinned to n1, n2" in result.message, result.message
    (patch,) = api.calls("PATCH", "/jobs/paused$")  # unsuspend and pin together: never one without the other
    assert patch.body["spec"]["suspend"] is False
    assert api.get(BATCH, "jobs", "paused", "ml")["spec"]["suspend"] is False
    # Each of the Job's own (ORed) terms keeps its requirement and becomes one term per planned node
    # (the API allows one value per node-name requirement).
    assert _terms(api, "paused") == [{"matchExpressions": [H100], "matchFields": [_name("n1")]},
                                     {"matchExpressions": [H100], "matchFields": [_name("n2")]},
                                     {"matchExpressions": [H200], "matchFields": [_name("n1")]},
                                     {"matchExpressions": [H200], "matchFields": [_name("n2")]}]

    # Preempted, then admitted elsewhere: the new pin replaces the old one, the Job's own terms stay.
    assert cluster.apply(Action(ActionKind.SUSPEND, "ml/paused", "preempted")).ok
    cluster.snapshot()
    assert cluster.apply(Action(ActionKind.RESUME, "ml/paused", "admitted", _placed("n3"))).ok
    assert _terms(api, "paused") == [{"matchExpressions": [H100], "matchFields": [_name("n3")]},
                                     {"matchExpressions": [H200], "matchFields": [_name("n3")]}]


def test_an_edit_to_the_suspended_jobs_own_affinity_survives_the_next_pin(api, tmp_path):
    node(api, "n0")
    job(api, "ml", "edited", suspend=True, affinity=OWN_AFFINITY)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    assert cluster.apply(Action(ActionKind.RESUME, "ml/edited", "admitted", _placed("n0"))).ok
    assert cluster.apply(Action(ActionKind.SUSPEND, "ml/edited", "preempted")).ok
    # The owner narrows the Job to H200 while it is suspended (KEP-2926 allows it).
    def narrow(stored: dict) -> None:
        stored["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"] = [{"matchExpressions": [H200], "matchFields": [_name("n0")]}]
    _edit_job(api, "edited", narrow)
    cluster.snapshot()
    assert cluster.apply(Action(ActionKind.RESUME, "ml/edited", "admitted", _placed("n0"))).ok
    assert _terms(api, "edited") == [{"matchExpressions": [H200], "matchFields": [_name("n0")]}]


def test_a_job_without_node_affinity_is_pinned_by_one_term_per_node(api, tmp_path):
    node(api, "n0")
    node(api, "n1")
    job(api, "ml", "free", gpus=1, suspend=True, parallelism=2)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    assert cluster.apply(Action(ActionKind.RESUME, "ml/free", "admitted", _placed("n1", "n0"))).ok
    assert _terms(api, "free") == [{"matchFields": [_name("n0")]}, {"matchFields": [_name("n1")]}]
    assert api.get(BATCH, "jobs", "free", "ml")["metadata"]["annotations"]["gpuwarden.io/pinned-nodes"] == "n0,n1"


def test_a_job_that_ran_has_its_start_time_cleared_once_its_pods_are_gone_then_is_pinned(api, tmp_path):
    """A Job that ran keeps status.startTime (before 1.36) and the API server then refuses a new pin:
    the actuator clears it, as Kueue does, but not while the Job's pods are still stopping."""
    node(api, "n0")
    job(api, "ml", "ran", gpus=2, suspend=True, start_time="2026-11-30T10:00:00Z")
    _edit_job(api, "ran", lambda stored: stored["status"].update(active=1))  # its pod is still terminating
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    stopping = cluster.apply(Action(ActionKind.RESUME, "ml/ran", "admitted", _placed("n0", "n0")))
    assert not stopping.ok and stopping.temporary and "still stopping" in stopping.message, stopping.message
    assert api.get(BATCH, "jobs", "ran", "ml")["spec"]["suspend"] is True and not api.calls("PATCH")

    _edit_job(api, "ran", lambda stored: stored["status"].update(active=0))
    result = cluster.apply(Action(ActionKind.RESUME, "ml/ran", "admitted", _placed("n0", "n0")))
    assert result.ok and "pinned to n0" in result.message, result.message
    (status_patch,) = api.calls("PATCH", "/jobs/ran/status$")
    assert status_patch.body["status"] == {"startTime": None}
    assert api.get(BATCH, "jobs", "ran", "ml")["spec"]["suspend"] is False
    assert _terms(api, "ran") == [{"matchFields": [_name("n0")]}]


def test_a_refused_pin_resumes_unpinned_but_never_onto_an_earlier_pin(api, tmp_path):
    """Without jobs/status rights (an older chart) the startTime stays and the pin is refused. A Job
    never pinned resumes unpinned and says why; a Job still pinned to an earlier plan's nodes stays
    suspended, since resuming it would put it on nodes the plan has given away."""
    node(api, "n0")
    node(api, "n1")
    job(api, "ml", "fresh", suspend=True, start_time="2026-11-30T10:00:00Z")
    job(api, "ml", "stale", suspend=True, start_time="2026-11-30T10:00:00Z",
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [_name("n0")]}]}}},
        annotations={"gpuwarden.io/pinned-nodes": "n0"})
    api.inject("PATCH", "/jobs/[a-z]+/status$", 403, times=2)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    fresh = cluster.apply(Action(ActionKind.RESUME, "ml/fresh", "admitted", _placed("n1")))
    assert fresh.ok and "not pinned to n1" in fresh.message and "immutable" in fresh.message, fresh.message
    stored = api.get(BATCH, "jobs", "fresh", "ml")
    assert stored["spec"]["suspend"] is False and "affinity" not in stored["spec"]["template"]["spec"]

    stale = cluster.apply(Action(ActionKind.RESUME, "ml/stale", "admitted", _placed("n1")))
    assert not stale.ok and "immutable" in stale.message, stale.message
    assert api.get(BATCH, "jobs", "stale", "ml")["spec"]["suspend"] is True
    assert _terms(api, "stale") == [{"matchFields": [_name("n0")]}]


def test_a_resume_without_placements_or_under_kueue_leaves_the_template_alone(api, tmp_path):
    node(api, "n0")
    job(api, "ml", "plain", suspend=True)
    job(api, "ml", "queued", suspend=True)
    kueue_workload(api, "ml", "job-queued", "queued", "batch-low", active=False)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    assert cluster.apply(Action(ActionKind.RESUME, "ml/plain", "capacity returned")).ok
    assert cluster.apply(Action(ActionKind.RESUME, "ml/queued", "admitted", _placed("n0"))).ok  # Kueue places it
    for name in ("plain", "queued"):
        assert "affinity" not in api.get(BATCH, "jobs", name, "ml")["spec"]["template"]["spec"], name
    assert not api.calls("GET", "/jobs/")


# -- failures, typed ------------------------------------------------------------------------------

@pytest.mark.parametrize("status, temporary, words", [
    (403, False, "lacks verb 'patch' on resource 'nodes'"),
    (404, False, "already gone"),
    (422, False, "invalid"),
    (429, True, "gave up after 3 tries"),
    (500, True, "gave up after 3 tries"),
    ("timeout", True, "no answer from the API server"),
])
def test_a_failure_mid_plan_is_typed_recorded_and_the_plan_goes_on(api, tmp_path, status, temporary, words):
    small_fleet(api)
    cluster = connect(api, tmp_path, attempts=3, timeout_seconds=0.5)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=FakeClock(NOW))
    snapshot = cluster.snapshot()
    api.inject("PATCH", "/nodes/n1$", status, times=5, hang_seconds=1.0)
    entries = actuator.execute(plan_from_findings([health("n0"), health("n1"), health("n2")], snapshot), snapshot)
    outcomes = [(e.target, e.outcome) for e in entries]
    assert outcomes == [("n0", Outcome.APPLIED), ("n1", Outcome.RETRY if temporary else Outcome.REFUSED),
                        ("n2", Outcome.APPLIED)]
    assert words in entries[1].message and "Traceback" not in entries[1].message
    tries = len(api.calls("PATCH", "/nodes/n1$"))
    assert tries == (3 if temporary else 1)


def test_a_409_mid_plan_is_re_read_and_retried(api, tmp_path):
    small_fleet(api)
    cluster = connect(api, tmp_path)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, clock=FakeClock(NOW))
    snapshot = cluster.snapshot()
    api.inject("PATCH", "/nodes/n1$", 409, times=2)
    entries = actuator.execute(plan_from_findings([health(n) for n in ("n0", "n1", "n2")], snapshot), snapshot)
    assert [e.outcome for e in entries] == [Outcome.APPLIED] * 3
    assert len(api.calls("PATCH", "/nodes/n1$")) == 3 and api.get(CORE, "nodes", "n1")["spec"]["unschedulable"]


def test_the_circuit_breaker_posts_an_event_raises_the_metric_and_waits_for_a_person(api, tmp_path):
    small_fleet(api)
    cluster = connect(api, tmp_path)
    cluster.namespace = "gpuwarden"
    actuator = Actuator(cluster, Mode.AUTO, SafetyLimits(max_actions_per_hour=1, max_cordoned_node_ratio=1.0),
                        AuditLog(tmp_path / "audit.jsonl"), clock=FakeClock(NOW))
    snapshot = cluster.snapshot()
    actuator.execute(plan_from_findings([health("n0"), health("n1")], snapshot), snapshot)
    assert actuator.metrics.registry.get_sample_value("gpuwarden_actuator_circuit_open") == 1.0
    (event,) = api.calls("POST", "/namespaces/gpuwarden/events")
    assert event.body["reason"] == "CircuitBreakerOpen" and "1 actions in the last hour" in event.body["message"]
    breaker = [r for r in audit_of(tmp_path) if r["outcome"] == "breaker-open"]
    assert breaker and breaker[0]["kind"] == "circuit-breaker"
    restarted = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=FakeClock(NOW))
    assert restarted.breaker_open  # a restart does not close it; a person does
    restarted.reset_breaker(by="ops")
    assert restarted.metrics.registry.get_sample_value("gpuwarden_actuator_circuit_open") == 0.0
    entries = restarted.execute(plan_from_findings([health("n1")], cluster.snapshot()))
    assert [e.outcome for e in entries] == [Outcome.APPLIED]


def test_a_429_backs_off_on_the_clock_and_then_succeeds(api, tmp_path):
    """The back-offs are waits on the injected clock: 0.2 s then 0.4 s, each x0.5..1.5 jitter."""
    small_fleet(api)
    clock = FakeClock(NOW)
    client = load_client(api.kubeconfig(tmp_path / "kc.json"))
    cluster = KubeCluster(KubeApi(client, backoff_seconds=0.2, clock=clock), clock=clock)
    api.inject("PATCH", "/nodes/n0$", 429, times=2)
    results = []
    applying = threading.Thread(target=lambda: results.append(cluster.apply(Action(ActionKind.CORDON, "n0", "x"))))
    applying.start()
    tick(clock, 0.099)  # short of the shortest first back-off (0.1 s)
    assert clock.waiting == 1 and len(api.calls("PATCH", "/nodes/n0$")) == 1
    tick(clock, 0.201)  # 0.3 s: past the longest first back-off; the second starts here
    tick(clock, 0.199)  # short of the shortest second back-off (0.2 s)
    assert clock.waiting == 1 and len(api.calls("PATCH", "/nodes/n0$")) == 2
    tick(clock, 0.401)  # past the longest second back-off (0.6 s)
    applying.join(10)
    assert [r.ok for r in results] == [True] and len(api.calls("PATCH", "/nodes/n0$")) == 3


# -- modes, limits, restarts ------------------------------------------------------------------------

def test_observe_mode_reports_what_the_limits_would_block_and_sends_no_write(api, tmp_path):
    for i in range(10):
        node(api, f"n{i}")
    node(api, "n9-tainted", taints=[{"key": "gpuwarden.io/unhealthy", "value": "true", "effect": "NoSchedule"}])
    cluster = connect(api, tmp_path)
    actuator = Actuator(cluster, Mode.OBSERVE, SafetyLimits(max_cordoned_node_ratio=0.3), clock=FakeClock(NOW))
    snapshot = cluster.snapshot()
    entries = actuator.execute(plan_from_findings([health(f"n{i}") for i in range(5)], snapshot), snapshot)
    # 11 nodes, one already tainted by gpuwarden (counts): 30% allows 3 out, so 2 more.
    assert [e.outcome for e in entries] == [Outcome.PLANNED] * 2 + [Outcome.BLOCKED] * 3
    assert entries[2].message.startswith("would be blocked: would leave 4 of 11 nodes cordoned or tainted")
    assert [r for r in api.requests if r.method != "GET"] == []


def test_the_hourly_limit_survives_restarts(api, tmp_path):
    """#16: a limit of 3 per hour and three restarts within two minutes apply 3 actions, not 9."""
    for i in range(9):
        node(api, f"n{i}")
    clock = FakeClock(NOW)
    limits = SafetyLimits(max_actions_per_hour=3, max_cordoned_node_ratio=1.0)
    for restart in range(3):
        cluster = connect(api, tmp_path)  # a new process: nothing in memory but the audit log on disk
        actuator = Actuator(cluster, Mode.AUTO, limits, AuditLog(tmp_path / "audit.jsonl"), clock=clock)
        snapshot = cluster.snapshot()
        actuator.execute(plan_from_findings([health(f"n{3 * restart + k}") for k in range(3)], snapshot), snapshot)
        clock.advance(40)
    applied = [r["target"] for r in audit_of(tmp_path) if r["outcome"] == "applied"]
    assert applied == ["n0", "n1", "n2"]
    assert len(api.calls("PATCH", "/nodes/")) == 3
    assert actuator.breaker_open  # and it waits for a person


def test_a_restart_in_the_middle_of_a_plan_never_repeats_what_was_applied(api, tmp_path):
    small_fleet(api)
    cluster = connect(api, tmp_path)
    findings = [health("n0"), health("n1", ActionKind.TAINT), health("n2")]
    snapshot = cluster.snapshot()
    plan = plan_from_findings(findings, snapshot)
    first = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=FakeClock(NOW))
    api.inject("PATCH", "/nodes/n1$", "timeout", times=10, hang_seconds=1.0)  # the process dies while n1 hangs
    cluster.api.attempts, cluster.api.timeout_seconds = 1, 0.3
    first.execute(type(plan)(plan.actions[:2], (), plan.snapshot_at), snapshot)
    api.faults.clear()
    cluster = connect(api, tmp_path)
    second = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=FakeClock(NOW))
    snapshot = cluster.snapshot()
    plan = plan_from_findings(findings, snapshot)
    assert [p.action.target for p in plan.actions] == ["n1", "n2"]  # n0 stands: not planned again
    second.execute(plan, snapshot)
    patches = [c.path for c in api.calls("PATCH", "/nodes/") if c.body.get("spec", {}).get("unschedulable")]
    assert patches == ["/api/v1/nodes/n0", "/api/v1/nodes/n2"]
    assert api.get(CORE, "nodes", "n1")["spec"]["taints"][0]["key"] == "gpuwarden.io/unhealthy"


def test_protect_label_on_a_node_or_a_namespace_opts_it_out(api, tmp_path):
    node(api, "n0", labels={"gpuwarden.io/protect": "true"})
    node(api, "n1")
    namespace(api, "vip", {"gpuwarden.io/protect": "true", "gpuwarden.io/reclaim-idle": "true"})
    job_with_pods(api, "vip", "train", ["n1"])
    cluster = connect(api, tmp_path)
    plan = plan_from_findings([health("n0"), idle("vip", "train-0", "n1")], cluster.snapshot(),
                              PlanningPolicy(notify_grace_seconds=0))
    assert plan.actions == ()
    assert {why for _, why in plan.skipped} == {"node 'n0' is protected", "namespace 'vip' is protected"}


def test_approvals_survive_a_restart_and_are_applied_at_the_next_round_with_the_approvers_name(api, tmp_path):
    small_fleet(api)
    path = tmp_path / "audit.jsonl"
    cluster = connect(api, tmp_path)
    snapshot = cluster.snapshot()
    plan = plan_from_findings([health("n0"), health("n1")], snapshot)
    Actuator(cluster, Mode.APPROVE, ROOMY, AuditLog(path), clock=FakeClock(NOW)).execute(plan, snapshot)
    waiting = pending(path)
    assert [(p.kind, p.target) for p in waiting] == [("cordon", "n0"), ("cordon", "n1")]
    assert waiting[0].findings[0]["kind"] == "off-the-bus" and waiting[0].planned_at
    decide(path, waiting[0].approval_id, True, by="dana", comment="confirmed on the console")
    decide(path, waiting[1].approval_id, False, by="dana")
    with pytest.raises(ValueError, match="already approved by dana"):
        decide(path, waiting[0].approval_id, False, by="erin")
    with pytest.raises(ValueError, match="no action awaits approval with id nope"):
        decide(path, "nope", True, by="erin")
    assert pending(path) == []
    assert api.calls("PATCH") == []

    restarted = Actuator(connect(api, tmp_path), Mode.APPROVE, ROOMY, AuditLog(path), clock=FakeClock(NOW))
    snapshot = restarted.cluster.snapshot()
    entries = restarted.execute(plan_from_findings([health("n0"), health("n1")], snapshot), snapshot)
    assert [(e.outcome, e.target, e.by) for e in entries] == [(Outcome.APPLIED, "n0", "dana")]  # n1 was rejected
    assert [c.path for c in api.calls("PATCH")] == ["/api/v1/nodes/n0"]
    assert restarted.execute(plan_from_findings([health("n0"), health("n1")], restarted.cluster.snapshot())) == []


def test_a_truncated_audit_line_is_skipped_not_fatal(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_text('{"outcome": "awaiting-approval", "approval_id": "a1", "kind": "cordon", "target": "n0"}\n{"outc')
    assert [p.approval_id for p in pending(path)] == ["a1"]


def test_a_finished_drain_stands_and_is_not_applied_again(api, tmp_path):
    """#16: a standing drain used to be re-applied every round and use up the hourly limit."""
    small_fleet(api)
    job_with_pods(api, "prod", "train", ["n0"])
    cluster = connect(api, tmp_path)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=FakeClock(NOW))
    for _ in range(3):
        snapshot = cluster.snapshot()
        actuator.execute(plan_from_findings([health("n0", ActionKind.DRAIN)], snapshot), snapshot)
    assert [r["kind"] for r in audit_of(tmp_path) if r["outcome"] == "applied"] == ["drain"]
    assert len(api.calls("POST", "/eviction$")) == 1
    plan = plan_from_findings([health("n0", ActionKind.DRAIN)], cluster.snapshot())
    assert plan.actions == () and "already drained" in plan.skipped[0][1]
