"""The fakes' Dynamic Resource Allocation (``tests/fake_kube_dra_alloc.py``) refuses what kube-scheduler
refuses and allocates what it allocates: the ResourceClaim controller makes claims from templates, the
kube-scheduler stand-in (``tests/fake_kube_scheduler.py``) allocates them on binding from the node's
ResourceSlices (class, count, selectors; a device never in two claims) or leaves the pod Pending with
the DynamicResources plugin's reason. Nothing real runs here: these are the fakes' own tests."""

from __future__ import annotations

import re

import pytest
from fake_kube_api import CORE, RESOURCE, FakeKubeAPI
from fake_kube_dra import (A100, DRIVER, H100, claim, claim_pod, claim_template, dra_node, gpu_device, gpu_slice,
                           mig_device, nvidia_classes, request, resource_slice)
from fake_kube_dra_alloc import (CelRuntimeError, FakeResourceClaimController, UnsupportedSelector,
                                 compile_selector)
from fake_kube_scheduler import FakeKubeScheduler
from kube_fleet import namespace, node

PRODUCT = f"device.attributes['{DRIVER}'].productName"


@pytest.fixture
def api() -> FakeKubeAPI:
    api = FakeKubeAPI().with_dra()  # in process: the stand-ins go through handle(), no HTTP needed here
    nvidia_classes(api)
    namespace(api, "ml")
    return api


def _pass(api: FakeKubeAPI):
    FakeResourceClaimController(api).step()
    return FakeKubeScheduler(api).step()


def _claims(api: FakeKubeAPI) -> dict[str, dict]:
    return {c["metadata"]["name"]: c for c in api.objects(RESOURCE, "resourceclaims")}


def _results(claim_obj: dict) -> list[tuple[str, str]]:
    return [(r["pool"], r["device"]) for r in claim_obj["status"]["allocation"]["devices"]["results"]]


def _pod(api: FakeKubeAPI, name: str, ns: str = "ml") -> dict:
    found = api.get(CORE, "pods", name, ns)
    assert found is not None
    return found


def _pin(api: FakeKubeAPI, pod_name: str, node_name: str) -> None:
    """As gpuwarden pins an admitted pod: required node affinity on the node's name."""
    stored = api.store[(CORE, "pods")][("ml", pod_name)]
    stored["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}}


def test_a_template_claim_is_made_per_pod_named_owned_and_recorded_then_allocated_on_binding(api):
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0")
    claim_template(api, "ml", "two-gpus", [request("gpus", "gpu.nvidia.com", 2)])
    claim_pod(api, "ml", "train-0", None, templates={"gpus": "two-gpus"}, gated=True)
    FakeResourceClaimController(api).step()
    (made,) = _claims(api).values()
    assert re.fullmatch(r"train-0-gpus-[bcdfghjklmnpqrstvwxz2456789]{5}", made["metadata"]["name"])
    assert made["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "train-0",
                                                    "uid": "uid-train-0", "controller": True, "blockOwnerDeletion": True}]
    assert made["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpus"
    assert made["spec"]["devices"]["requests"] == [request("gpus", "gpu.nvidia.com", 2)]
    assert _pod(api, "train-0")["status"]["resourceClaimStatuses"] == [
        {"name": "gpus", "resourceClaimName": made["metadata"]["name"]}]
    FakeResourceClaimController(api).step()
    assert len(_claims(api)) == 1  # made once
    assert not FakeKubeScheduler(api).step().bound  # gated: never bound, nothing allocated
    assert not _claims(api)[made["metadata"]["name"]].get("status")
    api.store[(CORE, "pods")][("ml", "train-0")]["spec"]["schedulingGates"] = []
    assert _pass(api).bound == [("ml/train-0", "dra-0")]
    allocated = _claims(api)[made["metadata"]["name"]]["status"]
    assert [(r["request"], r["driver"], r["pool"], r["device"]) for r in allocated["allocation"]["devices"]["results"]] == [
        ("gpus", DRIVER, "dra-0", "gpu-0"), ("gpus", DRIVER, "dra-0", "gpu-1")]
    assert allocated["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["dra-0"]
    assert allocated["reservedFor"] == [{"resource": "pods", "name": "train-0", "uid": "uid-train-0"}]
    # the allocation was written before the binding, as PreBind does
    writes = [r.path for r in api.calls(user="system:kube-scheduler") if r.method in ("PATCH", "POST")]
    assert writes.index(f"/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/{made['metadata']['name']}/status") \
        < writes.index("/api/v1/namespaces/ml/pods/train-0/binding")


def test_a_device_is_never_in_two_claims_and_the_pod_left_over_waits_with_the_plugins_reason(api):
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0")
    claim_template(api, "ml", "five", [request("gpus", "gpu.nvidia.com", 5)])
    for name in ("a", "b"):
        claim_pod(api, "ml", name, None, templates={"gpus": "five"})
    result = _pass(api)
    assert result.bound == [("ml/a", "dra-0")]
    assert result.unschedulable == {"ml/b": "0/1 nodes are available: 1 cannot allocate all claims."}
    scheduled = next(c for c in _pod(api, "b")["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["reason"], scheduled["message"]) == ("Unschedulable", result.unschedulable["ml/b"])
    assert [e["message"] for e in api.objects(CORE, "events") if e["reason"] == "FailedScheduling"] == [
        result.unschedulable["ml/b"]]
    held = [d for c in _claims(api).values() if (c.get("status") or {}).get("allocation") for d in _results(c)]
    assert len(held) == len(set(held)) == 5


def test_the_pinned_node_is_the_only_one_tried_and_the_message_counts_each_reason(api):
    for name in ("dra-0", "dra-1", "dra-2"):
        dra_node(api, name)
        gpu_slice(api, name, gpus=2)
    claim(api, "ml", "taken", [request("gpus", "gpu.nvidia.com", 2)], [("dra-1", "gpu-0"), ("dra-1", "gpu-1")],
          reserved_for=["other"])
    claim_pod(api, "ml", "other", "dra-1", claims={"gpus": "taken"})
    claim(api, "ml", "mine", [request("gpus", "gpu.nvidia.com", 1)])
    claim_pod(api, "ml", "pinned", None, claims={"gpus": "mine"})
    _pin(api, "pinned", "dra-1")
    result = FakeKubeScheduler(api).step()
    assert result.unschedulable["ml/pinned"] == ("0/3 nodes are available: 1 cannot allocate all claims, "
                                                 "2 node(s) didn't match Pod's node affinity/selector.")
    assert not (_claims(api)["mine"].get("status") or {}).get("allocation")


def test_class_count_and_the_selectors_classes_and_requests_use(api):
    dra_node(api, "mig-0")
    resource_slice(api, "mig-0", [mig_device("mig-0", 0, "3g.40gb", 0), mig_device("mig-0", 0, "1g.10gb", 4),
                                  mig_device("mig-0", 0, "1g.10gb", 5), gpu_device("mig-0", 1, A100)])
    dra_node(api, "h100-0")
    gpu_slice(api, "h100-0", gpus=2)
    claim(api, "ml", "two-small", [request("mig", "mig-1g.10gb.gpu.nvidia.com", 2)])
    claim_pod(api, "ml", "small", None, claims={"mig": "two-small"})
    claim(api, "ml", "forty", [request("mig", "mig.nvidia.com", cel=f"device.capacity['{DRIVER}'].memory"
                                                                     ".compareTo(quantity('40Gi')) >= 0")])
    claim_pod(api, "ml", "big", None, claims={"mig": "forty"})
    claim(api, "ml", "an-a100", [request("gpu", "gpu.nvidia.com", cel=f"{PRODUCT} == '{A100}'")])
    claim_pod(api, "ml", "ampere", None, claims={"gpu": "an-a100"})
    claim(api, "ml", "an-h100", [request("gpus", "gpu.nvidia.com", 2, cel=f"{PRODUCT} == '{H100}'")])
    claim_pod(api, "ml", "hopper", None, claims={"gpu": "an-h100"})
    claim(api, "ml", "three-small", [request("mig", "mig-1g.10gb.gpu.nvidia.com", 3)])
    claim_pod(api, "ml", "too-many", None, claims={"mig": "three-small"})
    result = _pass(api)
    claims = _claims(api)
    assert _results(claims["two-small"]) == [("mig-0", "gpu-0-mig-1g10gb-19-4"), ("mig-0", "gpu-0-mig-1g10gb-19-5")]
    assert _results(claims["forty"]) == [("mig-0", "gpu-0-mig-3g40gb-9-0")]  # the only MIG device of 40Gi or more
    assert _results(claims["an-a100"]) == [("mig-0", "gpu-1")]  # the product selector: the A100, not an H100
    assert _results(claims["an-h100"]) == [("h100-0", "gpu-0"), ("h100-0", "gpu-1")]
    assert result.unschedulable["ml/too-many"] == "0/2 nodes are available: 2 cannot allocate all claims."


def test_allocation_mode_all_takes_every_matching_device_or_none(api):
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0", gpus=3)
    claim(api, "ml", "one", [request("gpu", "gpu.nvidia.com")], [("dra-0", "gpu-1")], reserved_for=["first"])
    claim_pod(api, "ml", "first", "dra-0", claims={"gpu": "one"})
    claim(api, "ml", "every", [request("gpus", "gpu.nvidia.com", mode="All")])
    claim_pod(api, "ml", "greedy", None, claims={"gpus": "every"})
    assert FakeKubeScheduler(api).step().unschedulable["ml/greedy"] == (
        "0/1 nodes are available: 1 cannot allocate all claims.")  # one of them is in use
    api.store[(CORE, "pods")][("ml", "first")]["status"]["phase"] = "Succeeded"
    assert _pass(api).bound == [("ml/greedy", "dra-0")]
    assert _results(_claims(api)["every"]) == [("dra-0", "gpu-0"), ("dra-0", "gpu-1"), ("dra-0", "gpu-2")]


def test_only_the_newest_generation_of_a_node_local_pool_is_allocated(api):
    dra_node(api, "dra-0")
    resource_slice(api, "dra-0", [gpu_device("dra-0", 0), gpu_device("dra-0", 1)], name="old", generation=1)
    resource_slice(api, "dra-0", [gpu_device("dra-0", 2)], name="new", generation=2)
    api.add(RESOURCE, "resourceslices", {"metadata": {"name": "everywhere"}, "spec": {
        "driver": DRIVER, "allNodes": True, "pool": {"name": "net", "generation": 1, "resourceSliceCount": 1},
        "devices": [gpu_device("x", 7)]}})
    claim(api, "ml", "two", [request("gpus", "gpu.nvidia.com", 2)])
    claim_pod(api, "ml", "two", None, claims={"gpus": "two"})
    claim(api, "ml", "one", [request("gpu", "gpu.nvidia.com")])
    claim_pod(api, "ml", "one", None, claims={"gpu": "one"})
    result = FakeKubeScheduler(api).step()
    assert "ml/two" in result.unschedulable and result.bound == [("ml/one", "dra-0")]
    assert _results(_claims(api)["one"]) == [("dra-0", "gpu-2")]


@pytest.mark.parametrize(("cel", "reason"), [
    (f"{PRODUCT}.startsWith('NVIDIA')", "unsupported selector"),
    (f"device.attributes['{DRIVER}'].driverVersion.isGreaterThan(semver('570.0.0'))", "unsupported selector"),
    (f"!({PRODUCT} == 'x')", "unsupported selector"),
    (f"'{DRIVER}/productName' in device.attributes", "unsupported selector"),
])
def test_a_selector_the_fake_cannot_evaluate_keeps_the_pod_pending_with_the_reason(api, cel, reason):
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0")
    claim(api, "ml", "odd", [request("gpu", "gpu.nvidia.com", cel=cel)])
    claim_pod(api, "ml", "odd", None, claims={"gpu": "odd"})
    message = FakeKubeScheduler(api).step().unschedulable["ml/odd"]
    assert message.startswith("0/1 nodes are available: ") and reason in message
    assert not (_claims(api)["odd"].get("status") or {}).get("allocation")


def test_what_kube_scheduler_cannot_start_on_is_refused_before_any_node(api):
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0")
    claim_pod(api, "ml", "lost", None, claims={"gpu": "nowhere"})
    claim_template(api, "ml", "one", [request("gpu", "gpu.nvidia.com")])
    claim_pod(api, "ml", "early", None, templates={"gpu": "one"})  # its claim not made yet
    claim(api, "ml", "no-class", [request("gpu", "fpga.example.com")])
    claim_pod(api, "ml", "classless", None, claims={"gpu": "no-class"})
    claim(api, "ml", "alternatives", [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com"}]}])
    claim_pod(api, "ml", "choosy", None, claims={"gpu": "alternatives"})
    result = FakeKubeScheduler(api).step()  # no ResourceClaim controller ran
    assert result.unschedulable["ml/lost"] == '0/1 nodes are available: resourceclaim "nowhere" not found.'
    assert "waiting for resource claim" in result.unschedulable["ml/early"]
    assert 'device class "fpga.example.com" does not exist' in result.unschedulable["ml/classless"]
    assert "firstAvailable is not modelled" in result.unschedulable["ml/choosy"]
    assert not result.bound


def test_an_allocated_claim_takes_its_pod_to_its_node_and_is_shared(api):
    for name in ("dra-0", "dra-1"):
        dra_node(api, name)
        gpu_slice(api, name, gpus=1)
    claim(api, "ml", "shared", [request("gpu", "gpu.nvidia.com")], [("dra-1", "gpu-0")], reserved_for=["first"])
    claim_pod(api, "ml", "first", "dra-1", claims={"gpu": "shared"})
    claim_pod(api, "ml", "second", None, claims={"gpu": "shared"})
    assert FakeKubeScheduler(api).step().bound == [("ml/second", "dra-1")]
    assert [r["name"] for r in _claims(api)["shared"]["status"]["reservedFor"]] == ["first", "second"]
    claim_pod(api, "ml", "elsewhere", None, claims={"gpu": "shared"})
    _pin(api, "elsewhere", "dra-0")
    assert FakeKubeScheduler(api).step().unschedulable["ml/elsewhere"] == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 resourceclaim not available on the node.")


def test_kep_5004_an_extended_resource_is_a_claim_on_a_dra_node_and_the_device_plugins_elsewhere(api):
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0", gpus=4)
    node(api, "dp-0")  # the device plugin's nvidia.com/gpu: 8
    for name, where in (("on-dra", "dra-0"), ("on-plugin", "dp-0")):
        api.add(CORE, "pods", {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}, "spec": {
            "containers": [{"name": "main", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]},
            "status": {"phase": "Pending"}})
        _pin(api, name, where)
    assert sorted(_pass(api).bound) == [("ml/on-dra", "dra-0"), ("ml/on-plugin", "dp-0")]
    (made,) = _claims(api).values()  # only the DRA node's pod got one
    assert made["metadata"]["name"].startswith("on-dra-extended-resources-")
    assert made["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert made["metadata"]["ownerReferences"][0]["name"] == "on-dra"
    assert made["spec"]["devices"]["requests"] == [{"name": "container-0-request-0", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 3}}]
    assert _results(made) == [("dra-0", "gpu-0"), ("dra-0", "gpu-1"), ("dra-0", "gpu-2")]
    assert _pod(api, "on-dra")["status"]["extendedResourceClaimStatus"] == {
        "resourceClaimName": made["metadata"]["name"], "requestMappings": [
            {"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]}
    assert "extendedResourceClaimStatus" not in _pod(api, "on-plugin")["status"]
    api.add(CORE, "pods", {"metadata": {"name": "more", "namespace": "ml", "uid": "uid-more"}, "spec": {
        "containers": [{"name": "main", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        "status": {"phase": "Pending"}})
    _pin(api, "more", "dra-0")
    assert _pass(api).unschedulable["ml/more"] == (  # one GPU left there
        "0/2 nodes are available: 1 cannot allocate all claims, 1 node(s) didn't match Pod's node affinity/selector.")


def test_a_finished_pod_frees_its_devices_and_a_deleted_pods_claims_are_collected(api):
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0", gpus=2)
    claim_template(api, "ml", "two", [request("gpus", "gpu.nvidia.com", 2)])
    claim_pod(api, "ml", "first", None, templates={"gpus": "two"})
    claim_pod(api, "ml", "second", None, templates={"gpus": "two"})
    result = _pass(api)
    assert [k for k, _ in result.bound] == ["ml/first"] and "ml/second" in result.unschedulable
    api.act("kubelet", "PATCH", "/api/v1/namespaces/ml/pods/first/status", {"status": {"phase": "Succeeded"}},
            "application/merge-patch+json")
    assert _pass(api).bound == [("ml/second", "dra-0")]  # the controller deallocated first's claim
    first = next(c for n, c in _claims(api).items() if n.startswith("first-"))
    assert "allocation" not in first["status"] and "reservedFor" not in first["status"]
    api.act("user", "DELETE", "/api/v1/namespaces/ml/pods/first")
    FakeResourceClaimController(api).step()
    assert [n for n in _claims(api) if n.startswith("first-")] == []  # the garbage collector took it


def test_the_cel_evaluator_follows_cels_semantics_for_the_forms_it_reads():
    gpu = gpu_device("n", 0)
    assert compile_selector(f"device.driver == '{DRIVER}' && {PRODUCT} == '{H100}'")(gpu, DRIVER)
    assert not compile_selector(f"{PRODUCT} != '{H100}'")(gpu, DRIVER)
    assert compile_selector(f"device.attributes['{DRIVER}']['type'] == 'gpu'")(gpu, DRIVER)
    assert compile_selector(f"device.capacity['{DRIVER}'].memory.isGreaterThan(quantity('79Gi'))")(gpu, DRIVER)
    assert compile_selector(f"device.capacity['{DRIVER}'].memory.compareTo(quantity('80Gi')) == 0")(gpu, DRIVER)
    missing = f"device.attributes['{DRIVER}'].profile == '1g.10gb'"
    with pytest.raises(CelRuntimeError, match="no such key"):
        compile_selector(missing)(gpu, DRIVER)
    # false && error is false, true || error is true (CEL's commutative logic)
    assert not compile_selector(f"{missing} && device.driver == 'other'")(gpu, DRIVER)
    assert compile_selector(f"({missing}) || device.driver == '{DRIVER}'")(gpu, DRIVER)
    qualified = {**gpu, "attributes": {f"{DRIVER}/productName": {"string": A100}}}
    assert compile_selector(f"{PRODUCT} == '{A100}'")(qualified, DRIVER)  # a qualified name, same attribute
    assert not compile_selector("device.attributes['other.example.com'].index == 0 && false")(gpu, DRIVER)
    for expression in ("device.name == 'gpu-0'", "size(device.attributes) > 1", f"{PRODUCT}.matches('H1')",
                       "device.capacity['gpu.nvidia.com'].memory >= 1"):
        with pytest.raises(UnsupportedSelector):
            compile_selector(expression)
