"""The Kubernetes inventory reads GPUs allocated by Dynamic Resource Allocation (issue 34 items 1, 3
and 7's inventory half, and its "Bad input"). Through HTTP: the official client, unmodified, lists
``resource.k8s.io/v1`` from the fake API server (``tests/fake_kube_api.py`` with ``with_dra()``;
the objects as NVIDIA's DRA driver and kube-scheduler write them: ``tests/fake_kube_dra.py``)."""

from __future__ import annotations

import pytest
from fake_kube_api import BATCH, DEFAULT_RESOURCES, RESOURCE, FakeKubeAPI
from fake_kube_dra import (A100, claim, claim_pod, claim_template, dra_node, gpu_device, gpu_slice, mig_device,
                           nvidia_classes, request, resource_slice)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kube_fleet import connect, namespace, node, pod

from gpuwarden.fleet import GpuRequest, WorkloadPhase


@pytest.fixture(scope="module")
def server():
    """One server for the module (each stop waits out its poll); every test starts it empty."""
    running = FakeKubeAPI().start()
    yield running
    running.stop()


def _fresh(server: FakeKubeAPI, dra: bool = True) -> FakeKubeAPI:
    server.store.clear()
    server.requests.clear()
    server.faults.clear()
    server.resources = set(DEFAULT_RESOURCES)
    return server.with_dra() if dra else server


@pytest.fixture
def api(server):
    return _fresh(server)


def _fleet(api: FakeKubeAPI) -> None:
    """A DRA-only H100 pool, an A100 with MIG published through DRA, a device-plugin node and a node
    running both (the same 8 GPUs seen twice)."""
    nvidia_classes(api)
    namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "16"})
    for name in ("dra-0", "dra-1"):
        dra_node(api, name)
        gpu_slice(api, name)
    dra_node(api, "mig-0", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    resource_slice(api, "mig-0", [mig_device("mig-0", 0, "3g.40gb", 0), mig_device("mig-0", 0, "3g.40gb", 4),
                                  mig_device("mig-0", 0, "1g.10gb", 3), gpu_device("mig-0", 1, A100)])
    node(api, "dp-0")  # the device plugin's: nvidia.com/gpu 8
    dra_node(api, "both-0", labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, allocatable_gpus=8)
    gpu_slice(api, "both-0")


def _states(snapshot):
    return {f"{w.workload.namespace}/{w.workload.name}": w for w in snapshot.workloads}


def test_dra_nodes_and_claims_are_one_fleet_with_the_device_plugin(api, tmp_path):
    _fleet(api)
    claim(api, "ml", "train-0-gpus", [request("gpus", "gpu.nvidia.com", 2)], [("dra-0", "gpu-2"), ("dra-0", "gpu-3")],
          reserved_for=["train-0"])
    claim_pod(api, "ml", "train-0", "dra-0", claims={"gpus": "train-0-gpus"}, owner="train")
    claim(api, "ml", "infer-mig-x7", [request("mig", "mig-1g.10gb.gpu.nvidia.com")],
          [("mig-0", "gpu-0-mig-1g10gb-19-3")], reserved_for=["infer"])
    claim_pod(api, "ml", "infer", "mig-0", templates={"mig": "one-mig>infer-mig-x7"})
    pod(api, "ml", "plugin", "dp-0", 1)
    # a node with the device plugin and the DRA driver: a pod of each on the same 8 GPUs
    claim(api, "ml", "dra-pod-gpus", [request("gpus", "gpu.nvidia.com", 2)], [("both-0", "gpu-0"), ("both-0", "gpu-1")],
          reserved_for=["dra-pod"])
    claim_pod(api, "ml", "dra-pod", "both-0", claims={"gpus": "dra-pod-gpus"})
    pod(api, "ml", "plugin-pod", "both-0", 2)
    cluster = connect(api, tmp_path)
    snapshot = cluster.snapshot()

    nodes = {n.name: n for n in snapshot.nodes}
    assert {name: n.gpu_count for name, n in nodes.items()} == {"dra-0": 8, "dra-1": 8, "mig-0": 2, "dp-0": 8,
                                                                  "both-0": 8}  # never 16: one source per node
    # the published product through the catalogue, as GPU feature discovery labels it: one pool with dp-0
    assert nodes["dra-0"].gpu_model == nodes["dp-0"].gpu_model == "NVIDIA-H100-80GB-HBM3"
    assert nodes["dra-0"].pool == nodes["dp-0"].pool
    mig0 = [g for g in snapshot.gpus if g.node == "mig-0"]
    assert [g.uuid for g in mig0] == ["mig-0/gpu-0", "mig-0/gpu-1"]
    assert mig0[0].mig_enabled and sorted(i.profile for i in mig0[0].mig_instances) == ["1g.10gb", "3g.40gb", "3g.40gb"]
    assert not mig0[1].mig_enabled
    assert cluster.inventory.dra.gpu_uuids["dra-0/gpu-2"] == "GPU-dra-0-2"

    states = _states(snapshot)
    train = states["ml/train"]
    assert train.phase == WorkloadPhase.RUNNING and train.workload.gpus == GpuRequest(count=2)
    assert [(p.node, p.gpu_uuid) for p in train.placements] == [("dra-0", "dra-0/gpu-2"), ("dra-0", "dra-0/gpu-3")]
    infer = states["ml/infer"]
    assert infer.workload.gpus == GpuRequest(mig_profile="1g.10gb")
    (placement,) = infer.placements
    instance = next(i for i in mig0[0].mig_instances if i.gpu_instance_id == placement.mig_instance_id)
    assert (placement.gpu_uuid, instance.profile) == ("mig-0/gpu-0", "1g.10gb")
    held = cluster.inventory.dra.pods
    assert held["ml/infer"].gpu_units == pytest.approx(1 / 7) and held["ml/infer"].allocated
    assert held["ml/train-0"].gpu_units == 2.0 and held["ml/train-0"].devices == ("dra-0/gpu-2", "dra-0/gpu-3")
    assert [p.gpu_uuid for p in states["ml/plugin"].placements] == ["dp-0/gpu-0"]
    # on the mixed node the device plugin's pod is laid beside the claimed GPUs, never on them
    assert [p.gpu_uuid for p in states["ml/dra-pod"].placements] == ["both-0/gpu-0", "both-0/gpu-1"]
    assert [p.gpu_uuid for p in states["ml/plugin-pod"].placements] == ["both-0/gpu-2", "both-0/gpu-3"]
    assert cluster.inventory.dra.skipped == {}
    lists = {r.path for r in api.requests if r.path.startswith("/apis/resource.k8s.io/v1/")}
    assert lists == {f"/apis/resource.k8s.io/v1/{plural}" for plural in
                     ("deviceclasses", "resourceslices", "resourceclaims", "resourceclaimtemplates")}


def test_each_pod_is_laid_on_its_own_claimed_devices_whatever_the_order(api, tmp_path):
    """Pods are listed by name, workloads built by key: the layout finds each pod's own devices."""
    _fleet(api)
    for pod_name, job, device in (("a-pod", "zeta", "gpu-5"), ("b-pod", "alpha", "gpu-1")):
        claim(api, "ml", f"{pod_name}-gpu", [request("gpu", "gpu.nvidia.com")], [("dra-1", device)],
              reserved_for=[pod_name])
        claim_pod(api, "ml", pod_name, "dra-1", claims={"gpu": f"{pod_name}-gpu"}, owner=job)
    states = _states(connect(api, tmp_path).snapshot())
    assert [p.gpu_uuid for p in states["ml/zeta"].placements] == ["dra-1/gpu-5"]
    assert [p.gpu_uuid for p in states["ml/alpha"].placements] == ["dra-1/gpu-1"]


def test_a_kep_5004_pod_holds_its_claim_not_its_extended_resource_too(api, tmp_path):
    _fleet(api)
    claim(api, "ml", "ext-abc", [request("container-0-request-0", "gpu.nvidia.com", 1)], [("dra-1", "gpu-5")],
          reserved_for=["ext"], annotations={"resource.kubernetes.io/extended-resource-claim": "true"})
    claim_pod(api, "ml", "ext", "dra-1", extended=("nvidia.com/gpu", 1, "ext-abc"))
    snapshot = connect(api, tmp_path).snapshot()
    (ext,) = [w for w in snapshot.workloads if w.workload.name == "ext"]
    assert ext.workload.gpus == GpuRequest(count=1) and [p.gpu_uuid for p in ext.placements] == ["dra-1/gpu-5"]


def test_a_suspended_job_asks_what_its_templates_claims_ask(api, tmp_path):
    _fleet(api)
    claim_template(api, "ml", "two-gpus", [request("gpus", "gpu.nvidia.com", 2)])
    api.add(BATCH, "jobs", {"metadata": {"name": "paused", "namespace": "ml"}, "spec": {
        "suspend": True, "parallelism": 2, "template": {"spec": {
            "containers": [{"name": "main", "image": "trainer"}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]}}}})
    paused = _states(connect(api, tmp_path).snapshot())["ml/paused"]
    assert paused.phase == WorkloadPhase.SUSPENDED and paused.workload.gpus == GpuRequest(count=2)
    assert paused.workload.gang_size == 2


def test_a_claim_shared_by_two_pods_is_counted_once_and_one_kind_per_pod(api, tmp_path):
    _fleet(api)
    claim(api, "ml", "shared", [request("gpus", "gpu.nvidia.com", 1)], [("dra-0", "gpu-7")], reserved_for=["a", "b"])
    for name in ("a", "b"):
        claim_pod(api, "ml", name, "dra-0", claims={"gpus": "shared"})
    claim(api, "ml", "mixed", [request("gpus", "gpu.nvidia.com", 1), request("mig", "mig-1g.10gb.gpu.nvidia.com")])
    claim_pod(api, "ml", "mixed", None, claims={"both": "mixed"}, gated=True)
    cluster = connect(api, tmp_path)
    states = _states(cluster.snapshot())
    assert [p.gpu_uuid for p in states["ml/a"].placements] == ["dra-0/gpu-7"] and "ml/b" not in states
    assert "one kind per pod" in cluster.inventory.refused["ml/mixed"]


def test_a_waiting_pods_claims_are_its_demand_in_gpu_units_or_its_reason(api, tmp_path):
    _fleet(api)
    claim_template(api, "ml", "two-gpus", [request("gpus", "gpu.nvidia.com", 2)])
    claim_pod(api, "ml", "wait-0", None, templates={"gpus": "two-gpus"}, owner="wait", gated=True)
    claim(api, "ml", "small", [request("mig", "mig.nvidia.com", cel="device.attributes['gpu.nvidia.com'].profile "
                                                                     "== '1g.10gb'")])
    claim_pod(api, "ml", "tiny", None, claims={"mig": "small"}, gated=True)
    claim(api, "ml", "every", [request("gpus", "gpu.nvidia.com", mode="All")])
    claim_pod(api, "ml", "greedy", None, claims={"gpus": "every"}, gated=True)
    claim(api, "ml", "any-mig", [request("mig", "mig.nvidia.com")])
    claim_pod(api, "ml", "vague", None, claims={"mig": "any-mig"}, gated=True)
    api.add(RESOURCE, "deviceclasses", {"metadata": {"name": "either"}, "spec": {"selectors": [{"cel": {"expression": (
        "device.driver == 'gpu.nvidia.com' && (device.attributes['gpu.nvidia.com'].type == 'gpu' || "
        "device.attributes['gpu.nvidia.com'].type == 'mig')")}}]}})
    claim(api, "ml", "either-one", [request("dev", "either")])
    claim_pod(api, "ml", "unreadable", None, claims={"dev": "either-one"}, gated=True)
    api.add(RESOURCE, "deviceclasses", {"metadata": {"name": "compute-domain-default-channel.nvidia.com"}, "spec": {
        "selectors": [{"cel": {"expression": "device.driver == 'compute-domain.nvidia.com' && "
                                             "device.attributes['compute-domain.nvidia.com'].type == 'channel'"}}]}})
    claim_template(api, "ml", "channel", [request("channel", "compute-domain-default-channel.nvidia.com")])
    claim_pod(api, "ml", "nvl-0", None, templates={"gpus": "two-gpus", "channel": "channel"}, owner="nvl", gated=True)
    cluster = connect(api, tmp_path)
    states = _states(cluster.snapshot())
    wait = states["ml/wait"]
    assert wait.phase == WorkloadPhase.PENDING and wait.workload.gpus == GpuRequest(count=2)
    assert wait.workload.gpus.gpu_equivalents == cluster.inventory.dra.pods["ml/wait-0"].gpu_units == 2.0
    assert not cluster.inventory.dra.pods["ml/wait-0"].allocated
    assert states["ml/tiny"].workload.gpus == GpuRequest(mig_profile="1g.10gb")
    assert cluster.inventory.dra.pods["ml/tiny"].gpu_units == pytest.approx(1 / 7)
    refused = cluster.inventory.refused
    assert "allocationMode All" in refused["ml/greedy"] and "naming no profile" in refused["ml/vague"]
    assert "does not say which kind" in refused["ml/unreadable"]
    assert not {"ml/greedy", "ml/vague", "ml/unreadable"} & set(states)
    # a ComputeDomain channel is no GPU: the pod's demand is its two GPUs
    assert states["ml/nvl"].workload.gpus == GpuRequest(count=2)


def test_a_cluster_without_dra_reads_as_before(server, tmp_path):
    """An older cluster (no resource.k8s.io/v1: 404) has no DRA, and a 403 is said once, not raised."""
    api = _fresh(server, dra=False)
    node(api, "dp-0")
    namespace(api, "ml")
    pod(api, "ml", "plugin", "dp-0", 2)
    claim_pod(api, "ml", "claims", "dp-0", claims={"gpus": "somewhere"})  # a beta-era pod: not read
    cluster = connect(api, tmp_path)
    snapshot = cluster.snapshot()
    assert [n.gpu_count for n in snapshot.nodes] == [8] and not cluster.inventory.dra.served
    assert [w.workload.name for w in snapshot.workloads] == ["plugin"]
    assert len(api.calls("GET", "^/apis/resource.k8s.io/")) == 1  # one 404, then nothing more of DRA
    api.with_dra()
    api.inject("GET", "/apis/resource.k8s.io/v1/deviceclasses$", 403, times=1)
    again = cluster.snapshot()
    assert [n.gpu_count for n in again.nodes] == [8] and not cluster.inventory.dra.served


def test_bad_slices_and_claims_are_skipped_counted_and_said_the_rest_is_read(api, tmp_path, caplog):
    _fleet(api)
    bad_device = gpu_device("bad-0", 0)
    bad_device["attributes"]["productName"] = {"int": 3}
    dra_node(api, "bad-0")
    resource_slice(api, "bad-0", [bad_device])
    api.add(RESOURCE, "resourceslices", {"metadata": {"name": "odd"}, "spec": {"driver": "gpu.nvidia.com",
                                                                                "pool": "not-an-object"}})
    claim(api, "ml", "count-words", [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": "two"}}])
    claim(api, "ml", "no-class", [request("gpus", "fpga.example.com")])
    claim_pod(api, "ml", "uses-bad", None, claims={"gpus": "count-words"}, gated=True)
    claim(api, "ml", "good", [request("gpus", "gpu.nvidia.com", 1)], [("dra-1", "gpu-0")], reserved_for=["fine"])
    claim_pod(api, "ml", "fine", "dra-1", claims={"gpus": "good"})
    cluster = connect(api, tmp_path)
    with caplog.at_level("WARNING", logger="gpuwarden.kube"):
        snapshot = cluster.snapshot()
    skipped = cluster.inventory.dra.skipped
    assert set(skipped) == {"ResourceSlice bad-0-gpu.nvidia.com-slice", "ResourceSlice odd",
                            "ResourceClaim ml/count-words", "ResourceClaim ml/no-class"}
    assert "productName" in skipped["ResourceSlice bad-0-gpu.nvidia.com-slice"]
    assert "fpga.example.com" in skipped["ResourceClaim ml/no-class"]
    assert "ResourceClaim ml/no-class skipped" in caplog.text
    assert "bad-0" not in {n.name for n in snapshot.nodes} and len(snapshot.nodes) == 5
    assert "ResourceClaim count-words was skipped" in cluster.inventory.refused["ml/uses-bad"]
    assert [p.gpu_uuid for p in _states(snapshot)["ml/fine"].placements] == ["dra-1/gpu-0"]


_NODE = st.tuples(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8))  # device plugin, DRA GPUs, claimed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_NODE, min_size=1, max_size=4))
def test_no_gpu_is_counted_twice_and_no_claim_holds_more_than_is_published(server, tmp_path, nodes):
    api = _fresh(server)
    nvidia_classes(api)
    namespace(api, "ml")
    for n, (plugin, published, claimed) in enumerate(nodes):
        name = f"n{n}"
        dra_node(api, name, allocatable_gpus=plugin)
        if published:
            gpu_slice(api, name, published)
        for i in range(min(claimed, published) // 2):  # two GPUs a pod
            devices = [(name, f"gpu-{2 * i}"), (name, f"gpu-{2 * i + 1}")]
            claim(api, "ml", f"{name}-c{i}", [request("gpus", "gpu.nvidia.com", 2)], devices, reserved_for=[f"{name}-p{i}"])
            claim_pod(api, "ml", f"{name}-p{i}", name, claims={"gpus": f"{name}-c{i}"})
        if plugin and not published:
            pod(api, "ml", f"{name}-plugin", name, 1)
    snapshot = connect(api, tmp_path).snapshot()
    counts = {n.name: n.gpu_count for n in snapshot.nodes}
    for n, (plugin, published, _) in enumerate(nodes):
        expected = published or plugin
        assert counts.get(f"n{n}", 0) == expected
        if plugin and published:
            assert counts[f"n{n}"] != plugin + published
    held: dict[str, list[str]] = {}
    for state in snapshot.workloads:
        for p in state.placements:
            held.setdefault(p.node, []).append(p.gpu_uuid)
    for name, uuids in held.items():
        assert len(uuids) == len(set(uuids)) <= counts[name]  # no device twice, never past what is published
    assert sum(len(u) for u in held.values()) == sum(min(c, d) // 2 * 2 + (1 if p and not d else 0)
                                                     for p, d, c in nodes)
    assert not [r for r in api.requests if r.method != "GET"]
