"""Issue 24's second bad-input probe: each class it found, held (a one-line error naming the value,
or a count said beside the results; never data lost or changed without a word).

Servers here are real sockets on 127.0.0.1 (a trickling HTTP server, a raw pipelining client);
the store race runs a real compaction in another process against reads in this one."""

from __future__ import annotations

import socket
import threading
import time

from builders import gpu_reading
from polling import wait_for
from test_exporter import FakeBackend
from test_exporter_server import started  # noqa: F401 - the fixture

from gpuwarden.exporter.web import Limits


# -- 6. the exporter's per-connection output is bounded while a client pipelines and never reads --
def test_a_client_that_keeps_pipelining_and_never_reads_is_dropped_at_the_write_timeout(started):  # noqa: F811
    readings = [gpu_reading(i) for i in range(64)]
    service = started(FakeBackend(readings), http_limits=Limits(write_timeout=0.3, idle_timeout=30))
    wait_for(lambda: service.snapshot.success, what="first collection")
    answer_bytes = len(service.render_metrics())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", service.port))
    sock.settimeout(0.2)
    largest_buffer_bytes = 0
    sent_requests = 0
    started_at = time.monotonic()
    dropped_after_s = None
    try:
        while time.monotonic() - started_at < 5.0:  # requests keep coming: each used to re-arm the timers
            try:
                sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                sent_requests += 1
            except TimeoutError:
                pass  # the server stopped reading (backpressure): the client keeps trying
            except OSError:
                dropped_after_s = time.monotonic() - started_at
                break
            for connection in list(service._server._connections):
                if connection.transport is not None:
                    largest_buffer_bytes = max(largest_buffer_bytes, connection.transport.get_write_buffer_size())
            if service._server.open_connections == 0:
                dropped_after_s = time.monotonic() - started_at
                break
    finally:
        sock.close()
    assert sent_requests > 10
    assert dropped_after_s is not None and dropped_after_s < 3.0, dropped_after_s
    # At most the answer being written sits in user space (plus its head), never one per request.
    assert largest_buffer_bytes <= answer_bytes + 1024, (largest_buffer_bytes, answer_bytes)
    wait_for(lambda: service._server.open_connections == 0, what="closed")
    assert service._server.open_connections == 0
