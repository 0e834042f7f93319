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

Each try is bounded as a whole (:mod:`.transport`): no whole answer within the request timeout is
:class:`Unreachable` (retried); an answer past ``max_answer_bytes`` (64 MiB), or encoded unasked,
is an :class:`UnexpectedAnswer` read no further (not retried: it would come again). A list is paged
(``limit``/``continue``) and bounded: more than ``max_list_items`` items or ``max_list_bytes`` bytes,
a continue token sent twice, or more pages than the items allow, is an UnexpectedAnswer.
:meth:`KubeApi.abort` (the process stops) cuts every request in flight and every back-off short.
The kubeconfig is checked before the client reads it (:mod:`.kubeconfig`).
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
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .answers import list_items, parse_object
from .failure import Conflict, KubeFailure as KubeFailure  # re-exported: callers import it from here
from .failure import TooManyRequests, UnexpectedAnswer, Unreachable, failure_for_status
from .kubeconfig import load_configuration
from .transport import AnswerRefused, RequestGuard, guard_pools

log = logging.getLogger("gpuwarden.kube")

MERGE_PATCH = "application/merge-patch+json"  # the client would otherwise send json-patch for a PATCH

Json = dict[str, Any]  # a Kubernetes object, list or patch as parsed JSON

MAX_ANSWER_BYTES = 64 << 20  # one answer: a page of 500 pods with their managedFields is ~15 MB
MAX_LIST_ITEMS = 500_000  # one list: over three times the pods Kubernetes supports in a cluster (150,000)
MAX_LIST_BYTES = 2 << 30  # one list, all its pages together


class TimedApiClient(client.ApiClient):
    """The client with the request timeout that :class:`KubeApi` applies to each call."""

    timeout_seconds: float = 10.0


def load_client(kubeconfig: str | None = None, in_cluster: bool = False, context: str | None = None,
                timeout_seconds: float = 10.0) -> TimedApiClient:
    """An ApiClient from a kubeconfig (``kubeconfig``, else ``$KUBECONFIG``, else ~/.kube/config) or
    the pod's service account, checked first (:mod:`.kubeconfig`); one line on failure (ValueError)."""
    configuration = load_configuration(kubeconfig, in_cluster, context)
    configuration.retries = False  # KubeApi.call owns retries, so they are counted and jittered
    try:
        api_client = TimedApiClient(configuration)
    except (ValueError, ImportError, urllib3.exceptions.HTTPError) as error:  # a proxy URL urllib3 cannot use
        raise ValueError(f"cannot use the kubeconfig's cluster: {' '.join(str(error).split())}") from None
    guard_pools(api_client.rest_client.pool_manager)
    api_client.timeout_seconds = timeout_seconds
    return api_client


class KubeApi:
    def __init__(self, api_client: client.ApiClient, attempts: int = 4, backoff_seconds: float = 0.5,
                 max_backoff_seconds: float = 10.0, timeout_seconds: float | None = None,
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None,
                 max_retry_after_seconds: float = 60.0, max_answer_bytes: int | None = None,
                 max_list_items: int | None = None, max_list_bytes: int | None = None) -> None:
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
        self.timeout_seconds = float(timeout_seconds or getattr(api_client, "timeout_seconds", None) or 10.0)
        self.clock = clock  # back-offs wait on it (a FakeClock in tests)
        self.rng = rng or random.Random()
        self.calls = 0  # requests sent, retries included (the bench reads it)
        self.max_answer_bytes = max_answer_bytes or MAX_ANSWER_BYTES
        self.max_list_items = max_list_items or MAX_LIST_ITEMS
        self.max_list_bytes = max_list_bytes or MAX_LIST_BYTES
        self.guarded = guard_pools(api_client.rest_client.pool_manager)  # deadlines and caps on its connections
        self._stopping = threading.Event()  # abort(): no request starts, no back-off waits
        self._in_flight: set[RequestGuard] = set()
        self._lock = threading.Lock()

    def call(self, method: Callable[..., Any], *args: Any, verb: str, resource: str, retry_429: bool = True,
             deadline: float | None = None, **kwargs: Any) -> Json:
        """``method(*args, **kwargs)``'s answer as JSON. ``retry_429=False``: a 429 is raised at once
        (an eviction's PodDisruptionBudget). ``deadline``: a time on ``clock.monotonic()`` the call
        must be over by; no back-off is started that would end after it."""
        return self._call(method, *args, verb=verb, resource=resource, retry_429=retry_429, deadline=deadline,
                          **kwargs)[0]

    def _call(self, method: Callable[..., Any], *args: Any, verb: str, resource: str, retry_429: bool = True,
              deadline: float | None = None, **kwargs: Any) -> tuple[Json, int]:
        """The answer as JSON, and its size in bytes."""
        kwargs.setdefault("_preload_content", False)
        kwargs.setdefault("_request_timeout", self.timeout_seconds)
        for attempt in range(1, self.attempts + 1):
            if self._stopping.is_set():
                raise Unreachable(f"{verb} {resource}: not sent: the process is stopping")
            self.calls += 1
            guard = RequestGuard(self.timeout_seconds, self.max_answer_bytes)
            try:
                data = self._try(guard, method, args, kwargs)
            except (ApiException, urllib3.exceptions.HTTPError, OSError, AnswerRefused) as error:
                cause, failure = error, self._failure(guard, error, verb, resource)
                if not failure.temporary or isinstance(failure, Conflict | UnexpectedAnswer) or guard.aborted or (
                        isinstance(failure, TooManyRequests) and not retry_429):
                    raise failure from error
                if attempt == self.attempts:
                    raise failure.noted(f"gave up after {attempt} tries; retry later") from error
                delay = self._delay(failure, attempt)
                if deadline is not None and self.clock.monotonic() + delay > deadline:
                    raise failure.noted(f"not retried: waiting {delay:.3g} s would pass the caller's deadline; "
                                        "retry later") from error
            else:
                return parse_object(data, verb, resource), len(data)
            log.info("%s %s: %s; retrying in %.2f s", verb, resource, failure.message, delay)
            if self.clock.wait(self._stopping, delay):  # stopping: the back-off ends, and so does the call
                raise failure.noted("not retried: the process is stopping") from cause
        raise AssertionError("unreachable")

    def _try(self, guard: RequestGuard, method: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        """One try under ``guard``: the request, and its answer read whole within its deadline and cap."""
        with self._lock:
            self._in_flight.add(guard)
        try:
            with guard:
                response = method(*args, **kwargs)
                if guard.problem is not None:  # refused from its head: not a byte of the body is read
                    response.close()
                    raise AnswerRefused(guard.problem)
                data = response.data if hasattr(response, "data") else response
            if guard.expired or guard.aborted:  # a head cut short reads as one that ended: not an answer
                raise AnswerRefused("cut short")
            return data
        finally:
            with self._lock:
                self._in_flight.discard(guard)

    def _failure(self, guard: RequestGuard, error: BaseException, verb: str, resource: str) -> KubeFailure:
        """What the try's failure was: the guard's reason (cut short, refused) first, else the client's."""
        if guard.problem is not None:
            outcome = "nothing was acted on" if verb in ("get", "list") else "the change may have been made"
            hint = " (lower --page-size: fewer objects in each answer)" if verb == "list" else ""
            return UnexpectedAnswer(f"{verb} {resource}: the API server's answer {guard.problem}; {outcome}{hint}")
        if guard.aborted:
            return Unreachable(f"{verb} {resource}: cut short: the process is stopping")
        if guard.expired:
            return Unreachable(f"{verb} {resource}: no answer from the API server within {guard.timeout_seconds:g} s, "
                               "the whole request's timeout (--request-timeout)")
        return translate(error, verb, resource, self.clock.now())

    def abort(self) -> None:
        """The process is stopping (SIGTERM): cut every request in flight, end every back-off, and
        send no more; each call raises an :class:`Unreachable` that says so."""
        self._stopping.set()
        with self._lock:
            in_flight = list(self._in_flight)
        for guard in in_flight:
            guard.cut(aborted=True)

    def _delay(self, failure: KubeFailure, attempt: int) -> float:
        """The wait before the next try: the server's Retry-After (bounded), else back-off with jitter."""
        if failure.retry_after is not None:
            return min(failure.retry_after, self.max_retry_after_seconds)
        delay = min(self.max_backoff_seconds, self.backoff_seconds * 2.0 ** (attempt - 1))
        return delay * self.rng.uniform(0.5, 1.5)

    def list_all(self, method: Callable[..., Any], *args: Any, resource: str, page_size: int = 500,
                 **kwargs: Any) -> list[Json]:
        """Every item of a list, page by page (``limit``/``continue``), within the list's bounds."""
        items: list[Json] = []
        token: str | None = None
        seen: set[str] = set()
        total_bytes = 0
        most_pages = self.max_list_items // max(1, page_size) + 2  # empty pages (a field selector) count too
        for pages in range(1, most_pages + 1):
            paging: dict[str, Any] = {"limit": page_size, **({"_continue": token} if token else {})}
            page, size = self._call(method, *args, verb="list", resource=resource, **paging, **kwargs)
            items.extend(list_items(page, resource))
            total_bytes += size
            if len(items) > self.max_list_items or total_bytes > self.max_list_bytes:
                what = (f"{self.max_list_items:,} items" if len(items) > self.max_list_items
                        else f"{self.max_list_bytes:,} bytes")
                raise UnexpectedAnswer(f"list {resource}: more than {what} (read in {pages} page(s)); nothing was "
                                       "acted on: a cluster this large is past gpuwarden's bound (is it the one meant?)")
            meta = page.get("metadata") or {}
            said = meta.get("continue") if isinstance(meta, dict) else meta
            if not said:
                return items
            if not isinstance(said, str):
                raise UnexpectedAnswer(f"list {resource}: the API server's answer has a metadata(.continue) of type "
                                       f"{type(said).__name__}, not a string; nothing was acted on")
            token = said
            if token in seen:
                raise UnexpectedAnswer(f"list {resource}: the API server sent the continue token {token[:40]!r} "
                                       "again (a list that never ends); nothing was acted on")
            seen.add(token)
        raise UnexpectedAnswer(f"list {resource}: still a continue token after {most_pages:,} pages of {page_size} "
                               f"with {len(items):,} items; nothing was acted on")


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
        said = f": {' '.join(str(error.reason).split())}" if isinstance(error, ApiException) and error.reason else ""
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
