"""``KubeCluster.snapshot`` from paged lists on ``tests/fake_kube_api.py`` (a fake API server speaking
the real REST protocol; the official client runs unmodified over HTTP)."""

from __future__ import annotations

import pytest
from fake_kube_api import BATCH, CORE, JOBSET, KUEUE, FakeKubeAPI
from kube_fleet import job, job_with_pods, namespace, node, pod

from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.fleet import Action, ActionKind


def connect(api, tmp_path, page_size=500) -> KubeCluster:
    return KubeCluster(KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json"))), page_size=page_size)


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def test_snapshot_reads_nodes_pods_owners_teams_and_pages_through_lists(api, tmp_path):
    node(api, "a", labels={"gpuwarden.io/pool": "train", "gpuwarden.io/price-tier": "spot",
                           "topology.kubernetes.io/zone": "z1"}, unschedulable=True,
         taints=[{"key": "gpuwarden.io/unhealthy", "value": "true", "effect": "NoSchedule"}])
    node(api, "b")
    api.add(CORE, "nodes", {"metadata": {"name": "cpu-only"}, "status": {"capacity": {"cpu": "8", "memory": "32Gi"}}})
    api.add(CORE, "nodes", {"metadata": {"name": "mig", "labels": {"nvidia.com/gpu.count": "1"}},
                            "status": {"capacity": {"nvidia.com/mig-1g.10gb": "7", "cpu": "8", "memory": "32Gi"}}})
    namespace(api, "ml", {"gpuwarden.io/queue": "vision"}, {"gpuwarden.io/guaranteed-gpus": "4", "gpuwarden.io/burst-gpus": "8"})
    job_with_pods(api, "ml", "train", ["a", "b"], gpus=2)
    for i in range(2):  # two Jobs of one JobSet are one workload
        pod(api, "ml", f"js-{i}", "b", 1, owner=("Job", f"js-job-{i}"), labels={"jobset.sigs.k8s.io/jobset-name": "js"},
            priority_class="high-priority")
    pod(api, "ml", "web", "b", 0, owner=("ReplicaSet", "web-123"))  # no GPU: not a GPU workload
    pod(api, "ml", "done", "b", 1, phase="Succeeded")  # finished: filtered by the field selector
    job(api, "ml", "paused", gpus=1, suspend=True)

    cluster = connect(api, tmp_path, page_size=2)
    snapshot = cluster.snapshot()
    assert [n.name for n in snapshot.nodes] == ["a", "b", "mig"]
    a = snapshot.nodes[0]
    assert (a.pool, a.price_tier.value, a.gpu_count, a.topology.rack) == ("train", "spot", 8, "z1")
    assert snapshot.cordoned == {"a"} and snapshot.taints["a"] == ("gpuwarden.io/unhealthy=true:NoSchedule",)
    mig_gpus = [g for g in snapshot.gpus if g.node == "mig"]
    assert len(mig_gpus) == 1 and len(mig_gpus[0].mig_instances) == 7
    states = {f"{w.workload.namespace}/{w.workload.name}": w for w in snapshot.workloads}
    assert set(states) == {"ml/train", "ml/js", "ml/paused"}
    assert states["ml/train"].controller == "Job" and states["ml/train"].workload.gang_size == 2
    assert states["ml/train"].workload.team == "vision" and len(states["ml/train"].placements) == 4
    assert states["ml/js"].controller == "JobSet" and states["ml/js"].workload.priority_class.value == "high"
    assert states["ml/paused"].phase.value == "suspended"
    (team,) = [t for t in snapshot.teams if t.name == "vision"]
    assert (team.guaranteed_gpus, team.burst_limit_gpus) == (4.0, 8.0)
    # Lists only, page by page; Kueue absent (404) is not an error.
    assert {r.method for r in api.requests} == {"GET"}
    pod_lists = [r for r in api.requests if r.path == "/api/v1/pods"]
    assert len(pod_lists) == 3 and all(r.query["limit"] == "2" for r in pod_lists)  # 5 active pods
    assert "continue" not in pod_lists[0].query and all("continue" in r.query for r in pod_lists[1:])
    assert cluster.inventory.kueue is False
    # A JobSet is suspended through its own spec.suspend.
    api.add(JOBSET, "jobsets", {"metadata": {"name": "js", "namespace": "ml"}, "spec": {}})
    assert cluster.apply(Action(ActionKind.SUSPEND, "ml/js", "test")).ok
    assert api.get(JOBSET, "jobsets", "js", "ml")["spec"]["suspend"] is True


def test_a_node_label_outside_the_vocabulary_is_named_and_the_node_kept_with_defaults(api, tmp_path, caplog):
    node(api, "odd", labels={"gpuwarden.io/pool": "train", "gpuwarden.io/price-tier": "cheap"})
    node(api, "cloudy", labels={"gpuwarden.io/location": "cloud"})
    with caplog.at_level("WARNING", logger="gpuwarden.kube"):
        snapshot = connect(api, tmp_path).snapshot()
    odd, cloudy = sorted(snapshot.nodes, key=lambda n: n.name != "odd")
    assert (odd.name, odd.pool, odd.location.value, odd.price_tier.value) == ("odd", "default", "on-prem", "on-demand")
    assert odd.gpu_count == 8 and len([g for g in snapshot.gpus if g.node == "odd"]) == 8
    assert (cloudy.location.value, cloudy.price_tier.value) == ("cloud", "on-demand")
    assert "label gpuwarden.io/price-tier='cheap' is not one of: on-demand, reserved, spot, owned" in caplog.text


def test_kueue_cluster_queues_are_teams(api, tmp_path):
    api.with_kueue()
    node(api, "a")
    api.add(KUEUE, "clusterqueues", {"metadata": {"name": "research"}, "spec": {"resourceGroups": [{"flavors": [
        {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "16", "borrowingLimit": "8"}]}]}]}})
    snapshot = connect(api, tmp_path).snapshot()
    (team,) = [t for t in snapshot.teams if t.name == "research"]
    assert (team.guaranteed_gpus, team.burst_limit_gpus) == (16.0, 24.0)


def test_the_scheduling_round_resumes_a_job_it_suspended_never_one_a_user_created_suspended(api, tmp_path):
    """The round resumes a Job annotated suspended-by=scheduler (its own, across restarts); a Job a
    user created suspended (no annotation) stays theirs (issue 21). Outside the queue it touches
    neither (issue 31); a resume applied there (remediation's undo) is pinned to the planned node."""
    node(api, "a", gpus=8)
    namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "8"})
    namespace(api, "web", {"gpuwarden.io/team": "web"})
    for ns in ("ml", "web"):
        job(api, ns, "paused", gpus=4, suspend=True, annotations={"gpuwarden.io/suspended-by": "scheduler"})
        job(api, ns, "held", gpus=4, suspend=True)
    cluster = connect(api, tmp_path)
    results = SchedulingRound(cluster).run_round()
    assert [(r.ok, r.action.kind, r.action.target) for r in results] == [(True, ActionKind.RESUME, "ml/paused")]
    (resume,) = [c.body for c in api.calls("PATCH", "/namespaces/ml/jobs/paused") if "spec" in c.body]
    assert resume["spec"] == {"suspend": False}  # in a queue namespace its new pods come gated
    # the user's Job is never resumed; it only gets its queue note (position, and why: theirs to resume)
    assert all("spec" not in c.body for c in api.calls("PATCH", "/jobs/held"))
    assert "theirs to resume" in api.get(BATCH, "jobs", "held", "ml")["metadata"]["annotations"]["gpuwarden.io/queue-reason"]
    assert not [c for c in api.requests if c.method != "GET" and "/namespaces/web/" in c.path]
    undo = cluster.apply(Action(ActionKind.RESUME, "web/paused", "undo suspend",
                                {"placements": ({"node": "a", "gpu_uuid": "a/gpu-0"},)}))
    assert undo.ok, undo.message
    (pinned,) = [c.body for c in api.calls("PATCH", "/namespaces/web/jobs/paused") if "spec" in c.body]
    terms = pinned["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["a"]


def test_mig_pods_are_placed_on_mig_instances_and_the_planner_accepts_them(api, tmp_path):
    from gpuwarden.scheduling.planner import plan as schedule_plan

    api.add(CORE, "nodes", {"metadata": {"name": "mig", "labels": {"nvidia.com/gpu.count": "1"}},
                            "status": {"capacity": {"nvidia.com/mig-1g.10gb": "7", "cpu": "8", "memory": "32Gi"}}})
    for i in range(2):
        api.add(CORE, "pods", {"metadata": {"name": f"m{i}", "namespace": "ml"}, "spec": {"nodeName": "mig", "containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}, "status": {"phase": "Running"}})
    snapshot = connect(api, tmp_path).snapshot()
    placements = sorted(p.mig_instance_id for w in snapshot.workloads for p in w.placements)
    assert placements == [1, 2] and all(w.workload.gpus.mig_profile == "1g.10gb" for w in snapshot.workloads)
    assert schedule_plan(snapshot, "gpuwarden").actions == ()
