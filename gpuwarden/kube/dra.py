"""GPUs allocated by Dynamic Resource Allocation: what the cluster's DRA objects say of nodes and pods.

:func:`read_dra` lists ``resource.k8s.io/v1`` DeviceClasses, ResourceSlices, ResourceClaims and
ResourceClaimTemplates (four paged lists, whatever the number of pods). A cluster that does not
serve the API (404: older than 1.34, or DRA turned off) has no DRA: the snapshot reads as before; a
403 (the chart's ClusterRole lacks it) is said once and read the same way.

- Slices: a pool's current slices are those of its highest ``spec.pool.generation`` (older ones are
  being replaced); each device once. A node's GPUs come from its devices (:mod:`.dra_nodes`).
- Claims: a device in ``status.allocation.devices.results`` is in use. It is held by the pod that
  names the claim (``spec.resourceClaims[].resourceClaimName``, or through a template the claim
  ``status.resourceClaimStatuses`` names, or KEP-5004's ``status.extendedResourceClaimStatus``)
  when ``status.reservedFor`` is empty or starts with that pod: a claim shared by several pods is
  counted once, on the first (the others hold nothing of it).
- A pod's GPUs (:meth:`DraInventory.pod_request`): the devices its claims hold on its node (a whole
  GPU 1, a MIG device its share of its GPU: the one rule of :mod:`gpuwarden.fleet.semantics`);
  before allocation the claims' (or templates') requests: ``count`` devices of the class's kind.
  What cannot be sized is refused with the reason, never guessed: ``allocationMode: All``,
  prioritized alternatives (``firstAvailable``), a MIG class naming no profile, a class whose
  selector gpuwarden cannot read, or more than one kind of GPU in one pod.
- Where it may run (``PodRequest.dra_nodes``): the nodes whose published devices of the kind (and
  MIG profile) all match the class's and the request's selectors (product, memory: evaluated on
  the devices, :func:`.dra_objects.device_matches`), so kube-scheduler's allocation on the node the
  plan pins it to succeeds; never a device-plugin-only node. A request no node's devices match can
  never start (refused, saying what it asks and what is published); a selector term gpuwarden
  cannot evaluate is refused, the expression said.
- Bad input: a slice, class, claim or template with a field of the wrong type, or a claim naming a
  device class the cluster does not have, is skipped, counted (``DraInventory.skipped``) and
  logged; a pod using such a claim is refused naming it; the rest is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwarden.fleet import DeviceHealthNote, Placement
from gpuwarden.fleet.mig_geometry import check_profile
from gpuwarden.fleet.semantics_scalar import request_gpu_equivalents

from .answers import reading
from .api import Json, KubeApi, KubeFailure
from .dra_objects import (ALL_DEVICES, GPU_DRIVERS, GPU_TYPE, MIG_TYPE, UNSCHEDULABLE_EFFECTS, Claim, DeviceClass,
                          DeviceKey, DraDevice, Slice, device_from_name, device_matches, read_claim, read_class, read_slice, read_template,
                          unknown_classes)
from .dra_selectors import Match
from .failure import UnexpectedAnswer
from .inventory_nodes import GPU, MIG_PREFIX, SHARED_GPU, NodeOffer, PodRequest

log = logging.getLogger("gpuwarden.kube")
_SAID: set[str] = set()  # messages logged once per process (a 403 would otherwise repeat every round)


@dataclass(frozen=True)
class DraPodGpus:
    """What one pod's claims hold (or, not allocated yet, ask) in GPU units."""

    gpu_units: float
    devices: tuple[str, ...] = ()  # "pool/device" held; () while pending
    allocated: bool = False


@dataclass
class DraInventory:
    served: bool = False  # the cluster answered resource.k8s.io/v1
    classes: dict[str, DeviceClass] = field(default_factory=dict)
    devices: dict[DeviceKey, DraDevice] = field(default_factory=dict)
    by_node: dict[str, list[DraDevice]] = field(default_factory=dict)
    claims: dict[str, Claim] = field(default_factory=dict)  # "ns/name"
    templates: dict[str, Claim] = field(default_factory=dict)  # "ns/name"
    skipped: dict[str, str] = field(default_factory=dict)  # "Kind ns/name" -> why it was not read
    pods: dict[str, DraPodGpus] = field(default_factory=dict)  # "ns/pod" -> its GPUs from claims
    gpu_uuids: dict[str, str] = field(default_factory=dict)  # snapshot GPU uuid -> the uuid the driver published
    offers: Mapping[str, NodeOffer] = field(default_factory=dict)
    placements: dict[DeviceKey, Placement] = field(default_factory=dict)
    _matching: dict[tuple[str, str, Match], tuple[str, ...]] = field(default_factory=dict)  # (kind, profile, match) -> nodes
    dra_only_nodes: set[str] = field(default_factory=set)  # GPU nodes whose allocatable has no device-plugin GPUs

    def skip(self, kind: str, item: Json, why: str) -> None:
        meta = item.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        name = f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))
        self.skipped[f"{kind} {name}"] = why
        log.warning("DRA: %s %s skipped: %s; the rest is read", kind, name, why)

    def attach(self, offers: Mapping[str, NodeOffer]) -> None:
        """The nodes as read: each allocated device is marked taken on its node's offer, so that pods of
        the device plugin are never laid on it."""
        self.offers = offers
        for offer in offers.values():
            self.placements.update(offer.dra_placements)
            for key, placement in offer.dra_placements.items():
                device = self.devices[key]
                published = device.uuid if device.kind == GPU_TYPE else device.parent_uuid
                if published:
                    self.gpu_uuids.setdefault(placement.gpu_uuid, published)
        for claim in self.claims.values():
            for _, key in claim.results:
                taken = self.placements.get(key)
                if taken is not None:
                    offers[taken.node].dra_taken.add((taken.gpu_uuid, taken.mig_instance_id))

    def health_notes(self) -> tuple[DeviceHealthNote, ...]:
        """Each device tainted NoSchedule or NoExecute, once per taint: the health rules' evidence, and
        its GPU (the parent of a MIG device) unhealthy for the scheduler: kube-scheduler allocates such a
        device to no new claim."""
        out: list[DeviceHealthNote] = []
        for key, placement in sorted(self.placements.items()):
            device = self.devices.get(key)
            if device is None or not device.unschedulable:
                continue
            published = device.uuid if device.kind == GPU_TYPE else (device.parent_uuid or device.uuid)
            out.extend(DeviceHealthNote(placement.node, placement.gpu_uuid, published, taint)
                       for taint in device.taints if taint.rpartition(":")[2] in UNSCHEDULABLE_EFFECTS)
        return tuple(out)

    # -- pods ------------------------------------------------------------------------------------
    def pod_request(self, pod: Json, request: PodRequest) -> PodRequest:
        """The pod's GPU request with what its claims hold or ask (``request``: its extended resources,
        :func:`.inventory_pods.gpu_request`); ValueError saying why it cannot be sized."""
        return self._request(pod, request, record=True)

    def template_request(self, namespace: str, pod_spec: Json, request: PodRequest) -> PodRequest:
        """What a pod of a Job's template would ask through its claims (a suspended Job has no pods)."""
        return self._request({"metadata": {"namespace": namespace, "name": ""}, "spec": pod_spec}, request,
                             record=False)

    def _request(self, pod: Json, request: PodRequest, record: bool) -> PodRequest:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        entries = spec.get("resourceClaims") or ()
        extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        if not (entries or extended) or not self.served:
            return self._plugin_only(request)
        meta = pod["metadata"]
        namespace, name = str(meta.get("namespace", "")), str(meta["name"])
        made = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()}
        wanted: list[tuple[str, Claim | None]] = []  # (what the pod calls it, the claim or template)
        for entry in entries:
            claim_name = entry.get("resourceClaimName") or made.get(entry.get("name"))
            if claim_name:
                wanted.append((f"resource claim {claim_name}", self._claim(namespace, str(claim_name), "ResourceClaim")))
            elif entry.get("resourceClaimTemplateName") and not spec.get("nodeName"):
                # its claim is not made yet: the template says what it asks (bound without one: none was needed)
                template = str(entry["resourceClaimTemplateName"])
                wanted.append((f"resource claim template {template}",
                               self._claim(namespace, template, "ResourceClaimTemplate")))
        found = self._claim(namespace, str(extended), "ResourceClaim") if extended else None
        if found is not None:  # KEP-5004: the extended resources it asks are this claim's devices, not the plugin's
            request = PodRequest()
            wanted.append((f"resource claim {extended}", found))
        whole, migs, devices, allocated = request.count, [request.mig] if request.mig else [], [], False
        nodes: set[str] | None = None  # where every request not allocated yet can be: None, not one asks
        units = request.count + (request_gpu_equivalents(request.mig) if request.mig else 0.0)
        for said, claim in wanted:
            if claim is None:
                raise ValueError(f"{said} is not found")
            if claim.allocated:
                held = self._held(claim, name, str(meta.get("uid") or ""))
                allocated = allocated or bool(held)
                for device, placement in held:
                    devices.append(f"{device.pool}/{device.name}")
                    if device.kind == GPU_TYPE or (placement is not None and placement.mig_instance_id is None):
                        whole, units = whole + 1, units + 1.0
                    else:
                        migs.append(str(device.profile))
                        units += request_gpu_equivalents(device.profile, model=self._model(placement))
                continue
            for kind, count, profile, matching in self._demand(claim, said):
                nodes = set(matching) if nodes is None else nodes & set(matching)
                if not nodes:
                    raise ValueError(f"{said}: its requests match the devices of no one node together (it can never "
                                     "start as written)")
                if kind == GPU_TYPE:
                    whole, units = whole + count, units + count
                else:
                    migs.extend([profile] * count)
                    units += request_gpu_equivalents(profile, count)
        if not (whole or migs):
            return request
        if len(migs) > 1 or sum(bool(x) for x in (whole, migs, request.shares)) > 1:
            raise ValueError(f"its GPUs mix kinds ({whole} whole, MIG {', '.join(migs) or 'none'}, {request.shares} "
                             "time-sliced share(s)) through its claims: one kind per pod, one MIG device at most")
        if migs:
            check_profile(migs[0])
        if record:
            self.pods[f"{namespace}/{name}"] = DraPodGpus(units, tuple(devices), allocated)
        if allocated:
            self._place(pod, namespace, name)
        return PodRequest(whole, migs[0] if migs else None, request.shares, dra=True,
                          dra_nodes=tuple(sorted(nodes)) if nodes is not None else None)

    def _plugin_only(self, request: PodRequest) -> PodRequest:
        """A request of the device plugin's resources, kept to the nodes that serve them where some GPU
        nodes publish theirs only through DRA (kube-scheduler would leave it Pending there), unless a
        DeviceClass maps the resource (KEP-5004: DRA allocates it anywhere a class's device fits)."""
        if request.empty or not self.dra_only_nodes:
            return request
        asked = {GPU} if request.count else set()
        asked |= {MIG_PREFIX + request.mig} if request.mig else set()
        asked |= {SHARED_GPU} if request.shares else set()
        mapped = {c.extended_resource for c in self.classes.values() if c.extended_resource}
        # mapped: DRA allocates it on any node, so it leaves the DRA-only ones to claims that can go nowhere else
        return replace(request, spare_dra_only=True) if asked <= mapped else replace(request, plugin=True)

    def _claim(self, namespace: str, name: str, kind: str) -> Claim | None:
        why = self.skipped.get(f"{kind} {namespace}/{name}")
        if why is not None:
            raise ValueError(f"{kind} {name} was skipped: {why}")
        return (self.claims if kind == "ResourceClaim" else self.templates).get(f"{namespace}/{name}")

    def _held(self, claim: Claim, pod: str, uid: str) -> list[tuple[DraDevice, Placement | None]]:
        """The GPU devices ``claim`` holds for ``pod``: all of them when the pod is its first user."""
        if not pod or (claim.reserved_for and claim.reserved_for[0][0] != pod and (
                not uid or claim.reserved_for[0][1] != uid)):
            return []  # shared: counted on its first user; a Job's template holds nothing
        out = []
        for _, key in claim.results:
            device = self.devices.get(key) or device_from_name(*key, node="")
            if device is not None and device.is_gpu:
                out.append((device, self.placements.get(key)))
        return out

    def _model(self, placement: Placement | None) -> str | None:
        offer = self.offers.get(placement.node) if placement is not None else None
        return offer.node.gpu_model if offer is not None else None

    def _place(self, pod: Json, namespace: str, name: str) -> None:
        """What the pod's claims hold, on its node's offer, for the layout of running pods."""
        key, claimed = f"{namespace}/{name}", []
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        names = [e.get("resourceClaimName") for e in spec.get("resourceClaims") or ()]
        names += [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()]
        names.append((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))
        for claim_name in dict.fromkeys(n for n in names if n):
            claim = self.claims.get(f"{namespace}/{claim_name}")
            if claim is not None and claim.allocated:
                claimed += [p for _, p in self._held(claim, name, str(pod["metadata"].get("uid") or "")) if p]
        for placement in dict.fromkeys(claimed):
            offer = self.offers[placement.node]
            offer.claimed[key] = (*offer.claimed.get(key, ()), placement)

    def _demand(self, claim: Claim, said: str) -> list[tuple[str, int, str, tuple[str, ...]]]:
        """(kind, count, MIG profile, the nodes it may be allocated on) per GPU request of a claim not allocated
        yet; ValueError when unsizable, when a selector cannot be evaluated, or when no node publishes its devices."""
        out = []
        for request in claim.requests:
            if request.device_class is None:
                raise ValueError(f"{said} request {request.name} lists prioritized alternatives (firstAvailable): "
                                 "which one it gets is not known before allocation")
            device_class = self.classes[request.device_class]
            match = device_class.match.joined(request.match)
            if match.driver is not None and match.driver not in GPU_DRIVERS:
                continue  # another driver's devices (a NIC, a ComputeDomain channel): no GPU
            kind = match.value("type")
            if kind is None:  # any device of a GPU driver, or of any driver: a GPU, a MIG device, or none
                unread = "; ".join(match.unread) or "no type"
                raise ValueError(f"{said} request {request.name}: device class {device_class.name} does not say "
                                 f"which kind of device it gives as gpuwarden reads its selector ({unread})")
            if kind not in (GPU_TYPE, MIG_TYPE):
                continue
            if request.mode == ALL_DEVICES:
                raise ValueError(f"{said} request {request.name} asks allocationMode All of {device_class.name}: "
                                 "every matching device of the node it lands on, not known before allocation")
            profile = match.value("profile")
            if kind == MIG_TYPE and not isinstance(profile, str):
                raise ValueError(f"{said} request {request.name} asks a MIG device of {device_class.name} naming no "
                                 "profile: its share of a GPU is not known before allocation")
            unevaluable = match.unevaluable()
            if unevaluable:
                raise ValueError(f"{said} request {request.name} (device class {device_class.name}): gpuwarden cannot "
                                 f"evaluate {'; '.join(repr(t) for t in unevaluable)} of its selectors; refused rather "
                                 "than guessed")
            nodes = self._nodes_matching(str(kind), str(profile or ""), match)
            if not nodes:
                raise ValueError(self._published_none(said, request.name, str(kind), str(profile or ""), match))
            out.append((str(kind), request.count, str(profile or ""), nodes))
        return out

    def _same_kind(self, devices: list[DraDevice], kind: str, profile: str) -> list[DraDevice]:
        """A node's devices a request of ``kind`` (and MIG ``profile``) may be given (static MIG only)."""
        return [d for d in devices if d.is_gpu and d.kind == kind and (kind == GPU_TYPE or (
            d.profile == profile and not d.partitionable))]

    def _nodes_matching(self, kind: str, profile: str, match: Match) -> tuple[str, ...]:
        """The GPU nodes whose published devices of the kind all match: there, every free device of the kind the
        scheduler counts is one kube-scheduler may allocate (a node where only some match is left out: never
        pinned where fewer match than are free)."""
        key = (kind, profile, match)
        if key not in self._matching:
            self._matching[key] = tuple(sorted(
                node for node, devices in self.by_node.items() if node in self.offers
                and (same := self._same_kind(devices, kind, profile)) and all(device_matches(match, d) for d in same)))
        return self._matching[key]

    def _published_none(self, said: str, request: str, kind: str, profile: str, match: Match) -> str:
        """Why a request can never start: what it asks, and what the nodes publish of that kind."""
        what = f"MIG {profile} devices" if kind == MIG_TYPE else "GPUs"
        seen = sorted({f"{d.product or 'unnamed'}" + (f" {d.memory_bytes / (1 << 30):g}Gi" if d.memory_bytes else "")
                       for node, devices in self.by_node.items() if node in self.offers
                       for d in self._same_kind(devices, kind, profile)})
        return (f"can never start as written: {said} request {request} asks {what} with {match.said()}, and no node "
                f"publishes {what} that all match" + (f" (published: {', '.join(seen)})" if seen else
                                                       f" (no node publishes {what} through DRA)"))


def _said_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        log.warning(message)


def _each(inventory: DraInventory, kind: str, items: list[Json], read: Callable[[Json], Any]) -> list[tuple[Json, Any]]:
    """(item, ``read(item)``) of each item; one that cannot be read is skipped, counted and said."""
    out = []
    for item in items:
        try:
            with reading(kind.lower(), item):
                out.append((item, read(item)))
        except UnexpectedAnswer as error:
            cause = error.__cause__
            inventory.skip(kind, item, f"{type(cause).__name__}: {cause}" if cause is not None else str(error))
    return out


def read_dra(api: KubeApi, page_size: int = 500) -> DraInventory:
    """The cluster's DRA objects; an empty, unserved inventory where the API is not served or not granted."""
    from kubernetes import client  # the client classes load with the first read (see the package doc)

    resource = client.ResourceV1Api(api.client)
    inventory = DraInventory()
    try:
        classes = api.list_all(resource.list_device_class, resource="deviceclasses.resource.k8s.io",
                               page_size=page_size)
        slices = api.list_all(resource.list_resource_slice, resource="resourceslices.resource.k8s.io",
                              page_size=page_size)
        claims = api.list_all(resource.list_resource_claim_for_all_namespaces,
                              resource="resourceclaims.resource.k8s.io", page_size=page_size)
        templates = api.list_all(resource.list_resource_claim_template_for_all_namespaces,
                                 resource="resourceclaimtemplates.resource.k8s.io", page_size=page_size)
    except KubeFailure as failure:
        if failure.status == 403:  # served, but the chart's ClusterRole does not grant it
            _said_once(f"DRA: {failure.message}; GPUs allocated by DRA are not seen")
            return inventory
        if failure.gone:  # not served: a cluster before 1.34, or DRA off
            return inventory
        raise
    inventory.served = True
    inventory.classes = {c.name: c for _, c in _each(inventory, "DeviceClass", classes, read_class)}
    _add_slices(inventory, [s for _, s in _each(inventory, "ResourceSlice", slices, read_slice)])
    for kind, items, reader, table in (("ResourceClaim", claims, read_claim, inventory.claims),
                                       ("ResourceClaimTemplate", templates, read_template, inventory.templates)):
        for item, claim in _each(inventory, kind, items, reader):
            missing = unknown_classes(claim, inventory.classes)
            if missing:
                inventory.skip(kind, item, f"device class {', '.join(missing)} is not one the cluster has")
            else:
                table[claim.key] = claim
    return inventory


def _add_slices(inventory: DraInventory, slices: list[Slice]) -> None:
    """Each pool's current generation; a device once."""
    current: dict[tuple[str, str], int] = {}
    for s in slices:
        current[(s.driver, s.pool)] = max(current.get((s.driver, s.pool), s.generation), s.generation)
    seen: dict[tuple[str, str], int] = {}
    for s in slices:
        if s.generation != current[(s.driver, s.pool)]:
            continue
        seen[(s.driver, s.pool)] = seen.get((s.driver, s.pool), 0) + 1
        for device in s.devices:
            if device.key not in inventory.devices:
                inventory.devices[device.key] = device
                inventory.by_node.setdefault(device.node, []).append(device)
    for (driver, pool), count in seen.items():
        wanted = next(s.slice_count for s in slices if (s.driver, s.pool) == (driver, pool)
                      and s.generation == current[(driver, pool)])
        if count < wanted and driver in GPU_DRIVERS:
            log.info("DRA: pool %s of %s has %d of its %d slices (being published); read as it is", pool, driver,
                     count, wanted)
