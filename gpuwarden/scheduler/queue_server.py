"""The scheduler's HTTP endpoint (default port 8083): the live queue, its metrics, its health, and
portal submissions.

- ``GET /queue``: the latest round's queue document (:mod:`gpuwarden.scheduling.live_queue`);
  ``?namespace=N`` keeps that namespace's workloads and ignored pods (the team table stays whole);
  503 with ``Retry-After`` (:data:`RETRY_AFTER_SECONDS`) and a one-line JSON ``error`` while there
  is no queue to give: before the first round, or while a round runs that has not finished within
  the reader's bound (``SchedulingRound.queue``: 2 s, below the request timeouts of the dashboard and
  ``gpuwarden queue``). A reader never waits longer than that bound, whatever the round does;
- ``GET /metrics``: the scheduler's Prometheus registry (:mod:`.scheduler_metrics`);
- ``GET /healthz``: 200 ``ok`` while the process serves (the chart's liveness probe);
- ``POST /submit`` with ``{"request": {...portal request...}, "identity": "alice@example.com"}``:
  hands the request to the ``submit(request, identity) -> (workload key, message)`` it was given
  (the demo adds a simulated workload; a cluster creates a Job), answers 201 ``{"workload",
  "message"}``, or 400 ``{"error": one line naming the field}`` when ``submit`` raises ValueError;
  404 where no ``submit`` was given.
One server thread per request (``ThreadingHTTPServer``); the queue is read, never computed, here.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("gpuwarden.scheduler")
Submit = Callable[[Mapping[str, Any], str], tuple[str, str]]
MAX_BODY_BYTES = 1 << 20
RETRY_AFTER_SECONDS = 5  # a 503 on /queue: ask again after this long (a round takes about a second)
NO_QUEUE_YET = (f"no scheduling round has run yet (or the round running now has not finished); try again in "
                f"{RETRY_AFTER_SECONDS} s")


def filter_namespace(document: Mapping[str, Any], namespace: str | None) -> dict[str, Any]:
    """The queue document with only ``namespace``'s workloads (all of them when None)."""
    if not namespace:
        return dict(document)
    return {**document, "workloads": [w for w in document.get("workloads", ()) if w.get("namespace") == namespace],
            "ignored_pods": [p for p in document.get("ignored_pods", ())
                             if str(p.get("pod", "")).partition("/")[0] == namespace]}


class QueueServer:
    def __init__(self, queue: Callable[[], Mapping[str, Any]], registry: Any = None, submit: Submit | None = None,
                 host: str = "127.0.0.1", port: int = 8083) -> None:
        self.queue = queue
        self.registry = registry
        self.submit = submit
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server._get(self)

            def do_POST(self) -> None:  # noqa: N802
                server._post(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
                log.debug("queue server: " + format, *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = str(self.httpd.server_address[0])
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"

    def start(self) -> QueueServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="gpuwarden-queue-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- requests --------------------------------------------------------------------------------
    def _get(self, request: BaseHTTPRequestHandler) -> None:
        url = urlsplit(request.path)
        if url.path == "/queue":
            document = self.queue()
            if not document:
                _send(request, 503, {"error": NO_QUEUE_YET}, {"Retry-After": str(RETRY_AFTER_SECONDS)})
                return
            namespace = next(iter(parse_qs(url.query).get("namespace") or ()), None)
            _send(request, 200, filter_namespace(document, namespace))
        elif url.path == "/metrics" and self.registry is not None:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            _send_bytes(request, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif url.path == "/healthz":
            _send_bytes(request, 200, b"ok\n", "text/plain; charset=utf-8")
        else:
            _send(request, 404, {"error": f"no such path {url.path!r}; this server has /queue, /metrics, /healthz"})

    def _post(self, request: BaseHTTPRequestHandler) -> None:
        if urlsplit(request.path).path != "/submit" or self.submit is None:
            _send(request, 404, {"error": f"no such path {request.path!r} (POST /submit where submissions are wired)"})
            return
        try:
            length = int(request.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                raise ValueError(f"body: {length} bytes; send one JSON object of 1..{MAX_BODY_BYTES} bytes")
            body = json.loads(request.rfile.read(length))
            if not isinstance(body, Mapping) or not isinstance(body.get("request"), Mapping):
                raise ValueError('body: expected {"request": {...}, "identity": "..."}')
            identity = body.get("identity")
            if not isinstance(identity, str) or not identity.strip():
                raise ValueError("identity: the signed-in user who submits, a non-empty string")
            workload, message = self.submit(body["request"], identity.strip())
        except ValueError as error:  # json.JSONDecodeError is one too
            _send(request, 400, {"error": " ".join(str(error).split())})
            return
        _send(request, 201, {"workload": workload, "message": message})


def _send(request: BaseHTTPRequestHandler, status: int, document: Mapping[str, Any],
          headers: Mapping[str, str] | None = None) -> None:
    _send_bytes(request, status, json.dumps(document).encode(), "application/json", headers)


def _send_bytes(request: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str,
                headers: Mapping[str, str] | None = None) -> None:
    request.send_response(status)
    for name, value in (headers or {}).items():
        request.send_header(name, value)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)
