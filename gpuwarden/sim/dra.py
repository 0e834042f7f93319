"""The simulated fleet as a cluster that allocates GPUs by Dynamic Resource Allocation (``gpuwarden demo --dra``).

With ``SimConfig.dra`` the fleet is the cluster NVIDIA's DRA driver (``gpu.nvidia.com``) runs on, and
:class:`SimDra` says so in ``resource.k8s.io/v1`` objects, written as the driver, the resource-claim
controller and kube-scheduler write them (the fields gpuwarden's Kubernetes reader reads, docs/dra.md):

- DeviceClasses ``gpu.nvidia.com`` and ``mig.nvidia.com`` (the driver chart's);
- a ResourceSlice per node, its pool named after the node: each whole GPU ``gpu-<minor>``, each MIG
  instance of a MIG-mode GPU ``gpu-<minor>-mig-<profile>-<GI profile id>-<placement start>``, with
  ``type``, ``uuid``, ``productName``, ``profile``, ``parentUUID`` and capacity ``memory``;
- per pod of each live job, one ResourceClaimTemplate entry ``gpu`` and the claim made from it,
  named as the resource-claim controller names it (``<pod>-gpu-<5 random characters>``; a new claim
  each time the pod is made again: after a preemption or a failure); its request asks what the pod
  asks (``count`` whole GPUs, or one MIG device of a profile); it is allocated, ``reservedFor`` its
  pod, while the pod runs: the devices the scheduling round bound it to.

A pod of the trace asking a fraction of a GPU (openb's milli-GPU) asks, in DRA, a MIG device or else
a whole GPU (``firstAvailable``): gpuwarden refuses to size such a claim before it is allocated on a
real cluster, while the simulation's planner places it by its fraction; once placed its claim holds
the MIG device or whole GPU it got, and the fleet counts that (``SimCluster``: a running pod holds
what its claims hold, in GPU units).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuwarden.fleet import GpuRequest, WorkloadPhase
from gpuwarden.fleet.gpu_catalogue import gpu_catalogue

from .fleet_state import SimulatedFleet
from .jobs import SimJob

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
POD_CLAIM = "gpu"  # the pod's spec.resourceClaims[] entry (and its request's name)
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"  # what the controller writes on a claim it makes
# NVIDIA's GPU-instance profile ids by (compute slices, memory slices), as nvidia-smi mig -lgip lists them
GI_PROFILE_IDS = {(1, 1): 19, (1, 2): 15, (2, 2): 14, (3, 4): 9, (4, 4): 5, (7, 8): 0}
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the API server's generateName characters
_LIVE = (WorkloadPhase.PENDING, WorkloadPhase.RUNNING, WorkloadPhase.SUSPENDED)


@dataclass(frozen=True)
class HeldDevice:
    """One device a pod holds through its claim (what dcgm-exporter's ``dra_*`` labels say of it)."""

    claim_namespace: str
    claim_name: str
    pod: str
    pool: str
    device: str
    gpu_units: float  # a whole GPU 1, a MIG device its share of its GPU


def claim_name(pod: str, pod_claim: str, seed: str) -> str:
    """The name the resource-claim controller gives the claim it makes for ``pod``'s entry ``pod_claim``:
    ``generateName`` ``<pod>-<pod claim>-`` (both cut in proportion past 57 characters) and the API
    server's 5 random characters, here drawn from ``seed``."""
    base = f"{pod}-{pod_claim}-"
    if len(base) > 57:
        base = f"{pod[:len(pod) * 57 // len(base)]}-{pod_claim[:len(pod_claim) * 57 // len(base)]}"
    digest = hashlib.sha256(seed.encode()).digest()
    return base + "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:5])


def _selector(kind: str, profile: str | None = None) -> list[dict[str, Any]]:
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
    if profile:
        expression += f" && device.attributes['{DRIVER}'].profile == '{profile}'"
    return [{"cel": {"expression": expression}}]


class SimDra:
    """The DRA objects of a simulated fleet, read from its state when asked (never stored beside it)."""

    def __init__(self, simulation: SimulatedFleet) -> None:
        self.sim = simulation
        catalogue = gpu_catalogue()
        # per device: its name in its node's ResourceSlice; per MIG device its uuid
        self.device_names: list[str] = []
        self._mig_uuids: dict[int, str] = {}
        self._taken: dict[int, set[int]] = {}  # per GPU: the memory slices its instances start on or span
        for d, (g, mig_id, profile) in enumerate(zip(simulation.dev_gpu, simulation.dev_mig_id, simulation.dev_mig_profile)):
            gpu = simulation.gpus[int(g)]
            if not mig_id:
                self.device_names.append(f"gpu-{gpu.index}")
                continue
            spec = catalogue.mig_profiles(gpu.model)[str(profile)]
            start = self._placement_start(int(g), spec.memory_slices, spec.placements)
            profile_id = GI_PROFILE_IDS.get((spec.compute_slices, spec.memory_slices), 0)
            self.device_names.append(f"gpu-{gpu.index}-mig-{str(profile).replace('.', '')}-{profile_id}-{start}")
            self._mig_uuids[d] = f"MIG-{gpu.uuid.removeprefix('GPU-')}-{int(mig_id)}"

    def _placement_start(self, gpu: int, memory_slices: int, placements: tuple[int, ...]) -> int:
        """The first memory slice the instance may start at that its GPU's earlier instances leave free."""
        taken = self._taken.setdefault(gpu, set())
        for start in placements:
            span = set(range(start, start + memory_slices))
            if not span & taken:
                taken.update(span)
                return start
        return placements[0] if placements else 0

    # -- objects ---------------------------------------------------------------------------------
    def device_classes(self) -> list[dict[str, Any]]:
        return [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": GPU_CLASS},
                 "spec": {"selectors": _selector("gpu"), "extendedResourceName": "nvidia.com/gpu"}},
                {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": MIG_CLASS},
                 "spec": {"selectors": _selector("mig")}}]

    def resource_slices(self) -> list[dict[str, Any]]:
        sim = self.sim
        devices: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(sim.nodes))}
        for d, name in enumerate(self.device_names):
            gpu = sim.gpus[int(sim.dev_gpu[d])]
            attributes: dict[str, Any] = {"productName": {"string": gpu.model}}
            if d in self._mig_uuids:
                attributes |= {"type": {"string": "mig"}, "uuid": {"string": self._mig_uuids[d]},
                               "profile": {"string": str(sim.dev_mig_profile[d])}, "parentUUID": {"string": gpu.uuid}}
            else:
                attributes |= {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}}
            memory = int(sim.dev_mem_total[d])
            devices[int(sim.dev_node[d])].append({"name": name, "attributes": attributes,
                                                  "capacity": {"memory": {"value": str(memory)}}})
        return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                 "metadata": {"name": f"{node.name}-{DRIVER}-slice"},
                 "spec": {"driver": DRIVER, "nodeName": node.name, "devices": devices[i],
                          "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1}}}
                for i, node in enumerate(sim.nodes)]

    def claims(self) -> list[dict[str, Any]]:
        """A ResourceClaim per pod of each live job (allocated while it runs), in submission order."""
        with self.sim.lock:
            return [self._claim(job, pod, held) for job in self._live_jobs() for pod, held in self._pods(job)]

    def pods(self) -> list[dict[str, Any]]:
        """The DRA part of each live pod: its claim entry, the claim made from it, and its node."""
        out = []
        with self.sim.lock:
            for job in self._live_jobs():
                for pod, held in self._pods(job):
                    spec: dict[str, Any] = {"resourceClaims": [
                        {"name": POD_CLAIM, "resourceClaimTemplateName": self._template(job)}]}
                    if held:
                        spec["nodeName"] = self.sim.nodes[int(self.sim.dev_node[held[0]])].name
                    out.append({"metadata": {"namespace": job.spec.workload.namespace, "name": pod,
                                             "uid": self._pod_uid(job, pod)},
                                "spec": spec,
                                "status": {"phase": "Running" if held else "Pending", "resourceClaimStatuses": [
                                    {"name": POD_CLAIM, "resourceClaimName": self._claim_name(job, pod)}]}})
        return out

    def objects(self) -> dict[str, list[dict[str, Any]]]:
        """Every object, by the resource a ``kubectl get -o json`` of it names (pods: their DRA fields)."""
        return {"deviceclasses": self.device_classes(), "resourceslices": self.resource_slices(),
                "resourceclaims": self.claims(), "pods": self.pods()}

    # -- what the exporter labels ----------------------------------------------------------------
    def held(self) -> dict[tuple[str, str, int | None], HeldDevice]:
        """Each device a running pod holds through its claim, by (node, GPU uuid, MIG instance id)."""
        sim = self.sim
        out: dict[tuple[str, str, int | None], HeldDevice] = {}
        with sim.lock:
            for job in self._live_jobs():
                if job.devices is None:
                    continue
                namespace = job.spec.workload.namespace
                for pod, held in self._pods(job):
                    name = self._claim_name(job, pod)
                    for d in held:
                        node = sim.nodes[int(sim.dev_node[d])].name
                        key = (node, sim.gpus[int(sim.dev_gpu[d])].uuid, int(sim.dev_mig_id[d]) or None)
                        out[key] = HeldDevice(namespace, name, pod, node, self.device_names[d], self._units(d))
        return out

    # -- the parts -------------------------------------------------------------------------------
    def _live_jobs(self) -> Iterator[SimJob]:
        return (job for job in self.sim.jobs if job.phase in _LIVE)

    def _pods(self, job: SimJob) -> list[tuple[str, list[int]]]:
        """(pod name, the devices it holds) per pod of ``job``; a gang's pods hold ``gpus.count`` devices each."""
        workload = job.spec.workload
        names = [workload.name] if workload.gang_size == 1 else [f"{workload.name}-{k}" for k in range(workload.gang_size)]
        devices = [] if job.devices is None else [int(d) for d in np.asarray(job.devices)]
        per_pod = len(devices) if workload.gang_size == 1 else max(1, workload.gpus.count)
        return [(name, devices[k * per_pod:(k + 1) * per_pod]) for k, name in enumerate(names)]

    def pod_claims(self, job: SimJob) -> list[str]:
        """``<namespace>/<name>`` of the claim of each pod of ``job``, in pod order, as named now (fleet
        samples' ``dra_claim``)."""
        return [f"{job.spec.workload.namespace}/{self._claim_name(job, pod)}" for pod, _ in self._pods(job)]

    def _claim_name(self, job: SimJob, pod: str) -> str:
        return claim_name(pod, POD_CLAIM, f"{self.sim.config.seed}/{self._pod_uid(job, pod)}")

    def _pod_uid(self, job: SimJob, pod: str) -> str:
        """A pod stopped (preempted, or on a failed GPU) is made again: a new pod uid, a new claim."""
        return f"{job.spec.workload.namespace}-{pod}-{job.preemptions + job.restarts}"

    def _template(self, job: SimJob) -> str:
        return f"{job.spec.workload.name}-{POD_CLAIM}"

    def _units(self, device: int) -> float:
        return float(self.sim.dev_share[device]) if self.sim.dev_is_mig[device] else 1.0

    def _request(self, request: GpuRequest) -> dict[str, Any]:
        if request.mig_profile:
            return {"name": POD_CLAIM, "exactly": {"deviceClassName": MIG_CLASS, "allocationMode": "ExactCount",
                                                   "count": 1, "selectors": _selector("mig", request.mig_profile)}}
        if request.fraction_milli < 1000:  # a MIG device if one is free, else a whole GPU
            return {"name": POD_CLAIM, "firstAvailable": [
                {"name": "mig", "deviceClassName": MIG_CLASS, "allocationMode": "ExactCount", "count": 1},
                {"name": "gpu", "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": 1}]}
        return {"name": POD_CLAIM, "exactly": {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount",
                                               "count": max(1, request.count)}}

    def _claim(self, job: SimJob, pod: str, held: list[int]) -> dict[str, Any]:
        sim, workload = self.sim, job.spec.workload
        request = self._request(workload.gpus)
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": self._claim_name(job, pod), "namespace": workload.namespace,
                         "annotations": {POD_CLAIM_ANNOTATION: POD_CLAIM},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                              "uid": self._pod_uid(job, pod), "controller": True}]},
            "spec": {"devices": {"requests": [request]}}, "status": {}}
        if held:
            chosen = POD_CLAIM
            if "firstAvailable" in request:
                chosen = f"{POD_CLAIM}/{'mig' if sim.dev_is_mig[held[0]] else 'gpu'}"
            claim["status"] = {
                "allocation": {"devices": {"results": [
                    {"request": chosen, "driver": DRIVER, "pool": sim.nodes[int(sim.dev_node[d])].name,
                     "device": self.device_names[d]} for d in held]}},
                "reservedFor": [{"resource": "pods", "name": pod, "uid": self._pod_uid(job, pod)}]}
        return claim

    def held_request(self, job: SimJob) -> GpuRequest | None:
        """What a running job's pods hold through their claims, as a request (a fractional pod on a whole
        GPU holds the GPU; on a MIG device, that device); None when it holds what it asks."""
        request = job.spec.workload.gpus
        if job.devices is None or request.mig_profile or request.fraction_milli == 1000:
            return None
        device = int(np.asarray(job.devices)[0])
        if self.sim.dev_is_mig[device]:
            return GpuRequest(mig_profile=str(self.sim.dev_mig_profile[device]), gpu_model=request.gpu_model)
        return GpuRequest(count=1, gpu_model=request.gpu_model)
