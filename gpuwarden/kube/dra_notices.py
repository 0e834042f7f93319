"""DRA objects the inventory skipped (issue 34, "Bad input"), said where people look.

:func:`.dra.read_dra` skips a ResourceSlice, DeviceClass, ResourceClaim or ResourceClaimTemplate with
a field of the wrong type, or a claim naming a device class the cluster does not have, and lists it
in ``DraInventory.skipped`` (``"Kind ns/name" -> why``); the rest is scheduled. Here:

- :class:`SkippedClaimEvents`: one Warning Event ``GpuwardenClaimSkipped`` on each skipped claim or
  template (its owner reads it with ``kubectl describe``), once per object and reason per process,
  not every round: an object read again is forgotten, so one broken again is told again. Slices and
  classes are cluster-scoped and have no owner to tell: they are logged and counted.
- :func:`skipped_by_kind`: how many objects of each kind were skipped, for the scheduler's metric
  (``gpuwarden_scheduler_dra_skipped_objects{kind}``).
A failed Event is logged and never fails the round.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .api import KubeApi, KubeFailure

log = logging.getLogger("gpuwarden.kube")

SKIPPED_REASON = "GpuwardenClaimSkipped"
DRA_KINDS = ("ResourceSlice", "DeviceClass", "ResourceClaim", "ResourceClaimTemplate")
_NAMESPACED = ("ResourceClaim", "ResourceClaimTemplate")
_API_VERSION = "resource.k8s.io/v1"


def skipped_by_kind(skipped: Mapping[str, str]) -> dict[str, int]:
    """{kind: objects skipped} for every DRA kind (0 where none: an alert needs no first skip)."""
    out = dict.fromkeys(DRA_KINDS, 0)
    for key in skipped:
        kind = key.split(" ", 1)[0]
        out[kind] = out.get(kind, 0) + 1
    return out


class SkippedClaimEvents:
    """Tells each skipped claim or template once (per process and reason) through an Event on it."""

    def __init__(self, api: KubeApi, source: str = "gpuwarden-scheduler", clock: Clock = SYSTEM_CLOCK) -> None:
        self.api = api
        self.source = source
        self.clock = clock
        self.told: dict[str, str] = {}  # "Kind ns/name" -> the reason it was told of

    def tell(self, skipped: Mapping[str, str]) -> int:
        """An Event on each skipped claim or template not told of this reason yet; the Events posted."""
        self.told = {key: why for key, why in self.told.items() if skipped.get(key) == why}
        posted = 0
        for key, why in sorted(skipped.items()):
            kind, _, name = key.partition(" ")
            namespace, _, short = name.partition("/")
            if kind not in _NAMESPACED or not short or key in self.told:
                continue
            self.told[key] = why  # said once, also when the write fails (logged): never every round
            if self._event(kind, namespace, short, why):
                posted += 1
        return posted

    def _event(self, kind: str, namespace: str, name: str, why: str) -> bool:
        now = self.clock.now().isoformat().replace("+00:00", "Z")
        message = (f"gpuwarden skipped {kind} {name}: {why}. Pods using it are not admitted until it is fixed; "
                   "the rest of the cluster is scheduled")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{name}.gpuwarden.", "namespace": namespace},
                "involvedObject": {"kind": kind, "name": name, "namespace": namespace, "apiVersion": _API_VERSION},
                "reason": SKIPPED_REASON, "message": message[:1024], "type": "Warning",
                "source": {"component": self.source}, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.api.call(self.api.core.create_namespaced_event, namespace, body, verb="create", resource="events")
        except KubeFailure as failure:
            log.warning("event %s on %s %s/%s: %s", SKIPPED_REASON, kind, namespace, name, failure.message)
            return False
        return True
