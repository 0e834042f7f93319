"""Findings from what the cluster reports itself: devices a DRA driver tainted.

NVIDIA's DRA driver (its NVML health check, KEP-5055 device taints) taints a device on its
ResourceSlice after a fatal XID (``gpu.nvidia.com/xid=<code>``, NoSchedule) and when the GPU is lost
(``gpu.nvidia.com/gpu-lost``). The snapshot carries those taints (``ClusterSnapshot.device_health``);
each becomes the finding the same XID in the samples would raise (the XID catalogue's kind, severity
and action), a lost GPU the ``off-the-bus`` finding of XID 79. The driver already keeps new claims
off the device; the finding lets the actuator cordon, drain or repair the node as for any fault.
Application XIDs (the driver taints them with effect None, or not at all) and codes the catalogue
has no rule for raise nothing here. A node whose slices vanished (the driver stopped publishing its
GPUs) is a ``dra-devices-gone`` warning for the node, with no action: nothing new lands there anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from gpuwarden.fleet import DeviceHealthNote, Finding, FindingKind, Severity

from .catalogue import XID_RULES, recommended_action

XID_TAINT = "gpu.nvidia.com/xid"
GPU_LOST_TAINT = "gpu.nvidia.com/gpu-lost"
OFF_THE_BUS_XID = 79  # the code whose rule a lost GPU's finding takes
DEVICES_GONE = "gpuwarden.io/dra-devices-gone"  # the snapshot's note of a node whose slices vanished


def findings_from_device_health(notes: Iterable[DeviceHealthNote], now: datetime) -> list[Finding]:
    """One finding per tainted device and kind (see the module doc)."""
    out: dict[tuple[FindingKind, str, str], Finding] = {}
    for note in notes:
        key, _, rest = note.taint.partition("=")
        value = rest.rpartition(":")[0]
        if key == DEVICES_GONE:
            out.setdefault((FindingKind.DRA_DEVICES_GONE, note.node, ""), Finding(
                kind=FindingKind.DRA_DEVICES_GONE, severity=Severity.WARNING, node=note.node, gpu_uuid=None,
                evidence={"source": "dra-resource-slices", "taint": note.taint}, recommended_action=None,
                confidence=0.9, first_seen=note.since or now, last_seen=now))
            continue
        if key == XID_TAINT and value.isdigit() and int(value) in XID_RULES:
            rule = XID_RULES[int(value)]
        elif key == GPU_LOST_TAINT:
            rule = XID_RULES[OFF_THE_BUS_XID]
        else:
            continue
        if not rule.implicates_gpu:
            continue
        gpu = note.device_uuid or note.gpu_uuid
        out.setdefault((rule.kind, note.node, gpu), Finding(
            kind=rule.kind, severity=rule.severity, node=note.node, gpu_uuid=gpu,
            evidence={"source": "dra-device-taint", "taint": note.taint, "snapshot_gpu": note.gpu_uuid},
            recommended_action=recommended_action(rule.kind), confidence=rule.confidence,
            first_seen=note.since or now, last_seen=now))
    return list(out.values())
