"""Pod attribution through the kubelet pod-resources API (``v1.PodResourcesLister/List``).

The kubelet lists, per pod and container, the device ids it handed out: GPU UUIDs for
``nvidia.com/gpu``, MIG UUIDs for ``nvidia.com/mig-*``, ``<uuid>::<n>`` replicas when the device
plugin time-slices a GPU, or plain indices with ``DEVICE_ID_STRATEGY=index``. The
:class:`PodAttributor` is the pipeline's transform step: it maps each GPU reading (or MIG instance)
to the pod, namespace and container holding it. A GPU shared by several pods (time-slicing) gives
one reading per pod, as dcgm-exporter does.

On such a shared GPU, with a :class:`~.processes.PodMemory` given, each pod's series carries the
pod's own ``DCGM_FI_DEV_FB_USED`` (the sum of its processes' memory, mapped through cgroups) and
``gpuwarden_pod_fb_used_attributed`` 1; utilisation, power, temperature, clocks, ``FB_FREE`` and
every other value stay the whole GPU's, as dcgm-exporter repeats them on each pod's series. So
``sum by (UUID) (DCGM_FI_DEV_FB_USED)`` adds pods' memory without counting the GPU twice, while GPU-
wide gauges must not be summed over pods (use ``max by (UUID)``). Where a pod's own memory cannot
be known the series keeps the GPU's memory and ``gpuwarden_pod_fb_used_attributed`` is 0.

DRA-allocated GPUs and MIG devices (the kubelet's ``dynamic_resources``; :mod:`.dra`) are labelled
the same way, and their series also carry dcgm-exporter's ``dra_claim_name``, ``dra_claim_namespace``,
``dra_driver_name``, ``dra_pool_name`` and ``dra_device_name`` labels. A DRA device whose name maps to
no GPU here is counted and said once, never guessed; a GPU it may be has no pod label and the
attribution state "failed" (owner unknown), while every other GPU keeps its attribution.

``api_pb2`` is generated from the vendored ``api.proto`` (the kubelet's own wire contract);
``grpc`` is imported only when a socket exists, so a node without a kubelet never pays for it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuwarden.fleet import GpuReading

from ..nvml.identity import DeviceIdentity
from ..snapshot import DraClaim, DraStatus, attributed
from .dra import DeviceNames, dra_allocations, unresolved_key
from .processes import PodMemory, split_values

log = logging.getLogger("gpuwarden.exporter.pods")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
_GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu(\.shared)?|mig-[\w.\-+]+)$")
_REPLICA = re.compile(r"::\d+$")
ANY_GPU = "*"  # in ``suspects``: any GPU without a pod label may be held by a device nobody could map


@dataclass(frozen=True, order=True)
class PodRef:
    namespace: str
    pod: str
    container: str


def is_gpu_resource(name: str) -> bool:
    return bool(_GPU_RESOURCE.match(name))


def device_map(response: Any) -> dict[str, tuple[PodRef, ...]]:
    """A ``ListPodResourcesResponse`` -> device id (replica suffix removed) -> pods holding it."""
    found: dict[str, set[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    ref = PodRef(pod.namespace, pod.name, container.name)
                    found.setdefault(_REPLICA.sub("", device_id), set()).add(ref)
    return {device: tuple(sorted(refs)) for device, refs in found.items()}


class PodResourcesClient:
    """A gRPC client for the kubelet's pod-resources socket: a channel per ``List`` call.

    An open gRPC channel keeps grpc's event-engine and timer threads waking (0.08% of a core
    measured on the replay bench, more than the whole exporter at a 15 s interval); connecting
    to a unix socket once per collection costs far less, and with no channel open they exit."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel: Any = None
        self._list: Any = None

    def list_devices(self) -> dict[str, tuple[PodRef, ...]]:
        """The device plugins' GPUs of one ``List`` call (:func:`device_map`)."""
        return device_map(self.list())

    def list(self) -> Any:
        """Call ``List`` once (a ``ListPodResourcesResponse``); raises ``grpc.RpcError`` when the
        kubelet does not answer."""
        if self._list is None:
            import grpc

            from . import api_pb2

            self._channel = grpc.insecure_channel(f"unix://{os.path.abspath(self.socket_path)}")
            self._list = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
                response_deserializer=api_pb2.ListPodResourcesResponse.FromString,
            )
            self._request = api_pb2.ListPodResourcesRequest()
        try:
            return self._list(self._request, timeout=self.timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._list = None


def _keys(reading: GpuReading) -> Iterable[str]:  # GPU UUID, MIG UUID or index, as device ids name them
    if reading.mig_instance_id is not None:
        if reading.mig_uuid:
            yield reading.mig_uuid
        return
    yield reading.gpu_uuid
    yield str(reading.gpu_index)  # DEVICE_ID_STRATEGY=index


def attribute(readings: Sequence[GpuReading], devices: Mapping[str, Sequence[PodRef]],
              memory: PodMemory | None = None, claims: Mapping[tuple[str, PodRef], DraClaim] | None = None,
              suspects: Collection[str] = ()) -> tuple[GpuReading, ...]:
    """Label each reading with the pod holding its device; one reading per pod when shared.

    With ``memory``, the pods sharing a whole GPU each carry their own memory (see the module).
    ``claims`` names the DRA claim a (device, pod) is held through; a reading without a pod whose
    UUID (or MIG UUID) is in ``suspects`` (or any, with :data:`ANY_GPU`) is of unknown owner."""
    out: list[GpuReading] = []
    claims = claims or {}
    for reading in readings:
        pods: Sequence[PodRef] = ()
        key = ""
        for key in _keys(reading):
            pods = devices.get(key, ())
            if pods:
                break
        if not pods:
            own_key = reading.gpu_uuid if reading.mig_instance_id is None else reading.mig_uuid
            unknown = bool(suspects) and (ANY_GPU in suspects or own_key in suspects)
            out.append(attributed(reading, owner_unknown=True) if unknown else reading)
            continue
        holders = sorted({(p.namespace, p.pod) for p in pods})
        split = memory is not None and len(holders) > 1 and reading.mig_instance_id is None
        own = memory.split(reading, holders) if memory is not None and split else {}
        for p in pods:
            labelled = replace(reading, namespace=p.namespace, pod=p.pod, container=p.container)
            if split:
                labelled = replace(labelled, values=split_values(reading, own.get((p.namespace, p.pod))))
            claim = claims.get((key, p))
            out.append(attributed(labelled, claim=claim) if claim is not None else labelled)
    return tuple(out)


class PodAttributor:
    """The transform step: pod labels from the kubelet, or none (said once) when it is absent.

    ``exists`` (default ``os.path.exists``) is injectable for tests. On a kubelet error the last
    good mapping is kept, so a kubelet restart does not churn every series. ``memory`` (a
    :class:`~.processes.PodMemory`, whose constructor takes the proc and kubelet roots) splits
    time-sliced GPUs' memory among their pods; without it they all carry the GPU's memory.
    ``identities`` (``NvmlBackend.device_identities``) gives the collection's NVML identities that
    DRA device names are matched against; without it no DRA device is mapped (each is said).
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout: float = 2.0,
                 client: PodResourcesClient | None = None, exists: Callable[[str], bool] = os.path.exists,
                 memory: PodMemory | None = None,
                 identities: Callable[[], Sequence[DeviceIdentity]] | None = None):
        self.socket_path = socket_path
        self.memory = memory
        self.identities = identities
        self.client = client or PodResourcesClient(socket_path, timeout)
        self._exists = exists
        self._devices: dict[str, tuple[PodRef, ...]] = {}
        self._claims: dict[tuple[str, PodRef], DraClaim] = {}
        self._suspects: frozenset[str] = frozenset()
        self._unresolved: set[tuple[str, ...]] = set()  # the previous answer's unresolved allocations
        self._said: set[str] = set()
        self.last_ok: bool | None = None
        self.dra_status = DraStatus()

    def _say_once(self, key: str, level: int, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, message, *args)

    def attribute(self, readings: Sequence[GpuReading]) -> tuple[GpuReading, ...]:
        if not self._exists(self.socket_path):
            self._say_once("absent", logging.WARNING,
                           "kubelet pod-resources socket %s not found: serving GPU metrics without pod labels",
                           self.socket_path)
            self._devices = {}
            self.last_ok = False
            return tuple(readings)
        try:
            response = self.client.list()
        except Exception as error:  # noqa: BLE001 (grpc.RpcError and friends)
            code = getattr(error, "code", lambda: None)()
            detail = error.details() if callable(getattr(error, "details", None)) else str(error)
            self._say_once(f"error:{code}", logging.WARNING,
                           "kubelet pod-resources List failed (%s: %s); keeping the last pod labels", code, detail)
            self.last_ok = False
        else:
            self._map(response)
            if not self.last_ok:
                log.info("kubelet pod-resources: %d GPU devices held by pods (%d through DRA claims)",
                         len(self._devices), self.dra_status.devices)
            self._said.discard("absent")
            self.last_ok = True
        return attribute(readings, self._devices, self.memory, self._claims, self._suspects)

    def _map(self, response: Any) -> None:
        """Device plugins' GPUs and DRA claims' devices -> pods; DRA names that map to nothing said."""
        found: dict[str, set[PodRef]] = {key: set(refs) for key, refs in device_map(response).items()}
        claims: dict[tuple[str, PodRef], DraClaim] = {}
        names = DeviceNames(self.identities() if self.identities is not None else None)
        suspects: set[str] = set()
        unresolved: set[tuple[str, ...]] = set()
        for allocation in dra_allocations(response):
            claim = allocation.claim
            uuid, reason = names.resolve(claim.device)
            if uuid is None:
                unresolved.add(unresolved_key(allocation))
                maybe = names.suspects(claim.device, reason)
                suspects.update((ANY_GPU,) if maybe is None else maybe)
                self._say_once(f"dra:{claim.pool}/{claim.device}:{reason}", logging.WARNING,
                               "DRA device %s (pool %s, claim %s/%s, pod %s/%s) names no GPU here (%s): counted in "
                               "gpuwarden_exporter_dra_devices_unresolved, not attributed", claim.device or "(no name)",
                               claim.pool, claim.claim_namespace, claim.claim_name, allocation.namespace,
                               allocation.pod, reason)
                continue
            ref = PodRef(allocation.namespace, allocation.pod, allocation.container)
            found.setdefault(uuid, set()).add(ref)
            claims[(uuid, ref)] = claim
        self._devices = {key: tuple(sorted(refs)) for key, refs in found.items()}
        self._claims, self._suspects = claims, frozenset(suspects)
        total = self.dra_status.unresolved_total + len(unresolved - self._unresolved)
        self._unresolved = unresolved
        self.dra_status = DraStatus(devices=len(claims), unresolved=len(unresolved), unresolved_total=total)

    def close(self) -> None:
        self.client.close()
