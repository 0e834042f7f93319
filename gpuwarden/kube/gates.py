"""Reading gpuwarden's admission gate on Kubernetes pods. The names themselves (the gate, labels and
annotations gpuwarden uses on objects) are the seam's vocabulary in :mod:`gpuwarden.fleet.object_names`,
re-exported here for the adapter's modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwarden.fleet.object_names import (  # re-exported
    ADMISSION_GATE as ADMISSION_GATE,
    QUEUE_LABEL as QUEUE_LABEL,
    GANG_LABEL as GANG_LABEL,
    GANG_SIZE_LABEL as GANG_SIZE_LABEL,
    KUEUE_GATE as KUEUE_GATE,
    KUEUE_QUEUE_LABEL as KUEUE_QUEUE_LABEL,
    ADMITTED_NODE_ANNOTATION as ADMITTED_NODE_ANNOTATION,
    ADMITTED_AT_ANNOTATION as ADMITTED_AT_ANNOTATION,
    QUEUE_POSITION_ANNOTATION as QUEUE_POSITION_ANNOTATION,
    QUEUE_REASON_ANNOTATION as QUEUE_REASON_ANNOTATION,
    ESTIMATED_START_ANNOTATION as ESTIMATED_START_ANNOTATION,
    RESERVED_NODES_ANNOTATION as RESERVED_NODES_ANNOTATION,
    RESERVED_AT_ANNOTATION as RESERVED_AT_ANNOTATION,
    SUSPENDED_BY_ANNOTATION as SUSPENDED_BY_ANNOTATION,
    RESUME_REQUESTED_ANNOTATION as RESUME_REQUESTED_ANNOTATION,
    REQUESTED_BY_ANNOTATION as REQUESTED_BY_ANNOTATION,
    CHECKPOINT_ANNOTATION as CHECKPOINT_ANNOTATION,
    PRIORITY_CLASS_ANNOTATION as PRIORITY_CLASS_ANNOTATION,
)


def in_queue(namespace_labels: Mapping[str, str]) -> bool:
    """Whether a namespace with these labels queues in gpuwarden: ``gpuwarden.io/queue`` set, not empty."""
    return bool(namespace_labels.get(QUEUE_LABEL))


def scheduling_gates(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's scheduling gates, in order."""
    return [str(g.get("name")) for g in ((pod.get("spec") or {}).get("schedulingGates") or ()) if isinstance(g, Mapping)]


def gated_by_gpuwarden(pod: Mapping[str, Any]) -> bool:
    return ADMISSION_GATE in scheduling_gates(pod)
