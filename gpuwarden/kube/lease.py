"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two replicas never act at once.

``try_acquire_or_renew`` reads the Lease and patches it with the read ``resourceVersion``: a
409 means another replica wrote first, and this one is not the leader. A holder that has not
renewed within ``lease_duration_seconds`` may be replaced. ``is_leader`` is true only while the last
successful renewal is younger than the lease duration, so a leader that cannot reach the API server
stops acting within one lease duration, and the other replica takes over after it expires. Time is
the injected clock's (``FakeClock`` in tests); the process's runner calls :meth:`LeaderElector.try_acquire_or_renew`
every :attr:`LeaderElector.renew_interval_seconds` (a third of the lease); one renewal's retries
(a throttled API server's ``Retry-After`` included) end before the next is due.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, UTC

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .api import MERGE_PATCH, KubeApi, KubeFailure
from .failure import Conflict, NotFound

log = logging.getLogger("gpuwarden.kube")


def _format(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class LeaderElector:
    def __init__(self, api: KubeApi, namespace: str, name: str, identity: str, lease_duration_seconds: int = 15,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_duration = timedelta(seconds=lease_duration_seconds)
        self.clock = clock
        self.renewed_at: datetime | None = None

    @property
    def renew_interval_seconds(self) -> float:
        """How often the runner renews: a third of the lease, so two renewals can fail before it lapses."""
        return max(1.0, self.lease_duration.total_seconds() / 3)

    def is_leader(self) -> bool:
        return self.renewed_at is not None and self.clock.now() - self.renewed_at < self.lease_duration

    def try_acquire_or_renew(self) -> bool:
        now = self.clock.now()
        deadline = self.api.clock.monotonic() + self.renew_interval_seconds  # the next renewal's turn
        try:
            lease = self.api.call(self.api.coordination.read_namespaced_lease, self.name, self.namespace, verb="get",
                                  resource="leases", deadline=deadline)
        except NotFound:
            lease = None
        except KubeFailure as failure:
            log.warning("lease %s/%s: %s", self.namespace, self.name, failure.message)
            return self.is_leader()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration.total_seconds()),
                "renewTime": _format(now)}
        try:
            if lease is None:
                spec["acquireTime"] = _format(now)
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
                self.api.call(self.api.coordination.create_namespaced_lease, self.namespace, body, verb="create",
                              resource="leases", deadline=deadline)
            else:
                current = lease.get("spec") or {}
                holder = current.get("holderIdentity")
                renewed = _parse(current.get("renewTime"))
                duration = timedelta(seconds=int(current.get("leaseDurationSeconds") or self.lease_duration.total_seconds()))
                if holder and holder != self.identity and renewed and now - renewed < duration:
                    self.renewed_at = None
                    return False  # someone else holds a live lease
                spec["acquireTime"] = current.get("acquireTime") if holder == self.identity else _format(now)
                spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + (holder != self.identity)
                # A merge patch carrying the read resourceVersion: a stale one is a 409 (RBAC needs only patch).
                body = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": spec}
                self.api.call(self.api.coordination.patch_namespaced_lease, self.name, self.namespace, body,
                              verb="patch", resource="leases", _content_type=MERGE_PATCH, deadline=deadline)
        except Conflict:
            self.renewed_at = None  # another replica wrote first (or created it first): it leads
            return False
        except KubeFailure as failure:
            log.warning("lease %s/%s: %s", self.namespace, self.name, failure.message)
            return self.is_leader()
        self.renewed_at = now
        return True
