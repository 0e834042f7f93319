"""Queue annotations on a workload's objects: one merge PATCH per object whose values change.

The scheduler loop publishes each waiting workload's position, reason and estimated start every
round; most do not change between rounds, so an object is patched only where a value differs
from what the last snapshot read (and what this process wrote since), which keeps the requests of
a round near the number of workloads whose place in the queue moved.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .api import MERGE_PATCH, Json, KubeApi, KubeFailure
from .failure import NotFound

log = logging.getLogger("gpuwarden.kube")


def annotate_objects(api: KubeApi, namespace: str, objects: Mapping[tuple[str, str], dict[str, str]],
                     values: Mapping[str, str | None]) -> int:
    """Write ``values`` (None removes the key) on each (kind, name) object, Pod or Job, whose
    annotations (``objects``, updated in place) differ; the PATCHes sent. A gone object is skipped;
    another failure is logged: the queue's news never stops a round."""
    sent = 0
    for (kind, name), notes in sorted(objects.items()):
        changed = {k: v for k, v in values.items() if notes.get(k) != v}
        if not changed:
            continue
        method = api.batch.patch_namespaced_job if kind == "Job" else api.core.patch_namespaced_pod
        try:
            api.call(method, name, namespace, {"metadata": {"annotations": changed}}, verb="patch",
                     resource="jobs" if kind == "Job" else "pods", _content_type=MERGE_PATCH)
        except NotFound:  # gone since the snapshot: nothing to annotate
            continue
        except KubeFailure as failure:
            log.warning("annotate %s %s/%s: %s", kind, namespace, name, failure.message)
            continue
        sent += 1
        for key, value in changed.items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
    return sent


JOBSET = ("jobset.x-k8s.io", "v1alpha2")
PYTORCHJOB = ("kubeflow.org", "v1")


class WorkloadNotes:
    """The queue's Events and annotations on a workload's owner and pods: what ``KubeCluster``
    offers the scheduler loop (it has the API, the last snapshot's inventory and ``_workload`` /
    ``_event``)."""

    api: KubeApi
    inventory: Any

    def _workload(self, target: str) -> tuple[str, str, str]:
        raise NotImplementedError

    def _event(self, namespace: str, involved: Json, reason: str, message: str, kind: str = "Normal") -> None:
        raise NotImplementedError

    def _owner_object(self, target: str) -> Json | None:
        """The workload's owner as an Event's involvedObject (Job, JobSet, PyTorchJob), or None."""
        _, name, controller = self._workload(target)
        versions = {"Job": "batch/v1", "JobSet": "/".join(JOBSET), "PyTorchJob": "/".join(PYTORCHJOB)}
        return {"kind": controller, "name": name, "apiVersion": versions[controller]} if controller in versions else None

    def record_workload_event(self, target: str, reason: str, message: str, type: str = "Normal") -> int:  # noqa: A002 - the Event's field
        """An Event on the workload's owner (Job, JobSet, PyTorchJob), else on each of its pods; the
        Events posted. A failure is logged, never raised: the queue's news never stops a round."""
        try:
            namespace, _, _ = self._workload(target)
            owner = self._owner_object(target)
            involved = [owner] if owner else [{"kind": "Pod", "name": p, "apiVersion": "v1"}
                                              for p in self.inventory.pods.get(target, ())]
            for obj in involved:
                self._event(namespace, obj, reason, message, type)
        except (KubeFailure, LookupError) as error:
            log.warning("event %s on %s: %s", reason, target, error)
            return 0
        return len(involved)

    def record_team_event(self, team: str, reason: str, message: str, type: str = "Warning") -> int:  # noqa: A002 - the Event's field
        """An Event on the namespace whose quota annotation refused ``team`` (0 where none is known)."""
        namespace = self.inventory.refused_teams.get(team)
        if not namespace:
            return 0
        try:
            self._event(namespace, {"kind": "Namespace", "name": namespace, "apiVersion": "v1"}, reason, message, type)
        except KubeFailure as error:
            log.warning("event %s on namespace %s: %s", reason, namespace, error)
            return 0
        return 1

    def annotate_workload(self, target: str, values: Mapping[str, str | None]) -> int:
        """Set (None: remove) annotations on the workload's pods and Job, one merge PATCH per object
        whose values differ from the last snapshot's; the PATCHes sent. Failures are logged."""
        try:
            namespace, _, _ = self._workload(target)
        except LookupError as error:
            log.warning("annotate %s: %s", target, error)
            return 0
        return annotate_objects(self.api, namespace, self.inventory.objects.get(target, {}), values)
