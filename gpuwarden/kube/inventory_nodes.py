"""GPU nodes of a Kubernetes cluster as fleet ``Node`` and ``Gpu`` objects.

What a node offers comes from its capacity (the NVIDIA device plugin's resources) and GPU feature
discovery's labels:

- whole GPUs: ``nvidia.com/gpu``;
- MIG (the device plugin's *mixed* strategy): ``nvidia.com/mig-<profile>`` instances, laid on the
  node's GPUs that are not whole ones (``nvidia.com/gpu.count`` less ``nvidia.com/gpu``), each GPU
  filled up to its compute slices. The *single* strategy (MIG devices advertised as
  ``nvidia.com/gpu``) is read as whole GPUs: not supported for MIG placement;
- time-sliced GPUs: a node labelled ``nvidia.com/gpu.replicas=r`` (r > 1) shares its GPUs
  (``Node.shares_gpus``). With the device plugin's ``renameByDefault: true`` it advertises
  ``nvidia.com/gpu.shared`` (r per GPU); physical GPUs are ``nvidia.com/gpu.count``, else capacity
  / r. A pod asking ``nvidia.com/gpu.shared: 1`` is a fraction of ``1000 // r`` milli-GPU. Such a
  node is put in its own pool (``<pool>/time-sliced``) so that whole-GPU pods and shared pods are
  never planned onto each other's nodes, as kube-scheduler would refuse. Not supported: several
  shares per pod (the device plugin may hand them from different GPUs) and ``renameByDefault:
  false`` (shares advertised as ``nvidia.com/gpu`` are read as whole GPUs);
- topology from labels named by :class:`NodeLabels`;
- GPUs published by Dynamic Resource Allocation (:mod:`.dra_nodes`): a node whose ResourceSlices
  publish GPU or MIG devices gets its GPUs from them alone. A GPU the DRA driver publishes is the
  same GPU the device plugin would count, so the node's ``nvidia.com/gpu`` and ``nvidia.com/mig-*``
  (a device plugin on the same node, or KEP-5004's extended resource backed by DRA) are never added
  to them: the two sources are never summed.

Every other node (no GPU resource, no published GPU) is not a GPU node and is left out.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes.utils import parse_quantity

from gpuwarden.fleet import FleetValueError, Gpu, Location, MigInstance, Node, Placement, PriceTier, Topology, WorkloadState
from gpuwarden.fleet.price_tiers import TIER_LABEL, tier_from_labels
from gpuwarden.fleet.mig_geometry import compute_slices, fits, mig_table

from .dra_nodes import DraLayout, dra_layout
from .dra_objects import DeviceKey, DraDevice

log = logging.getLogger("gpuwarden.kube")

GPU = "nvidia.com/gpu"
SHARED_GPU = "nvidia.com/gpu.shared"  # the device plugin's renamed time-sliced resource
MIG_PREFIX = "nvidia.com/mig-"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"  # GPU feature discovery: time-slicing replicas per GPU
COUNT_LABEL = "nvidia.com/gpu.count"  # GPU feature discovery: physical GPUs
PRODUCT_LABEL = "nvidia.com/gpu.product"
TIME_SLICED_POOL_SUFFIX = "/time-sliced"

E = TypeVar("E", bound=enum.Enum)


@dataclass(frozen=True)
class NodeLabels:
    """Which node labels give a node's topology and pool (``KubeCluster(labels=...)``)."""

    leaf_switch: str = "gpuwarden.io/leaf-switch"
    leaf_switch_fallback: str = "topology.kubernetes.io/zone"
    nvlink_domain: str = "nvidia.com/gpu.clique"  # GPU feature discovery's NVLink clique (GB200 NVL)
    pool: str = "gpuwarden.io/pool"
    rack: str = "gpuwarden.io/rack"


@dataclass(frozen=True)
class PodRequest:
    count: int = 0  # whole GPUs
    mig: str | None = None
    shares: int = 0  # time-sliced shares
    dra: bool = False  # asked (or held) through DRA resource claims: laid on the devices its claims hold
    dra_nodes: tuple[str, ...] | None = None  # the nodes whose published devices its pending claims match; None: any
    plugin: bool = False  # asks the device plugin's resources where some GPU nodes publish theirs only through DRA
    spare_dra_only: bool = False  # may go anywhere (KEP-5004): leaves DRA-only nodes to claims that need them

    @property
    def empty(self) -> bool:
        return not (self.count or self.mig or self.shares)


@dataclass
class NodeOffer:
    """One GPU node: the fleet objects and what its GPUs offer, for laying running pods on them."""

    node: Node
    gpus: list[Gpu]
    whole: list[str] = field(default_factory=list)  # uuids of GPUs offered whole
    mig: list[tuple[str, int, str]] = field(default_factory=list)  # (gpu uuid, instance id, profile)
    replicas: int = 1  # > 1: time-sliced, each GPU shared by this many pods
    dra_placements: dict[DeviceKey, Placement] = field(default_factory=dict)  # each published device
    dra_taken: set[tuple[str, int | None]] = field(default_factory=set)  # (gpu, MIG instance) allocated by claims
    claimed: dict[str, tuple[Placement, ...]] = field(default_factory=dict)  # "ns/pod" -> what its claims hold


DEFAULT_LABELS = NodeLabels()


def quantity(value: Any, what: str) -> float:
    """A Kubernetes quantity as a number; ValueError naming ``what`` and the value when unparseable."""
    try:
        return float(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        raise ValueError(f"{what}: {value!r} is not a Kubernetes quantity") from None


def _label(enum_type: type[E], labels: Mapping[str, str], key: str, default: str) -> E:
    """A node label's value as ``enum_type``, or FleetValueError naming the label and the allowed values."""
    value = labels.get(key) or default
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in enum_type)
        raise FleetValueError(f"label {key}={value!r} is not one of: {allowed}") from None


def _tier(labels: Mapping[str, str], node: str) -> PriceTier:
    """The price tier the node's labels give (gpuwarden.io/price-tier, else a cloud's capacity
    label: :mod:`gpuwarden.fleet.price_tiers`); on-demand where none says, and where a cloud's label
    has a value we do not know (with a warning): a cloud may add values, and a label gpuwarden does
    not own must not cost the node its model, pool and capacity. A wrong gpuwarden.io/price-tier is
    an error like any gpuwarden.io label's (the node's labels are ignored)."""
    try:
        found = tier_from_labels(labels, node)
    except FleetValueError as error:
        if labels.get(TIER_LABEL):  # read first: the error is our own label's
            raise
        log.warning("%s; the node is taken as on-demand", error)
        return PriceTier.ON_DEMAND
    return PriceTier.ON_DEMAND if found is None else found[0]


def _whole_number(labels: Mapping[str, str], key: str, name: str) -> int:
    try:
        return max(0, int(labels.get(key) or 0))
    except ValueError:
        log.warning("node %s: label %s=%r is not a whole number; ignored", name, key, labels.get(key))
        return 0


def _mig_layouts(model: str, gpus: int, counts: Mapping[str, int]) -> list[list[str]]:
    """``counts`` instances laid on ``gpus`` GPUs, largest first, each on the first GPU it fits
    (compute and memory slices, instances per profile: :func:`gpuwarden.fleet.mig_geometry.fits`); a
    model the catalogue does not know is filled by compute slices. What fits nowhere goes
    round-robin: the node says it has them."""
    table = mig_table(model)
    most = compute_slices(model if table else None)
    layouts: list[list[str]] = [[] for _ in range(gpus)]

    def slices(profile: str) -> int:
        spec = table.get(profile)
        return spec.compute_slices if spec else int(profile.split("g.", 1)[0]) if profile[:1].isdigit() else 1

    def room(layout: list[str], profile: str) -> bool:
        if table:
            return fits(model, layout, profile)
        return sum(slices(p) for p in layout) + slices(profile) <= most

    spill = 0
    for profile in sorted(counts, key=lambda p: (-slices(p), p)):
        for _ in range(counts[profile]):
            g = next((i for i in range(gpus) if room(layouts[i], profile)), None)
            if g is None:
                g, spill = spill % gpus, spill + 1
            layouts[g].append(profile)
    return layouts


def serves_plugin_gpus(item: Mapping[str, Any]) -> bool:
    """Whether the node's allocatable holds a device plugin's GPU resource (whole, time-sliced or MIG):
    a pod asking one can be bound there; a node whose GPUs only a DRA driver publishes has none."""
    status = item.get("status") or {}
    for key, value in {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}.items():
        if key in (GPU, SHARED_GPU) or key.startswith(MIG_PREFIX):
            try:
                if quantity(value, key) > 0:
                    return True
            except ValueError:
                continue
    return False


def read_node(item: Mapping[str, Any], names: NodeLabels = DEFAULT_LABELS,
              dra: Sequence[DraDevice] = ()) -> NodeOffer | None:
    """A node object as a GPU node, or None when it offers no GPU. Bad labels are logged and defaulted.
    ``dra``: the devices its ResourceSlices publish; GPUs among them are the node's GPUs."""
    meta, status = item["metadata"], item.get("status") or {}
    capacity = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    labels = meta.get("labels") or {}
    name = meta["name"]
    published = dra_layout(name, labels.get(PRODUCT_LABEL), dra) if dra else None
    if published is not None:
        return _dra_offer(item, names, labels, capacity, published)
    try:
        whole = int(quantity(capacity.get(GPU, "0"), f"node {name} {GPU}"))
        shares = int(quantity(capacity.get(SHARED_GPU, "0"), f"node {name} {SHARED_GPU}"))
        mig = {k[len(MIG_PREFIX):]: int(quantity(v, f"node {name} {k}")) for k, v in capacity.items()
               if k.startswith(MIG_PREFIX)}
    except ValueError as error:
        log.warning("%s; node left out", error)
        return None
    mig = {profile: n for profile, n in mig.items() if n > 0}
    if whole <= 0 and shares <= 0 and not mig:
        return None  # not a GPU node
    counted = _whole_number(labels, COUNT_LABEL, name)
    replicas = _whole_number(labels, REPLICAS_LABEL, name)
    shared = replicas > 1 and shares > 0
    if shared:
        physical = counted or max(1, shares // replicas)
        mig_gpus = 0
    else:
        replicas = 1
        mig_gpus = max(counted - whole, 1) if mig else 0
        physical = whole + mig_gpus
    node = _node(item, names, labels, capacity, labels.get(PRODUCT_LABEL, "unknown"), physical, shared)
    offer = NodeOffer(node, [], replicas=replicas)
    layouts = _mig_layouts(node.gpu_model, mig_gpus, mig) if mig_gpus else []
    for index in range(physical):
        uuid = f"{name}/gpu-{index}"
        layout = layouts[index - (physical - mig_gpus)] if index >= physical - mig_gpus else []
        instances = tuple(MigInstance(i + 1, profile) for i, profile in enumerate(layout))
        offer.gpus.append(Gpu(uuid, index, name, node.gpu_model, mig_enabled=bool(instances), mig_instances=instances))
        if instances:
            offer.mig.extend((uuid, instance.gpu_instance_id, instance.profile) for instance in instances)
        elif not shared and index < whole:
            offer.whole.append(uuid)
    if shared:
        offer.whole = [g.uuid for g in offer.gpus]  # shares are laid on these, r per GPU
    return offer


def _node(item: Mapping[str, Any], names: NodeLabels, labels: Mapping[str, str], capacity: Mapping[str, Any],
          model: str, physical: int, shared: bool) -> Node:
    name = str(item["metadata"]["name"])
    zone = labels.get(names.leaf_switch_fallback, "")
    pool = labels.get(names.pool) or labels.get(PRODUCT_LABEL) or (model if model != "unknown" else "default")
    if shared:
        pool += TIME_SLICED_POOL_SUFFIX
    topology = Topology(labels.get(names.nvlink_domain) or name, labels.get(names.leaf_switch) or zone,
                        labels.get(names.rack) or zone)
    cpu_milli = int(_or_zero(capacity.get("cpu", "0"), f"node {name} cpu") * 1000)
    memory = int(_or_zero(capacity.get("memory", "0"), f"node {name} memory"))
    try:
        return Node(
            name=name, pool=pool,
            location=_label(Location, labels, "gpuwarden.io/location",
                            "cloud" if (item.get("spec") or {}).get("providerID") else "on-prem"),
            price_tier=_tier(labels, name),
            topology=topology, gpu_model=model, gpu_count=physical, cpu_milli=cpu_milli, memory_bytes=memory,
            shares_gpus=shared,
        )
    except FleetValueError as error:
        log.warning("node %s: %s; its labels are ignored", name, error)
        return Node(name, "default" + (TIME_SLICED_POOL_SUFFIX if shared else ""), Location.ON_PREM,
                    PriceTier.ON_DEMAND, Topology(name, zone, zone), "unknown", physical, 0, 0, shares_gpus=shared)


def _dra_offer(item: Mapping[str, Any], names: NodeLabels, labels: Mapping[str, str], capacity: Mapping[str, Any],
               published: DraLayout) -> NodeOffer:
    """A node whose GPUs its ResourceSlices publish: they alone (never added to its extended resources)."""
    node = _node(item, names, labels, capacity, published.model, len(published.gpus), False)
    return NodeOffer(node, published.gpus, whole=published.whole, mig=published.mig,
                     dra_placements=published.placements)


def _or_zero(value: Any, what: str) -> float:
    try:
        return quantity(value, what)
    except ValueError as error:
        log.warning("%s; read as 0", error)
        return 0.0


class Layout:
    """Running pods laid on their nodes' GPUs in order (the device plugin does not say which GPU a pod
    has); a pod whose DRA claims hold devices is laid on exactly those (``NodeOffer.claimed``), and the
    others never on a device a claim holds."""

    def __init__(self, offers: Mapping[str, NodeOffer]) -> None:
        self.offers = offers
        self.whole: dict[str, int] = {}
        self.shares: dict[str, int] = {}
        self.mig_used: dict[str, set[int]] = {}
        self.claims_laid: set[tuple[str, str]] = set()  # (node, "ns/pod") whose claimed devices are laid
        self.overfull: set[str] = set()  # nodes where pods were laid past what they offer

    def lay(self, node: str, request: PodRequest, pod: Mapping[str, Any] | None = None) -> list[Placement]:
        """Where one pod of ``request`` on ``node`` holds GPUs; ``pod`` (the pod object) names it, so a pod
        holding DRA devices is laid on its own. Without it (GPUs held for a pod not made or admitted yet: its
        claims hold nothing), on free GPUs, never on devices other pods' claims hold."""
        offer = self.offers.get(node)
        if offer is None or not offer.gpus:
            return []  # not a GPU node we read (gone, or its GPUs unreadable)
        if request.dra and offer.claimed and pod is not None:
            held = self._claimed(node, offer, pod)
            if held is not None:
                return list(held)
        if request.mig:
            # an instance of its own profile: the device plugin publishes each profile's count exactly, so a
            # pod found none of its profile free (admitted past what the node offers) holds none of another's
            used = self.mig_used.setdefault(node, set())
            free = [i for i, (uuid, instance, profile) in enumerate(offer.mig) if profile == request.mig
                    and i not in used and (uuid, instance) not in offer.dra_taken]
            if not free:
                self.overfull.add(node)
                return []
            used.add(free[0])
            uuid, instance, _ = offer.mig[free[0]]
            return [Placement(node, uuid, instance)]
        gpus = offer.whole or [g.uuid for g in offer.gpus]
        gpus = [u for u in gpus if (u, None) not in offer.dra_taken] or gpus  # every one taken: laid past, overfull
        if request.shares:
            index = self.shares.get(node, 0)
            self.shares[node] = index + 1
            return [Placement(node, gpus[min(index // offer.replicas, len(gpus) - 1)])]
        out = []
        for _ in range(max(1, request.count)):
            index = self.whole.get(node, 0)
            self.whole[node] = index + 1
            out.append(Placement(node, gpus[min(index, len(gpus) - 1)]))
        return out

    def _claimed(self, node: str, offer: NodeOffer, pod: Mapping[str, Any]) -> tuple[Placement, ...] | None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if key not in offer.claimed or (node, key) in self.claims_laid:
            return None
        self.claims_laid.add((node, key))
        return offer.claimed[key]


def overfull_nodes(workloads: Sequence[WorkloadState], offers: Mapping[str, NodeOffer]) -> set[str]:
    """Nodes whose pods, as laid, need more than the node offers of a kind: whole GPUs, time-sliced
    shares, or one MIG instance twice."""
    used: dict[tuple[str, object], int] = {}
    for ws in workloads:
        for p in ws.placements:
            offer = offers.get(p.node)
            if offer is None:
                continue
            kind: object = (p.gpu_uuid, p.mig_instance_id) if p.mig_instance_id is not None else (
                "shares" if offer.replicas > 1 else "whole")
            used[(p.node, kind)] = used.get((p.node, kind), 0) + 1
    full = set()
    for (node, kind), count in used.items():
        offer = offers[node]
        capacity = 1 if isinstance(kind, tuple) else len(offer.gpus) * offer.replicas if kind == "shares" \
            else len(offer.whole)
        if count > capacity:
            full.add(node)
    return full
