"""The exporter process: a collection thread that swaps snapshots, and an HTTP server that
renders the latest one.

collect (``backend.read()`` once per interval, off the scrape path) -> snapshot (immutable,
swapped in whole) -> render (``/metrics`` through a per-service ``CollectorRegistry``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import replace
from typing import Callable, Sequence

from prometheus_client import CollectorRegistry, generate_latest

from gpuwarden.fleet import GpuBackend

from gpuwarden.fleet.catalogue import MetricSpec
from .collector import GpuCollector
from .snapshot import ExporterSnapshot
from .web import make_server

log = logging.getLogger("gpuwarden.exporter")

STALE_AFTER_INTERVALS = 3
_MAX_REMEMBERED_ERRORS = 256


class ExporterService:
    """Serve Prometheus metrics for the GPUs a :class:`~gpuwarden.fleet.GpuBackend` reads.

    ``clock`` gives the wall-clock time written into the timestamp metrics (injectable for
    tests); staleness for ``/healthz`` is measured on ``time.monotonic``.
    """

    def __init__(
        self,
        backend: GpuBackend,
        interval_seconds: float = 15.0,
        host: str = "127.0.0.1",
        port: int = 9400,
        *,
        catalogue: Sequence[MetricSpec] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")
        self.backend = backend
        self.interval_seconds = float(interval_seconds)
        self.host = host
        self.port = port
        self._clock = clock
        self.collector = GpuCollector(catalogue=catalogue)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self._lock = threading.Lock()
        self._attempts = itertools.count(1)
        self._applied_attempt = 0
        self._last_success_monotonic: float | None = None
        self._logged_errors: set[str] = set()
        self._stop = threading.Event()
        self._server = None
        self._server_thread: threading.Thread | None = None
        self._collect_thread: threading.Thread | None = None

    # -- collection ------------------------------------------------------------------------
    @property
    def snapshot(self) -> ExporterSnapshot:
        return self.collector.snapshot

    def collect_now(self) -> ExporterSnapshot:
        """Read the backend once and swap in the result; returns the snapshot now served.

        A backend error keeps the previous readings and marks the collection failed. When
        collections overlap, a result never replaces one from a later-started attempt.
        """
        attempt = next(self._attempts)
        started = time.perf_counter()
        try:
            readings = tuple(self.backend.read())
            driver = self.backend.driver_version()
            error = None
        except Exception as exc:  # noqa: BLE001 (any backend failure must keep the exporter up)
            readings, driver, error = (), "", f"{type(exc).__name__}: {exc}"
            self._log_error_once(error)
        duration = time.perf_counter() - started
        now = self._clock()
        with self._lock:
            if attempt < self._applied_attempt:
                log.debug("collect attempt=%d discarded: a later attempt already landed", attempt)
                return self.collector.snapshot
            self._applied_attempt = attempt
            old = self.collector.snapshot
            if error is None:
                new = ExporterSnapshot(
                    readings=readings,
                    driver_version=driver,
                    success=True,
                    timestamp_seconds=now,
                    duration_seconds=duration,
                    last_success_timestamp_seconds=now,
                )
                self._last_success_monotonic = time.monotonic()
            else:
                new = replace(old, success=False, timestamp_seconds=now, duration_seconds=duration, error=error)
            self.collector.update(new)
        log.debug("collect attempt=%d ok=%s gpus=%d duration=%.4fs", attempt, error is None, len(new.readings), duration)
        return new

    def _log_error_once(self, message: str) -> None:
        if message in self._logged_errors:
            log.debug("collect failed again: %s", message)
            return
        if len(self._logged_errors) < _MAX_REMEMBERED_ERRORS:
            self._logged_errors.add(message)
        log.warning("collect failed (serving the previous snapshot): %s", message, exc_info=True)

    def _collect_loop(self) -> None:
        while not self._stop.is_set():
            self.collect_now()
            self._stop.wait(self.interval_seconds)

    # -- serving ---------------------------------------------------------------------------
    def render_metrics(self) -> bytes:
        """The text exposition of the current snapshot (what ``/metrics`` returns)."""
        return generate_latest(self.registry)

    def health(self) -> tuple[bool, str]:
        """``(True, "ok")`` while the last successful collection is younger than 3 intervals."""
        last = self._last_success_monotonic
        limit = STALE_AFTER_INTERVALS * self.interval_seconds
        if last is None:
            return False, "no successful collection yet"
        age = time.monotonic() - last
        if age > limit:
            reason = f"stale: last successful collection {age:.2f}s ago (limit {limit:.2f}s)"
            error = self.collector.snapshot.error
            return False, f"{reason}; last error: {error}" if error else reason
        return True, "ok"

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics``; the bound port once started (port 0 picks one)."""
        return f"http://{self.host}:{self.port}/metrics"

    def start(self) -> "ExporterService":
        """Bind the HTTP server and start the collection thread; returns self."""
        if self._server is not None:
            raise RuntimeError("ExporterService already started")
        self._stop.clear()
        self._server = make_server(self.host, self.port, self.render_metrics, self.health)
        self.port = self._server.server_address[1]
        self._server_thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="gpuwarden-exporter-http", daemon=True
        )
        self._collect_thread = threading.Thread(target=self._collect_loop, name="gpuwarden-exporter-collect", daemon=True)
        self._server_thread.start()
        self._collect_thread.start()
        log.info("exporter serving %s (backend=%s, interval=%.3gs)", self.url, getattr(self.backend, "name", "?"), self.interval_seconds)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop collecting and serving, close the socket; safe to call twice."""
        self._stop.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        for thread in (self._server_thread, self._collect_thread):
            if thread is not None:
                thread.join(timeout)
                if thread.is_alive():
                    log.warning("%s still running after stop (a backend read that never returned?)", thread.name)
        self._server_thread = self._collect_thread = None
        log.info("exporter stopped")

    def __enter__(self) -> "ExporterService":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
