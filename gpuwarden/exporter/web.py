"""The tiny HTTP front: ``/metrics`` and ``/healthz``, both answered from memory.

The handlers only call the two functions they are given; they never reach a GPU backend.
"""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

log = logging.getLogger("gpuwarden.exporter")

RenderMetrics = Callable[[], bytes]
Health = Callable[[], "tuple[bool, str]"]


def make_server(host: str, port: int, render_metrics: RenderMetrics, health: Health) -> ThreadingHTTPServer:
    """Bind (port 0 picks a free port) without serving yet; call ``serve_forever`` in a thread."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuwarden-exporter"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = urlsplit(self.path).path
            if path == "/metrics":
                self._reply(200, render_metrics(), CONTENT_TYPE_PLAIN_0_0_4)
            elif path == "/healthz":
                ok, reason = health()
                self._reply(200 if ok else 503, f"{reason}\n".encode(), "text/plain; charset=utf-8")
            elif path == "/":
                self._reply(200, b"gpuwarden exporter: /metrics /healthz\n", "text/plain; charset=utf-8")
            else:
                self._reply(404, b"not found\n", "text/plain; charset=utf-8")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("http %s " + format, self.address_string(), *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    return server
