"""A node's GPUs from the devices its ResourceSlices publish (Dynamic Resource Allocation).

- a ``gpu`` device is one whole GPU;
- static MIG devices (``mig``, no shared counters) are instances of their parent GPU (``parentUUID``,
  else the minor in the device's name), numbered 1.. in name order: the GPU is MIG-enabled with
  that layout, as the device plugin's ``nvidia.com/mig-<profile>`` resources are read;
- dynamic MIG (KEP-4815 partitionable devices, ``consumesCounters``): the candidates are what
  *could* be made, not instances: the parent counts as one whole GPU, and a claim holding a
  partition holds that whole GPU (never less than it holds: not supported finer);
- VFIO passthrough devices and other drivers' devices are not counted.

Snapshot GPUs are named ``NODE/gpu-<minor>`` like the device plugin's (Kubernetes never names them
there); the NVML UUID the driver published is kept beside (``DraInventory.gpu_uuids``). The GPU
model is GPU feature discovery's label where the node has one, else the driver's ``productName``
resolved through the GPU catalogue and written as that label is (spaces as ``-``), so that DRA
nodes and device-plugin nodes of one model share its name and default pool.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpuwarden.fleet import ClusterSnapshot, DeviceHealthNote, Gpu, MigInstance, Placement
from gpuwarden.fleet.gpu_catalogue import gpu_catalogue
from gpuwarden.fleet.node_selection import LabelRequirement

from .dra_objects import GPU_TYPE, DeviceKey, DraDevice

log = logging.getLogger("gpuwarden.kube")
# In the snapshot's node labels only (never on the cluster): the node's name on a node whose ResourceSlices publish
# GPUs, so that a pod's claims keep it to the nodes whose devices match them through the one node-selection
# mechanism the scheduler honours (``PodRequest.dra_nodes``). gpuwarden's own key: no node carries it.
DRA_NODE_LABEL = "dra.gpuwarden.io/node"
# Likewise, on the nodes whose allocatable holds the device plugin's GPU resources, where some GPU nodes
# serve GPUs only through DRA: a pod asking nvidia.com/gpu (no DeviceClass maps it, KEP-5004) runs only there.
PLUGIN_NODE_LABEL = "dra.gpuwarden.io/plugin-gpus"
# And on the GPU nodes that serve GPUs only through DRA: work that may also go elsewhere spares them.
DRA_ONLY_NODE_LABEL = "dra.gpuwarden.io/dra-only"
SPARE_DRA_ONLY = ((LabelRequirement(DRA_ONLY_NODE_LABEL, "Exists", ()),),)
DEVICES_GONE_TAINT = "gpuwarden.io/dra-devices-gone=:NoSchedule"  # a DeviceHealthNote's taint: nothing published


def devices_gone(previous: ClusterSnapshot | None, listed: set[str], node_labels: Mapping[str, Mapping[str, str]],
                 now: datetime) -> tuple[DeviceHealthNote, ...]:
    """The nodes whose GPUs an earlier snapshot read from DRA slices and that, still in the cluster,
    publish none now (the driver stopped, its slices deleted): one note each, no GPU named, kept from
    snapshot to snapshot (since the first) until the slices are back or the node is gone."""
    if previous is None:
        return ()
    since = {n.node: n.since for n in previous.device_health if n.taint == DEVICES_GONE_TAINT}
    return tuple(DeviceHealthNote(node, "", None, DEVICES_GONE_TAINT, since.get(node) or now) for node in sorted(listed)
                 if (node in since or DRA_NODE_LABEL in previous.node_labels.get(node, {}))
                 and DRA_NODE_LABEL not in node_labels.get(node, {}))


@dataclass
class DraLayout:
    model: str
    gpus: list[Gpu] = field(default_factory=list)
    whole: list[str] = field(default_factory=list)  # snapshot uuids of GPUs offered whole
    mig: list[tuple[str, int, str]] = field(default_factory=list)  # (gpu uuid, instance id, profile)
    placements: dict[DeviceKey, Placement] = field(default_factory=dict)  # what each published device is


def fleet_model(product: str | None) -> str:
    """The fleet's name for a published ``productName``: GPU feature discovery's label form of the
    catalogue's name (``NVIDIA-H100-80GB-HBM3``), or of the product when the catalogue lacks it."""
    if not product:
        return "unknown"
    known = gpu_catalogue().resolve(product)
    if known is None:
        log.info("DRA: GPU product %r is not in the GPU catalogue; its nodes keep the name as published", product)
    return "-".join((known or product).split())


def _parent(device: DraDevice) -> str:
    """Which physical GPU a device is on: its (parent's) UUID, else its minor, else its own name."""
    own = device.uuid if device.kind == GPU_TYPE else device.parent_uuid
    if own:
        return own
    return f"minor:{device.minor}" if device.minor is not None else device.name


def dra_layout(node: str, label_model: str | None, devices: Sequence[DraDevice]) -> DraLayout | None:
    """The GPUs of ``node`` from its published devices; None when it publishes no GPU."""
    gpus = [d for d in devices if d.is_gpu]
    if not gpus:
        return None
    product = next((d.product for d in gpus if d.product), None)
    layout = DraLayout(label_model or fleet_model(product))
    physical: dict[str, list[DraDevice]] = {}
    for device in sorted(gpus, key=lambda d: (d.minor is None, d.minor or 0, d.name)):
        physical.setdefault(_parent(device), []).append(device)
    for index, (parent, members) in enumerate(physical.items()):
        minor = next((d.minor for d in members if d.minor is not None), None)
        uuid = f"{node}/gpu-{minor}" if minor is not None else f"{node}/{members[0].name}"
        static = sorted((d for d in members if d.kind != GPU_TYPE and not d.partitionable), key=lambda d: d.name)
        if static and len(static) == len(members):
            instances = tuple(MigInstance(i + 1, str(d.profile)) for i, d in enumerate(static))
            layout.gpus.append(Gpu(uuid, index, node, layout.model, mig_enabled=True, mig_instances=instances))
            for instance, device in zip(instances, static, strict=True):
                layout.mig.append((uuid, instance.gpu_instance_id, instance.profile))
                layout.placements[device.key] = Placement(node, uuid, instance.gpu_instance_id)
            continue
        if static:  # a whole device and static instances of one GPU: the driver publishes one or the other
            log.warning("DRA: node %s publishes GPU %s whole and as MIG devices; read as whole", node, parent)
        layout.gpus.append(Gpu(uuid, index, node, layout.model))
        layout.whole.append(uuid)
        for device in members:  # the GPU itself, and any partition of it a claim may hold
            layout.placements[device.key] = Placement(node, uuid)
    return layout
