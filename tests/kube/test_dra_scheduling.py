"""Scheduling claims (issue 34 item 2): a gated pod's claims are its demand, and the production round
(``SchedulingRound`` on ``KubeCluster``) pins it only to a node whose published devices match them:
its kind, MIG profile, and the product and memory its CEL selectors test. A claim no node's devices
match can never start, the cause in the queue; a selector gpuwarden cannot evaluate is refused,
the expression said. Through HTTP on the fake API server with the official client."""

from __future__ import annotations

import pytest
from fake_kube_api import CORE, DEFAULT_RESOURCES, RESOURCE, FakeKubeAPI
from fake_kube_dra import A100, H100, claim, claim_pod, dra_node, gpu_device, gpu_slice, nvidia_classes, request, \
    resource_slice
from kube_fleet import connect, namespace, node

from gpuwarden.fleet import Gpu, GpuRequest, Location, Node, Placement, PriceTier, Topology, WorkloadPhase
from gpuwarden.fleet.node_selection import LabelRequirement
from gpuwarden.kube.dra_nodes import DRA_NODE_LABEL
from gpuwarden.kube.dra_objects import DraDevice, device_matches
from gpuwarden.kube.dra_selectors import read_selectors
from gpuwarden.kube.gates import ADMITTED_NODE_ANNOTATION, QUEUE_REASON_ANNOTATION
from gpuwarden.kube.inventory_nodes import Layout, NodeOffer, PodRequest
from gpuwarden.scheduler.scheduling_round import SchedulingRound

L4 = "NVIDIA L4"
PRODUCT = "device.attributes['gpu.nvidia.com'].productName"
MEMORY = "device.capacity['gpu.nvidia.com'].memory"


@pytest.fixture(scope="module")
def server():
    running = FakeKubeAPI().start()
    yield running
    running.stop()


@pytest.fixture
def api(server):
    server.store.clear()
    server.requests.clear()
    server.faults.clear()
    server.resources = set(DEFAULT_RESOURCES)
    return server.with_dra()


def _fleet(api: FakeKubeAPI) -> None:
    """Three DRA nodes of three products (an L4 publishes 24Gi) and a device-plugin node with 8 free GPUs."""
    nvidia_classes(api)
    namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "64"})
    for name, product in (("h100-0", H100), ("a100-0", A100)):
        dra_node(api, name)
        gpu_slice(api, name, 4, product)
    dra_node(api, "l4-0")
    resource_slice(api, "l4-0", [gpu_device("l4-0", minor, L4, memory_gib=24) for minor in range(4)])
    node(api, "dp-0")


def _gated(api: FakeKubeAPI, name: str, count: int = 1, cel: str | None = None, device_class: str = "gpu.nvidia.com"):
    claim(api, "ml", f"{name}-gpus", [request("gpus", device_class, count, cel=cel)])
    claim_pod(api, "ml", name, None, claims={"gpus": f"{name}-gpus"}, gated=True)


def _admitted(api: FakeKubeAPI) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION]
            for p in api.objects(CORE, "pods") if ADMITTED_NODE_ANNOTATION in (p["metadata"].get("annotations") or {})}


def test_a_pod_is_pinned_only_where_the_devices_its_claims_select_are_published(api, tmp_path):
    _fleet(api)
    _gated(api, "want-a100", 2, f"{PRODUCT} == '{A100}'")
    _gated(api, "want-memory", 3, f"{MEMORY}.compareTo(quantity('40Gi')) >= 0")  # not the 24Gi L4
    _gated(api, "small-memory", 1, f"{MEMORY}.isLessThan(quantity('32Gi'))")
    _gated(api, "plain", 1)  # any GPU published through DRA, never the device plugin's dp-0
    loop = SchedulingRound(connect(api, tmp_path))
    loop.run_round()
    admitted = _admitted(api)
    assert admitted["want-a100"] == "a100-0"
    assert admitted["want-memory"] in ("h100-0", "a100-0") and admitted["small-memory"] == "l4-0"
    assert admitted["plain"] in ("h100-0", "a100-0", "l4-0")
    per_node: dict[str, int] = {}
    for name, count in (("want-a100", 2), ("want-memory", 3), ("small-memory", 1), ("plain", 1)):
        per_node[admitted[name]] = per_node.get(admitted[name], 0) + count
    assert max(per_node.values()) <= 4  # no node past the 4 GPUs it publishes
    assert "dp-0" not in admitted.values()


def test_a_claim_no_node_can_satisfy_can_never_start_and_says_why(api, tmp_path):
    _fleet(api)
    _gated(api, "want-b200", 1, f"{PRODUCT} == 'NVIDIA B200'")
    _gated(api, "want-huge", 1, f"{MEMORY}.compareTo(quantity('141Gi')) >= 0")
    _gated(api, "want-mig", 1, device_class="mig-1g.10gb.gpu.nvidia.com")  # no node publishes MIG devices
    _gated(api, "too-many", 5, f"{PRODUCT} == '{H100}'")  # 4 is the most one node publishes
    loop = SchedulingRound(connect(api, tmp_path))
    loop.run_round()
    assert not _admitted(api)
    reasons = {row["name"]: row["reason"] for row in loop.queue["workloads"]}
    assert "can never start as written" in reasons["want-b200"]
    assert "productName == 'NVIDIA B200'" in reasons["want-b200"] and f"published: {A100} 80Gi" in reasons["want-b200"]
    assert "memory >= 141Gi" in reasons["want-huge"]
    assert "no node publishes MIG 1g.10gb devices through DRA" in reasons["want-mig"]
    assert "the largest node it may use offers 4 whole GPUs" in reasons["too-many"]  # the engine's own verdict
    notes = {p["metadata"]["name"]: p["metadata"]["annotations"].get(QUEUE_REASON_ANNOTATION, "")
             for p in api.objects(CORE, "pods")}
    assert "NVIDIA B200" in notes["want-b200"]  # what the pod's owner reads with kubectl


def test_an_expression_gpuwarden_cannot_evaluate_is_refused_and_said(api, tmp_path):
    _fleet(api)
    _gated(api, "by-arch", 1, "device.attributes['gpu.nvidia.com'].architecture == 'Hopper'")
    _gated(api, "by-prefix", 1, f"{PRODUCT}.startsWith('NVIDIA H')")
    _gated(api, "either", 1, f"{PRODUCT} == '{H100}' || {PRODUCT} == '{A100}'")
    api.add(RESOURCE, "deviceclasses", {"metadata": {"name": "big.example.com"}, "spec": {"selectors": [{"cel": {
        "expression": f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && "
                      f"{MEMORY}.compareTo(quantity('40Gi')) > 1"}}]}})
    _gated(api, "odd-class", 1, device_class="big.example.com")
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    refused = cluster.inventory.refused
    assert "cannot evaluate \"architecture == 'Hopper'\"" in refused["ml/by-arch"]
    assert f"{PRODUCT}.startsWith('NVIDIA H')" in refused["ml/by-prefix"]
    assert "||" in refused["ml/either"] and "refused rather than guessed" in refused["ml/either"]
    assert "compareTo(quantity('40Gi')) > 1" in refused["ml/odd-class"]  # compareTo gives -1, 0 or 1: read against 0


def test_a_class_selecting_a_product_constrains_like_a_request_selector(api, tmp_path):
    _fleet(api)
    api.add(RESOURCE, "deviceclasses", {"metadata": {"name": "h100.example.com"}, "spec": {"selectors": [{"cel": {
        "expression": f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && "
                      f"{PRODUCT} == '{H100}'"}}]}})
    _gated(api, "by-class", 2, device_class="h100.example.com")
    cluster = connect(api, tmp_path)
    snapshot = cluster.snapshot()
    (state,) = [w for w in snapshot.workloads if w.workload.name == "by-class"]
    assert state.workload.gpus == GpuRequest(count=2)
    SchedulingRound(cluster).run_round()
    assert _admitted(api) == {"by-class": "h100-0"}


def test_selectors_evaluate_on_published_devices():
    h100 = DraDevice("gpu.nvidia.com", "n", "gpu-0", "n", "gpu", product=H100, memory_bytes=80 << 30)
    bare = DraDevice("gpu.nvidia.com", "n", "gpu-1", "n", "gpu", product=H100)  # no memory published
    cases = {f"{MEMORY}.compareTo(quantity('80Gi')) == 0": True, f"{MEMORY}.compareTo(quantity('80Gi')) > 0": False,
             f"{MEMORY}.isGreaterThan(quantity('79Gi'))": True, f"{PRODUCT} != '{H100}'": False,
             f"{PRODUCT} != '{A100}' && device.driver == 'gpu.nvidia.com'": True,
             "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'": True}
    for expression, expected in cases.items():
        match = read_selectors([{"cel": {"expression": expression}}], "selectors")
        assert not match.unevaluable(), expression
        assert device_matches(match, h100) is expected, expression
    memory = read_selectors([{"cel": {"expression": f"{MEMORY}.isGreaterThan(quantity('1Gi'))"}}], "selectors")
    assert not device_matches(memory, bare)  # a capacity not published fails its test, as a CEL error would


def test_gpus_held_for_a_pod_not_admitted_yet_are_never_another_pods_claimed_devices():
    """A reservation (GPUs held for a resumed gang's pods still gated) is laid on free GPUs: the devices a
    running pod's claims hold stay that pod's, whatever order the workloads are laid in."""
    offer = NodeOffer(Node("n", "p", Location.ON_PREM, PriceTier.ON_DEMAND, Topology("n", "a", "a"), "H100", 2, 0, 0),
                      [Gpu(f"n/gpu-{i}", i, "n", "H100") for i in range(2)], whole=["n/gpu-0", "n/gpu-1"])
    offer.claimed["ml/holder"] = (Placement("n", "n/gpu-0"),)
    offer.dra_taken.add(("n/gpu-0", None))
    layout = Layout({"n": offer})
    assert layout.lay("n", PodRequest(1, dra=True)) == [Placement("n", "n/gpu-1")]  # reserved, laid first
    holder = {"metadata": {"namespace": "ml", "name": "holder"}}
    assert layout.lay("n", PodRequest(1, dra=True), holder) == [Placement("n", "n/gpu-0")]


def test_a_running_jobs_replacement_pod_keeps_to_the_nodes_its_claims_match(api, tmp_path):
    """A Job's pods are one workload, read from its first pod: a running pod's claims are allocated (no
    constraint), its gated replacement's are not: the waiting part keeps to the nodes they match."""
    _fleet(api)
    cel = f"{PRODUCT} == '{A100}'"
    claim(api, "ml", "train-0-gpus", [request("gpus", "gpu.nvidia.com", 2, cel=cel)], [("a100-0", "gpu-0"),
                                                                                       ("a100-0", "gpu-1")],
          reserved_for=["train-0"])
    claim_pod(api, "ml", "train-0", "a100-0", claims={"gpus": "train-0-gpus"}, owner="train")
    claim(api, "ml", "train-1-gpus", [request("gpus", "gpu.nvidia.com", 2, cel=cel)])
    claim_pod(api, "ml", "train-1", None, claims={"gpus": "train-1-gpus"}, owner="train", gated=True)
    cluster = connect(api, tmp_path)
    (waiting,) = [w for w in cluster.snapshot().workloads if w.phase == WorkloadPhase.PENDING]
    assert waiting.workload.node_selection == ((LabelRequirement(DRA_NODE_LABEL, "In", ("a100-0",)),),)
    SchedulingRound(cluster).run_round()
    assert _admitted(api) == {"train-1": "a100-0"}  # the 2 A100s left, not the free H100s or the device plugin's
