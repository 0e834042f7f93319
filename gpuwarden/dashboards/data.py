"""What every dashboard page needs: where the store is, a friendly stop when it is empty or
unreadable, the one window every page shares, and reports computed once per window.

The samples come from the directory named by ``GPUWARDEN_STORE`` (an embedded
:class:`gpuwarden.store.LocalStore`), or, with ``GPUWARDEN_SOURCE=prometheus`` (what the helm
chart sets), from the Prometheus at ``GPUWARDEN_PROMETHEUS_URL`` read at
``GPUWARDEN_PROMETHEUS_STEP`` (opened as ``--source prometheus`` opens it:
:func:`gpuwarden.store.sources.open_prometheus`). Every cached read or report is keyed on the
source's *key* (the store path; for Prometheus a folder under ``GPUWARDEN_CACHE_DIR``, default
``/tmp/gpuwarden-reports``, named for its URL and step, where its bundles are written), the window
and the source's *version*: for a store the newest modification time of its day folders, for
Prometheus (no files to look at) the newest sample's time floored to the step, looked up at most
once per refresh interval. So a page that switches windows or pages does not recompute, and new
samples are picked up at the next refresh. Reports are built by :mod:`gpuwarden.analytics` only;
this module just decides when. Where the samples come from is :mod:`.sources`; the bundles are
kept and refreshed by :class:`.board.Board`.

The window is chosen once, in the sidebar of the router (``app.py``), and kept in
``st.session_state`` under :data:`WINDOW_KEY` / :data:`CUSTOM_KEY`; pages read it with
:func:`current_window`. Its end is the newest sample, not the wall clock (the demo's clock is
simulated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, overload

import pandas as pd
import streamlit as st

from gpuwarden.analytics import report_bundle
from gpuwarden.analytics.report_bundle import Bundle
from gpuwarden.analytics.windows import DEFAULT_PRESET, PRESET_LABELS, PRESETS, Window, bucket_for, window_for
from gpuwarden.dashboards import PROMETHEUS_URL_ENV, STORE_ENV
from gpuwarden.fleet.errors import UserError
from gpuwarden.store import LocalStore

from .board import BUILDERS, SPINNERS, Board, board
from .pricing import bundle_variant, dashboard_pricing
from .sources import (
    PrometheusSettings,
    SourceMisconfigured,
    StoreUnreadable,
    one_line,
    prometheus_settings,
    prometheus_source,
    samples_source,
    store_path,
)

# Re-exported for the pages, which read them as ``data.X``.
__all__ = ["BUILDERS", "DEFAULT_PRESET", "PRESETS", "PRESET_LABELS", "Board", "SourceMisconfigured", "StoreUnreadable",
           "Window", "board", "bucket_for", "samples_source", "store_path", "window_for"]

CACHE_TTL_S = 300  # also bounded by the store version: new samples make a new key at once
REFRESH_EVERY_S = 60

HOW_TO_FILL = (
    "Run `gpuwarden demo` to fill a store with a simulated fleet and open this dashboard on it, "
    f"or set `{STORE_ENV}` to the directory of a store that gpuwarden is writing to."
)

WINDOW_KEY = "window_preset"
CUSTOM_KEY = "window_custom"


def store_version(path: str) -> float:
    """Newest modification time of the store's day folders (a new or merged file changes it)."""
    return report_bundle.store_version(path)


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def _time_range(path: str, version: float) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    if not Path(path).is_dir():
        return None
    try:
        return LocalStore(path).time_range()
    except Exception as error:  # noqa: BLE001 - a damaged Parquet file: one line, never a traceback
        raise StoreUnreadable(f"a file in the store cannot be read ({one_line(error)})") from None


@st.cache_data(ttl=REFRESH_EVERY_S, show_spinner=False)
def _prometheus_time_range(url: str, step: str, refresh: int) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """Prometheus' sample span, asked again each ``refresh`` (wall-clock interval number)."""
    try:
        return prometheus_source(PrometheusSettings(url, step)).time_range()
    except SourceMisconfigured:
        raise
    except Exception as error:  # noqa: BLE001 - unreachable, refused, timed out: one line, never a traceback
        raise StoreUnreadable(one_line(error)) from None


RETRY_FAILED_AFTER_S = 10.0  # a Prometheus that did not answer is asked again after this long, not on every call
_failures: dict[PrometheusSettings, tuple[float, str]] = {}


def _prometheus_info(settings: PrometheusSettings) -> StoreInfo | None:
    """Prometheus' span and version. SourceMisconfigured / StoreUnreadable for the page to explain.
    A failure is remembered for a few seconds: a page asks several times per run (sidebar, page),
    and each ask of a Prometheus that does not answer waits for its retries."""
    import time

    now = time.monotonic()
    failed = _failures.get(settings)
    if failed is not None and now - failed[0] < RETRY_FAILED_AFTER_S:
        raise StoreUnreadable(failed[1])
    try:
        span = _prometheus_time_range(settings.url, settings.step, int(time.time() // REFRESH_EVERY_S))
    except StoreUnreadable as error:
        _failures[settings] = (now, str(error))
        raise
    _failures.pop(settings, None)
    if span is None:
        return None
    step_s = float(getattr(prometheus_source(settings), "step", 60.0)) or 60.0
    version = math.floor(span[1].timestamp() / step_s) * step_s  # the newest sample, floored to the step
    return StoreInfo(settings.cache_root, span[0], span[1], version)


@dataclass(frozen=True)
class StoreInfo:
    path: str  # the store directory, or the folder a Prometheus source's bundles go to: the cache key
    oldest: pd.Timestamp
    newest: pd.Timestamp
    version: float


def store_info() -> StoreInfo | None:
    """The samples source and its time range, or None when it is unset, empty, unreadable or
    misconfigured (no message)."""
    try:
        settings = prometheus_settings()
        if settings is not None:
            return _prometheus_info(settings)
    except (SourceMisconfigured, StoreUnreadable):
        return None
    path = store_path()
    if path is None:
        return None
    version = store_version(path)  # once: a live store may change between two looks
    try:
        span = _time_range(path, version)
    except StoreUnreadable:
        return None
    return None if span is None else StoreInfo(path, span[0], span[1], version)


def current_version() -> float | None:
    """The samples source's version now (a change means new samples; the auto-refresh compares it):
    the store's folder times, or Prometheus' newest sample floored to the step (asked at most once
    per refresh interval). None without a usable source."""
    try:
        settings = prometheus_settings()
    except SourceMisconfigured:
        return None
    if settings is None:
        path = store_path()
        return None if path is None else store_version(path)
    info = store_info()
    return None if info is None else info.version


def require_prometheus(settings: PrometheusSettings) -> StoreInfo:
    """Prometheus' samples; otherwise explain (misconfigured, unreachable or empty) and stop."""
    try:
        info = _prometheus_info(settings)
    except SourceMisconfigured as error:
        misconfigured(str(error))
    except StoreUnreadable as error:
        st.error(f"Prometheus at `{settings.url}` could not be read: {error}. Check `{PROMETHEUS_URL_ENV}` "
                 "(helm value `prometheus.url`) and that Prometheus answers there, then reload.", icon=":material/error:")
        st.stop()
    if info is None:
        st.info(f"Prometheus at `{settings.url}` holds no GPU samples yet. Check that it scrapes the gpuwarden "
                "exporters (helm values `serviceMonitor.enabled` or the exporter pods' `prometheus.io/scrape` "
                "annotations).", icon=":material/info:")
        st.stop()
    return info


def misconfigured(why: str) -> NoReturn:
    st.error(f"The dashboard's data source is misconfigured: {why}.", icon=":material/error:")
    st.stop()


def require_store() -> StoreInfo:
    """The samples source (the store, or Prometheus); otherwise explain (unset, misconfigured,
    empty or unreadable) and stop the page."""
    try:
        settings = prometheus_settings()
    except SourceMisconfigured as error:
        misconfigured(str(error))
    if settings is not None:
        return require_prometheus(settings)
    path = store_path()
    if path is None:
        st.info(f"No store configured: `{STORE_ENV}` is not set.\n\n{HOW_TO_FILL}", icon=":material/info:")
        st.stop()
    version = store_version(path)
    try:
        span = _time_range(path, version)
    except StoreUnreadable as error:
        unreadable(path, str(error))
    warn_quarantined(path)
    if span is None:
        st.info(f"The store at `{path}` holds no samples yet.\n\n{HOW_TO_FILL}", icon=":material/info:")
        st.stop()
    return StoreInfo(path, span[0], span[1], version)


def warn_quarantined(path: str) -> None:
    """The store moves files it cannot read aside and reads on; say so, so no gap goes unexplained."""
    moved = sorted(p.name for p in (Path(path) / "quarantine").rglob("*.parquet"))
    if moved:
        names = ", ".join(moved[:3]) + (f" and {len(moved) - 3} more" if len(moved) > 3 else "")
        st.warning(f"{len(moved)} unreadable store file(s) were moved to `{Path(path) / 'quarantine'}` "
                   f"({names}); their samples are missing from these pages. `gpuwarden store check` "
                   "says more.", icon=":material/warning:")


def unreadable(path: str, why: str) -> None:
    st.error(f"The store at `{path}` could not be read: {why}. Move the damaged file aside "
             "(or run `gpuwarden store` checks) and reload.", icon=":material/error:")
    st.stop()


# -- the shared window (defined in analytics, so the demo precomputes exactly what a page asks for) --


def current_window(info: StoreInfo) -> Window:
    preset = st.session_state.get(WINDOW_KEY, DEFAULT_PRESET)
    return window_for(preset, info.oldest, info.newest, st.session_state.get(CUSTOM_KEY))


def window_caption(info: StoreInfo, window: Window, extra: str = "", bundles: tuple[Bundle, ...] = ()) -> None:
    """The window, "data as of", and, when a page shows figures computed a few samples ago while
    fresh ones are computed, up to when they go."""
    clipped = " (the store holds less than that)" if window.start <= info.oldest else ""
    behind = min((b.end for b in bundles), default=window.end)
    stale = ""
    if behind < window.end - pd.Timedelta(seconds=1):
        stale = (f" · **figures cover samples up to {behind - pd.Timedelta(seconds=1):%Y-%m-%d %H:%M} UTC**; "
                 "newer ones are being added in the background")
    st.caption(f"{window.label}: {window.start:%Y-%m-%d %H:%M} → {window.end:%Y-%m-%d %H:%M} UTC, sample time{clipped} · "
               f"data as of {info.newest:%Y-%m-%d %H:%M:%S} UTC{extra}{stale}")


# -- report bundles: computed once per window, kept beside the store, refreshed in the background ----

@overload
def bundle(kind: str, info: StoreInfo, window: Window) -> Bundle: ...
@overload
def bundle(kind: str, info: StoreInfo, window: Window, wait: bool) -> Bundle | None: ...


def bundle(kind: str, info: StoreInfo, window: Window, wait: bool = True) -> Bundle | None:
    """The ``kind`` bundle (fleet, ledger, health, gpus) of ``window``: see :class:`Board`. With
    ``wait=False``: None while it is first computed in the background."""
    variant = ""
    if kind == "ledger":  # priced: a bundle per price book and inventory
        try:
            variant = bundle_variant(*dashboard_pricing())
        except UserError as error:
            misconfigured(f"the price book or inventory cannot be read: {error}")
    with st.spinner(SPINNERS[kind]):
        return board().get(kind, info.path, window, info.version, BUILDERS[kind], wait=wait, variant=variant)


def price_book_name(ledger: Bundle) -> str:
    """Which price book priced a ledger bundle (one stored before books were named: the bundled one)."""
    return str(ledger.values.get("price_book", "built-in"))


def clear_caches() -> None:
    """Forget every cached read and report held in memory (the bench's uncached path); bundles
    written beside the store stay (``report_bundle.remove_all`` forgets those)."""
    st.cache_data.clear()
    st.cache_resource.clear()


def cluster_version(directory: Path | None) -> float:
    """Modification time of the cluster snapshot (a new snapshot: a new key); 0 without one."""
    try:
        return 0.0 if directory is None else (directory / "snapshot.json").stat().st_mtime
    except OSError:
        return 0.0


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=4, show_spinner=False)
def _snapshot(directory: str, version: float) -> Any:
    from gpuwarden.fleet import cluster_state as cs

    return cs.read_snapshot(Path(directory))


def cluster_snapshot(directory: Path | None) -> Any:
    """The newest cluster snapshot (cached by file time), None without one; ValueError if damaged."""
    if directory is None:
        return None
    return _snapshot(str(directory), cluster_version(directory))


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=32, show_spinner="Reading the GPU's history…")
def gpu_history(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float, node: str, uuid: str) -> dict[str, Any]:
    """One GPU's chart groups, model and holders over the window (``fleet_report.gpu_history``)."""
    from gpuwarden.analytics.fleet_report import gpu_history as history

    try:
        return history(samples_source(path), Window(start, end, ""), node, uuid)
    except Exception as error:  # noqa: BLE001 - any reader failure becomes one line
        raise StoreUnreadable(f"a file in the store cannot be read ({one_line(error)})") from None
