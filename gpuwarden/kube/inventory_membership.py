"""Which workload a pod is part of, and how many pods its gang must have admitted together (what
:mod:`.inventory_workloads` groups pods by).

In order, the first that applies:
1. a native gang (:mod:`.podgroups`: the pod's PodGroup, or its v1alpha1 Workload's pod group, with a
   ``gang`` policy): ONE workload needing ``minCount`` pods. Where the group is its pods' own
   controller's (the Job controller makes one PodGroup per Job, owned by the Job) and has no replica
   key, the workload stays that controller's (a Job is still suspended and resumed as a Job, its
   Kueue Workload still found), its gang size the group's ``minCount`` rather than the Job's
   parallelism; otherwise (a PodGroup several Jobs share, a replica key, pods of no controller) the
   workload is the group's own (controller ``PodGroup``, named ``podgroup:NAME`` or
   ``workload:WORKLOAD:GROUP[:REPLICA]``). A ``basic`` policy is no gang; a group Kueue made is
   Kueue's: both fall through to 2-4;
2. the ``gpuwarden.io/gang`` label: that gang, of ``gpuwarden.io/gang-size`` pods;
3. the controller ownerReference (a Job of a JobSet is its JobSet);
4. the pod itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .api import Json
from .gates import GANG_LABEL, GANG_SIZE_LABEL
from .podgroups import PodGroups, controller_of, pod_gang

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
NATIVE_CONTROLLER = "PodGroup"  # the controller of a workload that is a native gang of its own


@dataclass(frozen=True)
class Membership:
    """A pod's workload (its controller kind and name), the native gang it counts toward
    (``(gang name, minCount)``), and the problem that keeps its gang from being read."""

    controller: str
    name: str
    gang: tuple[str, int] | None = None
    problem: str | None = None


def owner_of(meta: Mapping[str, Any], labels: Mapping[str, str], gang_label: bool = True) -> tuple[str, str]:
    """(controller kind, workload name) of a pod from its gang label and owner (2-4 above)."""
    if gang_label and labels.get(GANG_LABEL):
        return "Gang", labels[GANG_LABEL]
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None:
        return "Pod", str(meta["name"])
    if owner.get("kind") == "Job" and labels.get(JOBSET_LABEL):
        return "JobSet", labels[JOBSET_LABEL]
    return str(owner.get("kind", "Pod")), str(owner.get("name", meta["name"]))


def membership(pod: Json, pod_groups: PodGroups | None) -> Membership:
    """The workload a pod is part of (1-4 above); ``pod_groups`` None: no native gangs are read."""
    meta = pod["metadata"]
    labels = dict(meta.get("labels") or {})
    native = pod_gang(pod, pod_groups)
    if native is None or native.kueue:
        return Membership(*owner_of(meta, labels))
    if native.problem is not None or native.min_count is None:  # unresolved (a resolved gang has a minCount)
        controller, name = (NATIVE_CONTROLLER, native.name) if native.name else owner_of(meta, labels)
        return Membership(controller, name, problem=native.problem or "its pod group has no gang minCount")
    if native.owner is not None and native.replica is None and native.owner == controller_of(meta):
        return Membership(*owner_of(meta, labels, gang_label=False), gang=(native.name, native.min_count))
    return Membership(NATIVE_CONTROLLER, native.name, gang=(native.name, native.min_count))


def gang_size_label(labels: Mapping[str, str]) -> tuple[int | None, str | None]:
    """The ``gpuwarden.io/gang-size`` label: (pods, None), (None, None) without it, or (None, why) when
    it is not a whole number >= 1."""
    text = labels.get(GANG_SIZE_LABEL)
    if text is None:
        return None, None
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        return None, f"label {GANG_SIZE_LABEL}={text!r} is not a whole number of pods >= 1"
    return size, None
