"""What every dashboard page needs: where the store is, a friendly stop when it is empty or
unreadable, the one window every page shares, and reports computed once per window.

The store is the directory named by ``GPUWARDEN_STORE`` (an embedded
:class:`gpuwarden.store.LocalStore`). Every cached read or report is keyed on the store path, the
window and the store's *version* (the newest modification time of its day folders), so a page
that switches windows or pages does not recompute, and a live demo that appends samples is
picked up at the next refresh. Reports are built by :mod:`gpuwarden.analytics` only; this module
just decides when.

The window is chosen once, in the sidebar of the router (``app.py``), and kept in
``st.session_state`` under :data:`WINDOW_KEY` / :data:`CUSTOM_KEY`; pages read it with
:func:`current_window`. Its end is the newest sample, not the wall clock (the demo's clock is
simulated).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from gpuwarden.dashboards import STORE_ENV
from gpuwarden.store import LocalStore

CACHE_TTL_S = 300  # also bounded by the store version: new samples make a new key at once
REFRESH_EVERY_S = 60

HOW_TO_FILL = (
    "Run `gpuwarden demo` to fill a store with a simulated fleet and open this dashboard on it, "
    f"or set `{STORE_ENV}` to the directory of a store that gpuwarden is writing to."
)

PRESETS: dict[str, pd.Timedelta] = {
    "1h": pd.Timedelta(hours=1),
    "6h": pd.Timedelta(hours=6),
    "24h": pd.Timedelta(hours=24),
    "7d": pd.Timedelta(days=7),
}
PRESET_LABELS: dict[str, str] = {"1h": "Last 1 hour", "6h": "Last 6 hours", "24h": "Last 24 hours",
                                 "7d": "Last 7 days", "custom": "Custom range"}
DEFAULT_PRESET = "24h"
WINDOW_KEY = "window_preset"
CUSTOM_KEY = "window_custom"


class StoreUnreadable(Exception):
    """The store exists but a file in it cannot be read; the message is one line for the page."""


def store_path() -> str | None:
    """The store directory from ``GPUWARDEN_STORE``, or None when unset or blank."""
    value = os.environ.get(STORE_ENV, "").strip()
    return value or None


def store_version(path: str) -> float:
    """Newest modification time of the store's day folders (a new or merged file changes it)."""
    samples = Path(path) / "samples"
    try:
        stamps = [samples.stat().st_mtime, *(p.stat().st_mtime for p in samples.glob("date=*"))]
    except OSError:
        return 0.0
    return max(stamps)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def _time_range(path: str, version: float) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    if not Path(path).is_dir():
        return None
    try:
        return LocalStore(path).time_range()
    except Exception as error:  # noqa: BLE001 - a damaged Parquet file: one line, never a traceback
        raise StoreUnreadable(f"a file in the store cannot be read ({_one_line(error)})") from None


@dataclass(frozen=True)
class StoreInfo:
    path: str
    oldest: pd.Timestamp
    newest: pd.Timestamp
    version: float


def store_info() -> StoreInfo | None:
    """The store and its time range, or None when it is unset, empty or unreadable (no message)."""
    path = store_path()
    if path is None:
        return None
    try:
        span = _time_range(path, store_version(path))
    except StoreUnreadable:
        return None
    return None if span is None else StoreInfo(path, span[0], span[1], store_version(path))


def require_store() -> StoreInfo:
    """The store; otherwise explain (unset, empty or unreadable) and stop the page."""
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


# -- the shared window -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    start: pd.Timestamp  # inclusive
    end: pd.Timestamp  # exclusive (newest sample + 1 s for presets)
    label: str

    @property
    def span(self) -> pd.Timedelta:
        return self.end - self.start


def window_for(preset: str, oldest: pd.Timestamp, newest: pd.Timestamp,
               custom: tuple[dt.date, dt.date] | None = None) -> Window:
    """The window a preset (or a custom day range) means over a store whose newest sample is ``newest``."""
    end = newest + pd.Timedelta(seconds=1)
    if preset == "custom" and custom and len(custom) == 2:
        first = pd.Timestamp(custom[0], tz="UTC")
        last = pd.Timestamp(custom[1], tz="UTC") + pd.Timedelta(days=1)
        start, end = max(first, oldest), min(last, end)
        if start >= end:
            start = end - pd.Timedelta(hours=1)
        return Window(start, end, "custom range")
    span = PRESETS.get(preset, PRESETS[DEFAULT_PRESET])
    start = max(end - span, oldest)
    return Window(start, end, PRESET_LABELS.get(preset, preset).lower())


def current_window(info: StoreInfo) -> Window:
    preset = st.session_state.get(WINDOW_KEY, DEFAULT_PRESET)
    return window_for(preset, info.oldest, info.newest, st.session_state.get(CUSTOM_KEY))


def window_caption(info: StoreInfo, window: Window, extra: str = "") -> None:
    clipped = " (the store holds less than that)" if window.start <= info.oldest else ""
    st.caption(f"{window.label}: {window.start:%Y-%m-%d %H:%M} → {window.end:%Y-%m-%d %H:%M} UTC, sample time{clipped} · "
               f"data as of {info.newest:%Y-%m-%d %H:%M:%S} UTC{extra}")


def bucket_for(span: pd.Timedelta) -> str:
    """Chart bucket for a window (one rule for every page: :func:`fleet_view.bucket_for`)."""
    from gpuwarden.dashboards import fleet_view as fv

    return fv.bucket_for(span)


# -- cached reads and reports ------------------------------------------------------------------------


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=16, show_spinner="Reading fleet samples…")
def read_window(path: str, start: pd.Timestamp, end: pd.Timestamp, columns: tuple[str, ...], version: float,
                nodes: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Samples in ``[start, end)`` with ``columns`` (optionally of some nodes only). Shared, not
    copied on each rerun (a cache_resource): callers filter into new frames, never change it."""
    try:
        return LocalStore(path).read(start=start, end=end, columns=list(columns), nodes=nodes)
    except Exception as error:  # noqa: BLE001 - any reader failure becomes one line
        raise StoreUnreadable(f"a file in the store cannot be read ({_one_line(error)})") from None


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=6, show_spinner="Classifying and pricing GPU time…")
def ledger(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float):
    """The analytics ledger of the window (shared, read-only: never mutate it)."""
    from gpuwarden.analytics import build_ledger

    try:
        return build_ledger(LocalStore(path), start, end)
    except Exception as error:  # noqa: BLE001 - any reader failure becomes one line
        raise StoreUnreadable(f"the samples could not be analysed ({_one_line(error)})") from None


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=6, show_spinner=False)
def idle(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float):
    from gpuwarden.analytics import idle_report

    return idle_report(ledger(path, start, end, version))


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=6, show_spinner=False)
def cost(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float):
    from gpuwarden.analytics import cost_report

    return cost_report(ledger(path, start, end, version))


@st.cache_data(ttl=CACHE_TTL_S, max_entries=8, show_spinner="Scanning for health findings…")
def health_tables(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float, bucket: str):
    """(findings table with GPU indices, XID/ECC/remap event timeline) of the window."""
    from gpuwarden.dashboards import health_view as hv

    frame = read_window(path, start, end, hv.TIMELINE_COLUMNS, version)
    table = hv.findings_table(findings(path, start, end, version), hv.gpu_indices(frame))
    return table, hv.event_timeline(frame, bucket)


@st.cache_data(ttl=CACHE_TTL_S, max_entries=8, show_spinner="Scanning for health findings…")
def findings(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float) -> list:
    from gpuwarden.analytics.health import scan
    from gpuwarden.analytics.health.features import NEEDED_COLUMNS

    return scan(read_window(path, start, end, tuple(NEEDED_COLUMNS), version))


def clear_caches() -> None:
    """Forget every cached read and report (the bench's uncached path)."""
    st.cache_data.clear()
    st.cache_resource.clear()


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=6, show_spinner=False)
def efficiency(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float):
    from gpuwarden.analytics import efficiency_report

    return efficiency_report(ledger(path, start, end, version))


def cluster_version(directory: Path | None) -> tuple[float, ...]:
    """Modification times of the cluster-state files (a new snapshot, request or weight: a new key)."""
    if directory is None:
        return ()
    stamps = []
    for name in ("snapshot.json", "requests.jsonl", "team_weights.json"):
        try:
            stamps.append((directory / name).stat().st_mtime)
        except OSError:
            stamps.append(0.0)
    return tuple(stamps)


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=8, show_spinner="Planning the queue…")
def queue_plan(directory: str, version: tuple[float, ...]):
    """(snapshot with portal requests and admin weights, the planner's plan, pending table,
    unreadable request lines), or None without a snapshot. ValueError for a damaged snapshot."""
    from gpuwarden.dashboards import cluster_state as cs
    from gpuwarden.dashboards import queue_view

    folder = Path(directory)
    snapshot = cs.read_snapshot(folder)
    if snapshot is None:
        return None
    requests, problems = cs.read_requests(folder)
    snapshot = cs.with_weights(cs.with_requests(snapshot, requests), cs.read_weights(folder))
    result = queue_view.plan_with(snapshot)
    return snapshot, result, queue_view.pending_table(snapshot, result), requests, problems


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=6, show_spinner="Summarising the fleet…")
def fleet_summary(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float) -> dict:
    """Everything the Fleet page draws, computed once per window: small frames only (the samples
    themselves are not kept, so a rerun never copies them)."""
    from gpuwarden.dashboards import fleet_view as fv

    frame = read_window(path, start, end, (*fv.FLEET_COLUMNS, "gpu_index"), version)
    snapshot = fv.latest_snapshot(frame)
    xids = fv.xid_events(frame)
    return {
        "headline": fv.headline(frame, snapshot),
        "reporting": fv.reporting(frame, snapshot),
        "grid": fv.activity_grid(frame, snapshot),
        "series": fv.utilisation_over_time(frame, bucket_for(end - start)),
        "teams": fv.allocation_by_team(snapshot),
        "models": fv.allocation_by_model(snapshot),
        "nodes": fv.node_table(frame, snapshot, xids),
        "xids": xids[xids["total"] > 0],
    }


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=4, show_spinner=False)
def _snapshot(directory: str, version: tuple[float, ...]):
    from gpuwarden.dashboards import cluster_state as cs

    return cs.read_snapshot(Path(directory))


def cluster_snapshot(directory: Path | None):
    """The newest cluster snapshot (cached by file time), None without one; ValueError if damaged."""
    if directory is None:
        return None
    return _snapshot(str(directory), cluster_version(directory))


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=6, show_spinner=False)
def gpu_list(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float) -> pd.DataFrame:
    """One row per GPU seen in the window: node, gpu_index, gpu_uuid (sorted by node and index)."""
    index = read_window(path, start, end, ("timestamp", "node", "gpu_uuid", "gpu_index"), version)
    gpus = index.drop_duplicates("gpu_uuid", keep="last")[["node", "gpu_index", "gpu_uuid"]].astype(
        {"node": str, "gpu_uuid": str})
    return gpus.sort_values(["node", "gpu_index"], ignore_index=True)


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=32, show_spinner=False)
def gpu_history(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float, node: str, uuid: str) -> dict:
    """One GPU's chart groups, model and holders over the window (see ``fleet_view.gpu_series``)."""
    from gpuwarden.dashboards import fleet_view as fv

    frame = read_window(path, start, end, fv.GPU_DETAIL_COLUMNS, version, nodes=(node,))
    frame = frame[frame["gpu_uuid"].astype(str) == uuid]
    model = frame["model"].dropna().astype(str).iloc[-1] if frame["model"].notna().any() else "unknown model"
    holders = frame.dropna(subset=["pod"])[["team", "pod"]].astype(str).drop_duplicates()
    return {"groups": fv.gpu_series(frame, bucket_for(end - start)), "model": model, "holders": holders}
