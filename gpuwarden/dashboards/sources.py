"""Where the dashboard's samples come from: the embedded store named by ``GPUWARDEN_STORE``
(default), or the Prometheus at ``GPUWARDEN_PROMETHEUS_URL`` read at ``GPUWARDEN_PROMETHEUS_STEP``
with ``GPUWARDEN_SOURCE=prometheus``; and the two errors a page explains instead of failing."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from gpuwarden.analytics.fleet_report import SamplesReader
from gpuwarden.dashboards import (
    CACHE_DIR_ENV,
    DEFAULT_CACHE_DIR,
    PROMETHEUS_STEP_ENV,
    PROMETHEUS_URL_ENV,
    SOURCE_ENV,
    SOURCES,
    STORE_ENV,
)
from gpuwarden.fleet.errors import UserError
from gpuwarden.store import LocalStore
from gpuwarden.store.sources import SamplesSource, open_prometheus


class StoreUnreadable(UserError):
    """The store exists but a file in it cannot be read (or Prometheus cannot be read); the message
    is one line for the page."""


class SourceMisconfigured(UserError):
    """``GPUWARDEN_SOURCE`` or a Prometheus setting is unusable; the message names the variable."""


def store_path() -> str | None:
    """The store directory from ``GPUWARDEN_STORE``, or None when unset or blank. Pages that only a
    local store feeds (cluster snapshot, audit log beside it) read this, also with Prometheus."""
    value = os.environ.get(STORE_ENV, "").strip()
    return value or None


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


# -- where samples come from: the embedded store (default) or Prometheus -----------------------------

DEFAULT_PROMETHEUS_STEP = "60s"


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    step: str  # as given ("30s"); PrometheusSource parses it

    @property
    def cache_root(self) -> str:
        """The folder this source's report bundles go to (its key in every cache)."""
        digest = hashlib.sha256(f"{self.url}\n{self.step}".encode()).hexdigest()[:12]
        base = os.environ.get(CACHE_DIR_ENV, "").strip() or DEFAULT_CACHE_DIR
        return str(Path(base) / f"prometheus-{digest}")


def prometheus_settings() -> PrometheusSettings | None:
    """The Prometheus to read (``GPUWARDEN_SOURCE=prometheus``), or None for the store (unset,
    blank or ``store``). SourceMisconfigured for another source or a missing URL."""
    source = os.environ.get(SOURCE_ENV, "").strip().lower() or "store"
    if source not in SOURCES:
        raise SourceMisconfigured(f"{SOURCE_ENV}={source!r} is not a source; allowed: {', '.join(SOURCES)}")
    if source == "store":
        return None
    url = os.environ.get(PROMETHEUS_URL_ENV, "").strip()
    if not url:
        raise SourceMisconfigured(f"{SOURCE_ENV}=prometheus needs {PROMETHEUS_URL_ENV} (e.g. http://prometheus:9090)")
    return PrometheusSettings(url, os.environ.get(PROMETHEUS_STEP_ENV, "").strip() or DEFAULT_PROMETHEUS_STEP)


_prometheus_sources: dict[PrometheusSettings, SamplesSource] = {}
_prometheus_lock = threading.Lock()


def prometheus_source(settings: PrometheusSettings) -> SamplesSource:
    """The one source per URL and step (kept: it holds connection settings, not data).
    SourceMisconfigured, naming the variable, for a URL or step it rejects."""
    with _prometheus_lock:
        source = _prometheus_sources.get(settings)
        if source is None:
            try:
                source = open_prometheus(settings.url, step=settings.step)
            except Exception as error:  # noqa: BLE001 - PrometheusError: one line naming the variables
                raise SourceMisconfigured(f"{PROMETHEUS_URL_ENV}={settings.url!r} / {PROMETHEUS_STEP_ENV}="
                                          f"{settings.step!r}: {one_line(error)}") from None
            _prometheus_sources[settings] = source
    return source


class NodeFilteredReads:
    """A source whose ``read`` has no ``nodes=`` (Prometheus) as one that has (a store): the rows
    of other nodes are dropped after the read. Everything else (time range, rollups, step) is the
    wrapped source's, so analytics finds the same methods on it."""

    def __init__(self, source: SamplesSource) -> None:
        self.source = source

    def read(self, start: Any = None, end: Any = None, columns: Sequence[str] | None = None,
             nodes: Iterable[str] | None = None) -> pd.DataFrame:
        if nodes is None:
            return self.source.read(start, end, columns)
        wanted = None if columns is None else list(dict.fromkeys([*columns, "node"]))
        frame = self.source.read(start, end, wanted)
        frame = frame[frame["node"].astype(object).isin(set(nodes))].reset_index(drop=True)
        return frame if columns is None else frame[list(columns)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def samples_source(key: str) -> SamplesReader:
    """The source behind a cache key (``StoreInfo.path``): Prometheus for its cache folder, else
    the store at that path."""
    try:
        settings = prometheus_settings()
    except SourceMisconfigured:
        settings = None
    if settings is not None and key == settings.cache_root:
        return NodeFilteredReads(prometheus_source(settings))
    return LocalStore(key)


def source_label() -> str:
    """What the pages read, for messages: the store path or the Prometheus URL."""
    try:
        settings = prometheus_settings()
    except SourceMisconfigured:
        settings = None
    if settings is not None:
        return f"Prometheus at {settings.url}"
    path = store_path()
    return f"the store at {path}" if path else "no store"
