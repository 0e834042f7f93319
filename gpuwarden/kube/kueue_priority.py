"""``set-priority`` on Kubernetes: a Kueue Workload's ``spec.priorityClassName`` and ``spec.priority``
(a team lead's change, planned by the scheduler where Kueue manages the Job). Anything else is
refused with the reason: a pod's priority is fixed at creation (``spec.priority`` is immutable), and
gpuwarden's own queue reads the ``gpuwarden.io/priority-class`` annotation instead."""

from __future__ import annotations

from typing import Any

from gpuwarden.fleet import Action, ActionKind

from .api import MERGE_PATCH, KubeApi
from .inventory import KUEUE


def set_kueue_priority(api: KubeApi, inventory: Any, action: Action, namespace: str,
                       controller: str) -> tuple[str, Action | None]:
    """Move the workload's Kueue Workload to ``params['priority_class']``, written on the version
    read; the message, and the action that moves it back."""
    wanted = action.params.get("priority_class")
    kueue = inventory.kueue_workload.get(action.target)
    if not kueue:
        raise ValueError(f"Kubernetes fixes a pod's priority at creation (spec.priority is immutable) and this "
                         f"{controller} has no Kueue Workload; recreate it with priorityClassName {wanted!r}")
    if wanted not in inventory.workload_priority_classes:
        known = ", ".join(sorted(inventory.workload_priority_classes)) or "none"
        raise ValueError(f"WorkloadPriorityClass {wanted!r} does not exist; known: {known}")
    current = api.call(api.custom.get_namespaced_custom_object, *KUEUE, namespace, "workloads", kueue,
                       verb="get", resource="workloads.kueue.x-k8s.io")
    previous = (current.get("spec") or {}).get("priorityClassName")
    api.call(api.custom.patch_namespaced_custom_object, *KUEUE, namespace, "workloads", kueue,
             {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
              "spec": {"priorityClassName": wanted, "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
                       "priority": inventory.workload_priority_classes[wanted]}},
             verb="patch", resource="workloads.kueue.x-k8s.io", _content_type=MERGE_PATCH)
    undo = Action(ActionKind.SET_PRIORITY, action.target, "undo set-priority", {"priority_class": previous}) if previous else None
    return f"{action.target}: Kueue Workload {kueue} priority {previous} -> {wanted}", undo
