"""Typed Kubernetes failures and the API server's Retry-After, against ``tests/fake_kube_api.py``
(a fake API server speaking the real REST protocol; the official client runs unmodified over HTTP).

Each failure an API call raises is one kind of ``KubeFailure`` (gpuwarden/kube/failure.py), chained
to the client's exception; a 429 or 503 carrying ``Retry-After`` is retried after that many seconds
on the injected clock (bounded by ``max_retry_after_seconds`` and the caller's ``deadline``), never
after the client's own back-off. Waits are read off the clock, never timed.
"""

from __future__ import annotations

import json
import pickle
import socket
import threading
from datetime import UTC, datetime

import pytest
import urllib3
from fake_kube_api import COORDINATION, CORE, FakeKubeAPI
from kube_fleet import node
from kubernetes.client.exceptions import ApiException
from polling import tick

from gpuwarden.fleet.clock import FakeClock
from gpuwarden.kube import KubeApi, KubeFailure, LeaderElector, load_client
from gpuwarden.kube.api import retry_after_seconds, translate
from gpuwarden.kube.failure import (Conflict, Forbidden, Invalid, NotFound, PermanentFailure, ServerFailure,
                                    TemporaryFailure, TooManyRequests, Unauthorized, UnexpectedAnswer, Unreachable)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NODE = "/api/v1/nodes/n0$"


class RecordingClock(FakeClock):
    """A fake clock whose waits end at once, moving time on by what was asked: the back-offs, in order."""

    def __init__(self) -> None:
        super().__init__(NOW)
        self.waits: list[float] = []

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        self.waits.append(float("inf") if seconds is None else seconds)
        self.advance(seconds or 0.0)
        return event.is_set()


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    node(server, "n0")
    yield server
    server.stop()


def kube_api(server: FakeKubeAPI, tmp_path, **kwargs) -> KubeApi:
    client = load_client(server.kubeconfig(tmp_path / "kc.json"), timeout_seconds=kwargs.pop("timeout_seconds", 2.0))
    kwargs.setdefault("backoff_seconds", 0.01)
    return KubeApi(client, **kwargs)


def read_node(kube: KubeApi, **kwargs) -> dict:
    return kube.call(kube.core.read_node, "n0", verb="get", resource="nodes", **kwargs)


# -- one kind per answer -----------------------------------------------------------------------------

@pytest.mark.parametrize("status, kind, temporary", [
    (400, PermanentFailure, False), (401, Unauthorized, False), (403, Forbidden, False), (404, NotFound, False),
    (409, Conflict, True), (422, Invalid, False), (429, TooManyRequests, True), (500, ServerFailure, True),
    (503, ServerFailure, True),
])
def test_each_status_is_its_kind_chained_to_the_clients_exception(api, tmp_path, status, kind, temporary):
    api.inject("GET", NODE, status)
    with pytest.raises(KubeFailure) as raised:
        read_node(kube_api(api, tmp_path, attempts=1))
    failure = raised.value
    assert type(failure) is kind and failure.status == status and failure.temporary is temporary
    assert isinstance(failure, TemporaryFailure if temporary else PermanentFailure)
    assert isinstance(failure.__cause__, ApiException) and failure.__cause__.status == status
    assert (failure.gone, failure.conflict) == (status == 404, status == 409)  # the old checks still read right
    assert f"injected {status}" in str(failure) and failure.retry_after is None


def test_a_create_that_exists_is_a_conflict_and_a_missing_object_not_found(api, tmp_path):
    kube = kube_api(api, tmp_path)
    with pytest.raises(Conflict, match="conflict"):
        kube.call(kube.core.create_node, {"metadata": {"name": "n0"}}, verb="create", resource="nodes")
    with pytest.raises(NotFound, match="already gone"):
        kube.call(kube.core.read_node, "n9", verb="get", resource="nodes")
    assert len(api.calls("POST", "/nodes$")) == 1  # a conflict is the caller's to re-read, never retried blindly


def test_a_refused_connection_is_unreachable_and_retried(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "kc.json"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    clock = RecordingClock()
    kube = KubeApi(load_client(str(path), timeout_seconds=2.0), attempts=3, clock=clock)
    with pytest.raises(Unreachable, match="no answer from the API server.*gave up after 3 tries") as raised:
        read_node(kube)
    assert raised.value.status is None and raised.value.temporary
    assert isinstance(raised.value.__cause__, (urllib3.exceptions.HTTPError, OSError))
    assert len(clock.waits) == 2 and kube.calls == 3


def test_a_timeout_is_unreachable(api, tmp_path):
    api.inject("GET", NODE, "timeout", hang_seconds=1.0)
    with pytest.raises(Unreachable) as raised:
        read_node(kube_api(api, tmp_path, attempts=1, timeout_seconds=0.3))
    assert isinstance(raised.value.__cause__, urllib3.exceptions.HTTPError)


def test_an_unreadable_answer_is_an_unexpected_answer(api, tmp_path):
    api.inject("GET", NODE, "not-an-object")
    with pytest.raises(UnexpectedAnswer, match="is a JSON list, not an object") as raised:
        read_node(kube_api(api, tmp_path))
    assert raised.value.temporary and raised.value.status is None


def test_giving_up_keeps_the_kind_and_the_chain(api, tmp_path):
    api.inject("GET", NODE, 503, times=5)
    clock = RecordingClock()
    with pytest.raises(ServerFailure, match=r"HTTP 503.*\(gave up after 2 tries; retry later\)") as raised:
        read_node(kube_api(api, tmp_path, attempts=2, clock=clock))
    assert raised.value.status == 503 and isinstance(raised.value.__cause__, ApiException)
    assert len(api.calls("GET", NODE)) == 2


def test_a_failure_copies_and_pickles_as_its_kind():
    failure = TooManyRequests("get nodes: throttled", retry_after=3.0)
    for again in (pickle.loads(pickle.dumps(failure)), failure.noted("a note")):
        assert type(again) is TooManyRequests and again.status == 429 and again.retry_after == 3.0
    assert str(failure.noted("a note")) == "get nodes: throttled (a note)" and str(failure) == "get nodes: throttled"
    assert ServerFailure("bad gateway", status=502).status == 502
    assert KubeFailure(404, "old style", False).gone  # the base keeps its constructor


def test_translate_is_the_one_place_the_clients_errors_become_kinds():
    assert type(translate(urllib3.exceptions.ReadTimeoutError(None, "/", "slow"), "get", "nodes")) is Unreachable
    assert type(translate(ConnectionRefusedError(), "get", "nodes")) is Unreachable
    tls = translate(ApiException(status=0, reason="SSLError certificate verify failed"), "get", "nodes")
    assert type(tls) is Unreachable and "certificate verify failed" in str(tls)


# -- Retry-After -------------------------------------------------------------------------------------

def test_a_429_with_retry_after_is_retried_after_that_many_seconds_on_the_clock(api, tmp_path):
    """The retry waits for the server's 7 s, not the 0.01 s back-off: nothing is sent before."""
    clock = FakeClock(NOW)
    kube = kube_api(api, tmp_path, clock=clock)
    api.inject("GET", NODE, 429, times=2, retry_after=7)
    results = []
    reading = threading.Thread(target=lambda: results.append(read_node(kube)))
    reading.start()
    tick(clock, 6.9)  # the back-off alone (at most 0.015 s) would have retried long before this
    assert len(api.calls("GET", NODE)) == 1 and clock.waiting == 1
    tick(clock, 0.2)  # 7.1 s: past Retry-After; the second try is throttled too
    tick(clock, 6.9)
    assert len(api.calls("GET", NODE)) == 2 and clock.waiting == 1
    tick(clock, 0.2)
    reading.join(10)
    assert [r["metadata"]["name"] for r in results] == ["n0"] and len(api.calls("GET", NODE)) == 3


def test_the_waits_are_the_headers_and_a_503s_too(api, tmp_path):
    clock = RecordingClock()
    api.inject("GET", NODE, 429, retry_after=3)
    api.inject("GET", NODE, 503, retry_after=5)
    assert read_node(kube_api(api, tmp_path, clock=clock))["metadata"]["name"] == "n0"
    assert clock.waits == [3.0, 5.0] and len(api.calls("GET", NODE)) == 3


def test_without_retry_after_the_back_off_is_the_clients(api, tmp_path):
    clock = RecordingClock()
    api.inject("GET", NODE, 429)
    read_node(kube_api(api, tmp_path, clock=clock, backoff_seconds=0.2))
    assert len(clock.waits) == 1 and 0.1 <= clock.waits[0] <= 0.3


def test_retry_after_is_bounded_by_the_maximum(api, tmp_path):
    clock = RecordingClock()
    api.inject("GET", NODE, 429, retry_after=600)
    read_node(kube_api(api, tmp_path, clock=clock))
    assert clock.waits == [60.0]
    api.inject("GET", NODE, 429, retry_after=600)
    read_node(kube_api(api, tmp_path, clock=clock, max_retry_after_seconds=5.0))
    assert clock.waits == [60.0, 5.0]


def test_a_wait_past_the_callers_deadline_is_not_started(api, tmp_path):
    clock = RecordingClock()
    kube = kube_api(api, tmp_path, clock=clock)
    api.inject("GET", NODE, 429, retry_after=7)
    with pytest.raises(TooManyRequests, match="would pass the caller's deadline") as raised:
        read_node(kube, deadline=clock.monotonic() + 5.0)
    assert raised.value.retry_after == 7.0 and isinstance(raised.value.__cause__, ApiException)
    assert clock.waits == [] and len(api.calls("GET", NODE)) == 1
    api.inject("GET", NODE, 429, retry_after=3)  # one that fits is waited for
    assert read_node(kube, deadline=clock.monotonic() + 5.0)["metadata"]["name"] == "n0"
    assert clock.waits == [3.0]


def test_a_429_the_caller_handles_itself_is_not_retried(api, tmp_path):
    clock = RecordingClock()
    api.inject("GET", NODE, 429, retry_after=2)
    with pytest.raises(TooManyRequests):
        read_node(kube_api(api, tmp_path, clock=clock), retry_429=False)
    assert clock.waits == []


def test_a_lease_renewal_does_not_wait_past_its_turn(api, tmp_path):
    """Retry-After longer than the renew interval: this renewal fails now, and the next one tries."""
    clock = RecordingClock()
    elector = LeaderElector(kube_api(api, tmp_path, clock=clock), "gpuwarden", "actuator", "replica-a", 15, clock=clock)
    api.inject("GET", "/leases/actuator$", 429, retry_after=30)
    assert not elector.try_acquire_or_renew() and clock.waits == []
    api.inject("GET", "/leases/actuator$", 429, retry_after=2)
    assert elector.try_acquire_or_renew() and clock.waits == [2.0]
    assert api.get(COORDINATION, "leases", "actuator", "gpuwarden")["spec"]["holderIdentity"] == "replica-a"
    assert api.get(CORE, "nodes", "n0")  # the fixture's node is untouched


@pytest.mark.parametrize("headers, body, seconds", [
    ({"Retry-After": "7"}, None, 7.0),
    ({"retry-after": "2.5"}, None, 2.5),  # a plain dict, not the client's case-insensitive one
    ({"Retry-After": "-3"}, None, 0.0),
    ({"Retry-After": "Mon, 30 Nov 2026 12:00:09 GMT"}, None, 9.0),  # an HTTP date, against the clock's now
    ({"Retry-After": "soon"}, None, None),
    ({"Retry-After": "nan"}, None, None),
    ({}, '{"kind": "Status", "details": {"retryAfterSeconds": 4}}', 4.0),  # the Status's own field
    ({}, "not json", None),
    (None, None, None),
])
def test_retry_after_is_read_from_the_header_or_the_status(headers, body, seconds):
    assert retry_after_seconds(headers, body, NOW) == seconds
