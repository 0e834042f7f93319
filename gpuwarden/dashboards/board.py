"""Report bundles computed once per window, kept beside the store and refreshed in the background
(:class:`Board`), and the builder of each bundle kind. Pages ask through ``data.bundle``."""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import streamlit as st

from gpuwarden.analytics import report_bundle
from gpuwarden.analytics.fleet_report import SamplesReader
from gpuwarden.analytics.report_bundle import Bundle
from gpuwarden.analytics.windows import Window

from .sources import StoreUnreadable, one_line, samples_source

log = logging.getLogger("gpuwarden.dashboards")

BundleBuilder = Callable[[SamplesReader, Window, float], Bundle]


class Board:
    """Report bundles by (kind, store, window key).

    - The bundle of the current store version is returned as it is.
    - A bundle of an older version (new samples arrived since; or the one ``gpuwarden demo`` wrote
      after its backfill) is returned at once while one worker thread computes the fresh one, as
      long as it lags the window's end by at most a quarter of the window; the page says how far
      it goes. Further behind, it is computed now.
    - Nothing at all: computed now, then kept in memory and written beside the store (where the
      dashboard may write) for the next dashboard process.
    """

    def __init__(self, max_entries: int = 32) -> None:
        self._entries: OrderedDict[tuple[str, str, str], Bundle] = OrderedDict()
        self._lock = threading.Lock()
        self._refreshing: dict[tuple[str, str, str], Future[None]] = {}
        self._workers = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuwarden-reports")
        self._max_entries = max_entries
        self.computed: Counter[str] = Counter()  # kind -> bundles computed (tests, bench)

    def get(self, kind: str, path: str, window: Window, version: float, build: BundleBuilder,
            wait: bool = True, variant: str = "") -> Bundle | None:
        """The bundle (see the class doc); with ``wait=False``, None instead of computing now (the
        computation is queued, and a later page run finds it). ``variant`` sets apart bundles of
        one window built with other inputs (another price book)."""
        key = (kind, path, window.key + variant)
        with self._lock:
            bundle = self._entries.get(key)
            if bundle is not None:
                self._entries.move_to_end(key)
        if bundle is None:
            bundle = report_bundle.load(path, kind, window.key + variant)  # as saved: per book too
            if bundle is not None:
                self._keep(key, bundle)
        if bundle is not None and bundle.version == version and bundle.start == window.start and bundle.end == window.end:
            return bundle
        if bundle is not None and window.end - bundle.end <= window.span / 4:
            self._refresh(key, path, window, version, build)
            return bundle
        if not wait:
            self._refresh(key, path, window, version, build)
            return None
        with self._lock:
            running = self._refreshing.get(key)
        if running is not None:  # a page that did not wait already asked for it: wait for that one
            running.result()
            with self._lock:
                done = self._entries.get(key)
            if done is not None and done.version == version:
                return done
        return self._compute(key, path, window, version, build)

    def _keep(self, key: tuple[str, str, str], bundle: Bundle) -> None:
        with self._lock:
            self._entries[key] = bundle
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def _compute(self, key: tuple[str, str, str], path: str, window: Window, version: float,
                 build: BundleBuilder) -> Bundle:
        try:
            bundle = build(samples_source(path), window, version)
        except Exception as error:  # noqa: BLE001 - any reader failure becomes one line on the page
            raise StoreUnreadable(f"the samples could not be analysed ({one_line(error)})") from None
        self.computed[key[0]] += 1
        self._keep(key, bundle)
        try:
            report_bundle.save(path, key[0], key[2], bundle)
        except OSError as error:  # a read-only store or cache folder: keep it in memory only
            log.debug("report bundle not written beside %s: %s", path, error)
        return bundle

    def _refresh(self, key: tuple[str, str, str], path: str, window: Window, version: float,
                 build: BundleBuilder) -> None:
        with self._lock:
            if key in self._refreshing:
                return
            started = threading.Event()  # registered before it can finish, so it is never waited on twice

            def work() -> None:
                started.wait()
                try:
                    self._compute(key, path, window, version, build)
                except Exception:  # the stale bundle stays; the next page run tries again
                    log.warning("refreshing the %s report failed", key[0], exc_info=True)
                finally:
                    with self._lock:
                        self._refreshing.pop(key, None)

            self._refreshing[key] = self._workers.submit(work)
            started.set()

    def wait(self) -> None:
        """Block until the refreshes queued so far are done (tests and the bench)."""
        self._workers.submit(lambda: None).result()


@st.cache_resource(show_spinner=False)
def board() -> Board:
    """The dashboard process's one :class:`Board` (a new one after :func:`clear_caches`)."""
    return Board()


def _fleet_builder(source: SamplesReader, window: Window, version: float) -> Bundle:
    from gpuwarden.analytics.fleet_report import fleet_bundle

    return fleet_bundle(source, window, version)


def _ledger_builder(source: SamplesReader, window: Window, version: float) -> Bundle:
    from gpuwarden.analytics.idle_cost_report import ledger_bundle

    from .pricing import dashboard_pricing

    return ledger_bundle(source, window, version, *dashboard_pricing())


def _health_builder(source: SamplesReader, window: Window, version: float) -> Bundle:
    from gpuwarden.analytics.health_report import health_bundle

    return health_bundle(source, window, version)


def _gpus_builder(source: SamplesReader, window: Window, version: float) -> Bundle:
    from gpuwarden.analytics.fleet_report import gpu_histories_bundle

    return gpu_histories_bundle(source, window, version)


BUILDERS: dict[str, BundleBuilder] = {"fleet": _fleet_builder, "ledger": _ledger_builder, "health": _health_builder,
                                      "gpus": _gpus_builder}
SPINNERS = {"fleet": "Summarising the fleet…", "ledger": "Classifying and pricing GPU time…",
            "health": "Scanning for health findings…", "gpus": "Reading GPU histories…"}
