"""One HTTP request under a whole-request deadline and a size bound, for every client of this room
(the Prometheus API, the embedded scraper of an exporter or dcgm-exporter).

``urlopen(timeout=...)`` bounds each socket read, not the request: a server that trickles its body
one byte a second, or its head one line at a time, holds the caller for as long as it likes. Here
a watchdog shuts the socket down at the deadline, whatever read is in progress, and the body is
read in chunks up to ``max_bytes``.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.parse

_CHUNK_BYTES = 1 << 16


class DeadlineExceeded(TimeoutError):
    """The whole request (connect, head and body) took longer than its deadline."""


class AnswerTooLarge(OSError):
    """The answer's body is larger than the caller's bound."""


_REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 3


def fetch(url: str, *, timeout_s: float, max_bytes: int, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None, ssl_context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """``(status, body)`` of one request to ``url`` (http or https), all of it within ``timeout_s``
    seconds; raises :class:`DeadlineExceeded`, :class:`AnswerTooLarge` or an ``OSError`` (refused,
    reset, TLS). A GET follows up to ``MAX_REDIRECTS`` redirects within the same deadline (as
    urllib did for the scraper); a POST's redirect is returned as it is (its form would be lost)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(MAX_REDIRECTS + 1):
        try:
            status, location, payload = _once(url, max(0.001, deadline - time.monotonic()), max_bytes, method, body,
                                              headers, ssl_context)
        except DeadlineExceeded:
            raise DeadlineExceeded(f"no whole answer within {timeout_s:g} s") from None
        if status not in _REDIRECTS or method != "GET" or not location:
            return status, payload
        url = urllib.parse.urljoin(url, location)
    return status, payload


def _once(url: str, timeout_s: float, max_bytes: int, method: str, body: bytes | None,
          headers: dict[str, str] | None, ssl_context: ssl.SSLContext | None) -> tuple[int, str | None, bytes]:
    """One request and answer: ``(status, Location header, body)``."""
    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout_s, context=ssl_context)
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    expired = threading.Event()
    opened: list[socket.socket] = []  # the connection hands its socket to the response (HTTP/1.0): keep it here

    def expire() -> None:
        expired.set()
        for sock in opened:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in any step
            except OSError:
                pass

    started = time.monotonic()
    watchdog = threading.Timer(timeout_s, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.connect()  # bounded by the socket timeout (timeout_s)
        opened.append(connection.sock)
        if expired.is_set():
            raise DeadlineExceeded(f"no whole answer within {timeout_s:g} s")
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        chunks: list[bytes] = []
        size = 0
        while chunk := response.read(_CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise AnswerTooLarge(f"the answer is larger than {max_bytes:,} bytes")
            chunks.append(chunk)
        if expired.is_set():
            raise DeadlineExceeded(f"no whole answer within {timeout_s:g} s")
        return response.status, response.getheader("Location"), b"".join(chunks)
    except (OSError, http.client.HTTPException) as error:
        if expired.is_set() or time.monotonic() - started >= timeout_s:
            raise DeadlineExceeded(f"no whole answer within {timeout_s:g} s") from None
        if isinstance(error, OSError):
            raise
        raise ConnectionError(f"bad HTTP answer ({type(error).__name__}: {error})") from None
    finally:
        watchdog.cancel()
        connection.close()
