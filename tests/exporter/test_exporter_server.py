"""The exporter's HTTP server under real sockets on loopback (issue 16, item 5): gzip, liveness
vs readiness while stale, a bound on threads and connections under slowloris, quiet client
disconnects, and the command line's number checks. The GPU backend is the test fake of
``test_exporter`` (no GPU on CI); the server, its sockets and its clients are real."""

from __future__ import annotations

import gzip
import http.client
import logging
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from builders import gpu_reading
from polling import tick, wait_for
from prometheus_client.parser import text_string_to_metric_families
from builders import FakeBackend

from gpuwarden.exporter import ExporterService
from gpuwarden.exporter.main import main as exporter_main
from gpuwarden.exporter.web import Limits, accepts_gzip
from gpuwarden.fleet.clock import FakeClock

ROOT = Path(__file__).resolve().parents[2]


def request(service: ExporterService, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=5)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_accept_encoding_parsing():
    assert accepts_gzip("gzip") and accepts_gzip("deflate, gzip;q=0.5") and accepts_gzip("*")
    assert not accepts_gzip(None) and not accepts_gzip("identity") and not accepts_gzip("gzip;q=0")
    assert not accepts_gzip("br, deflate")


def test_metrics_are_gzipped_when_the_scraper_accepts_it(started):
    service = started(FakeBackend([gpu_reading(0), gpu_reading(1)]), clock=FakeClock())
    wait_for(lambda: service.snapshot.success, what="first collection")
    status, headers, plain = request(service, "/metrics")
    assert status == 200 and "content-encoding" not in headers
    status, headers, packed = request(service, "/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip" and headers["vary"] == "Accept-Encoding"
    assert len(packed) < len(plain) / 3
    assert gzip.decompress(packed) == plain  # the same exposition; the age member decompresses in sequence
    parsed = samples(plain.decode())
    assert parsed[("DCGM_FI_DEV_POWER_USAGE", frozenset({**request_labels(service, gpu_reading(1))}.items()))] == 312.5
    assert parsed[("gpuwarden_exporter_snapshot_age_seconds", frozenset({"node": "node-a"}.items()))] == 0
    status, headers, _ = request(service, "/metrics", {"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in headers


def request_labels(service: ExporterService, reading) -> dict[str, str]:
    from gpuwarden.exporter.collector import gpu_labels

    return gpu_labels(reading, service.snapshot.driver_version)


def test_readiness_stays_ready_while_stale_and_liveness_fails_and_staleness_is_exported(started):
    """On a FakeClock: a collection that starts at 15 s and hangs is seen by the 5 s watchdog once
    the clock reaches 57 s; the served readings are then 57 s old."""
    clock = FakeClock(1_800_000_000.0)
    backend = FakeBackend([gpu_reading(0)])
    service = started(backend, interval_seconds=15, watchdog_seconds=5, clock=clock)
    wait_for(lambda: request(service, "/healthz")[0] == 200, what="healthy")
    assert request(service, "/readyz")[0] == 200
    backend.gate = threading.Event()  # the next read() hangs: the watchdog marks the snapshot stale
    try:
        tick(clock, 15, waiters=2)  # the collection loop and the watchdog are idle: the next collection starts
        wait_for(lambda: backend.reads == 2, what="the second collection to start")
        tick(clock, 42)  # the watchdog waits for it to pass 5 s
        node = frozenset({"node": "node-a"}.items())
        parsed = wait_for(lambda: (p := samples(request(service, "/metrics")[2].decode()))
                          [("gpuwarden_exporter_collection_stale", node)] == 1 and p, what="stale series")
        assert parsed[("gpuwarden_exporter_snapshot_age_seconds", node)] == 57.0
        assert ("DCGM_FI_DEV_GPU_UTIL", frozenset(request_labels(service, gpu_reading(0)).items())) in parsed  # last readings
        status, _, body = request(service, "/healthz")
        assert status == 503 and b"hung" in body
        status, _, body = request(service, "/readyz")
        assert status == 200 and body == b"ready (stale)\n"  # still a target: Prometheus shows it stale
    finally:
        backend.gate.set()
    wait_for(lambda: request(service, "/healthz")[0] == 200, what="healthy again")


def test_not_ready_before_the_first_collection(started):
    backend = FakeBackend([gpu_reading(0)])
    backend.gate = threading.Event()  # the first read() hangs
    service = started(backend)
    try:
        status, _, body = request(service, "/readyz")
        assert status == 503 and b"no collection yet" in body
        assert b"gpuwarden_exporter_snapshot_age_seconds" not in request(service, "/metrics")[2]  # nothing to age
    finally:
        backend.gate.set()
    wait_for(lambda: request(service, "/readyz")[0] == 200, what="ready")


def test_slowloris_sockets_leave_threads_bounded_and_are_timed_out(started):
    service = started(FakeBackend([gpu_reading(0)]), http_limits=Limits(header_timeout=0.5, max_connections=64))
    wait_for(lambda: service.snapshot.success, what="first collection")
    request(service, "/metrics")  # the worker threads exist from here on
    threads_before = threading.active_count()
    held = []
    try:
        for _ in range(40):
            sock = socket.create_connection(("127.0.0.1", service.port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
            held.append(sock)
        wait_for(lambda: service._server.open_connections == 40, what="40 connections held")
        # no thread per connection: at most the pool's lazily started workers join
        assert threading.active_count() <= threads_before + service.http_limits.workers
        status, _, body = request(service, "/metrics")  # a real scrape still answers meanwhile
        assert status == 200 and b"DCGM_FI_DEV_GPU_UTIL" in body
        for sock in held:  # each is closed once its head is overdue
            assert sock.recv(1) == b""
        wait_for(lambda: service._server.open_connections == 0, what="all closed")
    finally:
        for sock in held:
            sock.close()


def test_connections_beyond_the_limit_are_refused(started):
    service = started(FakeBackend([gpu_reading(0)]), http_limits=Limits(max_connections=3, header_timeout=5))
    held = [socket.create_connection(("127.0.0.1", service.port), timeout=5) for _ in range(3)]
    try:
        wait_for(lambda: service._server.open_connections == 3, what="3 open")
        extra = socket.create_connection(("127.0.0.1", service.port), timeout=5)
        try:
            extra.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert extra.recv(100) == b""
        except ConnectionResetError:
            pass  # refused by an abort: also closed
        finally:
            extra.close()
        assert service._server.refused_connections == 1
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: request(service, "/healthz")[0] == 200, what="served again")


def test_keep_alive_serves_several_requests_on_one_connection(started):
    service = started(FakeBackend([gpu_reading(0)]))
    wait_for(lambda: service.snapshot.success, what="first collection")
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=5)
    try:
        for path in ("/metrics", "/healthz", "/readyz", "/nope"):
            connection.request("GET", path)
            response = connection.getresponse()
            response.read()
            assert response.status == (404 if path == "/nope" else 200)
        connection.request("POST", "/metrics")
        assert connection.getresponse().status == 405
    finally:
        connection.close()


def test_client_disconnects_are_logged_quietly(started, caplog, capfd):
    service = started(FakeBackend([gpu_reading(i) for i in range(8)]))
    wait_for(lambda: service.snapshot.success, what="first collection")
    with caplog.at_level(logging.DEBUG, logger="gpuwarden.exporter"):
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", service.port), timeout=5)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset on close
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.close()  # gone before the answer is written
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", service.port), timeout=5)
            sock.sendall(b"GET /metr")
            sock.close()  # gone mid-request
        assert request(service, "/healthz")[0] == 200
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == []
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "NaN"])
def test_interval_that_is_not_a_finite_positive_number_is_one_line_and_exit_2(value, capsys):
    with pytest.raises(SystemExit) as exited:
        exporter_main(["--backend", "replay", f"--interval={value}", "--listen", "127.0.0.1:0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--interval" in err[0] and "finite number > 0" in err[0]
    with pytest.raises(ValueError):
        ExporterService(FakeBackend([]), interval_seconds=math.nan)


def test_sigterm_stops_the_exporter_process(data_dir):
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.exporter", "--backend", "replay", "--listen", "127.0.0.1:0",
         "--kubelet-socket", "none", "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "GPUWARDEN_DATA": str(data_dir), "PYTHONPATH": str(ROOT)})
    try:
        line = process.stdout.readline()
        assert line.startswith("serving "), process.stderr.read()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_client_that_never_reads_its_answer_is_dropped_after_the_write_timeout(started):
    readings = [gpu_reading(i) for i in range(640)]  # ~5 MiB: more than loopback's largest send buffer (4 MiB)
    service = started(FakeBackend(readings), http_limits=Limits(write_timeout=0.3))
    wait_for(lambda: service.snapshot.success, what="first collection")
    assert len(service.render_metrics()) > 4.5 * 2**20
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window: the answer cannot all be sent
    sock.connect(("127.0.0.1", service.port))
    try:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 3)  # pipelined, never read
        wait_for(lambda: service._server.open_connections == 1, what="connection open")
        wait_for(lambda: service._server.open_connections == 0, what="dropped after the write timeout")
    finally:
        sock.close()
    assert request(service, "/healthz")[0] == 200


def test_pipelined_requests_are_answered_in_order(started):
    service = started(FakeBackend([gpu_reading(0)]))
    wait_for(lambda: service.snapshot.success, what="first collection")
    with socket.create_connection(("127.0.0.1", service.port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", received)
    assert statuses == [b"200", b"404", b"200"]


@pytest.mark.parametrize("flag", ["--replay-gpus=100000000", "--replay-gpus=1e8", "--replay-mig=8", "--replay-gpus=-1"])
def test_replay_counts_are_bounded_one_line_exit_2(flag, capsys):
    with pytest.raises(SystemExit) as exited:
        exporter_main(["--backend", "replay", flag, "--listen", "127.0.0.1:0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag.split("=")[0] in err[0] and "expected an integer 0.." in err[0]


def test_an_answer_that_drains_slowly_then_closes_is_closed_once(started, caplog):
    """A large /metrics answer to a slow reader asking ``Connection: close`` (the demo's scraper,
    Prometheus with keep-alive off): asyncio resumes writing from inside its own write-ready
    handler, and closing the transport right there made asyncio run ``connection_lost`` twice (an
    ERROR with two tracebacks per scrape in the demo's log). Closing is deferred to the next loop
    turn."""
    service = started(FakeBackend([gpu_reading(i) for i in range(1024)]))
    wait_for(lambda: service.snapshot.success, what="first collection")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(3):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer cannot be written at once
            sock.settimeout(10)
            sock.connect(("127.0.0.1", service.port))
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            threading.Event().wait(0.2)  # let the server's send buffer fill before reading (about 8 MB to send)
            received = bytearray()
            while chunk := sock.recv(4096):
                received += chunk
            sock.close()
            assert received.startswith(b"HTTP/1.1 200") and b"DCGM_FI_DEV_GPU_UTIL{" in received
        assert request(service, "/healthz")[0] == 200
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
