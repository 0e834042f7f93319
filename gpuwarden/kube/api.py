"""One place where the official ``kubernetes`` client is called: typed failures, back-off, counting.

Every request goes through :meth:`KubeApi.call`, which returns the response as parsed JSON (the
client's ``_preload_content=False``: the client still builds and sends the request, we skip its
slow model deserialisation) or raises :class:`KubeFailure`:
- permanent: 403 (names the verb and resource the service account lacks), 404 (already gone),
  422 (invalid), other 4xx;
- temporary: 409 (the caller re-reads and retries), 429, 5xx and timeouts, after ``attempts``
  tries with exponential back-off and jitter (a ``Retry-After`` header is honoured).
Never a traceback: a caller turns a ``KubeFailure`` into an ``ActionResult``.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from typing import Any
from collections.abc import Callable

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock
from gpuwarden.fleet.inputs import MAX_CONFIG_FILE_BYTES, checked_input

from .answers import list_items, parse_object
from .failure import KubeFailure as KubeFailure  # re-exported: callers import it from here

log = logging.getLogger("gpuwarden.kube")

MERGE_PATCH = "application/merge-patch+json"  # the client would otherwise send json-patch for a PATCH

Json = dict[str, Any]  # a Kubernetes object, list or patch as parsed JSON


class TimedApiClient(client.ApiClient):
    """The client with the request timeout that :class:`KubeApi` applies to each call."""

    timeout_seconds: float = 10.0


def load_client(kubeconfig: str | None = None, in_cluster: bool = False, context: str | None = None,
                timeout_seconds: float = 10.0) -> TimedApiClient:
    """An ApiClient from a kubeconfig or the pod's service account; one line on failure (ValueError)."""
    configuration = client.Configuration()
    if kubeconfig and not in_cluster:  # a FIFO or a link to /dev/zero would hang the YAML reader
        checked_input(kubeconfig, "cannot load the kubeconfig", MAX_CONFIG_FILE_BYTES, raising=ValueError)
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    except (config.ConfigException, OSError, TypeError, ValueError, yaml.YAMLError) as error:
        where = "in-cluster service account" if in_cluster else f"kubeconfig {kubeconfig or '~/.kube/config'}"
        said = " ".join(str(error).split())  # a YAML error spans lines; the CLI says one
        raise ValueError(f"cannot load the {where}: {said}") from None
    configuration.retries = False  # KubeApi.call owns retries, so they are counted and jittered
    api_client = TimedApiClient(configuration)
    api_client.timeout_seconds = timeout_seconds
    return api_client


class KubeApi:
    def __init__(self, api_client: client.ApiClient, attempts: int = 4, backoff_seconds: float = 0.5,
                 max_backoff_seconds: float = 10.0, timeout_seconds: float | None = None,
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None) -> None:
        self.client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.attempts = max(1, attempts)
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.timeout_seconds = timeout_seconds or getattr(api_client, "timeout_seconds", 10.0)
        self.clock = clock  # back-offs wait on it (a FakeClock in tests)
        self._never = threading.Event()  # a back-off is a wait nothing ends early
        self.rng = rng or random.Random()
        self.calls = 0  # requests sent, retries included (the bench reads it)

    def call(self, method: Callable[..., Any], *args: Any, verb: str, resource: str, retry_429: bool = True,
             **kwargs: Any) -> Json:
        kwargs.setdefault("_preload_content", False)
        kwargs.setdefault("_request_timeout", self.timeout_seconds)
        for attempt in range(1, self.attempts + 1):
            self.calls += 1
            try:
                response = method(*args, **kwargs)
                data = response.data if hasattr(response, "data") else response
                return parse_object(data, verb, resource)
            except ApiException as error:
                failure = classify(error, verb, resource)
                retry_after = _retry_after(error)
            except (urllib3.exceptions.HTTPError, OSError) as error:
                failure = KubeFailure(None, f"{verb} {resource}: no answer from the API server ({type(error).__name__})",
                                      temporary=True)
                retry_after = None
            if not failure.temporary or failure.conflict or (failure.status == 429 and not retry_429):
                raise failure
            if attempt == self.attempts:
                raise KubeFailure(failure.status, f"{failure.message} (gave up after {attempt} tries; retry later)", True)
            delay = min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (attempt - 1))
            delay = retry_after if retry_after is not None else delay * self.rng.uniform(0.5, 1.5)
            log.info("%s %s: %s; retrying in %.2f s", verb, resource, failure.message, delay)
            self.clock.wait(self._never, delay)
        raise AssertionError("unreachable")

    def list_all(self, method: Callable[..., Any], *args: Any, resource: str, page_size: int = 500,
                 **kwargs: Any) -> list[Json]:
        """Every item of a list, page by page (``limit``/``continue``)."""
        items: list[Json] = []
        token = None
        while True:
            page = self.call(method, *args, verb="list", resource=resource, limit=page_size,
                             **({"_continue": token} if token else {}), **kwargs)
            items.extend(list_items(page, resource))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items


def _retry_after(error: ApiException) -> float | None:
    try:
        value = (error.headers or {}).get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _server_message(error: ApiException) -> str:
    try:
        return json.loads(error.body or "").get("message") or str(error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(error.reason or "")


def classify(error: ApiException, verb: str, resource: str) -> KubeFailure:
    status, said = error.status, _server_message(error)
    if status == 403:
        return KubeFailure(403, f"forbidden: the service account lacks verb {verb!r} on resource {resource!r} "
                                f"(grant it in the actuator's ClusterRole); server said: {said}", False)
    if status == 404:
        return KubeFailure(404, f"{resource}: not found (already gone); server said: {said}", False)
    if status == 409:
        return KubeFailure(409, f"{verb} {resource}: conflict (changed meanwhile); server said: {said}", True)
    if status == 422:
        return KubeFailure(422, f"{verb} {resource}: invalid; server said: {said}", False)
    if status == 429 or (status is not None and status >= 500):
        return KubeFailure(status, f"{verb} {resource}: HTTP {status}; server said: {said}", True)
    return KubeFailure(status, f"{verb} {resource}: HTTP {status}; server said: {said}", False)
