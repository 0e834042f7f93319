"""Native gangs: kube-scheduler's gang scheduling through the Workload / PodGroup API (KEP-4671,
API group ``scheduling.k8s.io``, feature gate ``GenericWorkload``), read so that the pods of one gang
PodGroup are ONE gpuwarden workload needing its ``minCount`` pods admitted together.

Versions and fields read (the newest version the API server serves is listed; each serves the same
objects, so one is enough, and an older one is not asked once a newer one answered):

- ``v1beta1`` (Kubernetes 1.37, beta, off by default) and ``v1alpha3`` (1.37 alpha): ``PodGroup``,
  namespaced, ``spec.schedulingPolicy`` with exactly one of ``basic: {}`` and ``gang: {minCount}``.
  Not read: ``spec.workloadRef`` (``workloadName``, ``templateName``), ``spec.schedulingConstraints``,
  ``spec.disruptionMode``, ``spec.priorityClassName`` and ``spec.parentCompositePodGroupName``: a
  CompositePodGroup (a gang of gangs, ``minGroupCount``) is not read; each PodGroup is its own gang.
- ``v1alpha2`` (1.36): the standalone ``PodGroup`` (KEP-5832 split it out of the Workload), the same
  ``spec.schedulingPolicy``; its ``spec.podGroupTemplateRef.workload`` is not read (the PodGroup
  carries a copy of its template's policy). From 1.36 a pod names its group with
  ``spec.schedulingGroup.podGroupName`` (a PodGroup in the pod's namespace); one PodGroup per replica.
- ``v1alpha1`` (1.35): ``Workload``, namespaced, ``spec.podGroups[]`` of ``{name, policy: {basic: {} |
  gang: {minCount}}}``, and ``spec.controllerRef {apiGroup, kind, name}``. A pod names its group with
  ``spec.workloadRef {name, podGroup, podGroupReplicaKey}``: each replica key of a pod group is a
  gang of its own (``minCount`` pods each).

What a pod's reference makes of it (:func:`pod_gang`):
- no reference, a ``basic`` policy, or no API read (``pod_groups`` None): no native gang;
- a group Kueue made (an ownerReference to a ``kueue.x-k8s.io`` object, or a ``kueue.x-k8s.io/``
  label or annotation on it): Kueue's; the pod keeps its Kueue handling;
- a gang: a :class:`NativeGang` named ``podgroup:NAME`` (v1alpha2 and later) or
  ``workload:WORKLOAD:GROUP[:REPLICA]`` (v1alpha1), names no Kubernetes object can have, with its
  ``minCount`` and its controller (the Job controller makes one PodGroup per Job, owned by the Job);
- a reference gpuwarden cannot resolve (the object is absent, skipped as unreadable, the list was
  forbidden, no version gpuwarden reads is served, or the reference itself is of the wrong type): a
  gang with a ``problem``, which the workload reader states instead of admitting part of a gang that
  kube-scheduler would then hold back.

Reading (:func:`read_pod_groups`): paged and bounded through :meth:`KubeApi.list_all`; 404 is a
version not served (the next older is tried); 403 is logged once per process and the next version
tried; any other failure is raised (the round retries). An object with a field of the wrong type is
skipped, counted and said (its reason, from :func:`.answers.reading`, logged and kept in
``PodGroups.bad``); the rest are read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .answers import object_name, reading
from .api import Json, KubeApi, KubeFailure
from .failure import UnexpectedAnswer

log = logging.getLogger("gpuwarden.kube")

GROUP = "scheduling.k8s.io"
# (version, plural), newest first: a pod-group version lists PodGroups, v1alpha1 lists Workloads
VERSIONS = (("v1beta1", "podgroups"), ("v1alpha3", "podgroups"), ("v1alpha2", "podgroups"), ("v1alpha1", "workloads"))
PODGROUP_VERSIONS = "/".join(v for v, plural in VERSIONS if plural == "podgroups") + f" PodGroups of {GROUP}"
KUEUE_GROUP = "kueue.x-k8s.io"
_TOLD: set[str] = set()  # 403s already logged (once per process)


@dataclass(frozen=True)
class GroupPolicy:
    """One pod group as read: its gang's minimum (None: the basic policy, no gang), the controller that
    made it (``(kind, name)``), and whether Kueue made it."""

    min_count: int | None
    owner: tuple[str, str] | None = None
    kueue: bool = False


@dataclass(frozen=True)
class NativeGang:
    """What a pod's reference makes of it: the gang's workload ``name``, its ``min_count``, whether it is
    Kueue's, its group's controller and replica key, or the ``problem`` that keeps it from being read."""

    name: str
    min_count: int | None = None
    kueue: bool = False
    owner: tuple[str, str] | None = None
    replica: str | None = None
    problem: str | None = None


@dataclass
class PodGroups:
    """The pod groups of a cluster, as read from one served version (``version``; None: none served)."""

    version: str | None = None  # e.g. "scheduling.k8s.io/v1alpha2"
    forbidden: str | None = None  # the API server's 403, where no version could be listed
    groups: dict[tuple[str, str], GroupPolicy] = field(default_factory=dict)  # (namespace, PodGroup) ->
    workloads: dict[tuple[str, str], dict[str, GroupPolicy]] = field(default_factory=dict)  # v1alpha1 Workloads
    bad: dict[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) -> why it was skipped

    @property
    def skipped(self) -> int:
        """Objects left out for a field of the wrong type."""
        return len(self.bad)

    def add(self, plural: str, item: Json) -> None:
        """One listed object (a PodGroup, or a v1alpha1 Workload); a wrong-typed one is skipped and said."""
        meta = item["metadata"]
        where = (str(meta.get("namespace") or ""), str(meta["name"]))
        try:
            with reading(plural[:-1], item):
                if plural == "workloads":
                    self.workloads[where] = parse_workload(item)
                else:
                    self.groups[where] = parse_pod_group(item)
        except UnexpectedAnswer as error:  # its field of the wrong type, as reading() names it
            cause = error.__cause__
            self.bad[where] = f"{type(cause).__name__}: {cause}" if cause is not None else str(error)
            log.warning("%s.%s %s skipped (%s): its pods are not admitted until it is fixed", plural, GROUP,
                        object_name(item), self.bad[where])


def _mapping(value: Any, what: str, required: bool = False) -> Mapping[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} is {type(value).__name__}, not an object")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} is {value!r}, not a name")
    return value


def read_policy(policy: Any, what: str) -> int | None:
    """A scheduling policy's gang ``minCount`` (a whole number >= 1), or None for ``basic``."""
    policy = _mapping(policy, what, required=True)
    kinds = [k for k in ("basic", "gang") if policy.get(k) is not None]
    if len(kinds) != 1:
        raise ValueError(f"{what} sets {' and '.join(kinds) or 'neither basic nor gang'}; exactly one must be set")
    if kinds == ["basic"]:
        _mapping(policy["basic"], f"{what}.basic")
        return None
    count = _mapping(policy["gang"], f"{what}.gang").get("minCount")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{what}.gang.minCount is {count!r}, not a whole number >= 1")
    return count


def made_by_kueue(meta: Mapping[str, Any]) -> bool:
    """Whether Kueue made the object: an ownerReference to a Kueue object, or a Kueue label or annotation."""
    owners = meta.get("ownerReferences") or ()
    if any(str(_mapping(o, "metadata.ownerReferences[]").get("apiVersion", "")).startswith(KUEUE_GROUP + "/")
           for o in owners):
        return True
    marks = [*_mapping(meta.get("labels"), "metadata.labels"), *_mapping(meta.get("annotations"), "metadata.annotations")]
    return any(str(k).startswith(KUEUE_GROUP + "/") for k in marks)


def controller_of(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(kind, name)`` of an object's controller ownerReference, None without one."""
    for owner in meta.get("ownerReferences") or ():
        owner = _mapping(owner, "metadata.ownerReferences[]")
        if owner.get("controller"):
            return str(owner.get("kind", "")), str(owner.get("name", ""))
    return None


def parse_pod_group(item: Json) -> GroupPolicy:
    """A PodGroup (v1alpha2, v1alpha3, v1beta1)."""
    meta, spec = item["metadata"], _mapping(item.get("spec"), "spec", required=True)
    return GroupPolicy(read_policy(spec.get("schedulingPolicy"), "spec.schedulingPolicy"), controller_of(meta),
                       made_by_kueue(meta))


def parse_workload(item: Json) -> dict[str, GroupPolicy]:
    """A v1alpha1 Workload: its pod groups by name; its controller is its controller ownerReference,
    else its ``spec.controllerRef``."""
    meta, spec = item["metadata"], _mapping(item.get("spec"), "spec", required=True)
    owner = controller_of(meta)
    if owner is None and spec.get("controllerRef") is not None:
        ref = _mapping(spec["controllerRef"], "spec.controllerRef")
        owner = (_text(ref.get("kind"), "spec.controllerRef.kind"), _text(ref.get("name"), "spec.controllerRef.name"))
    kueue = made_by_kueue(meta)
    groups = spec.get("podGroups")
    if not isinstance(groups, list):
        raise TypeError(f"spec.podGroups is {type(groups).__name__}, not a list")
    out = {}
    for i, group in enumerate(groups):
        group = _mapping(group, f"spec.podGroups[{i}]", required=True)
        name = _text(group.get("name"), f"spec.podGroups[{i}].name")
        out[name] = GroupPolicy(read_policy(group.get("policy"), f"spec.podGroups[{i}].policy"), owner, kueue)
    return out


def read_pod_groups(api: KubeApi, page_size: int = 500) -> PodGroups:
    """The cluster's pod groups from the newest served version (see the module's docstring)."""
    found = PodGroups()
    refused: list[str] = []
    for version, plural in VERSIONS:
        try:
            items = api.list_all(api.custom.list_cluster_custom_object, GROUP, version, plural,
                                 resource=f"{plural}.{GROUP}", page_size=page_size)
        except KubeFailure as failure:
            if failure.status == 403:
                refused.append(failure.message)
            elif not failure.gone:
                raise
            continue
        found.version = f"{GROUP}/{version}"
        for item in items:
            found.add(plural, item)
        return found
    if refused:
        found.forbidden = refused[0]
        if found.forbidden not in _TOLD:
            _TOLD.add(found.forbidden)
            log.warning("native gangs: %s; pods of a PodGroup or Workload are not admitted until it can be read",
                        found.forbidden)
    return found


def _unresolved(pod_groups: PodGroups, what: str, kinds: str) -> str:
    if pod_groups.forbidden:
        return f"{what} cannot be read: {pod_groups.forbidden}"
    return f"{what} cannot be read: the cluster serves no {kinds}, the versions gpuwarden reads"


def pod_gang(pod: Json, pod_groups: PodGroups | None) -> NativeGang | None:
    """The native gang a pod belongs to (see the module's docstring); None where it has none."""
    if pod_groups is None:
        return None
    spec, namespace = pod.get("spec") or {}, str(pod["metadata"].get("namespace") or "")
    if spec.get("schedulingGroup") is not None:
        ref = spec["schedulingGroup"]
        name = ref.get("podGroupName") if isinstance(ref, Mapping) else None
        if not isinstance(name, str) or not name:
            return NativeGang("", problem=f"spec.schedulingGroup is {ref!r}: no podGroupName gpuwarden can read")
        gang, what = f"podgroup:{name}", f"PodGroup {namespace}/{name}"
        if pod_groups.version is None or pod_groups.version.endswith("/v1alpha1"):
            return NativeGang(gang, problem=_unresolved(pod_groups, what, PODGROUP_VERSIONS))
        if (namespace, name) in pod_groups.bad:
            return NativeGang(gang, problem=f"{what} was skipped: {pod_groups.bad[(namespace, name)]}")
        policy = pod_groups.groups.get((namespace, name))
        if policy is None:
            return NativeGang(gang, problem=f"{what} does not exist (kube-scheduler holds its pods until it does)")
        return _gang(gang, policy, None)
    if spec.get("workloadRef") is not None:
        ref = spec["workloadRef"]
        parts = [ref.get(k) if isinstance(ref, Mapping) else None for k in ("name", "podGroup", "podGroupReplicaKey")]
        workload, group, replica = parts
        if not (isinstance(workload, str) and workload and isinstance(group, str) and group
                and (replica is None or isinstance(replica, str))):
            return NativeGang("", problem=f"spec.workloadRef is {ref!r}: no name and podGroup gpuwarden can read")
        gang = f"workload:{workload}:{group}" + (f":{replica}" if replica else "")
        what = f"Workload {namespace}/{workload}"
        if pod_groups.version != f"{GROUP}/v1alpha1":
            return NativeGang(gang, problem=_unresolved(pod_groups, what, f"{GROUP}/v1alpha1 Workloads"))
        if (namespace, workload) in pod_groups.bad:
            return NativeGang(gang, problem=f"{what} was skipped: {pod_groups.bad[(namespace, workload)]}")
        groups = pod_groups.workloads.get((namespace, workload))
        if groups is None or group not in groups:
            missing = what if groups is None else f"pod group {group!r} of {what}"
            return NativeGang(gang, problem=f"{missing} does not exist (kube-scheduler holds its pods until it does)")
        return _gang(gang, groups[group], replica or None)
    return None


def _gang(name: str, policy: GroupPolicy, replica: str | None) -> NativeGang | None:
    if policy.min_count is None and not policy.kueue:
        return None  # the basic policy: no gang
    return NativeGang(name, policy.min_count, policy.kueue, policy.owner, replica)
