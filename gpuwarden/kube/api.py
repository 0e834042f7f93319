"""One place where the official ``kubernetes`` client is called: typed failures, back-off, counting.

Every request goes through :meth:`KubeApi.call`, which returns the response as parsed JSON (the
client's ``_preload_content=False``: the client still builds and sends the request, we skip its
slow model deserialisation) or raises one kind of :class:`KubeFailure` (:mod:`.failure`), chained
to the client's exception; :func:`translate` is the one translation:
- permanent: 401, 403 (names the verb and resource the service account lacks), 404 (already gone),
  422 (invalid), other 4xx: raised at once;
- temporary: 409 (raised at once: the caller re-reads and retries), 429, 5xx and no answer
  (timeouts, refused connections): retried, ``attempts`` tries in all, after exponential back-off
  with jitter, or after the server's ``Retry-After`` when it sent one (at most
  ``max_retry_after_seconds``). A caller's ``deadline`` bounds the waits: a wait that would end past
  it is not started, and the failure is raised at once (its ``retry_after`` says when to come back).
Never a traceback: a caller turns a ``KubeFailure`` into an ``ActionResult``.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any
from collections.abc import Callable, Mapping

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock
from gpuwarden.fleet.inputs import MAX_CONFIG_FILE_BYTES, checked_input

from .answers import list_items, parse_object
from .failure import Conflict, KubeFailure as KubeFailure  # re-exported: callers import it from here
from .failure import TooManyRequests, Unreachable, failure_for_status

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
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None,
                 max_retry_after_seconds: float = 60.0) -> None:
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
        self.max_retry_after_seconds = max_retry_after_seconds  # a Retry-After longer than this waits this long
        self.timeout_seconds = timeout_seconds or getattr(api_client, "timeout_seconds", 10.0)
        self.clock = clock  # back-offs wait on it (a FakeClock in tests)
        self._never = threading.Event()  # a back-off is a wait nothing ends early
        self.rng = rng or random.Random()
        self.calls = 0  # requests sent, retries included (the bench reads it)

    def call(self, method: Callable[..., Any], *args: Any, verb: str, resource: str, retry_429: bool = True,
             deadline: float | None = None, **kwargs: Any) -> Json:
        """``method(*args, **kwargs)``'s answer as JSON. ``retry_429=False``: a 429 is raised at once
        (an eviction's PodDisruptionBudget). ``deadline``: a time on ``clock.monotonic()`` the call
        must be over by; no back-off is started that would end after it."""
        kwargs.setdefault("_preload_content", False)
        kwargs.setdefault("_request_timeout", self.timeout_seconds)
        for attempt in range(1, self.attempts + 1):
            self.calls += 1
            try:
                response = method(*args, **kwargs)
                data = response.data if hasattr(response, "data") else response
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                failure = translate(error, verb, resource, self.clock.now())
                if not failure.temporary or isinstance(failure, Conflict) or (
                        isinstance(failure, TooManyRequests) and not retry_429):
                    raise failure from error
                if attempt == self.attempts:
                    raise failure.noted(f"gave up after {attempt} tries; retry later") from error
                delay = self._delay(failure, attempt)
                if deadline is not None and self.clock.monotonic() + delay > deadline:
                    raise failure.noted(f"not retried: waiting {delay:.3g} s would pass the caller's deadline; "
                                        "retry later") from error
            else:
                return parse_object(data, verb, resource)
            log.info("%s %s: %s; retrying in %.2f s", verb, resource, failure.message, delay)
            self.clock.wait(self._never, delay)
        raise AssertionError("unreachable")

    def _delay(self, failure: KubeFailure, attempt: int) -> float:
        """The wait before the next try: the server's Retry-After (bounded), else back-off with jitter."""
        if failure.retry_after is not None:
            return min(failure.retry_after, self.max_retry_after_seconds)
        delay = min(self.max_backoff_seconds, self.backoff_seconds * 2.0 ** (attempt - 1))
        return delay * self.rng.uniform(0.5, 1.5)

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


def retry_after_seconds(headers: Mapping[str, str] | None, body: str | bytes | None,
                        now: datetime | None = None) -> float | None:
    """The seconds an answer asks the client to wait: its ``Retry-After`` header (seconds, or an
    HTTP date when ``now`` is given), else the Status's ``details.retryAfterSeconds``; None without one."""
    value: Any = next((v for k, v in (headers or {}).items() if k.lower() == "retry-after"), None)
    if value is None:
        try:
            value = (json.loads(body or "").get("details") or {}).get("retryAfterSeconds")
        except (TypeError, ValueError, AttributeError):
            return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        try:
            when = parsedate_to_datetime(str(value))
            seconds = (when - now).total_seconds() if now is not None and when.tzinfo is not None else math.nan
        except (TypeError, ValueError, IndexError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _server_message(error: ApiException) -> str:
    try:
        return json.loads(error.body or "").get("message") or str(error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(error.reason or "")


def translate(error: BaseException, verb: str, resource: str, now: datetime | None = None) -> KubeFailure:
    """The one translation of what the client raises into a kind of :class:`KubeFailure`; the
    caller raises it ``from error``."""
    if not isinstance(error, ApiException) or not error.status:  # status 0: the client's own TLS/connection error
        said = f": {error.reason}" if isinstance(error, ApiException) and error.reason else ""
        return Unreachable(f"{verb} {resource}: no answer from the API server ({type(error).__name__}{said})")
    status, said = int(error.status), _server_message(error)
    if status == 401:
        message = f"{verb} {resource}: unauthorized: the API server refused the credentials; server said: {said}"
    elif status == 403:
        message = (f"forbidden: the service account lacks verb {verb!r} on resource {resource!r} "
                   f"(grant it in the actuator's ClusterRole); server said: {said}")
    elif status == 404:
        message = f"{resource}: not found (already gone); server said: {said}"
    elif status == 409:
        message = f"{verb} {resource}: conflict (changed meanwhile); server said: {said}"
    elif status == 422:
        message = f"{verb} {resource}: invalid; server said: {said}"
    else:
        message = f"{verb} {resource}: HTTP {status}; server said: {said}"
    return failure_for_status(status, message, retry_after_seconds(error.headers, error.body, now))
