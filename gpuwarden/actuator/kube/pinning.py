"""Pin a suspended Job's pods to the nodes the planner chose, in the request that resumes it.

The planner places a resumed job on nodes and GPUs (topology, fragmentation, MIG). Unsuspending
alone would let kube-scheduler place it anywhere with room, so the plan's placement would be a
guess. The pin narrows the pod template's required node affinity to those nodes by name
(``matchFields metadata.name In [...]``, as the DaemonSet controller pins its pods), ANDed with
every term of the Job's own affinity, so the Job's own constraints still hold. Which GPUs of a node
the pods get stays the device plugin's choice: a node's free GPUs are what the planner counted.

Kubernetes accepts a change of a Job's node affinity only while it is suspended: a Job created
suspended that never ran (KEP-2926), or, from 1.36 (``MutableSchedulingDirectivesForSuspendedJobs``,
KEP-5440, beta and on by default), a Job that ran once its pods have terminated. The pin and the unsuspend
go in one PATCH, so a Job is never resumed with half of it. The Job's own affinity is kept in an
annotation, and each pin starts from it, so pins never pile up over suspends and resumes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

Json = dict[str, Any]

OWN_AFFINITY_ANNOTATION = "gpuwarden.io/own-affinity"  # the Job's affinity before gpuwarden pinned it (JSON)


def pinned_affinity(own: Json | None, nodes: Iterable[str]) -> Json:
    """``own`` (a pod affinity, or None) with its required node affinity narrowed to ``nodes``.

    Node selector terms are ORed and the requirements inside one term ANDed, so the name
    requirement joins every term: a pod may go where one of the Job's own terms allows and
    the node is one of ``nodes``."""
    names = sorted(set(nodes))
    if not names:
        raise ValueError("a pin needs at least one node")
    pin = {"key": "metadata.name", "operator": "In", "values": names}
    affinity = copy.deepcopy(own) if own else {}
    required = affinity.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**term, "matchFields": [*(term.get("matchFields") or ()), pin]} for term in terms]
    return affinity


def resume_pinned_patch(job: Json, nodes: Iterable[str]) -> Json:
    """The merge patch that resumes ``job`` (as read from the API) pinned to ``nodes``.

    It carries the read ``resourceVersion``: a Job changed since is a 409, re-read and retried."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    if OWN_AFFINITY_ANNOTATION in annotations:
        own = json.loads(annotations[OWN_AFFINITY_ANNOTATION])
    else:
        own = ((job.get("spec") or {}).get("template") or {}).get("spec", {}).get("affinity")
    return {
        "metadata": {"resourceVersion": job["metadata"]["resourceVersion"],
                     "annotations": {OWN_AFFINITY_ANNOTATION: json.dumps(own, sort_keys=True)}},
        "spec": {"suspend": False, "template": {"spec": {"affinity": pinned_affinity(own, nodes)}}},
    }
