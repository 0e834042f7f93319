"""The exporter process: a collection thread that swaps snapshots, a watchdog, and an HTTP
server that renders the latest one.

collect (``backend.read()`` once per interval, off the scrape path) -> transform (pod labels from
the kubelet, when an attributor is given) -> snapshot (immutable, swapped in whole) -> render
(``/metrics`` through a per-service ``CollectorRegistry``; the text of one snapshot is rendered
once and reused by every scrape of it). Each step is named in the debug log.

The watchdog never touches the backend: when a collection has run longer than
``watchdog_seconds`` (a hung NVML call), or none has succeeded for ``STALE_AFTER_INTERVALS``
intervals, it swaps in the same readings marked stale (``gpuwarden_exporter_collection_stale``)
and ``/healthz`` (liveness) answers 503; ``/metrics`` keeps answering from memory and ``/readyz``
(readiness) stays 200, so a stale exporter shows up in Prometheus as stale rather than dropping out
of its targets. Every scrape carries ``gpuwarden_exporter_snapshot_age_seconds``.
"""

from __future__ import annotations

import gzip
import itertools
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from prometheus_client import CollectorRegistry

from gpuwarden.fleet import GpuBackend, GpuReading
from gpuwarden.fleet.catalogue import MetricSpec
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock
from gpuwarden.fleet.runner import Every, Runner

from .collector import GpuCollector, escape_label_value, go_float, render_text
from .snapshot import DraStatus, ExporterSnapshot
from .web import ExporterHttpServer, Limits, make_server

log = logging.getLogger("gpuwarden.exporter")

STALE_AFTER_INTERVALS = 3
QUICK_RENDER_READINGS = 4  # up to this many GPUs/MIG instances a render stays in the HTTP loop (< ~1 ms)
DEFAULT_WATCHDOG_SECONDS = 10.0
_MAX_REMEMBERED_ERRORS = 256


class Attributor(Protocol):
    """The transform step (``podresources.PodAttributor``): labels readings with pods."""

    last_ok: bool | None

    @property
    def dra_status(self) -> DraStatus | None:
        """DRA devices mapped and unresolved (``gpuwarden_exporter_dra_*``); None: not read."""

    def attribute(self, readings: Sequence[GpuReading]) -> Sequence[GpuReading]: ...


class ExporterService:
    """Serve Prometheus metrics for the GPUs a :class:`~gpuwarden.fleet.GpuBackend` reads.

    ``clock`` (a :class:`~gpuwarden.fleet.clock.Clock`) gives the wall-clock time written into the
    timestamp metrics, the monotonic time staleness for ``/healthz`` is measured on, and the waits
    of the collection and watchdog threads: tests hand in a ``FakeClock`` and advance it. ``node_name`` labels the
    exporter's own series; ``attributor`` adds pod labels; ``watchdog_seconds`` (default
    ``min(10 s, 3 intervals)``) is how long a collection may run before it counts as hung.
    """

    def __init__(
        self,
        backend: GpuBackend,
        interval_seconds: float = 15.0,
        host: str = "127.0.0.1",
        port: int = 9400,
        *,
        catalogue: Sequence[MetricSpec] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        node_name: str = "",
        attributor: Attributor | None = None,
        watchdog_seconds: float | None = None,
        http_limits: Limits | None = None,
    ):
        if not (math.isfinite(interval_seconds) and interval_seconds > 0):
            raise ValueError("interval_seconds must be a finite number > 0")
        if watchdog_seconds is not None and not (math.isfinite(watchdog_seconds) and watchdog_seconds > 0):
            raise ValueError("watchdog_seconds must be a finite number > 0")
        self.backend = backend
        self.interval_seconds = float(interval_seconds)
        self.host = host
        self.port = port
        self._clock = clock
        self.node_name = node_name
        self.attributor = attributor
        self.watchdog_seconds = float(watchdog_seconds or min(DEFAULT_WATCHDOG_SECONDS, STALE_AFTER_INTERVALS * self.interval_seconds))
        self.collector = GpuCollector(ExporterSnapshot(node=node_name), catalogue=catalogue)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self._lock = threading.Lock()
        self._attempts = itertools.count(1)
        self._applied_attempt = 0
        self._last_success_monotonic: float | None = None
        self._logged_errors: set[str] = set()
        self._stop = threading.Event()
        self._watchdog_wake = threading.Event()
        self._server: ExporterHttpServer | None = None
        self._collections: Runner | None = None  # the process's runner: one job, the collections
        self._watchdog_thread: threading.Thread | None = None
        self._in_flight_since: float | None = None  # monotonic start of the running collection
        self._hang_logged = False
        self._rendered: tuple[ExporterSnapshot | None, bytes] = (None, b"")
        self._gzipped: tuple[ExporterSnapshot | None, bytes] = (None, b"")
        self.http_limits = http_limits or Limits()

    # -- collection ------------------------------------------------------------------------
    @property
    def snapshot(self) -> ExporterSnapshot:
        return self.collector.snapshot

    def _attribution_state(self, pods_ok: bool | None) -> str:
        """``gpuwarden_pod_attribution_state``: "known" when the kubelet answered (or the backend
        labels pods itself, as the simulated fleet does), "failed" when it did not, "off" when no
        kubelet socket is configured: then an empty pod label means "nobody looked", not "free"."""
        if self.attributor is not None:
            return "known" if pods_ok else "failed"
        labels_pods = getattr(self.backend, "labels_pods", getattr(self.backend, "name", "") == "sim")
        return "known" if labels_pods else "off"

    def collect_now(self) -> ExporterSnapshot:
        """Read the backend once and swap in the result; returns the snapshot now served.

        A backend error keeps the previous readings and marks the collection failed. When
        collections overlap, a result never replaces one from a later-started attempt.
        """
        attempt = next(self._attempts)
        started = time.perf_counter()
        self._in_flight_since = self._clock.monotonic()
        self._watchdog_wake.set()  # the watchdog sleeps until this collection could count as hung
        pods_ok: bool | None = None
        try:
            try:
                readings = tuple(self.backend.read())
                driver = self.backend.driver_version()
                error = None
            except Exception as exc:  # noqa: BLE001 (any backend failure must keep the exporter up)
                readings, driver, error = (), "", f"{type(exc).__name__}: {exc}"
                self._log_error_once(error)
            log.debug("collect attempt=%d backend=%s readings=%d ok=%s", attempt, getattr(self.backend, "name", "?"),
                      len(readings), error is None)
            if error is None and self.attributor is not None:
                try:
                    readings = tuple(self.attributor.attribute(readings))
                except Exception as exc:  # noqa: BLE001 (pod labels are optional; GPU series are not)
                    self._log_error_once(f"pod attribution failed: {type(exc).__name__}: {exc}")
                pods_ok = bool(self.attributor.last_ok)
                log.debug("transform attempt=%d pod_labels=%s readings=%d", attempt, pods_ok, len(readings))
        finally:
            self._in_flight_since = None
        duration = time.perf_counter() - started
        now = self._clock.time()
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
                    node=self.node_name,
                    pod_attribution=pods_ok,
                    attribution=self._attribution_state(pods_ok),
                    dra=self.attributor.dra_status if self.attributor is not None else None,
                )
                self._last_success_monotonic = self._clock.monotonic()
                if self._hang_logged:
                    log.warning("collection succeeded again after the snapshot went stale (took %.2fs)", duration)
                self._hang_logged = False
            else:
                new = replace(old, success=False, timestamp_seconds=now, duration_seconds=duration, error=error,
                              stale=self._too_old())
            self.collector.update(new)
        log.debug("snapshot attempt=%d ok=%s gpus=%d duration=%.4fs", attempt, error is None, len(new.readings), duration)
        return new

    def _too_old(self) -> bool:
        last = self._last_success_monotonic
        return last is None or self._clock.monotonic() - last > STALE_AFTER_INTERVALS * self.interval_seconds

    def hung_for(self) -> float | None:
        """Seconds the running collection has exceeded the watchdog by; None when not hung."""
        since = self._in_flight_since
        if since is None:
            return None
        age = self._clock.monotonic() - since
        return age if age > self.watchdog_seconds else None

    def check_watchdog(self) -> bool:
        """Mark the served snapshot stale when a collection hangs or none succeeded lately."""
        hung = self.hung_for()
        stale = hung is not None or (self._last_success_monotonic is not None and self._too_old())
        with self._lock:
            snapshot = self.collector.snapshot
            if stale and not snapshot.stale:
                reason = (f"collection hung for {hung:.1f}s (watchdog {self.watchdog_seconds:g}s)" if hung is not None
                          else "no successful collection lately")
                self.collector.update(replace(snapshot, stale=True, error=snapshot.error or reason))
                if not self._hang_logged:
                    self._hang_logged = True
                    log.warning("watchdog: %s; serving the last snapshot marked stale", reason)
        return stale

    def _watchdog_delay(self) -> float | None:
        """Seconds until the watchdog's answer could change; None: not before a collection starts.

        The watchdog sleeps until then instead of polling: an idle exporter wakes only around its
        collections (a periodic poll was one of the wake-ups behind issue 15's CPU figure)."""
        now = self._clock.monotonic()
        since, last = self._in_flight_since, self._last_success_monotonic
        deadlines = []
        if since is not None:
            deadlines.append(since + self.watchdog_seconds)
        if last is not None:
            deadlines.append(last + STALE_AFTER_INTERVALS * self.interval_seconds)
        future = [d for d in deadlines if d > now]
        return max(0.005, min(future) - now + 0.005) if future else None

    def _watchdog_loop(self) -> None:
        while not self._stop.is_set():
            self._clock.wait(self._watchdog_wake, self._watchdog_delay())
            self._watchdog_wake.clear()
            if self._stop.is_set():
                break
            self.check_watchdog()

    def _log_error_once(self, message: str) -> None:
        if message in self._logged_errors:
            log.debug("collect failed again: %s", message)
            return
        if len(self._logged_errors) < _MAX_REMEMBERED_ERRORS:
            self._logged_errors.add(message)
        log.warning("collect failed (serving the previous snapshot): %s", message, exc_info=True)

    # -- serving ---------------------------------------------------------------------------
    def _snapshot_text(self, snapshot: ExporterSnapshot) -> bytes:
        """The text of one snapshot, rendered once and reused by every scrape of it."""
        cached, body = self._rendered
        if cached is snapshot:
            return body
        body = render_text(snapshot, self.collector.catalogue)  # this snapshot, even if a newer one was swapped in
        self._rendered = (snapshot, body)
        return body

    def _age_text(self, snapshot: ExporterSnapshot) -> bytes:
        """The one series computed per scrape: how old the served GPU readings are."""
        last = snapshot.last_success_timestamp_seconds
        if last is None:
            return b""
        node = escape_label_value(snapshot.node or "")
        age = max(0.0, self._clock.time() - last)
        return (f"# HELP gpuwarden_exporter_snapshot_age_seconds Seconds since the served GPU readings were collected "
                f"(grows while the exporter is stale).\n# TYPE gpuwarden_exporter_snapshot_age_seconds gauge\n"
                f'gpuwarden_exporter_snapshot_age_seconds{{node="{node}"}} {go_float(age)}\n').encode()

    def render_metrics(self) -> bytes:
        """The text exposition of the current snapshot plus its age (what ``/metrics`` returns)."""
        snapshot = self.collector.snapshot
        return self._snapshot_text(snapshot) + self._age_text(snapshot)

    def metrics_response(self, accepts_gzip: bool) -> tuple[bytes, bool]:
        """``/metrics``: (body, whether it is gzip). The compressed snapshot text is cached like
        the text; the age series is a second gzip member (RFC 1952 allows several; Go's reader,
        which Prometheus uses, reads them all)."""
        snapshot = self.collector.snapshot
        if not accepts_gzip:
            return self._snapshot_text(snapshot) + self._age_text(snapshot), False
        cached, body = self._gzipped
        if cached is not snapshot:
            body = gzip.compress(self._snapshot_text(snapshot), compresslevel=6, mtime=0)
            self._gzipped = (snapshot, body)
        tail = self._age_text(snapshot)
        return body + (gzip.compress(tail, compresslevel=1, mtime=0) if tail else b""), True

    def quick_metrics_response(self, accepts_gzip: bool) -> tuple[bytes, bool] | None:
        """:meth:`metrics_response` when it is quick (the snapshot's bytes are ready, or the
        snapshot is small enough to render in about a millisecond); None when a render would hold
        the HTTP loop longer (the server then renders in a worker thread)."""
        snapshot = self.collector.snapshot
        cached = (self._gzipped if accepts_gzip else self._rendered)[0]
        if cached is snapshot or len(snapshot.readings) <= QUICK_RENDER_READINGS:
            return self.metrics_response(accepts_gzip)
        return None

    def ready(self) -> tuple[bool, str]:
        """Readiness: ready once the first collection attempt has landed, and ready from then on,
        stale or not (staleness is in ``/metrics``; liveness is ``/healthz``)."""
        if self._applied_attempt == 0:
            return False, "no collection yet"
        live, _ = self.health()
        return True, "ready" if live else "ready (stale)"

    def health(self) -> tuple[bool, str]:
        """``(True, "ok")`` while the last successful collection is younger than 3 intervals and
        no collection has hung past the watchdog."""
        last = self._last_success_monotonic
        limit = STALE_AFTER_INTERVALS * self.interval_seconds
        hung = self.hung_for()
        if hung is not None:
            return False, f"stale: collection hung for {hung:.2f}s (watchdog {self.watchdog_seconds:g}s)"
        if last is None:
            return False, "no successful collection yet"
        age = self._clock.monotonic() - last
        if age > limit:
            reason = f"stale: last successful collection {age:.2f}s ago (limit {limit:.2f}s)"
            error = self.collector.snapshot.error
            return False, f"{reason}; last error: {error}" if error else reason
        return True, "ok"

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics``; the bound port once started (port 0 picks one)."""
        return f"http://{self.host}:{self.port}/metrics"

    def start(self) -> ExporterService:
        """Bind the HTTP server and start the collection thread; returns self."""
        if self._server is not None:
            raise RuntimeError("ExporterService already started")
        self._stop.clear()
        self._server = make_server(self.host, self.port, self.metrics_response, self.health, self.ready, self.http_limits,
                                   quick_metrics=self.quick_metrics_response)
        self.port = self._server.server_address[1]
        self._watchdog_thread = threading.Thread(target=self._watchdog_loop, name="gpuwarden-exporter-watchdog", daemon=True)
        self._server.start()
        self._collections = Runner(self._clock, name="gpuwarden-exporter-collect")
        # A collection now, then one every interval on the clock (APScheduler is not in the exporter image).
        self._collections.add("collect", self.collect_now, Every(self.interval_seconds, self._clock.now()), at_once=True)
        self._collections.start()
        self._watchdog_thread.start()
        log.info("exporter serving %s (backend=%s, interval=%.3gs)", self.url, getattr(self.backend, "name", "?"), self.interval_seconds)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop collecting and serving, close the socket; safe to call twice."""
        self._stop.set()
        self._watchdog_wake.set()
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout)
        watchdog, self._watchdog_thread = self._watchdog_thread, None
        if watchdog is not None:
            watchdog.join(timeout)
        collections, self._collections = self._collections, None
        if collections is not None:
            collections.stop(min(timeout, 1.0))  # a backend read that never returns is left behind, logged
        log.info("exporter stopped")

    def __enter__(self) -> ExporterService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
