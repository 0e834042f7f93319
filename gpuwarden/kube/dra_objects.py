"""Dynamic Resource Allocation objects (``resource.k8s.io/v1``, GA in Kubernetes 1.34) as gpuwarden
reads them: ResourceSlices (the devices a driver publishes per node and pool), DeviceClasses,
ResourceClaims and ResourceClaimTemplates. Pure parsing of one object at a time; the reader is
:mod:`.dra`, the node's GPUs from its devices :mod:`.dra_nodes`.

A field of the wrong type raises TypeError or ValueError naming it: the reader skips that one
object, counts it and says why (issue 34, "Bad input"); the rest is read.

NVIDIA's DRA driver (``gpu.nvidia.com``, kubernetes-sigs/dra-driver-nvidia-gpu) publishes a GPU
as ``gpu-<minor>`` with attributes ``type`` ("gpu"), ``uuid``, ``productName``, ``architecture``,
``driverVersion``, ``cudaComputeCapability`` (releases before late 2025 also ``index`` and
``minor``), capacity ``memory``; a static MIG device as ``gpu-<minor>-mig-<profile>-<id>-<start>``
with ``type`` "mig", ``profile`` ("1g.10gb"), ``parentUUID`` and its own ``uuid``. Attribute names
may be written qualified by the driver's domain (``gpu.nvidia.com/productName``) or bare.

Selectors are CEL, read by :mod:`.dra_selectors` (conjunctions of tests on the driver, the
attributes above and memory); :func:`device_matches` evaluates them on a published device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.utils import parse_quantity

from .dra_selectors import EVALUATED, MEMORY, Match, _compare, _dict, _list, _text, read_selectors

NVIDIA_DRIVER = "gpu.nvidia.com"
GPU_DRIVERS = (NVIDIA_DRIVER,)
UNSCHEDULABLE_EFFECTS = ("NoSchedule", "NoExecute")  # a device taint's effects that stop new allocations  # drivers whose "gpu" and "mig" devices are GPUs gpuwarden counts
GPU_TYPE, MIG_TYPE = "gpu", "mig"
EXACT_COUNT, ALL_DEVICES = "ExactCount", "All"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"  # KEP-5004: made by kube-scheduler

DeviceKey = tuple[str, str, str]  # (driver, pool, device name): how an allocation result names a device

_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-\d+-\d+$")
_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_NAME_PROFILE = re.compile(r"^(\d+g)(\d+gb.*)$")  # the profile as the device name writes it: 1g10gb


@dataclass(frozen=True)
class DraDevice:
    """One device of a ResourceSlice, on the node the slice names."""

    driver: str
    pool: str
    name: str
    node: str
    kind: str | None  # the driver's ``type``: "gpu", "mig", "vfio", ...; None when not given
    uuid: str | None = None
    product: str | None = None
    profile: str | None = None  # MIG devices
    parent_uuid: str | None = None
    memory_bytes: int | None = None
    partitionable: bool = False  # consumes shared counters (KEP-4815): a dynamic-MIG candidate, not an instance
    taints: tuple[str, ...] = ()  # device taints (KEP-5055) as "key=value:effect", e.g. gpu.nvidia.com/xid=79:NoSchedule

    @property
    def key(self) -> DeviceKey:
        return self.driver, self.pool, self.name

    @property
    def is_gpu(self) -> bool:
        """A GPU or MIG device of a GPU driver (VFIO passthrough and other drivers' devices are not counted)."""
        return self.driver in GPU_DRIVERS and self.kind in (GPU_TYPE, MIG_TYPE)

    @property
    def unschedulable(self) -> bool:
        """Tainted so kube-scheduler allocates it to no new claim (NoSchedule, NoExecute): NVIDIA's driver
        taints a device after a fatal XID (``gpu.nvidia.com/xid``) or when the GPU is lost (``/gpu-lost``)."""
        return any(t.rpartition(":")[2] in UNSCHEDULABLE_EFFECTS for t in self.taints)

    @property
    def minor(self) -> int | None:
        """The GPU's minor number (of the parent, for a MIG device) from the driver's device name."""
        match = _GPU_NAME.match(self.name) or _MIG_NAME.match(self.name)
        return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Slice:
    """A ResourceSlice: its pool (a pool's current slices carry its highest generation) and devices."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str | None  # None: not node-local (allNodes, nodeSelector): no node's GPUs
    devices: tuple[DraDevice, ...]


def device_matches(match: Match, device: DraDevice) -> bool:
    """Whether ``device`` satisfies every term of ``match`` gpuwarden evaluates (:meth:`Match.unevaluable` is
    refused before: an unknown test never passes here). A capacity the device does not publish fails its test,
    as a CEL error fails the device in kube-scheduler."""
    if match.driver is not None and device.driver != match.driver:
        return False
    for attribute, value in match.equals:
        if attribute not in EVALUATED or getattr(device, EVALUATED[attribute]) != value:
            return False
    for attribute, op, value in match.compares:
        if attribute == MEMORY:
            if device.memory_bytes is None or not isinstance(value, int) or not _compare(device.memory_bytes, op, value):
                return False
        elif attribute not in EVALUATED or getattr(device, EVALUATED[attribute]) == value:
            return False  # op is "!="
    return True


@dataclass(frozen=True)
class DeviceClass:
    name: str
    match: Match
    extended_resource: str | None = None  # KEP-5004: pods asking this extended resource get this class

    @property
    def kind(self) -> str | None:
        value = self.match.value("type")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ClaimRequest:
    """One request of a claim or template (``spec.devices.requests[]``)."""

    name: str
    device_class: str | None  # None: prioritized alternatives (firstAvailable)
    mode: str = EXACT_COUNT
    count: int = 1
    match: Match = Match()


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    requests: tuple[ClaimRequest, ...]
    results: tuple[tuple[str, DeviceKey], ...] = ()  # (request, device) allocated
    allocated: bool = False
    reserved_for: tuple[tuple[str, str], ...] = ()  # pods using it: (name, uid), in the API server's order
    extended: bool = False  # made by kube-scheduler for a pod's extended resources (KEP-5004)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _int(value: Any, what: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} is {value!r}, not an integer")
    return value


def _bytes(value: Any, what: str) -> int:
    try:
        return int(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        raise ValueError(f"{what}: {value!r} is not a Kubernetes quantity") from None


def _attribute(attributes: Mapping[str, Any], driver: str, key: str, device: str) -> str | int | bool | None:
    """An attribute's value, written bare or qualified by the driver's domain; exactly one of
    string, int, bool, version."""
    raw = attributes.get(key, attributes.get(f"{driver}/{key}"))
    if raw is None:
        return None
    value = _dict(raw, f"device {device} attribute {key}")
    kinds = [k for k in ("string", "int", "bool", "version") if k in value]
    if len(kinds) != 1:
        raise ValueError(f"device {device} attribute {key} has {kinds or 'no value'}, not one of string, int, bool, version")
    found = value[kinds[0]]
    if kinds[0] in ("string", "version") and isinstance(found, str):
        return found
    if kinds[0] == "bool" and isinstance(found, bool):
        return found
    if kinds[0] == "int" and isinstance(found, int) and not isinstance(found, bool):
        return found
    raise TypeError(f"device {device} attribute {key}: {kinds[0]} {found!r} is not a {kinds[0]}")


def _string_attribute(attributes: Mapping[str, Any], driver: str, key: str, device: str) -> str | None:
    value = _attribute(attributes, driver, key, device)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"device {device} attribute {key} is {value!r}, not a string")
    return value


def read_slice(item: Mapping[str, Any]) -> Slice:
    """A ResourceSlice; TypeError or ValueError naming the field of the wrong type."""
    name = str(item["metadata"]["name"])
    spec = _dict(item.get("spec"), "spec")
    driver = str(_text(spec.get("driver"), "spec.driver"))
    pool = _dict(spec.get("pool"), "spec.pool")
    pool_name = str(_text(pool.get("name"), "spec.pool.name"))
    generation = _int(pool.get("generation"), "spec.pool.generation", 0)
    count = _int(pool.get("resourceSliceCount"), "spec.pool.resourceSliceCount", 1)
    node = _text(spec.get("nodeName"), "spec.nodeName", required=False)
    devices = []
    for position, raw in enumerate(_list(spec.get("devices"), "spec.devices")):
        entry = _dict(raw, f"spec.devices[{position}]")
        device = str(_text(entry.get("name"), f"spec.devices[{position}].name"))
        where = _text(entry.get("nodeName"), f"device {device} nodeName", required=False) or node
        if where is None:
            continue  # not on one node (allNodes, a node selector): not a node's GPU
        attributes = _dict(entry.get("attributes"), f"device {device} attributes")
        capacity = _dict(entry.get("capacity"), f"device {device} capacity")
        memory = _dict(capacity.get("memory", capacity.get(f"{driver}/memory")), f"device {device} capacity memory")
        kind = _string_attribute(attributes, driver, "type", device)
        devices.append(DraDevice(
            driver, pool_name, device, where, kind, uuid=_string_attribute(attributes, driver, "uuid", device),
            product=_string_attribute(attributes, driver, "productName", device),
            profile=_string_attribute(attributes, driver, "profile", device) or (
                name_profile(device) if kind == MIG_TYPE else None),
            parent_uuid=_string_attribute(attributes, driver, "parentUUID", device),
            memory_bytes=_bytes(memory["value"], f"device {device} capacity memory") if "value" in memory else None,
            partitionable=bool(_list(entry.get("consumesCounters"), f"device {device} consumesCounters")),
            taints=_taints(entry.get("taints"), device)))
    return Slice(name, driver, pool_name, generation, count, node, tuple(devices))


def _taints(value: Any, device: str) -> tuple[str, ...]:
    out = []
    for position, raw in enumerate(_list(value, f"device {device} taints")):
        taint = _dict(raw, f"device {device} taints[{position}]")
        key = _text(taint.get("key"), f"device {device} taints[{position}].key")
        effect = _text(taint.get("effect"), f"device {device} taints[{position}].effect")
        value_text = _text(taint.get("value"), f"device {device} taints[{position}].value", required=False) or ""
        out.append(f"{key}={value_text}:{effect}")
    return tuple(out)


def device_from_name(driver: str, pool: str, name: str, node: str) -> DraDevice | None:
    """A GPU driver's device known only by its name (its slice was skipped or is gone): what NVIDIA's
    canonical names say (``gpu-3``, ``gpu-0-mig-1g10gb-19-0``); None for another name or driver."""
    if driver not in GPU_DRIVERS:
        return None
    if _GPU_NAME.match(name):
        return DraDevice(driver, pool, name, node, GPU_TYPE)
    profile = name_profile(name)
    return DraDevice(driver, pool, name, node, MIG_TYPE, profile=profile) if profile else None


def name_profile(name: str) -> str | None:
    """The MIG profile a canonical MIG device name carries (``gpu-0-mig-1g10gb-19-0``: 1g.10gb)."""
    match = _MIG_NAME.match(name)
    profile = _NAME_PROFILE.match(match.group(2)) if match else None
    return f"{profile.group(1)}.{profile.group(2)}" if profile else None


def read_class(item: Mapping[str, Any]) -> DeviceClass:
    spec = _dict(item.get("spec"), "spec")
    return DeviceClass(str(item["metadata"]["name"]), read_selectors(spec.get("selectors"), "spec.selectors"),
                       _text(spec.get("extendedResourceName"), "spec.extendedResourceName", required=False))


def read_requests(devices: Any, what: str) -> tuple[ClaimRequest, ...]:
    """``spec.devices.requests`` of a claim (or a template's claim spec)."""
    out = []
    for position, raw in enumerate(_list(_dict(devices, what).get("requests"), f"{what}.requests")):
        entry = _dict(raw, f"{what}.requests[{position}]")
        name = str(_text(entry.get("name"), f"{what}.requests[{position}].name"))
        if entry.get("firstAvailable") is not None:
            _list(entry["firstAvailable"], f"request {name} firstAvailable")
            out.append(ClaimRequest(name, None))
            continue
        exactly = _dict(entry.get("exactly"), f"request {name} exactly")
        mode = str(_text(exactly.get("allocationMode") or EXACT_COUNT, f"request {name} allocationMode"))
        if mode not in (EXACT_COUNT, ALL_DEVICES):
            raise ValueError(f"request {name} allocationMode {mode!r} is not {EXACT_COUNT} or {ALL_DEVICES}")
        count = _int(exactly.get("count"), f"request {name} count", 1)
        if count < 1:
            raise ValueError(f"request {name} count {count} is not a whole number >= 1")
        out.append(ClaimRequest(name, _text(exactly.get("deviceClassName"), f"request {name} deviceClassName"), mode,
                                count, read_selectors(exactly.get("selectors"), f"request {name} selectors")))
    return tuple(out)


def read_claim(item: Mapping[str, Any]) -> Claim:
    meta = item["metadata"]
    spec, status = _dict(item.get("spec"), "spec"), _dict(item.get("status"), "status")
    allocation = _dict(status.get("allocation"), "status.allocation")
    results = []
    for position, raw in enumerate(_list(_dict(allocation.get("devices"), "status.allocation.devices").get("results"),
                                         "status.allocation.devices.results")):
        entry = _dict(raw, f"result {position}")
        results.append((str(_text(entry.get("request"), f"result {position} request")),
                        (str(_text(entry.get("driver"), f"result {position} driver")),
                         str(_text(entry.get("pool"), f"result {position} pool")),
                         str(_text(entry.get("device"), f"result {position} device")))))
    reserved = []
    for position, raw in enumerate(_list(status.get("reservedFor"), "status.reservedFor")):
        entry = _dict(raw, f"status.reservedFor[{position}]")
        if entry.get("resource", "pods") == "pods" and not entry.get("apiGroup"):
            reserved.append((str(_text(entry.get("name"), f"status.reservedFor[{position}].name")),
                             str(entry.get("uid") or "")))
    notes = _dict(meta.get("annotations"), "metadata.annotations")
    return Claim(str(meta.get("namespace") or ""), str(meta["name"]), read_requests(spec.get("devices"), "spec.devices"),
                 tuple(results), bool(allocation), tuple(reserved), notes.get(EXTENDED_CLAIM_ANNOTATION) == "true")


def read_template(item: Mapping[str, Any]) -> Claim:
    """A ResourceClaimTemplate as the (never allocated) claim it makes."""
    meta = item["metadata"]
    claim_spec = _dict(_dict(item.get("spec"), "spec").get("spec"), "spec.spec")
    return Claim(str(meta.get("namespace") or ""), str(meta["name"]),
                 read_requests(claim_spec.get("devices"), "spec.spec.devices"))


def unknown_classes(claim: Claim, classes: Mapping[str, DeviceClass]) -> Sequence[str]:
    return sorted({r.device_class for r in claim.requests if r.device_class and r.device_class not in classes})
