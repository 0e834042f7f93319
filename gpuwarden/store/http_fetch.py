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


def fetch(url: str, *, timeout_s: float, max_bytes: int, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None, ssl_context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """``(status, body)`` of one request to ``url`` (http or https), all of it within ``timeout_s``
    seconds; raises :class:`DeadlineExceeded`, :class:`AnswerTooLarge` or an ``OSError`` (refused,
    reset, TLS)."""
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
        return response.status, b"".join(chunks)
    except (OSError, http.client.HTTPException) as error:
        if expired.is_set() or time.monotonic() - started >= timeout_s:
            raise DeadlineExceeded(f"no whole answer within {timeout_s:g} s") from None
        if isinstance(error, OSError):
            raise
        raise ConnectionError(f"bad HTTP answer ({type(error).__name__}: {error})") from None
    finally:
        watchdog.cancel()
        connection.close()
