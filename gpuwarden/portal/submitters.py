"""Where the portal's requests go: a :class:`Submitter` creates the Job a request becomes
(:func:`gpuwarden.portal.submit.job_manifest`) and makes a team lead's priority change.

- :class:`KubeSubmitter`: the Kubernetes API through :class:`~gpuwarden.kube.api.KubeApi`
  (the dashboard's service account, or the kubeconfig ``GPUWARDEN_KUBECONFIG`` names); the chart
  grants it create and patch on Jobs in the team namespaces only.
- :class:`SchedulerEndpoint`: ``POST {GPUWARDEN_SCHEDULER_URL}/submit`` with
  ``{"request": PortalRequest.to_mapping(), "identity": ...}``, answered 201
  ``{"workload", "message"}`` or 400 ``{"error"}`` (the demo's scheduler adds the request to its
  simulated cluster).

:func:`submitter_from_env` picks one; both check the request against its template first.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol

from gpuwarden.store.http_fetch import fetch

from gpuwarden.kube.api import MERGE_PATCH, KubeApi, KubeFailure, load_client
from gpuwarden.fleet.object_names import ADMISSION_GATE, PRIORITY_CLASS_ANNOTATION
from .submit import PortalError, PortalRequest, TeamTemplate, check_priority_change, job_manifest, validate

SCHEDULER_URL_ENV = "GPUWARDEN_SCHEDULER_URL"
KUBECONFIG_ENV = "GPUWARDEN_KUBECONFIG"
SUBMIT_ENV = "GPUWARDEN_PORTAL_SUBMIT"  # kubernetes | scheduler; unset: see submitter_from_env
SUBMIT_WAYS = ("kubernetes", "scheduler")
SETTINGS_ENVS = (SUBMIT_ENV, KUBECONFIG_ENV, SCHEDULER_URL_ENV, "KUBERNETES_SERVICE_HOST")  # what submitter_from_env reads
HTTP_TIMEOUT_SECONDS = 5.0


class Submitter(Protocol):
    where: str  # one line for the page: where Jobs go

    def submit(self, request: PortalRequest, template: TeamTemplate, identity: str, held_gpus: float = 0.0) -> tuple[str, str]:
        """(workload key "ns/name", one line to show) once queued; PortalError when refused."""
        ...

    def change_priority(self, template: TeamTemplate, workload: str, priority_class: str, identity: str) -> str:
        """One line once changed; PortalError when refused or impossible."""
        ...

    @property
    def can_change_priority(self) -> bool: ...


class KubeSubmitter:
    """Jobs created and patched through the Kubernetes API (official client)."""

    can_change_priority = True

    def __init__(self, api: KubeApi, where: str = "the Kubernetes API") -> None:
        self.api = api
        self.where = where

    def submit(self, request: PortalRequest, template: TeamTemplate, identity: str, held_gpus: float = 0.0) -> tuple[str, str]:
        validate(request, template, held_gpus)
        try:
            job = self.api.call(self.api.batch.create_namespaced_job, template.namespace,
                                job_manifest(request, template, identity), verb="create", resource="jobs")
        except KubeFailure as failure:
            raise PortalError(f"Job not created in namespace {template.namespace}: {failure}") from None
        key = f"{template.namespace}/{job['metadata']['name']}"
        return key, f"Job {key} created; its pods wait behind the gate {ADMISSION_GATE} until the scheduler admits them."

    def change_priority(self, template: TeamTemplate, workload: str, priority_class: str, identity: str) -> str:
        namespace, name = check_priority_change(template, workload, priority_class, identity)
        patch = {"metadata": {"annotations": {PRIORITY_CLASS_ANNOTATION: priority_class}}}
        try:
            self.api.call(self.api.batch.patch_namespaced_job, name, namespace, patch, verb="patch", resource="jobs",
                          _content_type=MERGE_PATCH)
        except KubeFailure as failure:
            raise PortalError(f"priority of {workload} not changed: {failure}") from None
        return f"{workload} is now {priority_class}; the scheduler orders it so from its next round."


class SchedulerEndpoint:
    """Requests posted to a scheduler's ``/submit`` (the demo's: it adds them to its simulated cluster)."""

    can_change_priority = False  # the endpoint takes submissions only; a lead's change is a Job annotation

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.where = f"the scheduler at {self.url}"

    def submit(self, request: PortalRequest, template: TeamTemplate, identity: str, held_gpus: float = 0.0) -> tuple[str, str]:
        validate(request, template, held_gpus)
        status, answer = http_json(f"{self.url}/submit", {"request": request.to_mapping(), "identity": identity})
        if status == 201 and isinstance(answer, Mapping) and answer.get("workload"):
            return str(answer["workload"]), str(answer.get("message") or "queued")
        said = answer.get("error") if isinstance(answer, Mapping) else None
        raise PortalError(f"the scheduler at {self.url} refused it: {said or f'HTTP {status}'}")

    def change_priority(self, template: TeamTemplate, workload: str, priority_class: str, identity: str) -> str:
        raise PortalError(f"the scheduler at {self.url} takes no priority changes; they are Job annotations "
                          f"(set {SUBMIT_ENV}=kubernetes)")


MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a queue of tens of thousands of workloads is a few MiB


def http_json(url: str, body: Mapping[str, Any] | None = None,
              timeout_seconds: float = HTTP_TIMEOUT_SECONDS) -> tuple[int, Any]:
    """GET ``url`` (or POST ``body`` as JSON): (HTTP status, parsed JSON answer), the whole request
    within ``timeout_seconds`` and the answer within :data:`MAX_ANSWER_BYTES`. PortalError, one
    line, when the URL is not http(s), nothing answers in time or the answer is not JSON."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise PortalError(f"{url}: not an http:// or https:// URL")
    data = None if body is None else json.dumps(body).encode()
    try:
        status, raw = fetch(url, timeout_s=timeout_seconds, max_bytes=MAX_ANSWER_BYTES,
                            method="GET" if body is None else "POST", body=data,
                            headers={"Content-Type": "application/json", "Accept": "application/json"})
    except (OSError, http.client.HTTPException) as error:  # refused, reset, TLS, DeadlineExceeded, AnswerTooLarge
        raise PortalError(f"{url}: no answer ({error or type(error).__name__})") from None
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        raise PortalError(f"{url}: HTTP {status}, not JSON") from None


def submitter_from_env(env: Mapping[str, str] | None = None) -> Submitter | None:
    """Where the portal sends requests. ``GPUWARDEN_PORTAL_SUBMIT`` (kubernetes | scheduler) chooses;
    unset: Kubernetes when ``GPUWARDEN_KUBECONFIG`` names a kubeconfig or the dashboard runs in a pod
    (its service account), else the scheduler endpoint when ``GPUWARDEN_SCHEDULER_URL`` is set, else
    None (the portal cannot submit). PortalError for a bad value or a client that cannot load."""
    env = os.environ if env is None else env
    way = env.get(SUBMIT_ENV, "").strip()
    kubeconfig = env.get(KUBECONFIG_ENV, "").strip() or None
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST")) and kubeconfig is None
    url = env.get(SCHEDULER_URL_ENV, "").strip()
    if way and way not in SUBMIT_WAYS:
        raise PortalError(f"{SUBMIT_ENV}={way!r}: allowed: {', '.join(SUBMIT_WAYS)}")
    if not way:
        way = "kubernetes" if kubeconfig or in_cluster else "scheduler" if url else ""
    if way == "scheduler":
        if not url:
            raise PortalError(f"{SUBMIT_ENV}=scheduler needs {SCHEDULER_URL_ENV} (the scheduler's base URL)")
        return SchedulerEndpoint(url)
    if way == "kubernetes":
        try:
            client = load_client(kubeconfig, in_cluster)
        except ValueError as error:
            raise PortalError(f"the portal's Kubernetes client: {error}") from None
        where = "the Kubernetes API (" + (f"kubeconfig {kubeconfig}" if kubeconfig else
                                           "the dashboard's service account" if in_cluster else "default kubeconfig") + ")"
        return KubeSubmitter(KubeApi(client, attempts=1), where)  # never retried: a create with generateName makes a second Job
    return None

