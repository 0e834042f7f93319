"""Pin a suspended Job's pods to the nodes the planner chose, in the request that resumes it.

The planner places a resumed job on nodes and GPUs (topology, fragmentation, MIG). Unsuspending
alone would let kube-scheduler place it anywhere with room, so the plan's placement would be a
guess. The pin narrows the pod template's required node affinity to those nodes by name: each of
the Job's own node selector terms becomes one term per node, with ``matchFields metadata.name In
[node]`` added (the API allows one value per name requirement, as the DaemonSet controller's pins
have). Terms are ORed and a term's requirements ANDed, so a pod may go where one of the Job's own
terms allows and the node is one of the plan's. Which GPUs of a node the pods get stays the device
plugin's choice: a node's free GPUs are what the planner counted.

The nodes pinned are recorded in an annotation; the next pin first takes exactly those
requirements out again, so pins never pile up and an edit the user made to the suspended Job's
own affinity is kept.

Kubernetes accepts a change of a Job's node affinity only while the Job is suspended and has no
``status.startTime`` (KEP-2926). A Job created suspended has none; a Job that ran keeps it until
its controller clears it (from 1.36, ``MutableSchedulingDirectivesForSuspendedJobs``, KEP-5440) or
a queue controller does, as Kueue does and :class:`~.cluster.KubeCluster` does once the Job's pods
are gone. The pin and the unsuspend go in one PATCH, so a Job never resumes half-pinned.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Json = dict[str, Any]

PINNED_NODES_ANNOTATION = "gpuwarden.io/pinned-nodes"  # the nodes gpuwarden last pinned the Job to, comma-separated


def _name_requirement(node: str) -> Json:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def pinned_nodes(job: Json) -> list[str]:
    """The nodes gpuwarden last pinned ``job`` to (none when it never did)."""
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(PINNED_NODES_ANNOTATION) or ""
    return [name for name in (part.strip() for part in str(text).split(",")) if name]


def own_terms(job: Json) -> list[Json]:
    """The Job's own required node selector terms: its template's, less gpuwarden's last pin."""
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}
    ours = [_name_requirement(node) for node in pinned_nodes(job)]
    terms: list[Json] = []
    for term in required.get("nodeSelectorTerms") or ():
        fields = [f for f in term.get("matchFields") or () if f not in ours]
        own = {k: v for k, v in term.items() if k != "matchFields"} | ({"matchFields": fields} if fields else {})
        if own and own not in terms:  # an emptied term held only our pin; one own term became one per node
            terms.append(own)
    return terms


def pinned_terms(own: list[Json], nodes: Iterable[str]) -> list[Json]:
    """``own`` terms (none: no constraint of the Job's own) narrowed to ``nodes``, one term per node."""
    names = sorted(set(nodes))
    if not names:
        raise ValueError("a pin needs at least one node")
    return [{**term, "matchFields": [*(term.get("matchFields") or ()), _name_requirement(node)]}
            for term in (own or [{}]) for node in names]


def resume_pinned_patch(job: Json, nodes: Iterable[str]) -> Json:
    """The merge patch that resumes ``job`` (as read from the API) pinned to ``nodes``.

    It carries the read ``resourceVersion``: a Job changed since is a 409, re-read and retried.
    Only the required node selector terms are replaced (a merge patch replaces lists whole); the
    rest of the Job's affinity is left as it is."""
    names = sorted(set(nodes))
    return {
        "metadata": {"resourceVersion": job["metadata"]["resourceVersion"],
                     "annotations": {PINNED_NODES_ANNOTATION: ",".join(names)}},
        "spec": {"suspend": False, "template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": pinned_terms(own_terms(job), names)},
        }}}}},
    }
