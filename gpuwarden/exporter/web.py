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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

log = logging.getLogger("gpuwarden.exporter.http")

Metrics = Callable[[bool], "tuple[bytes, bool]"]  # (accepts gzip) -> (body, body is gzip)
CachedMetrics = Callable[[bool], "tuple[bytes, bool] | None"]  # the same, or None when it would render
Probe = Callable[[], "tuple[bool, str]"]  # -> (ok, reason)

_TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_MAX_HEAD_BYTES = 16384


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
                 cached_metrics: CachedMetrics | None = None):
        self.metrics, self.health, self.ready, self.limits = metrics, health, ready, limits
        self.cached_metrics = cached_metrics
        self._socket = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                            backlog=limits.backlog)
        self.server_address = self._socket.getsockname()[:2]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="gpuwarden-exporter-http-worker")
        self._tasks: set[asyncio.Task] = set()
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
            server = loop.run_until_complete(asyncio.start_server(
                self._connection, sock=self._socket, backlog=self.limits.backlog, limit=_MAX_HEAD_BYTES))
            self._started.set()
            loop.run_forever()
            server.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
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

    # -- one connection -------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.open_connections >= self.limits.max_connections:
            self.refused_connections += 1
            log.debug("refusing a connection: %d open (limit %d)", self.open_connections, self.limits.max_connections)
            writer.transport.abort()
            return
        self.open_connections += 1
        if task is not None:
            self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        try:
            timeout = self.limits.header_timeout
            while True:
                try:
                    async with asyncio.timeout(timeout):
                        head = await reader.readuntil(b"\r\n\r\n")
                except TimeoutError:
                    log.debug("http %s: no whole request within %.0fs; closed", peer, timeout)
                    return
                except asyncio.IncompleteReadError:
                    return  # the client closed (between requests: the normal end of keep-alive)
                except asyncio.LimitOverrunError:
                    await self._send(writer, 400, b"request head too large\n", _TEXT, close=True)
                    return
                keep_alive = await self._answer(head, writer)
                if not keep_alive:
                    return
                timeout = self.limits.idle_timeout
        except (ConnectionError, TimeoutError) as error:
            log.debug("http %s: client went away (%s)", peer, type(error).__name__)
        except asyncio.CancelledError:
            pass
        finally:
            self.open_connections -= 1
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _answer(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection stays open."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            await self._send(writer, 400, b"bad request line\n", _TEXT, close=True)
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        if headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers:
            await self._send(writer, 400, b"a request body is not accepted\n", _TEXT, close=True)
            return False
        if method not in ("GET", "HEAD"):
            await self._send(writer, 405, b"only GET and HEAD\n", _TEXT, close=not keep_alive, allow=True)
            return keep_alive
        path = urlsplit(target).path
        gzip_ok = accepts_gzip(headers.get("accept-encoding"))
        loop = asyncio.get_running_loop()
        encoding = None
        if path == "/metrics":
            # Served in the loop when the snapshot's bytes are ready; a render goes to a worker.
            answer = self.cached_metrics(gzip_ok) if self.cached_metrics is not None else None
            if answer is None:
                answer = await loop.run_in_executor(self._pool, self.metrics, gzip_ok)
            body, gzipped = answer
            status, content_type, encoding = 200, CONTENT_TYPE_PLAIN_0_0_4, "gzip" if gzipped else None
        elif path in ("/healthz", "/readyz"):
            ok, reason = await loop.run_in_executor(self._pool, self.health if path == "/healthz" else self.ready)
            status, body, content_type = 200 if ok else 503, f"{reason}\n".encode(), _TEXT
        elif path == "/":
            status, body, content_type = 200, b"gpuwarden exporter: /metrics /healthz (liveness) /readyz (readiness)\n", _TEXT
        else:
            status, body, content_type = 404, b"not found\n", _TEXT
        await self._send(writer, status, body, content_type, close=not keep_alive, encoding=encoding,
                         head_only=method == "HEAD")
        log.debug("http %s %s -> %d (%d bytes%s)", method, path, status, len(body), ", gzip" if encoding else "")
        return keep_alive

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, *, close: bool,
                    encoding: str | None = None, head_only: bool = False, allow: bool = False) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}", "Server: gpuwarden-exporter",
                 f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        if encoding:
            lines += [f"Content-Encoding: {encoding}", "Vary: Accept-Encoding"]
        if allow:
            lines.append("Allow: GET, HEAD")
        if close:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(body)
        async with asyncio.timeout(self.limits.write_timeout):
            await writer.drain()


def make_server(host: str, port: int, metrics: Metrics, health: Probe, ready: Probe,
                limits: Limits = Limits(), cached_metrics: CachedMetrics | None = None) -> ExporterHttpServer:
    """Bind (port 0 picks a free port) without serving yet; call ``start()``."""
    return ExporterHttpServer(host, port, metrics, health, ready, limits, cached_metrics)
