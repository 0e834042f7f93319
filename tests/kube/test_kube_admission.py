"""Admission by scheduling gate on Kubernetes: ``KubeCluster`` reads gated work into the snapshot and
admits it with one PATCH per pod (``tests/fake_kube_api.py``: a fake API server speaking the real
REST protocol; the official client runs unmodified over HTTP). Pods are written as a real cluster
would hold them: gated pods are unbound, gates are only removed, affinity only tightened."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fake_kube_api import BATCH, CORE, SCHEDULING, FakeKubeAPI
from kube_fleet import NOW, connect, gated_job, gpu_pod, namespace, node

from gpuwarden.kube.gates import (ADMISSION_GATE, RESERVED_AT_ANNOTATION, RESERVED_NODES_ANNOTATION, ADMITTED_AT_ANNOTATION, ADMITTED_NODE_ANNOTATION,
                                           GANG_LABEL, GANG_SIZE_LABEL, PRIORITY_CLASS_ANNOTATION,
                                           QUEUE_POSITION_ANNOTATION, QUEUE_LABEL, SUSPENDED_BY_ANNOTATION)
from gpuwarden.kube.inventory import NodeLabels
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.fleet import Action, ActionKind, WorkloadPhase
from gpuwarden.scheduling.mig import fits

ISO = "2026-11-30T12:00:00Z"


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def states_of(snapshot) -> dict:
    return {w.workload.key: w for w in snapshot.workloads}


# -- the snapshot -----------------------------------------------------------------------------------

def test_snapshot_reads_gated_admitted_timed_out_and_refused_pods(api, tmp_path):
    node(api, "n0", gpus=8)
    node(api, "n1", gpus=8)
    namespace(api, "research", {QUEUE_LABEL: "vision"}, {"gpuwarden.io/guaranteed-gpus": "8"})
    gated_job(api, "research", "train", pods=2, gpus=4, annotations={PRIORITY_CLASS_ANNOTATION: "high"})
    for i in range(2):  # a gang of 3 by label, one pod not created yet
        gpu_pod(api, "research", f"sweep-{i}", 2, labels={GANG_LABEL: "sweep", GANG_SIZE_LABEL: "3"})
    gpu_pod(api, "research", "ungated", 1, gates=())  # kube-scheduler's: not ours to queue
    gpu_pod(api, "research", "kueued", 1, gates=("kueue.x-k8s.io/admission",))  # Kueue's
    fresh = (NOW - timedelta(seconds=60)).isoformat()
    stale = (NOW - timedelta(seconds=301)).isoformat()
    gpu_pod(api, "research", "held", 2, gates=(), annotations={ADMITTED_NODE_ANNOTATION: "n1", ADMITTED_AT_ANNOTATION: fresh})
    gpu_pod(api, "research", "stuck", 1, gates=(), annotations={ADMITTED_NODE_ANNOTATION: "n0", ADMITTED_AT_ANNOTATION: stale},
            conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         "message": "0/2 nodes are available: 2 Insufficient cpu."}])
    gpu_pod(api, "research", "bound", 1, gates=(), node_name="n0")  # bound, its containers still starting
    gpu_pod(api, "research", "odd-mig", 1, resource="nvidia.com/mig-5g.99gb")
    gpu_pod(api, "research", "odd-qty", resource="nvidia.com/gpu", gpus="two")  # type: ignore[arg-type]

    cluster = connect(api, tmp_path)
    snapshot = cluster.snapshot()
    states = states_of(snapshot)
    assert set(states) == {"research/train", "research/sweep", "research/held", "research/bound"}
    train = states["research/train"]
    assert (train.phase, train.workload.gang_size, train.workload.gpus.count) == (WorkloadPhase.PENDING, 2, 4)
    assert train.workload.team == "vision" and train.priority_override == "high" and train.controller == "Job"
    assert train.submitted_at == datetime(2026, 11, 30, 11, 0, tzinfo=UTC) and train.started_at is None
    sweep = states["research/sweep"]
    assert (sweep.phase, sweep.workload.gang_size, sweep.controller) == (WorkloadPhase.PENDING, 3, "Gang")
    held = states["research/held"]
    assert held.phase == WorkloadPhase.RUNNING and {p.node for p in held.placements} == {"n1"}
    assert len(held.placements) == 2
    assert states["research/bound"].phase == WorkloadPhase.RUNNING
    assert all(w.attained_gpu_seconds == 0.0 for w in snapshot.workloads)
    inventory = cluster.inventory
    assert "0/2 nodes are available: 2 Insufficient cpu." in inventory.unschedulable["research/stuck"]
    assert "not bound 300 s after admission to n0" in inventory.unschedulable["research/stuck"]
    assert "unknown MIG profile '5g.99gb'" in inventory.refused["research/odd-mig"]
    assert "'two' is not a Kubernetes quantity" in inventory.refused["research/odd-qty"]
    assert [p.name for p in inventory.gated["research/train"]] == ["train-0", "train-1"]
    assert inventory.queue_namespaces == {"research"}
    # The next snapshot hands out the same Workload objects where nothing changed (the loop keeps their jobs).
    again = states_of(cluster.snapshot())
    assert again["research/train"].workload is train.workload and again["research/held"].workload is held.workload


def test_a_job_waiting_for_a_replacement_pod_holds_its_running_pods_and_queues_the_new_one(api, tmp_path):
    node(api, "n0", gpus=8)
    namespace(api, "research", {QUEUE_LABEL: "vision"})
    gated_job(api, "research", "train", pods=3, gpus=2, running_on="n0", running=2)  # the third: a replacement
    states = states_of(connect(api, tmp_path).snapshot())
    assert states["research/train~held"].phase == WorkloadPhase.RUNNING
    assert len(states["research/train~held"].placements) == 4
    queued = states["research/train"]
    assert (queued.phase, queued.workload.gang_size) == (WorkloadPhase.PENDING, 1)


def test_nodes_mig_time_sliced_and_topology_from_configured_labels(api, tmp_path):
    api.add(CORE, "nodes", {"metadata": {"name": "mixed", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "4", "rack.example/leaf": "leaf-7",
        "nvidia.com/gpu.clique": "clique-1", "gpuwarden.io/pool": "h100"}},
        "status": {"capacity": {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "6",
                                "cpu": "96", "memory": "1Ti"}}})
    api.add(CORE, "nodes", {"metadata": {"name": "sliced", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "2",
        "topology.kubernetes.io/zone": "zone-b"}},
        "status": {"capacity": {"nvidia.com/gpu.shared": "8", "cpu": "64", "memory": "512Gi"}}})
    node(api, "plain", gpus=8, labels={"gpuwarden.io/pool": "h100"})
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    gpu_pod(api, "ml", "slice", 1, resource="nvidia.com/gpu.shared")
    gpu_pod(api, "ml", "slice-running", 1, resource="nvidia.com/gpu.shared", gates=(), node_name="sliced", phase="Running")
    gpu_pod(api, "ml", "mig", 1, resource="nvidia.com/mig-3g.40gb")
    gpu_pod(api, "ml", "whole", 2)
    gpu_pod(api, "ml", "two-shares", 2, resource="nvidia.com/gpu.shared")

    cluster = connect(api, tmp_path, labels=NodeLabels(leaf_switch="rack.example/leaf"))
    snapshot = cluster.snapshot()
    nodes = {n.name: n for n in snapshot.nodes}
    mixed, sliced = nodes["mixed"], nodes["sliced"]
    assert (mixed.gpu_count, mixed.shares_gpus, mixed.topology.leaf_switch, mixed.topology.nvlink_domain) == \
        (4, False, "leaf-7", "clique-1")
    gpus = sorted((g for g in snapshot.gpus if g.node == "mixed"), key=lambda g: g.index)
    assert [g.mig_enabled for g in gpus] == [False, False, True, True]  # the 2 whole GPUs, then the MIG ones
    layouts = [[i.profile for i in g.mig_instances] for g in gpus[2:]]
    assert sorted(p for layout in layouts for p in layout) == ["1g.10gb"] * 6 + ["3g.40gb"] * 2
    for layout in layouts:  # each GPU holds a layout NVIDIA allows (compute and memory slices)
        assert all(fits("NVIDIA-H100-80GB-HBM3", layout[:i], p) for i, p in enumerate(layout))
    assert (sliced.gpu_count, sliced.shares_gpus, sliced.pool, sliced.topology.leaf_switch) == \
        (2, True, "NVIDIA-A100-SXM4-40GB/time-sliced", "zone-b")
    states = states_of(snapshot)
    assert states["ml/slice"].workload.gpus.fraction_milli == 250  # 1000 // 4 replicas
    assert states["ml/slice"].workload.pools == ("NVIDIA-A100-SXM4-40GB/time-sliced",)
    assert states["ml/whole"].workload.pools == ("h100",)  # whole-GPU pods stay off time-sliced nodes
    assert states["ml/mig"].workload.gpus.mig_profile == "3g.40gb"
    assert [p.gpu_uuid for p in states["ml/slice-running"].placements] == ["sliced/gpu-0"]
    assert "one share per pod is supported" in cluster.inventory.refused["ml/two-shares"]

    from gpuwarden.scheduling.planner import plan
    binds = {a.target: a.params["placements"] for a in plan(snapshot).actions if a.kind == ActionKind.BIND}
    assert {p["node"] for p in binds["ml/slice"]} == {"sliced"}
    assert {p["node"] for p in binds["ml/mig"]} == {"mixed"} and binds["ml/mig"][0]["mig_profile"] == "3g.40gb"
    assert {p["node"] for p in binds["ml/whole"]} <= {"mixed", "plain"}


# -- BIND -------------------------------------------------------------------------------------------

def test_bind_sends_one_patch_per_pod_that_removes_only_our_gate_and_narrows_affinity(api, tmp_path):
    node(api, "n0")
    node(api, "n1")
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    own_term = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
    for i in range(2):
        gpu_pod(api, "ml", f"g-{i}", 8, labels={GANG_LABEL: "g", GANG_SIZE_LABEL: "2"},
                gates=("example.com/quota", ADMISSION_GATE),
                affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [own_term]}}} if i == 0 else None)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    versions = [api.get(CORE, "pods", f"g-{i}", "ml")["metadata"]["resourceVersion"] for i in range(2)]
    placements = tuple({"node": n, "gpu_uuid": f"{n}/gpu-{g}", "milli": 1000} for n in ("n1", "n0") for g in range(8))
    result = cluster.apply(Action(ActionKind.BIND, "ml/g", "test", {"placements": placements}))
    assert result.ok, result.message
    patches = api.calls("PATCH", "/pods/")
    assert [p.path.rsplit("/", 1)[1] for p in patches] == ["g-0", "g-1"]
    assert all(p.content_type == "application/merge-patch+json" for p in patches)
    assert patches[0].body == {
        "metadata": {"resourceVersion": versions[0],
                     "annotations": {ADMITTED_NODE_ANNOTATION: "n1", ADMITTED_AT_ANNOTATION: ISO}},
        "spec": {"schedulingGates": [{"name": "example.com/quota"}],
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                     {**own_term, "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}}
    assert patches[1].body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == \
        {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]}
    stored = api.get(CORE, "pods", "g-1", "ml")
    assert stored["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    assert len([r for r in api.requests if r.method != "GET"]) == 2  # no read before each write


def test_a_gang_with_a_pod_missing_is_not_admitted_at_all(api, tmp_path):
    node(api, "n0")
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    for i in range(2):
        gpu_pod(api, "ml", f"g-{i}", 1, labels={GANG_LABEL: "g", GANG_SIZE_LABEL: "3"})
    cluster = connect(api, tmp_path)
    assert states_of(cluster.snapshot())["ml/g"].workload.gang_size == 3
    placements = tuple({"node": "n0", "gpu_uuid": f"n0/gpu-{g}", "milli": 1000} for g in range(3))
    result = cluster.apply(Action(ActionKind.BIND, "ml/g", "test", {"placements": placements}))
    assert not result.ok and result.temporary
    assert "2 of its 3 pod(s) are present and gated: none admitted" in result.message
    assert api.calls("PATCH") == []


def test_a_failure_midway_names_the_pods_admitted_and_a_conflict_rereads_one_pod(api, tmp_path):
    node(api, "n0")
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    gated_job(api, "ml", "train", pods=3, gpus=1)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    api.inject("PATCH", "/pods/train-0$", 409)  # changed since the snapshot: re-read, then admitted
    api.inject("PATCH", "/pods/train-2$", 422)
    placements = tuple({"node": "n0", "gpu_uuid": f"n0/gpu-{g}", "milli": 1000} for g in range(3))
    result = cluster.apply(Action(ActionKind.BIND, "ml/train", "test", {"placements": placements}))
    assert not result.ok and not result.temporary
    assert "admitted before the failure: train-0, train-1; still gated: train-2" in result.message
    assert len(api.calls("GET", "/pods/train-0$")) == 1 and len(api.calls("PATCH", "/pods/train-0$")) == 2
    assert "schedulingGates" not in api.get(CORE, "pods", "train-1", "ml")["spec"]
    assert api.get(CORE, "pods", "train-2", "ml")["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]


# -- resume, suspend, queue visibility ------------------------------------------------------------

def test_resume_in_a_queue_namespace_only_unsuspends_and_suspend_says_who(api, tmp_path):
    node(api, "n0")
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    template = {"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    api.add(BATCH, "jobs", {"metadata": {"name": "held", "namespace": "ml",
                                         "annotations": {SUSPENDED_BY_ANNOTATION: "scheduler"}},
                            "spec": {"suspend": True, "parallelism": 1, "template": template}})
    gated_job(api, "ml", "run", pods=1)
    cluster = connect(api, tmp_path)
    assert states_of(cluster.snapshot())["ml/held"].annotations[SUSPENDED_BY_ANNOTATION] == "scheduler"
    placements = ({"node": "n0", "gpu_uuid": "n0/gpu-0", "milli": 1000},)
    assert cluster.apply(Action(ActionKind.RESUME, "ml/held", "test", {"placements": placements})).ok
    # unsuspended, and the planned node held for its pods until they are admitted there
    assert api.calls("PATCH", "/jobs/held$")[-1].body == {
        "metadata": {"annotations": {SUSPENDED_BY_ANNOTATION: None, RESERVED_NODES_ANNOTATION: "n0",
                                     RESERVED_AT_ANNOTATION: "2026-11-30T12:00:00Z"}}, "spec": {"suspend": False}}
    held = states_of(cluster.snapshot())["ml/held"]  # no pod yet: the GPU is held, nothing to admit
    assert (held.phase, [p.node for p in held.placements], held.reserved) == (WorkloadPhase.RUNNING, ["n0"], ())
    gpu_pod(api, "ml", "held-abc", owner="held")  # the Job controller makes it, gated
    held = states_of(cluster.snapshot())["ml/held"]
    assert [p.node for p in held.reserved] == ["n0"]
    (admit,) = [r for r in SchedulingRound(cluster).run_round() if r.action.params.get("reserved")]
    assert admit.ok and api.get(CORE, "pods", "held-abc", "ml")["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION] == "n0"
    assert cluster.apply(Action(ActionKind.SUSPEND, "ml/run", "test", {"by": "idle-reclaim"})).ok
    assert api.calls("PATCH", "/jobs/run$")[-1].body == {
        "metadata": {"annotations": {SUSPENDED_BY_ANNOTATION: "idle-reclaim"}}, "spec": {"suspend": True}}
    cluster.snapshot()  # a suspend drops a reservation
    assert cluster.apply(Action(ActionKind.SUSPEND, "ml/held", "test", {"by": "scheduler"})).ok
    assert api.calls("PATCH", "/jobs/held$")[-1].body["metadata"]["annotations"] == {
        SUSPENDED_BY_ANNOTATION: "scheduler", RESERVED_NODES_ANNOTATION: None, RESERVED_AT_ANNOTATION: None}


def test_queue_annotations_patch_only_what_changed_and_events_go_to_the_job(api, tmp_path):
    node(api, "n0")
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    gated_job(api, "ml", "train", pods=2)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    assert cluster.annotate_workload("ml/train", {QUEUE_POSITION_ANNOTATION: "3"}) == 3  # two pods and the Job
    assert api.get(BATCH, "jobs", "train", "ml")["metadata"]["annotations"][QUEUE_POSITION_ANNOTATION] == "3"
    assert api.get(CORE, "pods", "train-1", "ml")["metadata"]["annotations"][QUEUE_POSITION_ANNOTATION] == "3"
    assert cluster.annotate_workload("ml/train", {QUEUE_POSITION_ANNOTATION: "3"}) == 0  # unchanged: no request
    cluster.snapshot()
    assert cluster.annotate_workload("ml/train", {QUEUE_POSITION_ANNOTATION: "3"}) == 0  # as read back
    assert cluster.annotate_workload("ml/train", {QUEUE_POSITION_ANNOTATION: None}) == 3
    assert QUEUE_POSITION_ANNOTATION not in api.get(CORE, "pods", "train-0", "ml")["metadata"]["annotations"]
    assert cluster.record_workload_event("ml/train", "Queued", "position 3: team ml at its guarantee") == 1
    (event,) = api.store[(CORE, "events")].values()
    assert (event["involvedObject"]["kind"], event["involvedObject"]["name"], event["reason"]) == ("Job", "train", "Queued")


# -- the scheduling round on a live cluster -------------------------------------------------------

def test_a_scheduling_round_admits_the_queue_in_policy_order_onto_the_planned_nodes(api, tmp_path):
    node(api, "n0", gpus=8, labels={"gpuwarden.io/leaf-switch": "leaf-a"})
    node(api, "n1", gpus=8, labels={"gpuwarden.io/leaf-switch": "leaf-b"})
    namespace(api, "ml", {QUEUE_LABEL: "ml"}, {"gpuwarden.io/guaranteed-gpus": "16"})
    for name, value in (("low", 100), ("high", 1000), ("critical", 10000)):
        api.add(SCHEDULING, "priorityclasses", {"metadata": {"name": name}, "value": value})
    gated_job(api, "ml", "low", pods=1, gpus=8, priority="low", created="2026-11-30T10:00:00Z")
    gated_job(api, "ml", "gang", pods=2, gpus=4, priority="high", created="2026-11-30T11:00:00Z")
    gated_job(api, "ml", "urgent", pods=1, gpus=8, priority="critical", created="2026-11-30T11:30:00Z")
    cluster = connect(api, tmp_path)
    results = SchedulingRound(cluster).run_round()
    admitted = [r.action.target for r in results if r.action.kind == ActionKind.BIND and r.ok]
    assert admitted == ["ml/urgent", "ml/gang"]  # by priority; 16 GPUs leave the low one waiting
    pins = {}
    for pod_name in ("urgent-0", "gang-0", "gang-1"):
        pod = api.get(CORE, "pods", pod_name, "ml")
        assert "schedulingGates" not in pod["spec"]
        (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        pins[pod_name] = term["matchFields"][0]["values"][0]
        assert pod["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION] == pins[pod_name]
    assert pins["gang-0"] == pins["gang-1"] != pins["urgent-0"]  # the gang under one leaf switch, on one node
    assert api.get(CORE, "pods", "low-0", "ml")["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]
    # Next round: admitted pods hold their nodes until bound, so nothing more is admitted.
    results = SchedulingRound(cluster).run_round()
    assert [r.action.kind for r in results if r.action.kind == ActionKind.BIND] == []
    states = states_of(cluster.snapshot())
    assert states["ml/gang"].phase == WorkloadPhase.RUNNING and states["ml/low"].phase == WorkloadPhase.PENDING
    again = cluster.apply(Action(ActionKind.BIND, "ml/gang", "test", {"placements": (
        {"node": "n0", "gpu_uuid": "n0/gpu-0", "milli": 1000},) * 8}))
    assert not again.ok and "nothing to admit" in again.message


def test_bad_input_is_named_and_never_stops_the_snapshot(api, tmp_path, caplog):
    node(api, "n0")
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    gated_job(api, "ml", "train", pods=1, annotations={PRIORITY_CLASS_ANNOTATION: "urgent"})
    gpu_pod(api, "ml", "slice", 1, resource="nvidia.com/gpu.shared")  # no node shares its GPUs
    gpu_pod(api, "ml", "g-0", 1, labels={GANG_LABEL: "g", GANG_SIZE_LABEL: "many"})
    cluster = connect(api, tmp_path)
    with caplog.at_level("WARNING", logger="gpuwarden.kube"):
        states = states_of(cluster.snapshot())
    assert set(states) == {"ml/train"} and states["ml/train"].priority_override is None
    assert "annotation gpuwarden.io/priority-class='urgent' is not one of: best-effort, low, normal, high, critical" \
        in caplog.text
    assert "no node offers time-sliced GPUs" in cluster.inventory.refused["ml/slice"]
    assert "label gpuwarden.io/gang-size='many' is not a whole number" in cluster.inventory.refused["ml/g"]
    assert cluster.record_workload_event("ml/nothing", "Queued", "x") == 0  # not in the snapshot: logged, not raised
