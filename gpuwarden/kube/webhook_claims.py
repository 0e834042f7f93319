"""The webhook's view of DRA: whether a pod asks GPUs through its resource claims.

A pod may ask no ``nvidia.com/gpu`` at all and still get GPUs: its ``spec.resourceClaims`` name a
ResourceClaim, or a ResourceClaimTemplate the claim is made from, whose requests name a DeviceClass
of NVIDIA's driver. Such a pod is gated like any GPU pod, or kube-scheduler would allocate its
devices outside the queue and its quotas. A pod whose claims ask only other drivers' devices (a
NIC, a ComputeDomain channel) is not: nothing would release it.

Each webhook replica lists DeviceClasses, ResourceClaimTemplates and ResourceClaims every
``refresh_seconds`` on a thread of its own (three paged lists); a template or claim the lists do not
hold yet (made just before its pod) is read once, on the review's path, with a short deadline. A
request is a GPU request where its class and selectors name a GPU driver's ``gpu`` or ``mig``
devices, or do not say which (the round then sizes it, or refuses it with the reason in the queue);
prioritized alternatives (``firstAvailable``) are not read here. Where
the cluster does not serve ``resource.k8s.io/v1``, or the class or claim cannot be read, the pod is
not gated on account of its claims (logged): the webhook never holds a pod it cannot account for.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .api import KubeApi, KubeFailure
from .background import BackgroundRefresh
from .dra_objects import GPU_DRIVERS, GPU_TYPE, MIG_TYPE, Claim, DeviceClass, read_claim, read_class, read_template

log = logging.getLogger("gpuwarden.kube")

READ_ONE_SECONDS = 2.0  # a review waits at most this for a template or claim made just before its pod


class GpuClaims(BackgroundRefresh):
    """``asks_gpu(namespace, pod)`` for :func:`.webhook.admission_response`."""

    thread_name = "gpuwarden-webhook-claims"

    def __init__(self, api: KubeApi, refresh_seconds: float = 30.0, clock: Clock = SYSTEM_CLOCK) -> None:
        from kubernetes import client  # the client classes load with the first use

        super().__init__(refresh_seconds, clock)
        self.api = api
        self.resource = client.ResourceV1Api(api.client)
        self.served: bool | None = None  # None: never listed
        self.classes: dict[str, DeviceClass] = {}
        self.templates: dict[str, Claim] = {}  # "ns/name"
        self.claims: dict[str, Claim] = {}

    def refresh(self) -> None:
        r = self.resource
        try:
            classes = self.api.list_all(r.list_device_class, resource="deviceclasses.resource.k8s.io")
            templates = self.api.list_all(r.list_resource_claim_template_for_all_namespaces,
                                          resource="resourceclaimtemplates.resource.k8s.io")
            claims = self.api.list_all(r.list_resource_claim_for_all_namespaces, resource="resourceclaims.resource.k8s.io")
        except KubeFailure as failure:
            if failure.gone or failure.status == 403:  # not served (before 1.34, DRA off) or not granted
                self.served = False
                return
            log.warning("webhook: DRA objects not listed (%s); keeping the last lists", failure.message)
            return
        self.served = True
        self.classes = dict(_read_each(classes, read_class, lambda c: c.name))
        self.templates = dict(_read_each(templates, read_template, lambda c: c.key))
        self.claims = dict(_read_each(claims, read_claim, lambda c: c.key))

    def asks_gpu(self, namespace: str, pod: Mapping[str, Any]) -> bool:
        """Whether any of the pod's claims asks a GPU or MIG device (see the module doc)."""
        entries = (pod.get("spec") or {}).get("resourceClaims") or ()
        if not entries or self.served is False:
            return False
        for entry in entries:
            if not isinstance(entry, Mapping):
                continue
            claim = self._claim(namespace, entry)
            if claim is not None and self._gpu_claim(claim):
                return True
        return False

    def _claim(self, namespace: str, entry: Mapping[str, Any]) -> Claim | None:
        template, name = entry.get("resourceClaimTemplateName"), entry.get("resourceClaimName")
        if not isinstance(template, str) and not isinstance(name, str):
            return None
        kind, table = ("ResourceClaimTemplate", self.templates) if isinstance(template, str) else ("ResourceClaim",
                                                                                                     self.claims)
        key = f"{namespace}/{template if isinstance(template, str) else name}"
        if key not in table:  # made just before its pod: read it now, once
            short = key.partition("/")[2]
            read, reader = ((self.resource.read_namespaced_resource_claim_template, read_template) if kind ==
                            "ResourceClaimTemplate" else (self.resource.read_namespaced_resource_claim, read_claim))
            try:
                item = self.api.call(read, short, namespace, verb="get", resource=f"{kind.lower()}s.resource.k8s.io",
                                     deadline=self.api.clock.monotonic() + READ_ONE_SECONDS)
                table[key] = reader(item)
            except (KubeFailure, ValueError, KeyError, TypeError) as error:
                log.warning("webhook: %s %s not read (%s); its pod is not gated on account of it", kind, key,
                            getattr(error, "message", error))
                return None
        return table[key]

    def _gpu_claim(self, claim: Claim) -> bool:
        for request in claim.requests:
            device_class = self.classes.get(request.device_class or "")
            if device_class is None:  # prioritized alternatives, or a class not listed: not accounted for
                continue
            match = device_class.match.joined(request.match)
            if match.driver is not None and match.driver not in GPU_DRIVERS:
                continue
            if match.value("type") in (None, GPU_TYPE, MIG_TYPE):
                return True
        return False



def _read_each(items: list[Any], reader: Any, key: Any) -> list[tuple[str, Any]]:
    out = []
    for item in items:
        try:
            read = reader(item)
        except (ValueError, KeyError, TypeError) as error:  # the scheduler's snapshot says it, with an Event
            log.debug("webhook: a DRA object not read (%s)", error)
            continue
        out.append((key(read), read))
    return out
