"""The webhook's own check of the queue: it gates pods only in namespaces labelled
``gpuwarden.io/queue``, whatever its configuration sends it.

The chart's MutatingWebhookConfiguration sends only those namespaces (its ``namespaceSelector``).
One edited by hand, or an older release's, may send others: a pod gated there would wait for ever,
since the scheduler leaves namespaces outside the queue alone. So each webhook replica also keeps
the queue's namespaces, listed (one ``labelSelector`` list) every ``refresh_seconds`` on a thread
of its own, never on a review's path; until the first list succeeds it trusts the selector, and a
failed list keeps the last one (logged).
"""

from __future__ import annotations

import logging

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .api import KubeApi, KubeFailure
from .background import BackgroundRefresh
from .gates import QUEUE_LABEL, in_queue

log = logging.getLogger("gpuwarden.kube")


class QueueNamespaces(BackgroundRefresh):
    """A ``Container[str]`` of the queue's namespaces for :func:`.webhook.admission_response`."""

    thread_name = "gpuwarden-webhook-namespaces"

    def __init__(self, api: KubeApi, refresh_seconds: float = 30.0, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(refresh_seconds, clock)
        self.api = api
        self._names: frozenset[str] | None = None  # None: never listed; the selector is trusted

    def __contains__(self, namespace: object) -> bool:
        names = self._names
        return names is None or namespace in names

    def refresh(self) -> None:
        try:
            items = self.api.list_all(self.api.core.list_namespace, resource="namespaces", label_selector=QUEUE_LABEL)
        except KubeFailure as failure:
            log.warning("webhook: the queue's namespaces not listed (%s); %s", failure.message,
                        "keeping the last list" if self._names is not None else "trusting the namespaceSelector")
            return
        self._names = frozenset(str(item["metadata"]["name"]) for item in items
                                if in_queue((item.get("metadata") or {}).get("labels") or {}))

