"""``set-mig-config`` on Kubernetes: set a node's ``nvidia.com/mig.config`` label, which the GPU
operator's MIG manager applies (it re-partitions the GPUs, so only on a node no GPU pod runs on).

The node is re-read and its pods listed at the moment of acting: a GPU pod bound since the snapshot
makes the action a temporary refusal, never a layout change under running work. The label is
written with the read ``resourceVersion`` (a concurrent change is a 409: the caller re-reads).
"""

from __future__ import annotations

from gpuwarden.fleet import Action, ActionKind

from .api import MERGE_PATCH, Json, KubeApi
from .failure import TemporaryFailure
from .inventory import ACTIVE_PHASES
from .inventory_pods import gpu_request

MIG_CONFIG_LABEL = "nvidia.com/mig.config"


def _uses_gpus(pod: Json) -> bool:
    try:
        return not gpu_request(pod.get("spec") or {}).empty
    except ValueError:  # a request gpuwarden cannot read: count it as using GPUs, never re-partition under it
        return True


def set_mig_config(api: KubeApi, action: Action, page_size: int = 500) -> tuple[str, Action | None]:
    node_name, wanted = action.target, str(action.params.get("config") or "")
    if not wanted:
        raise ValueError("params.config: the named MIG configuration is required (e.g. all-1g.10gb)")
    node = api.call(api.core.read_node, node_name, verb="get", resource="nodes")
    labels = node["metadata"].get("labels") or {}
    if MIG_CONFIG_LABEL not in labels:
        raise ValueError(f"node has no {MIG_CONFIG_LABEL} label: the GPU operator's MIG manager does not manage it")
    previous = labels[MIG_CONFIG_LABEL]
    if previous == wanted:
        return f"{node_name} already has {MIG_CONFIG_LABEL}={wanted}", None
    pods = api.list_all(api.core.list_pod_for_all_namespaces, resource="pods", page_size=page_size,
                        field_selector=f"spec.nodeName={node_name},{ACTIVE_PHASES}")
    running = [f"{p['metadata'].get('namespace')}/{p['metadata']['name']}" for p in pods if _uses_gpus(p)]
    if running:
        raise TemporaryFailure(f"{len(running)} GPU pod(s) run on it ({', '.join(running[:3])}): a new MIG layout "
                               "would destroy their instances; retried once it is drained")
    api.call(api.core.patch_node, node_name,
             {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"], "labels": {MIG_CONFIG_LABEL: wanted}}},
             verb="patch", resource="nodes", _content_type=MERGE_PATCH)
    undo = Action(ActionKind.SET_MIG_CONFIG, node_name, "undo set-mig-config", {"config": previous, "previous": wanted})
    return f"{node_name}: {MIG_CONFIG_LABEL} {previous} -> {wanted} (the GPU operator's MIG manager applies it)", undo
