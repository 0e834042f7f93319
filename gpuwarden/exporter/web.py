"""The exporter's HTTP front: ``/metrics``, ``/healthz`` (liveness) and ``/readyz`` (readiness),
all answered from memory.

One asyncio event loop in one thread holds every connection, so a slow or half-open client costs a
coroutine and a socket, never a thread: the thread count is fixed (the loop, plus ``workers``
threads that run the answer functions). What it guards against:

- a listen backlog of ``backlog`` (http.server's default is 5, which dropped SYNs under 50
  concurrent scrapers);
- ``header_timeout``: a client must send a whole request head within it (slowloris), and an idle
  keep-alive connection is closed after ``idle_timeout``; a write that cannot drain within
  ``write_timeout`` is dropped;
- at most ``max_connections`` open connections: beyond that a new one is closed at once;
- a client that disconnects is logged at debug level, in one line, never as a traceback.

``/metrics`` is gzip-compressed when the client sends ``Accept-Encoding: gzip``. The answer
functions are given in; the server never reaches a GPU backend.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

log = logging.getLogger("gpuwarden.exporter.http")

Metrics = Callable[[bool], "tuple[bytes, bool]"]  # (accepts gzip) -> (body, body is gzip)
QuickMetrics = Callable[[bool], "tuple[bytes, bool] | None"]  # the same, or None when it would be slow
Probe = Callable[[], "tuple[bool, str]"]  # -> (ok, reason)

_TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error",
            503: "Service Unavailable"}
_MAX_HEAD_BYTES = 16384
_T = TypeVar("_T")


@dataclass(frozen=True)
class Limits:
    backlog: int = 128
    max_connections: int = 256
    workers: int = 2
    header_timeout: float = 10.0
    idle_timeout: float = 30.0  # longer than a 15 s scrape interval, so Prometheus keeps its connection
    write_timeout: float = 10.0


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip (``gzip;q=0`` does not)."""
    for part in (header or "").split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            if q.startswith("q="):
                try:
                    return float(q[2:]) > 0
                except ValueError:
                    return False
            return True
    return False


class ExporterHttpServer:
    """Bind on construction (port 0 picks a free port); :meth:`start` serves in a thread."""

    def __init__(self, host: str, port: int, metrics: Metrics, health: Probe, ready: Probe, limits: Limits = Limits(),
                 quick_metrics: QuickMetrics | None = None):
        self.metrics, self.health, self.ready, self.limits = metrics, health, ready, limits
        self.quick_metrics = quick_metrics
        self._socket = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                            backlog=limits.backlog)
        self.server_address = self._socket.getsockname()[:2]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="gpuwarden-exporter-http-worker")
        self._connections: set[_Connection] = set()
        self.open_connections = 0
        self.refused_connections = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> ExporterHttpServer:
        self._thread = threading.Thread(target=self._run, name="gpuwarden-exporter-http", daemon=True)
        self._thread.start()
        self._started.wait(10)
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            server = loop.run_until_complete(loop.create_server(lambda: _Connection(self), sock=self._socket,
                                                                backlog=self.limits.backlog))
            self._started.set()
            loop.run_forever()
            server.close()
            for connection in list(self._connections):
                connection.abort()
            loop.run_until_complete(asyncio.sleep(0))  # let the aborted connections say goodbye
        finally:
            self._started.set()
            loop.close()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop serving and close the socket; open connections are dropped. Safe to call twice."""
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:  # closed meanwhile
                pass
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._socket.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- requests -------------------------------------------------------------------------------
    def handle(self, connection: _Connection, head: bytes) -> None:
        """Answer one request head (in the loop); slow answers go to a worker thread."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            connection.respond(400, b"bad request line\n", _TEXT, close=True)
            return
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        conn_header = headers.get("connection", "").lower()
        keep_alive = "close" not in conn_header if version == "HTTP/1.1" else "keep-alive" in conn_header
        if headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers:
            connection.respond(400, b"a request body is not accepted\n", _TEXT, close=True)
            return
        if method not in ("GET", "HEAD"):
            connection.respond(405, b"only GET and HEAD\n", _TEXT, close=not keep_alive, allow=True)
            return
        path = urlsplit(target).path
        head_only = method == "HEAD"
        if path == "/metrics":
            gzip_ok = accepts_gzip(headers.get("accept-encoding"))
            # Served in the loop when quick (bytes ready, or a small render); a long render goes to a worker.
            answer = self.quick_metrics(gzip_ok) if self.quick_metrics is not None else None
            if answer is not None:
                self._metrics_answer(connection, answer, keep_alive, head_only)
            else:
                self._in_worker(connection, lambda: self.metrics(gzip_ok),
                                lambda answer: self._metrics_answer(connection, answer, keep_alive, head_only))
        elif path in ("/healthz", "/readyz"):
            probe = self.health if path == "/healthz" else self.ready

            def probed(result: tuple[bool, str]) -> None:
                ok, reason = result
                connection.respond(200 if ok else 503, f"{reason}\n".encode(), _TEXT, close=not keep_alive,
                                   head_only=head_only)

            self._in_worker(connection, probe, probed)
        elif path == "/":
            connection.respond(200, b"gpuwarden exporter: /metrics /healthz (liveness) /readyz (readiness)\n", _TEXT,
                               close=not keep_alive, head_only=head_only)
        else:
            connection.respond(404, b"not found\n", _TEXT, close=not keep_alive, head_only=head_only)

    @staticmethod
    def _metrics_answer(connection: _Connection, answer: tuple[bytes, bool], keep_alive: bool, head_only: bool) -> None:
        body, gzipped = answer
        connection.respond(200, body, CONTENT_TYPE_PLAIN_0_0_4, close=not keep_alive,
                           encoding="gzip" if gzipped else None, head_only=head_only)

    def _in_worker(self, connection: _Connection, call: Callable[[], _T], then: Callable[[_T], None]) -> None:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, call)

        def done(finished: asyncio.Future[_T]) -> None:
            if connection.closed:
                return
            if finished.cancelled() or finished.exception() is not None:
                log.warning("http answer failed: %r", None if finished.cancelled() else finished.exception())
                connection.respond(500, b"internal error\n", _TEXT, close=True)
                return
            then(finished.result())

        future.add_done_callback(done)


class _Connection(asyncio.Protocol):
    """One client connection: request heads in, answers out, each step under a timer.

    The write buffer limits are zero, so asyncio says (pause/resume_writing) whenever an answer
    could not be written at once and when it has drained: a client that stops reading is dropped
    after ``write_timeout``."""

    def __init__(self, server: ExporterHttpServer):
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False  # a request is being answered
        self.writing = False  # an answer is still in the write buffer
        self.closing = False  # close once the answer is written
        self.closed = False
        self.peer: object = None

    # -- asyncio callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        assert isinstance(transport, asyncio.Transport)
        if server.open_connections >= self.limits.max_connections:
            server.refused_connections += 1
            log.debug("refusing a connection: %d open (limit %d)", server.open_connections, self.limits.max_connections)
            self.closed = True
            transport.abort()
            return
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        transport.set_write_buffer_limits(high=0, low=0)
        server.open_connections += 1
        server._connections.add(self)
        self._arm(self.limits.header_timeout, "no whole request head in time")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.busy or self.writing:
            # A client pipelining faster than it reads: stop reading until the answer drains, so
            # neither its requests nor our answers pile up in memory, and the write timer holds.
            if len(self.buffer) > _MAX_HEAD_BYTES and self.transport is not None:
                self.transport.pause_reading()
            return
        self._next_request()

    def eof_received(self) -> bool:
        if self.busy:  # answer the request in flight, then close
            self.closing = True
            return True
        return False

    def pause_writing(self) -> None:
        self.writing = True
        if self.transport is not None:
            self.transport.pause_reading()  # no new request is read (nor answered) until this one drains
        self._arm(self.limits.write_timeout, "answer not read in time")

    def resume_writing(self) -> None:
        self.writing = False
        # asyncio calls this from inside its write-ready handler, which itself ends the connection
        # once the buffer is empty and the transport closing: a close() made here would have
        # connection_lost run twice (an asyncio ERROR per scrape). Carry on at the next loop turn.
        asyncio.get_running_loop().call_soon(self._after_answer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None or self.closed:
            self.closed = True
            return
        self.closed = True
        self._cancel_timer()
        self.server.open_connections -= 1
        self.server._connections.discard(self)
        if exc is not None:
            log.debug("http %s: client went away (%s)", self.peer, type(exc).__name__)

    # -- steps ----------------------------------------------------------------------------------
    def _next_request(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > _MAX_HEAD_BYTES:
                self.busy = True
                self.respond(400, b"request head too large\n", _TEXT, close=True)
            return
        head = bytes(self.buffer[:end + 4])
        del self.buffer[:end + 4]
        self.busy = True
        self._cancel_timer()
        self.server.handle(self, head)

    def respond(self, status: int, body: bytes, content_type: str, *, close: bool, encoding: str | None = None,
                head_only: bool = False, allow: bool = False) -> None:
        transport = self.transport
        if self.closed or transport is None:
            return
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}", "Server: gpuwarden-exporter",
                 f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        if encoding:
            lines += [f"Content-Encoding: {encoding}", "Vary: Accept-Encoding"]
        if allow:
            lines.append("Allow: GET, HEAD")
        if close or self.closing:
            lines.append("Connection: close")
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            transport.write(body)
        log.debug("http %s -> %d (%d bytes%s)", self.peer, status, len(body), ", gzip" if encoding else "")
        self.closing = self.closing or close
        self.busy = False
        if not self.writing:
            self._after_answer()

    def _after_answer(self) -> None:
        """The answer has left the write buffer (or is leaving it): close, or wait for the next request."""
        if self.closed or self.busy or self.transport is None:
            return
        if self.closing:
            self._cancel_timer()
            self.transport.close()  # flushes what is left, then connection_lost
            return
        self._arm(self.limits.idle_timeout, "idle")
        if self.transport.is_closing():
            return
        self.transport.resume_reading()
        if self.buffer:
            self._next_request()  # a pipelined request

    def _arm(self, seconds: float, why: str) -> None:
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(seconds, self._expire, why)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self, why: str) -> None:
        log.debug("http %s: %s; closed", self.peer, why)
        self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()


def make_server(host: str, port: int, metrics: Metrics, health: Probe, ready: Probe,
                limits: Limits = Limits(), quick_metrics: QuickMetrics | None = None) -> ExporterHttpServer:
    """Bind (port 0 picks a free port) without serving yet; call ``start()``."""
    return ExporterHttpServer(host, port, metrics, health, ready, limits, quick_metrics)
