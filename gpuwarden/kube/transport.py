"""Each request to the API server bounded as a whole: a deadline, and a cap on the answer's size.

The official client bounds each socket operation (``_request_timeout``), never the request: an API
server (or a proxy before it) that sends one byte a second, never ends its head, or crawls through
a TLS handshake holds a call, and the round, for ever. And it reads an answer whole into memory,
so an endless body, or one that says it is a terabyte long, fills it.

:func:`guard_pools` gives the client's urllib3 pools connection classes that answer to the
:class:`RequestGuard` the calling thread holds (:meth:`gpuwarden.kube.api.KubeApi.call` opens one
around each try; a request outside one is the client's own):

- the deadline: a watchdog thread shuts the connection's socket down when the guard's deadline
  passes, wherever the request is (connecting, the TLS handshake, the head, the body), and
  :meth:`RequestGuard.cut` does so at once when the process stops (SIGTERM). The client then fails
  as on a dropped connection, and the guard says why (``expired``, ``aborted``). The socket is
  reached through a second descriptor taken when it was opened, so shutting it down never touches
  the TLS object the reading thread is using;
- the cap: the answer's bytes are counted as they are read off the socket, its head included; one
  that declares a ``Content-Length`` past the cap is refused before its body is read, one that runs
  past it as soon as it does, and one encoded (gzip) is refused unread: gpuwarden asks for no
  encoding, and a small encoded answer can decode to gigabytes. The guard's ``problem`` says which.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import socket
import threading
import time
from typing import Any

from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_current = threading.local()  # .guard: the RequestGuard of the request this thread is making, if any


class AnswerRefused(Exception):
    """Raised from a read of an answer the guard refused (``RequestGuard.problem`` says why). Not an
    OSError: urllib3 must not take it for a dropped connection and wrap it."""


class RequestGuard:
    """One try of one request: its deadline (``time.monotonic()``, real time: sockets do not run on
    an injected clock) and the cap on its answer. A context manager: the calling thread's requests
    answer to it while it is open."""

    def __init__(self, timeout_seconds: float, max_answer_bytes: int) -> None:
        self.timeout_seconds = timeout_seconds
        self.deadline = time.monotonic() + timeout_seconds
        self.max_answer_bytes = max_answer_bytes
        self.expired = False  # the deadline passed before the request was over
        self.aborted = False  # cut short: the process is stopping
        self.problem: str | None = None  # what is wrong with the answer ("is larger than N bytes")
        self._sockets: list[socket.socket] = []
        self._adopted: list[socket.socket] = []  # handles of connections closed while their answer is read
        self._lock = threading.Lock()
        self._open = False

    def __enter__(self) -> RequestGuard:
        with self._lock:
            self._open = True
        _current.guard = self
        _WATCHDOG.arm(self)
        return self

    def __exit__(self, *_: object) -> None:
        _current.guard = None
        with self._lock:
            self._open = False
            self._sockets.clear()
            adopted, self._adopted = self._adopted, []
        for handle in adopted:
            handle.close()

    def adopt(self, handle: socket.socket) -> bool:
        """Close ``handle`` when the request is over: http.client closes a connection whose answer
        says ``Connection: close`` before that answer is read, and the deadline must still reach it."""
        with self._lock:
            if self._open:
                self._adopted.append(handle)
            return self._open

    def watch(self, handle: socket.socket) -> None:
        """``handle`` (a descriptor of the request's socket) is shut down if the request is cut."""
        with self._lock:
            if not self._open:
                return
            self._sockets.append(handle)
            cut = self.expired or self.aborted
        if cut:
            _shut(handle)

    def cut(self, aborted: bool = False) -> None:
        """End the request now: its deadline passed, or (``aborted``) the process is stopping."""
        with self._lock:
            if not self._open:
                return
            if aborted:
                self.aborted = True
            else:
                self.expired = True
            handles = list(self._sockets)
        for handle in handles:
            _shut(handle)

    def refuse(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def too_large(self, declared: int | None = None) -> str:
        said = f" (it declares {declared:,})" if declared is not None else ""
        return f"is larger than {self.max_answer_bytes:,} bytes{said}"


def current_guard() -> RequestGuard | None:
    return getattr(_current, "guard", None)


def _shut(handle: socket.socket) -> None:
    try:
        handle.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed, or never connected
        pass


class _Watchdog:
    """One daemon thread that cuts each guard still open at its deadline."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._due: list[tuple[float, int, RequestGuard]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, guard: RequestGuard) -> None:
        with self._wake:
            heapq.heappush(self._due, (guard.deadline, next(self._order), guard))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="gpuwarden-kube-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, guard = heapq.heappop(self._due)
            guard.cut()  # a no-op once the request is over


_WATCHDOG = _Watchdog()


class _CountingReader:
    """The answer's socket file, counted against the guard's cap: a read never asks for more than
    one byte past it (http.client would allocate a declared length up front)."""

    def __init__(self, inner: Any, guard: RequestGuard) -> None:
        self._inner, self._guard, self._read_bytes = inner, guard, 0

    def _allowed(self, wanted: int | None) -> int:
        if self._guard.problem is not None:
            raise AnswerRefused(self._guard.problem)
        left = self._guard.max_answer_bytes - self._read_bytes + 1  # one past the cap tells "over"
        return left if wanted is None or wanted < 0 else min(wanted, left)

    def _counted(self, got: int) -> None:
        self._read_bytes += got
        if self._read_bytes > self._guard.max_answer_bytes:
            self._guard.refuse(self._guard.too_large())
            raise AnswerRefused(self._guard.problem)

    def read(self, amount: int | None = -1) -> bytes:
        data: bytes = self._inner.read(self._allowed(amount))
        self._counted(len(data))
        return data

    def read1(self, amount: int = -1) -> bytes:
        data: bytes = self._inner.read1(self._allowed(amount))
        self._counted(len(data))
        return data

    def readline(self, limit: int = -1) -> bytes:
        data: bytes = self._inner.readline(self._allowed(limit))
        self._counted(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)
        got = self._inner.readinto(view[:self._allowed(len(view))]) or 0
        self._counted(got)
        return int(got)

    def __getattr__(self, name: str) -> Any:  # close, closed, peek, fileno, flush
        return getattr(self._inner, name)


class _GuardedResponse(http.client.HTTPResponse):
    """http.client's response, read through a :class:`_CountingReader` under a guard."""

    def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self._guard = current_guard()
        if self._guard is not None:
            self.fp = _CountingReader(self.fp, self._guard)  # type: ignore[assignment]

    def begin(self) -> None:
        super().begin()
        guard = self._guard
        if guard is None:
            return
        encoding = (self.getheader("Content-Encoding") or "").strip().lower()
        if encoding not in ("", "identity"):
            guard.refuse(f"is {encoding[:40]}-encoded, which gpuwarden did not ask for (unread: a small encoded "
                         "answer can decode to gigabytes)")
        elif self.length is not None and self.length > guard.max_answer_bytes:
            guard.refuse(guard.too_large(self.length))


class _Guarded:
    """What both connection classes add: the socket's second descriptor, handed to each guard."""

    _handle: socket.socket | None = None

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        if self._handle is not None:  # reconnecting without a close: the old socket's handle goes too
            self._handle.close()
        self._handle = sock.dup()  # stays usable while TLS wraps (and detaches) the first one
        guard = current_guard()
        if guard is not None:
            guard.watch(self._handle)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        guard = current_guard()
        if guard is not None and self._handle is not None:  # a kept-alive connection's next request
            guard.watch(self._handle)
        super().request(*args, **kwargs)  # type: ignore[misc]

    def close(self) -> None:
        try:
            super().close()  # type: ignore[misc]
        finally:
            handle, self._handle = self._handle, None
            guard = current_guard()
            if handle is not None and not (guard is not None and guard.adopt(handle)):
                handle.close()


class GuardedHTTPConnection(_Guarded, HTTPConnection):
    response_class = _GuardedResponse


class GuardedHTTPSConnection(_Guarded, HTTPSConnection):
    response_class = _GuardedResponse


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = GuardedHTTPSConnection


def guard_pools(pool_manager: Any) -> bool:
    """Make ``pool_manager`` (the client's ``rest_client.pool_manager``) open guarded connections;
    whether it could (a SOCKS proxy's manager has connection classes of its own, left as they are)."""
    if not isinstance(pool_manager, PoolManager) or type(pool_manager).__name__ == "SOCKSProxyManager":
        return False
    if pool_manager.pool_classes_by_scheme.get("http") is not _GuardedHTTPPool:
        pool_manager.clear()  # pools made before (none, in practice) would keep the plain connections
        pool_manager.pool_classes_by_scheme = {"http": _GuardedHTTPPool, "https": _GuardedHTTPSPool}
    return True
