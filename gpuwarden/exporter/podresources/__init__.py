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

``api_pb2`` is generated from the vendored ``api.proto`` (the kubelet's own wire contract);
``grpc`` is imported only when a socket exists, so a node without a kubelet never pays for it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuwarden.fleet import GpuReading

from .processes import PodMemory, split_values

log = logging.getLogger("gpuwarden.exporter.pods")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
_GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu(\.shared)?|mig-[\w.\-+]+)$")
_REPLICA = re.compile(r"::\d+$")


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
        """Call ``List`` once; raises ``grpc.RpcError`` when the kubelet does not answer."""
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
            return device_map(self._list(self._request, timeout=self.timeout))
        finally:
            self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._list = None


def _keys(reading: GpuReading) -> Iterable[str]:
    if reading.mig_instance_id is not None:
        if reading.mig_uuid:
            yield reading.mig_uuid
        return
    yield reading.gpu_uuid
    yield str(reading.gpu_index)  # DEVICE_ID_STRATEGY=index


def attribute(readings: Sequence[GpuReading], devices: Mapping[str, Sequence[PodRef]],
              memory: PodMemory | None = None) -> tuple[GpuReading, ...]:
    """Label each reading with the pod holding its device; one reading per pod when shared.

    With ``memory``, the pods sharing a whole GPU each carry their own memory (see the module)."""
    out: list[GpuReading] = []
    for reading in readings:
        pods: Sequence[PodRef] = ()
        for key in _keys(reading):
            pods = devices.get(key, ())
            if pods:
                break
        if not pods:
            out.append(reading)
            continue
        holders = sorted({(p.namespace, p.pod) for p in pods})
        if memory is not None and len(holders) > 1 and reading.mig_instance_id is None:
            own = memory.split(reading, holders)
            out.extend(replace(reading, namespace=p.namespace, pod=p.pod, container=p.container,
                               values=split_values(reading, own.get((p.namespace, p.pod)))) for p in pods)
            continue
        out.extend(replace(reading, namespace=p.namespace, pod=p.pod, container=p.container) for p in pods)
    return tuple(out)


class PodAttributor:
    """The transform step: pod labels from the kubelet, or none (said once) when it is absent.

    ``exists`` (default ``os.path.exists``) is injectable for tests. On a kubelet error the last
    good mapping is kept, so a kubelet restart does not churn every series. ``memory`` (a
    :class:`~.processes.PodMemory`, whose constructor takes the proc and kubelet roots) splits
    time-sliced GPUs' memory among their pods; without it they all carry the GPU's memory.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout: float = 2.0,
                 client: PodResourcesClient | None = None, exists: Callable[[str], bool] = os.path.exists,
                 memory: PodMemory | None = None):
        self.socket_path = socket_path
        self.memory = memory
        self.client = client or PodResourcesClient(socket_path, timeout)
        self._exists = exists
        self._devices: dict[str, tuple[PodRef, ...]] = {}
        self._said: set[str] = set()
        self.last_ok: bool | None = None

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
            self._devices = self.client.list_devices()
        except Exception as error:  # noqa: BLE001 (grpc.RpcError and friends)
            code = getattr(error, "code", lambda: None)()
            detail = error.details() if callable(getattr(error, "details", None)) else str(error)
            self._say_once(f"error:{code}", logging.WARNING,
                           "kubelet pod-resources List failed (%s: %s); keeping the last pod labels", code, detail)
            self.last_ok = False
        else:
            if not self.last_ok:
                log.info("kubelet pod-resources: %d GPU devices held by pods", len(self._devices))
            self._said.discard("absent")
            self.last_ok = True
        return attribute(readings, self._devices, self.memory)

    def close(self) -> None:
        self.client.close()
