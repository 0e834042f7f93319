"""DRA-allocated GPUs through the kubelet pod-resources API: the claims' devices -> GPU / MIG UUIDs.

With Dynamic Resource Allocation the kubelet lists a container's devices under
``ContainerResources.dynamic_resources`` (feature gate ``KubeletPodResourcesDynamicResources``:
alpha from 1.27, beta and on by default from 1.34): per claim (``claim_namespace``/``claim_name``)
the driver, pool and device name the scheduler allocated, and the CDI devices the driver prepared.
Only the NVIDIA GPU driver's devices (``gpu.nvidia.com``) are GPUs; other drivers' (a ComputeDomain
channel, a NIC) are left alone.

The driver names devices after NVML identities (:mod:`..nvml.identity`), not UUIDs:

- a whole GPU: ``gpu-<minor>``;
- a MIG device, from driver v25.12: ``gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement
  start>``, the profile lower-cased without dots (``1g.18gb+me`` -> ``1g18gb-me``);
- a MIG device, up to v25.8: ``gpu-<parent minor>-mig-<GI profile id>-<placement start>-<size>``.

Where ``device_name`` is empty the name is read from the claim's CDI device
(``k8s.gpu.nvidia.com/claim=<claim uid>-<device name>``). A name is mapped only when it names
exactly one device here; otherwise it is *unresolved*, with a reason, and the caller says so
(a counter and a log line once) instead of guessing: ``unknown_name`` (a form not listed above),
``no_device`` (no GPU or MIG device here by that name), ``ambiguous`` (NVML gave no placement and
several MIG devices of that profile sit on the parent), ``no_identity`` (the GPU backend gives no
NVML identities), ``passthrough`` (``gpu-vfio-<n>``: a GPU bound to vfio-pci, invisible to NVML).
A GPU without a pod label that an unresolved device may be is of unknown owner, never free.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..nvml.identity import DeviceIdentity
from ..snapshot import DraClaim

GPU_DRIVER = "gpu.nvidia.com"
UNRESOLVED_REASONS = ("unknown_name", "no_device", "ambiguous", "no_identity", "passthrough")

_GPU = re.compile(r"^gpu-(\d+)$")
_MIG = re.compile(r"^gpu-(\d+)-mig-([a-z0-9-]*[a-z][a-z0-9-]*)-(\d+)-(\d+)$")  # v25.12 on: profile, id, start
_MIG_OLD = re.compile(r"^gpu-(\d+)-mig-(\d+)-(\d+)-(\d+)$")  # up to v25.8: id, start, size
_CDI = re.compile(r"^k8s\.gpu\.nvidia\.com/claim=[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}-(.+)$")
_NOT_NAME = re.compile(r"[^a-z0-9.-]")
_MINOR = re.compile(r"^gpu-(\d+)(?:-|$)")
_VFIO = re.compile(r"^gpu-vfio-\d+$")  # a GPU bound to vfio-pci for a VM: NVML does not see it


@dataclass(frozen=True)
class DraDevice:
    """A DRA device name, parsed: ``kind`` "gpu" or "mig"; the MIG fields None where the name's
    form does not carry them."""

    kind: str
    minor: int
    profile: str | None = None  # as the driver writes it in a name: "1g18gb"
    gi_profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None


def name_profile(profile: str) -> str:
    """A MIG profile as the driver writes it into a device name: ``1g.18gb+me`` -> ``1g18gb-me``."""
    return _NOT_NAME.sub("-", profile.replace(".", "").lower()).strip("-")


def parse_device_name(name: str) -> DraDevice | None:
    """The NVIDIA DRA driver's device name, parsed; None for a form it is not."""
    match = _GPU.match(name)
    if match:
        return DraDevice("gpu", int(match.group(1)))
    match = _MIG.match(name)
    if match:
        minor, profile, profile_id, start = match.groups()
        return DraDevice("mig", int(minor), profile, int(profile_id), int(start))
    match = _MIG_OLD.match(name)
    if match:
        minor, profile_id, start, size = (int(g) for g in match.groups())
        return DraDevice("mig", minor, None, profile_id, start, size)
    return None


def device_name(resource: Any) -> str:
    """A ``ClaimResource``'s device name, or the one its CDI device carries; "" when neither does."""
    if resource.device_name:
        return str(resource.device_name)
    for cdi in resource.cdi_devices:
        match = _CDI.match(cdi.name)
        if match:
            return match.group(1)
    return ""


class DeviceNames:
    """This node's GPUs and MIG devices (one collection's NVML identities) looked up by DRA name."""

    def __init__(self, identities: Iterable[DeviceIdentity] | None):
        self.known = identities is not None
        items = tuple(identities or ())
        self.gpus: dict[int, list[DeviceIdentity]] = {}
        self.migs: dict[int, list[DeviceIdentity]] = {}
        for item in items:
            (self.gpus if item.parent_uuid is None else self.migs).setdefault(item.minor, []).append(item)

    def resolve(self, name: str) -> tuple[str | None, str]:
        """(GPU or MIG UUID, "") for a name that names one device here, else (None, reason)."""
        parsed = parse_device_name(name)
        if parsed is None:
            return None, "passthrough" if _VFIO.match(name) else "unknown_name"
        if not self.known:
            return None, "no_identity"
        if parsed.kind == "gpu":
            found = self.gpus.get(parsed.minor, [])
            return (found[0].uuid, "") if len(found) == 1 else (None, "no_device" if not found else "ambiguous")
        candidates = self.migs.get(parsed.minor, [])
        exact = [c for c in candidates if c.gi_profile_id is not None
                 and (c.gi_profile_id, c.placement_start) == (parsed.gi_profile_id, parsed.placement_start)
                 and parsed.placement_size in (None, c.placement_size)
                 and (parsed.profile is None or c.profile is None or name_profile(c.profile) == parsed.profile)]
        if len(exact) == 1:
            return exact[0].uuid, ""
        # No placement from NVML: the profile (in the newer names) picks the device if only one fits.
        unplaced = [c for c in candidates if c.gi_profile_id is None]
        fits = [c for c in unplaced if parsed.profile is not None and c.profile is not None
                and name_profile(c.profile) == parsed.profile]
        if len(fits) == 1 and not exact:
            return fits[0].uuid, ""
        if len(exact) > 1 or len(fits) > 1 or (unplaced and parsed.profile is None):
            return None, "ambiguous"
        return None, "no_device"

    def suspects(self, name: str, reason: str) -> tuple[str, ...] | None:
        """The UUIDs an unresolved device may be (a GPU without a pod label among them is then of
        unknown owner, not free); None: any GPU here may be."""
        if reason in ("no_device", "passthrough"):
            return ()  # no such device here, or one NVML cannot see: it is none of ours
        match = _MINOR.match(name)
        if match is None or not self.known:
            return None
        minor = int(match.group(1))
        return tuple(i.uuid for i in (*self.gpus.get(minor, ()), *self.migs.get(minor, ())))


@dataclass(frozen=True)
class DraAllocation:
    """One GPU-driver device a container holds through a claim."""

    namespace: str
    pod: str
    container: str
    claim: DraClaim


def dra_allocations(response: Any) -> Iterator[DraAllocation]:
    """Every ``gpu.nvidia.com`` device in a ``ListPodResourcesResponse``'s dynamic resources."""
    for pod in response.pod_resources:
        for container in pod.containers:
            for dynamic in container.dynamic_resources:
                for resource in dynamic.claim_resources:
                    if resource.driver_name != GPU_DRIVER:
                        continue
                    claim = DraClaim(dynamic.claim_namespace or pod.namespace, dynamic.claim_name,
                                     resource.driver_name, resource.pool_name, device_name(resource))
                    yield DraAllocation(pod.namespace, pod.name, container.name, claim)


def unresolved_key(allocation: DraAllocation) -> tuple[str, ...]:
    claim = allocation.claim
    return (allocation.namespace, allocation.pod, allocation.container, claim.claim_namespace, claim.claim_name,
            claim.pool, claim.device)


__all__: Sequence[str] = [
    "GPU_DRIVER", "UNRESOLVED_REASONS", "DeviceNames", "DraAllocation", "DraDevice", "device_name",
    "dra_allocations", "name_profile", "parse_device_name", "unresolved_key",
]
