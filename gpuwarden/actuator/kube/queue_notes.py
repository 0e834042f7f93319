"""Queue annotations on a workload's objects: one merge PATCH per object whose values change.

The scheduler loop publishes each waiting workload's position, reason and estimated start every
round; most do not change between rounds, so an object is patched only where a value differs
from what the last snapshot read (and what this process wrote since), which keeps the requests of
a round near the number of workloads whose place in the queue moved.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from .api import MERGE_PATCH, KubeApi, KubeFailure

log = logging.getLogger("gpuwarden.actuator.kube")


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
        except KubeFailure as failure:
            if not failure.gone:
                log.warning("annotate %s %s/%s: %s", kind, namespace, name, failure.message)
            continue
        sent += 1
        for key, value in changed.items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
    return sent
