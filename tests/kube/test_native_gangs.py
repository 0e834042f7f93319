"""Native gangs from the Workload / PodGroup API (KEP-4671, ``scheduling.k8s.io``): the pure mapping
of a pod's reference to its gang (:mod:`gpuwarden.kube.podgroups`, :mod:`gpuwarden.kube.inventory_membership`),
then through HTTP with the official client on the fake API server (``tests/fake_kube_api.py``)."""

from __future__ import annotations

import logging

import pytest
from fake_kube_api import CORE, KUEUE, FakeKubeAPI
from kube_fleet import NOW, connect, gpu_pod, namespace, node

from gpuwarden.fleet import ActionKind, WorkloadPhase
from gpuwarden.kube import KubeApi, load_client
from gpuwarden.kube import podgroups as podgroups_module
from gpuwarden.kube.gates import GANG_LABEL, GANG_SIZE_LABEL, QUEUE_LABEL
from gpuwarden.kube.inventory_membership import membership
from gpuwarden.kube.inventory_model import Inventory
from gpuwarden.kube.inventory_workloads import WorkloadReader
from gpuwarden.kube.podgroups import GroupPolicy, NativeGang, PodGroups, pod_gang, read_pod_groups
from gpuwarden.scheduler.scheduling_round import SchedulingRound

V1ALPHA1 = "apis/scheduling.k8s.io/v1alpha1"
V1ALPHA2 = "apis/scheduling.k8s.io/v1alpha2"
V1BETA1 = "apis/scheduling.k8s.io/v1beta1"
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "controller": True}


def pod_group(name: str, ns: str = "ml", policy: object = None, owners: list | None = None, **meta) -> dict:
    """A PodGroup (v1alpha2 and later): a gang of ``policy`` (a minCount) or ``{"basic": {}}``."""
    policy = {"gang": {"minCount": policy}} if isinstance(policy, int) else policy
    return {"metadata": {"name": name, "namespace": ns, "ownerReferences": owners or [], **meta},
            "spec": {"schedulingPolicy": policy or {"basic": {}}}}


def workload(name: str, groups: list, ns: str = "ml", controller: tuple | None = None, **meta) -> dict:
    """A v1alpha1 Workload: ``groups`` of (pod group name, minCount or None for basic)."""
    spec: dict = {"podGroups": [{"name": g, "policy": {"gang": {"minCount": n}} if n else {"basic": {}}}
                                for g, n in groups]}
    if controller:
        spec["controllerRef"] = {"apiGroup": "batch", "kind": controller[0], "name": controller[1]}
    return {"metadata": {"name": name, "namespace": ns, **meta}, "spec": spec}


def a_pod(name: str, ns: str = "ml", group: str | None = None, ref: dict | None = None, job: str | None = None,
          labels: dict | None = None) -> dict:
    """A pod as listed: its ``spec.schedulingGroup.podGroupName`` (``group``) or ``spec.workloadRef`` (``ref``)."""
    meta: dict = {"name": name, "namespace": ns, "labels": labels or {}}
    if job:
        meta["ownerReferences"] = [{**JOB_OWNER, "name": job, "uid": f"uid-{job}"}]
    spec: dict = {}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    if ref is not None:
        spec["workloadRef"] = ref
    return {"metadata": meta, "spec": spec}


def groups_of(version: str, *items: dict) -> PodGroups:
    found = PodGroups(version=f"scheduling.k8s.io/{version}")
    for item in items:
        found.add("workloads" if version == "v1alpha1" else "podgroups", item)
    return found


# -- the pure mapping -------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["v1alpha2", "v1alpha3", "v1beta1"])
def test_a_pod_group_with_a_gang_policy_is_a_gang_of_its_min_count(version):
    groups = groups_of(version, pod_group("trainers", policy=4), pod_group("web", policy={"basic": {}}))
    assert pod_gang(a_pod("t-0", group="trainers"), groups) == NativeGang("podgroup:trainers", 4)
    assert pod_gang(a_pod("w-0", group="web"), groups) is None  # the basic policy is no gang
    assert pod_gang(a_pod("plain"), groups) is None  # no reference
    assert pod_gang(a_pod("t-0", group="trainers"), None) is None  # PodGroups not read: as before
    member = membership(a_pod("t-0", group="trainers", job="j1"), groups)  # several Jobs may share it
    assert (member.controller, member.name, member.gang) == ("PodGroup", "podgroup:trainers", ("podgroup:trainers", 4))
    basic = membership(a_pod("w-0", group="web", job="web-job"), groups)
    assert (basic.controller, basic.name, basic.gang) == ("Job", "web-job", None)


def test_a_v1alpha1_workload_pod_group_is_a_gang_and_each_replica_key_a_gang_of_its_own():
    groups = groups_of("v1alpha1", workload("train", [("driver", None), ("workers", 2)], controller=("Job", "train")))
    workers = {"name": "train", "podGroup": "workers"}
    assert pod_gang(a_pod("w", ref=workers), groups) == NativeGang("workload:train:workers", 2, owner=("Job", "train"))
    assert pod_gang(a_pod("d", ref={"name": "train", "podGroup": "driver"}), groups) is None  # basic
    names = {membership(a_pod(f"w-{k}-{i}", ref={**workers, "podGroupReplicaKey": k}, job="train"), groups).name
             for k in "01" for i in range(2)}
    assert names == {"workload:train:workers:0", "workload:train:workers:1"}  # two gangs of 2, not one of 4
    # no replica key, and the Workload's controller is the pod's own: the workload stays the Job's
    member = membership(a_pod("w-0", ref=workers, job="train"), groups)
    assert (member.controller, member.name, member.gang) == ("Job", "train", ("workload:train:workers", 2))


def test_the_job_controllers_pod_group_keeps_the_job_as_the_workload_and_outranks_the_gang_label():
    owned = pod_group("train-wl-main-7f2", policy=2, owners=[{**JOB_OWNER, "name": "train", "uid": "uid-train"}])
    groups = groups_of("v1alpha2", owned, pod_group("shared", policy=8))
    member = membership(a_pod("train-0", group="train-wl-main-7f2", job="train"), groups)
    assert (member.controller, member.name, member.gang) == ("Job", "train", ("podgroup:train-wl-main-7f2", 2))
    other = membership(a_pod("x-0", group="train-wl-main-7f2", job="other"), groups)  # not its controller's pod
    assert (other.controller, other.name) == ("PodGroup", "podgroup:train-wl-main-7f2")
    labelled = membership(a_pod("s-0", group="shared", labels={GANG_LABEL: "mine", GANG_SIZE_LABEL: "3"}), groups)
    assert (labelled.controller, labelled.name, labelled.gang) == ("PodGroup", "podgroup:shared", ("podgroup:shared", 8))
    js = membership(a_pod("js-0", group="train-wl-main-7f2", job="train",
                          labels={"jobset.sigs.k8s.io/jobset-name": "js"}), groups)
    assert (js.controller, js.name) == ("JobSet", "js")  # a JobSet's Job's own group: the JobSet, as before


@pytest.mark.parametrize("marks", [
    {"ownerReferences": [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "name": "job-train-1a2b",
                          "uid": "u", "controller": True}]},
    {"labels": {"kueue.x-k8s.io/queue-name": "main"}},
    {"annotations": {"kueue.x-k8s.io/workload": "job-train-1a2b"}},
])
def test_a_pod_group_kueue_made_is_left_to_kueue(marks):
    item = pod_group("kq", policy=4)
    item["metadata"].update(marks)
    groups = groups_of("v1beta1", item)
    owner = ("Workload", "job-train-1a2b") if "ownerReferences" in marks else None
    assert groups.groups[("ml", "kq")] == GroupPolicy(4, owner, kueue=True)
    gang = pod_gang(a_pod("k-0", group="kq"), groups)
    assert gang is not None and gang.kueue and gang.min_count == 4
    member = membership(a_pod("k-0", group="kq", job="train"), groups)
    assert (member.controller, member.name, member.gang, member.problem) == ("Job", "train", None, None)


def test_objects_of_the_wrong_type_are_skipped_counted_and_said_and_the_rest_read(caplog):
    bad = [
        pod_group("count-text", policy={"gang": {"minCount": "4"}}),
        pod_group("count-zero", policy=0),
        pod_group("both", policy={"basic": {}, "gang": {"minCount": 2}}),
        pod_group("neither", policy={"gang": None}),
        {"metadata": {"name": "spec-text", "namespace": "ml"}, "spec": "gang of 4"},
        pod_group("owners-text", policy=2, owners=["Job/train"]),
        pod_group("labels-list", policy=2, labels=["kueue"]),
    ]
    with caplog.at_level(logging.WARNING, logger="gpuwarden.kube"):
        groups = groups_of("v1alpha2", *bad, pod_group("fine", policy=3))
    assert groups.skipped == len(bad) and set(groups.groups) == {("ml", "fine")}
    assert "minCount is '4', not a whole number >= 1" in groups.bad[("ml", "count-text")]
    assert "sets basic and gang; exactly one must be set" in groups.bad[("ml", "both")]
    assert "podgroups.scheduling.k8s.io ml/spec-text skipped" in caplog.text
    gang = pod_gang(a_pod("c-0", group="count-text"), groups)
    assert gang is not None and gang.name == "podgroup:count-text" and "was skipped" in (gang.problem or "")
    assert pod_gang(a_pod("f-0", group="fine"), groups) == NativeGang("podgroup:fine", 3)
    v1 = groups_of("v1alpha1", {"metadata": {"name": "w", "namespace": "ml"}, "spec": {"podGroups": {"workers": 2}}},
                   workload("ok", [("workers", 2)]))
    assert v1.skipped == 1 and "spec.podGroups is dict, not a list" in v1.bad[("ml", "w")]
    assert "ml/w was skipped" in (pod_gang(a_pod("p", ref={"name": "w", "podGroup": "workers"}), v1).problem or "")


def test_a_reference_that_cannot_be_resolved_is_a_problem_never_a_guess():
    groups = groups_of("v1alpha2", pod_group("there", policy=2))
    missing = pod_gang(a_pod("m-0", group="absent"), groups)
    assert missing is not None and missing.name == "podgroup:absent"
    assert missing.problem == "PodGroup ml/absent does not exist (kube-scheduler holds its pods until it does)"
    none_served = pod_gang(a_pod("m-0", group="there"), PodGroups())
    assert "serves no v1beta1/v1alpha3/v1alpha2 PodGroups of scheduling.k8s.io" in (none_served.problem or "")
    forbidden = pod_gang(a_pod("m-0", group="there"), PodGroups(forbidden="forbidden: the service account lacks ..."))
    assert "cannot be read: forbidden: the service account lacks" in (forbidden.problem or "")
    v1 = groups_of("v1alpha1", workload("w", [("workers", 2)]))
    group_missing = pod_gang(a_pod("p", ref={"name": "w", "podGroup": "ps"}), v1)
    assert "pod group 'ps' of Workload ml/w does not exist" in (group_missing.problem or "")
    odd = membership(a_pod("odd", job="j", ref={"name": 7, "podGroup": "workers"}), v1)
    assert (odd.controller, odd.name) == ("Job", "j") and "spec.workloadRef is" in (odd.problem or "")
    odd = membership({"metadata": {"name": "odd", "namespace": "ml"}, "spec": {"schedulingGroup": "trainers"}}, groups)
    assert (odd.controller, odd.name) == ("Pod", "odd") and "no podGroupName" in (odd.problem or "")


# -- through HTTP with the official client ---------------------------------------------------------

@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def kube_api(api, tmp_path) -> KubeApi:
    return KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), backoff_seconds=0.01, max_backoff_seconds=0.05)


def gang_pods(api, ns: str, prefix: str, count: int, spec: dict, gpus: int = 1, owner: str | None = None) -> None:
    """``count`` gated GPU pods carrying ``spec`` (their reference to a pod group)."""
    for i in range(count):
        gpu_pod(api, ns, f"{prefix}-{i}", gpus, owner=owner)
        stored = api.get(CORE, "pods", f"{prefix}-{i}", ns)
        stored["spec"].update(spec)
        api.add(CORE, "pods", stored)


def reader_states(api, tmp_path, groups: PodGroups, queue: str = "ml") -> tuple[dict, Inventory]:
    inventory = Inventory(queue_namespaces={queue})
    reader = WorkloadReader(inventory, NOW, 300.0, pod_groups=groups)
    client = kube_api(api, tmp_path)
    for pod in client.list_all(client.core.list_pod_for_all_namespaces, resource="pods"):
        reader.add_pod(pod)
    for job in client.list_all(client.batch.list_job_for_all_namespaces, resource="jobs"):
        reader.add_job(job)
    return {s.workload.key: s for s in reader.build({queue: queue}, {}, lambda group: None)}, inventory


def test_read_pod_groups_lists_the_newest_served_version_page_by_page(api, tmp_path):
    for i in range(5):
        api.add(V1ALPHA2, "podgroups", pod_group(f"g{i}", ns=f"ns{i % 2}", policy=i + 1))
    groups = read_pod_groups(kube_api(api, tmp_path), page_size=2)
    assert groups.version == "scheduling.k8s.io/v1alpha2" and groups.skipped == 0
    assert groups.groups[("ns1", "g3")] == GroupPolicy(4)
    paths = [r.path for r in api.requests]
    assert paths[:2] == ["/apis/scheduling.k8s.io/v1beta1/podgroups", "/apis/scheduling.k8s.io/v1alpha3/podgroups"]
    assert paths[2:] == ["/apis/scheduling.k8s.io/v1alpha2/podgroups"] * 3  # 5 items, 2 a page; v1alpha1 not asked
    assert all(r.query["limit"] == "2" for r in api.requests)


def test_v1alpha1_workloads_live_beside_kueues_workloads_of_the_same_plural(api, tmp_path):
    api.with_kueue()
    api.add(KUEUE, "workloads", {"metadata": {"name": "job-train-1a2b", "namespace": "ml"}, "spec": {"active": True}})
    api.add(V1ALPHA1, "workloads", workload("train", [("workers", 4)]))
    groups = read_pod_groups(kube_api(api, tmp_path))
    assert groups.version == "scheduling.k8s.io/v1alpha1" and set(groups.workloads) == {("ml", "train")}
    client = kube_api(api, tmp_path)
    kueue = client.list_all(client.custom.list_cluster_custom_object, "kueue.x-k8s.io", "v1beta1", "workloads",
                            resource="workloads.kueue.x-k8s.io")
    assert [w["metadata"]["name"] for w in kueue] == ["job-train-1a2b"]


def test_no_api_served_is_no_native_gangs_and_a_403_is_logged_once(api, tmp_path, caplog):
    groups = read_pod_groups(kube_api(api, tmp_path))
    assert (groups.version, groups.forbidden, groups.groups) == (None, None, {})
    assert len(api.requests) == 4  # each version tried once: all 404
    podgroups_module._TOLD.clear()
    with caplog.at_level(logging.WARNING, logger="gpuwarden.kube"):
        for _ in range(2):
            api.inject("GET", "/apis/scheduling.k8s.io/", 403, times=4)
            forbidden = read_pod_groups(kube_api(api, tmp_path))
    assert forbidden.version is None and "podgroups.scheduling.k8s.io" in (forbidden.forbidden or "")
    assert caplog.text.count("native gangs: forbidden") == 1


def test_a_workload_reader_given_pod_groups_makes_4_gated_pods_one_gang_needing_4(api, tmp_path):
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    api.add(V1BETA1, "podgroups", pod_group("trainers", policy=4))
    for job in ("a", "b"):  # two Jobs of one PodGroup
        gang_pods(api, "ml", f"trainer-{job}", 2, {"schedulingGroup": {"podGroupName": "trainers"}}, gpus=2, owner=job)
    gang_pods(api, "ml", "partial", 3, {"schedulingGroup": {"podGroupName": "four"}})  # 3 of a gang of 4 so far
    api.add(V1BETA1, "podgroups", pod_group("four", policy=4))
    gang_pods(api, "ml", "orphan", 2, {"schedulingGroup": {"podGroupName": "not-yet"}})  # its PodGroup not made yet
    groups = read_pod_groups(kube_api(api, tmp_path))
    states, inventory = reader_states(api, tmp_path, groups)
    gang = states["ml/podgroup:trainers"]
    assert (gang.phase, gang.workload.gang_size, gang.workload.gpus.count, gang.controller) == (
        WorkloadPhase.PENDING, 4, 2, "PodGroup")
    assert sorted(gang.pods) == ["trainer-a-0", "trainer-a-1", "trainer-b-0", "trainer-b-1"]
    assert [p.name for p in inventory.gated["ml/podgroup:trainers"]] == sorted(gang.pods)
    assert states["ml/podgroup:four"].workload.gang_size == 4  # pending whole: BIND waits for the 4th
    assert "ml/podgroup:not-yet" not in states
    assert "PodGroup ml/not-yet does not exist" in inventory.refused["ml/podgroup:not-yet"]
    # without PodGroups (not wired): as before, one workload per Job owner
    before, _ = reader_states(api, tmp_path, None)
    assert {"ml/a", "ml/b"} <= set(before) and before["ml/a"].workload.gang_size == 2


def test_the_job_controllers_pod_group_sizes_the_jobs_gang_and_a_bound_pod_keeps_its_gpus(api, tmp_path):
    namespace(api, "ml", {QUEUE_LABEL: "ml"})
    api.add("apis/batch/v1", "jobs", {"metadata": {"name": "elastic", "namespace": "ml"},
                                      "spec": {"parallelism": 4, "template": {"spec": {}}}, "status": {}})
    api.add(V1ALPHA2, "podgroups", pod_group("elastic-wl-main-x1", policy=2,
                                             owners=[{**JOB_OWNER, "name": "elastic", "uid": "uid-elastic"}]))
    gang_pods(api, "ml", "elastic", 4, {"schedulingGroup": {"podGroupName": "elastic-wl-main-x1"}}, owner="elastic")
    gpu_pod(api, "ml", "runner", 1, gates=(), node_name="n0", phase="Running")  # bound; its PodGroup is gone
    stored = api.get(CORE, "pods", "runner", "ml")
    stored["spec"]["schedulingGroup"] = {"podGroupName": "deleted"}
    api.add(CORE, "pods", stored)
    states, inventory = reader_states(api, tmp_path, read_pod_groups(kube_api(api, tmp_path)))
    job = states["ml/elastic"]
    assert (job.controller, job.workload.gang_size) == ("Job", 2)  # minCount 2, not parallelism 4
    assert states["ml/podgroup:deleted"].phase == WorkloadPhase.RUNNING  # still holds its GPU
    assert "ml/podgroup:deleted" not in inventory.refused


def test_read_snapshot_and_the_round_admit_a_pod_group_gang_whole(api, tmp_path):
    node(api, "n0", gpus=8)
    namespace(api, "ml", {QUEUE_LABEL: "ml"}, {"gpuwarden.io/guaranteed-gpus": "8"})
    api.add(V1ALPHA2, "podgroups", pod_group("trainers", policy=4))
    gang_pods(api, "ml", "trainer", 4, {"schedulingGroup": {"podGroupName": "trainers"}}, gpus=2)
    cluster = connect(api, tmp_path)
    gang = {s.workload.key: s for s in cluster.snapshot().workloads}["ml/podgroup:trainers"]
    assert (gang.phase, gang.workload.gang_size, gang.controller) == (WorkloadPhase.PENDING, 4, "PodGroup")
    results = SchedulingRound(cluster).run_round()
    assert [(r.ok, r.action.kind, r.action.target) for r in results] == [(True, ActionKind.BIND, "ml/podgroup:trainers")]
    assert all(not api.get(CORE, "pods", f"trainer-{i}", "ml")["spec"].get("schedulingGates") for i in range(4))
