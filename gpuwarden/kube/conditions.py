"""The ``GPUHealthy`` NodeCondition: gpuwarden's findings where other tools read node health.

Karpenter's node repair, cluster autoscalers, NVSentinel and ``kubectl describe node`` read
NodeConditions; gpuwarden writes one on each GPU node in every mode (observe included), so they can
act on its findings without gpuwarden acting:
- ``status``: ``True`` with reason ``GPUsHealthy`` when the node has no open health finding,
  ``False`` with reason the finding kinds (``off-the-bus,row-remap-failure``) and a message naming
  each GPU, its finding and severity;
- ``lastTransitionTime`` moves only when the status flips; ``lastHeartbeatTime`` on each write.
It goes through the ``nodes/status`` subresource (the only write an observe-mode chart grants
besides Events): the nodes are listed once, and a node whose condition already says the same is
not written. The list of conditions is sent whole with the read ``resourceVersion`` (a JSON merge
patch replaces lists; the kubelet's own conditions are sent back as read, and a 409 is re-read).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gpuwarden.fleet import Finding
from gpuwarden.fleet.clock import Clock

from .api import MERGE_PATCH, Json, KubeApi
from .failure import Conflict
from .inventory_nodes import GPU, MIG_PREFIX

log = logging.getLogger("gpuwarden.kube")

CONDITION = "GPUHealthy"
HEALTHY_REASON = "GPUsHealthy"
MESSAGE_LIMIT = 1024
CONFLICT_RETRIES = 3


def condition_for(findings: Sequence[Finding]) -> tuple[str, str, str]:
    """(status, reason, message) of ``GPUHealthy`` for a node's open health findings."""
    if not findings:
        return "True", HEALTHY_REASON, "gpuwarden: no open GPU health finding"
    kinds = sorted({str(f.kind) for f in findings})
    parts = sorted({f"{f.gpu_uuid or 'node'}: {f.kind} ({f.severity.value})" for f in findings})
    return "False", ",".join(kinds), ("gpuwarden: " + "; ".join(parts))[:MESSAGE_LIMIT]


def _is_gpu_node(node: Json) -> bool:
    status = node.get("status") or {}
    capacity = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    return any(k == GPU or k.startswith(MIG_PREFIX) for k in capacity)


def _wanted(node: Json, findings: Sequence[Finding], now: str) -> list[Json] | None:
    """The node's conditions with ``GPUHealthy`` as it should be, or None when it already says so."""
    status, reason, message = condition_for(findings)
    conditions = list((node.get("status") or {}).get("conditions") or ())
    current = next((c for c in conditions if c.get("type") == CONDITION), None)
    if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
            status, reason, message):
        return None
    since = now if current is None or current.get("status") != status else current.get("lastTransitionTime", now)
    condition = {"type": CONDITION, "status": status, "reason": reason, "message": message, "lastHeartbeatTime": now,
                 "lastTransitionTime": since}
    return [c for c in conditions if c.get("type") != CONDITION] + [condition]


def publish(api: KubeApi, health: Mapping[str, Sequence[Finding]], clock: Clock, page_size: int = 500) -> int:
    """Write ``GPUHealthy`` on every GPU node whose condition changed; returns how many were written."""
    now = clock.now().isoformat().replace("+00:00", "Z")
    written = 0
    for node in api.list_all(api.core.list_node, resource="nodes", page_size=page_size):
        if not _is_gpu_node(node):
            continue
        name = node["metadata"]["name"]
        for attempt in range(CONFLICT_RETRIES + 1):
            conditions = _wanted(node, health.get(name, ()), now)
            if conditions is None:
                break
            try:
                api.call(api.core.patch_node_status, name,
                         {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                          "status": {"conditions": conditions}},
                         verb="patch", resource="nodes/status", _content_type=MERGE_PATCH)
                written += 1
                break
            except Conflict:
                if attempt == CONFLICT_RETRIES:
                    raise
                node = api.call(api.core.read_node, name, verb="get", resource="nodes")
    log.info("node conditions: %s written on %d node(s)", CONDITION, written)
    return written
