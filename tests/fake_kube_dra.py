"""Dynamic Resource Allocation objects on the fake API server (``tests/fake_kube_api.py``,
``FakeKubeAPI.with_dra()``), written as NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu,
driver ``gpu.nvidia.com``) and kube-scheduler write them: DeviceClasses, a node's ResourceSlice of
GPUs (``gpu-<minor>``) or static MIG devices (``gpu-<minor>-mig-<profile>-<id>-<start>``), claims,
templates and the pods that use them. Scenario data, not logic: claims made from templates and their
allocation on binding are ``tests/fake_kube_dra_alloc.py``'s (the ResourceClaim controller and
kube-scheduler's DynamicResources, run by ``tests/fake_kube_scheduler.py``)."""

from __future__ import annotations

from fake_kube_api import CORE, RESOURCE, FakeKubeAPI

DRIVER = "gpu.nvidia.com"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
GIB = 1 << 30
# NVIDIA's GPU-instance profile ids and memory (A100 / H100 80GB), for device names and capacity
MIG_PROFILES = {"1g.10gb": (19, 10), "1g.20gb": (15, 20), "2g.20gb": (14, 20), "3g.40gb": (9, 40),
                "4g.40gb": (5, 40), "7g.80gb": (0, 80)}


def _select(kind: str, profile: str | None = None) -> list[dict]:
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
    if profile:
        expression += f" && device.attributes['{DRIVER}'].profile == '{profile}'"
    return [{"cel": {"expression": expression}}]


def nvidia_classes(api: FakeKubeAPI) -> None:
    """The driver chart's DeviceClasses (gpu.nvidia.com backs nvidia.com/gpu, KEP-5004) and one MIG
    profile's class, as its extended-resources demo writes them."""
    api.add(RESOURCE, "deviceclasses", {"metadata": {"name": "gpu.nvidia.com"},
                                        "spec": {"selectors": _select("gpu"), "extendedResourceName": "nvidia.com/gpu"}})
    api.add(RESOURCE, "deviceclasses", {"metadata": {"name": "mig.nvidia.com"}, "spec": {"selectors": _select("mig")}})
    api.add(RESOURCE, "deviceclasses", {"metadata": {"name": "mig-1g.10gb.gpu.nvidia.com"},
                                        "spec": {"selectors": _select("mig", "1g.10gb")}})


def dra_node(api: FakeKubeAPI, name: str, labels: dict | None = None, allocatable_gpus: int = 0) -> None:
    """A node as kubelet reports it where the DRA driver (not the device plugin) runs: no nvidia.com/gpu,
    unless ``allocatable_gpus`` (a device plugin beside it, or an extended resource KEP-5004 shows)."""
    resources = {"cpu": "96", "memory": "1Ti", **({"nvidia.com/gpu": str(allocatable_gpus)} if allocatable_gpus else {})}
    api.add(CORE, "nodes", {"metadata": {"name": name, "labels": labels or {}}, "spec": {},
                            "status": {"capacity": dict(resources), "allocatable": dict(resources)}})


def _attributes(product: str, **more: object) -> dict:
    out = {"productName": {"string": product}, "architecture": {"string": "Hopper" if "H100" in product else "Ampere"},
           "driverVersion": {"version": "570.124.6"}, "cudaComputeCapability": {"version": "9.0.0"}}
    for key, value in more.items():
        out[key] = {"int": value} if isinstance(value, int) else {"string": value}
    return out


def gpu_device(node: str, minor: int, product: str = H100, memory_gib: int = 80) -> dict:
    return {"name": f"gpu-{minor}", "attributes": _attributes(product, type="gpu", uuid=f"GPU-{node}-{minor}"),
            "capacity": {"memory": {"value": f"{memory_gib}Gi"}}}


def mig_device(node: str, minor: int, profile: str, start: int, product: str = A100) -> dict:
    profile_id, memory = MIG_PROFILES[profile]
    return {"name": f"gpu-{minor}-mig-{profile.replace('.', '')}-{profile_id}-{start}",
            "attributes": _attributes(product, type="mig", profile=profile, parentUUID=f"GPU-{node}-{minor}",
                                      uuid=f"MIG-{node}-{minor}-{start}"),
            "capacity": {"memory": {"value": f"{memory}Gi"}}}


def resource_slice(api: FakeKubeAPI, node: str, devices: list[dict], name: str | None = None, generation: int = 1,
                   slice_count: int = 1) -> None:
    """One ResourceSlice of ``node``'s pool (the driver names the pool after the node)."""
    api.add(RESOURCE, "resourceslices", {
        "metadata": {"name": name or f"{node}-{DRIVER}-slice"},
        "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": slice_count}}})


def gpu_slice(api: FakeKubeAPI, node: str, gpus: int = 8, product: str = H100) -> None:
    resource_slice(api, node, [gpu_device(node, minor, product) for minor in range(gpus)])


def request(name: str, device_class: str, count: int = 1, mode: str = "ExactCount", cel: str | None = None) -> dict:
    exactly: dict = {"deviceClassName": device_class, "allocationMode": mode}
    if mode == "ExactCount":
        exactly["count"] = count
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": exactly}


def claim(api: FakeKubeAPI, ns: str, name: str, requests: list[dict], devices: list[tuple[str, str]] = (),
          reserved_for: list[str] = (), annotations: dict | None = None) -> None:
    """A ResourceClaim; ``devices`` (pool, device) allocated to its first request, ``reserved_for`` pod names."""
    status: dict = {}
    if devices:
        status["allocation"] = {"devices": {"results": [
            {"request": requests[0]["name"], "driver": DRIVER, "pool": pool, "device": device}
            for pool, device in devices]}}
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"} for pod in reserved_for]
    api.add(RESOURCE, "resourceclaims", {"metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
                                         "spec": {"devices": {"requests": requests}}, "status": status})


def claim_template(api: FakeKubeAPI, ns: str, name: str, requests: list[dict]) -> None:
    api.add(RESOURCE, "resourceclaimtemplates", {"metadata": {"name": name, "namespace": ns},
                                                 "spec": {"spec": {"devices": {"requests": requests}}}})


def claim_pod(api: FakeKubeAPI, ns: str, name: str, node: str | None, claims: dict[str, str] | None = None,
              templates: dict[str, str] | None = None, owner: str | None = None, gated: bool = False,
              extended: tuple[str, int, str] | None = None) -> None:
    """A pod using claims: ``claims`` {entry: claim name}; ``templates`` {entry: (template, claim made from it
    or None)} as ``template`` or ``template>made``; ``extended`` (resource, count, claim name): KEP-5004."""
    entries, statuses = [], []
    for entry, claim_name in (claims or {}).items():
        entries.append({"name": entry, "resourceClaimName": claim_name})
    for entry, spec in (templates or {}).items():
        template, _, made = spec.partition(">")
        entries.append({"name": entry, "resourceClaimTemplateName": template})
        if made:
            statuses.append({"name": entry, "resourceClaimName": made})
    resources = {"limits": {extended[0]: str(extended[1])}} if extended else {}
    spec: dict = {"containers": [{"name": "main", "image": "trainer", "resources": resources}], "resourceClaims": entries}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": "gpuwarden.io/admission"}]
    meta: dict = {"name": name, "namespace": ns, "uid": f"uid-{name}", "creationTimestamp": "2026-11-30T11:00:00Z"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": f"uid-{owner}",
                                    "controller": True}]
    status: dict = {"phase": "Running" if node else "Pending", "resourceClaimStatuses": statuses}
    if node:
        status["startTime"] = "2026-11-30T11:00:00Z"
    if extended:
        status["extendedResourceClaimStatus"] = {"resourceClaimName": extended[2], "requestMappings": [
            {"containerName": "main", "requestName": "container-0-request-0", "resourceName": extended[0]}]}
    api.add(CORE, "pods", {"metadata": meta, "spec": spec, "status": status})
