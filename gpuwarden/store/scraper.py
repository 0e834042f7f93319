"""The embedded scraper: exporter ``/metrics`` endpoints into the embedded store, no Prometheus.

Each page is parsed into fleet-samples rows by :mod:`.series` (the metric catalogue inverted, the
same mapping :class:`~gpuwarden.store.prometheus.PrometheusSource` uses), stamped with the time of the
scrape, and appended to a :class:`~gpuwarden.store.local.LocalStore`. Its rounds are a job on the
process's :class:`~gpuwarden.fleet.runner.Runner` (:meth:`Scraper.register`), or on a runner of its
own (:meth:`Scraper.start`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd

from gpuwarden.fleet.catalogue import MetricSpec
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock
from gpuwarden.fleet.runner import Job, Runner
from gpuwarden.fleet.semantics import to_utc
from gpuwarden.fleet.triggers import every

from .http_fetch import fetch
from .local import LocalStore
from .prometheus.series_checks import ReadNotes, series_name, unusable_identity
from .series import Attribution, FrameAssembler, SeriesMapper, namespace_is_team

log = logging.getLogger("gpuwarden.store.scraper")
# The largest exposition read (a node of 8 GPUs with MIG serves well under 1 MiB).
MAX_EXPOSITION_BYTES = 64 << 20

SampleTime = Callable[[], "float | datetime | pd.Timestamp"]  # the time scraped rows carry


# One sample line of the text format: name, {labels}, value, optional timestamp in milliseconds.
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+(-?\d+))?[ \t]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|$)')
_ESCAPES = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def _labels(body: str | None, line: str) -> dict[str, str]:
    if not body:
        return {}
    labels, end = {}, 0
    for match in _LABEL.finditer(body):
        if match.start() != end:
            break
        value = match[2]
        labels[match[1]] = _ESCAPES.sub(lambda e: _UNESCAPED.get(e[1], e[0]), value) if "\\" in value else value
        end = match.end()
    if end != len(body):
        raise ValueError(f"not a label set in the Prometheus text format: {line[:200]!r}")
    return labels


def parse_exposition(text: str, mapper: SeriesMapper, timestamp: pd.Timestamp,
                     notes: ReadNotes | None = None) -> pd.DataFrame:
    """One ``/metrics`` page (Prometheus text format) -> fleet-samples rows at ``timestamp``.

    Lines are parsed with two regular expressions, only those of series the catalogue names, and
    each distinct label set once (a GPU's series share theirs): prometheus_client's parser reads
    labels a character at a time. A malformed line is a ValueError naming it. Series that name no
    GPU (no ``UUID``, no node, a ``gpu`` that is not a number) are skipped and counted in ``notes``."""
    assembler = FrameAssembler(mapper)
    stamp = np.array([pd.Timestamp(timestamp).value], dtype=np.int64)
    label_sets: dict[str | None, dict[str, str]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise ValueError(f"not a sample line in the Prometheus text format: {line[:200]!r}")
        name, body, value, millis = match.groups()
        if mapper.target(name) is None:
            continue
        when = stamp if millis is None else np.array([int(millis) * 1_000_000], dtype=np.int64)
        labels = label_sets.get(body)
        if labels is None:
            labels = label_sets[body] = _labels(body, line)
        if notes is not None and mapper.identity(labels) is None:
            notes.add(f"{series_name('', labels)}: {unusable_identity(labels) or 'no GPU identity'}")
            notes.skip(1)
            continue
        assembler.add(name, labels, when, np.array([float(value)], dtype=np.float64))
    return assembler.frame()


@dataclass(frozen=True)
class ScrapeResult:
    url: str
    ok: bool
    rows: int
    error: str | None = None
    skipped_series: int = 0  # series without a GPU identity (logged when the count changes)


class Scraper:
    """Scrape exporter endpoints into a :class:`LocalStore` every ``interval_seconds``.

    ``scrape_once()`` scrapes every target once (in order) and appends one batch per target; a
    failing target is logged and reported, never fatal. :meth:`register` adds it to a process's
    runner, one round every ``interval_seconds`` on the runner's clock (the first at once);
    :meth:`start` does that on a runner of its own, on ``clock`` (a
    :class:`~gpuwarden.fleet.clock.Clock`; tests hand in a ``FakeClock`` and advance it).
    ``sample_time`` gives the time the rows carry (seconds or a datetime; default ``clock.time``);
    the demo passes the simulated fleet's time so scraped rows carry simulated time.
    """

    def __init__(
        self,
        targets: Sequence[str],
        store: LocalStore,
        interval_seconds: float = 15.0,
        *,
        cluster: str = "default",
        attribution: Attribution | None = namespace_is_team,
        catalogue: Sequence[MetricSpec] | None = None,
        timeout_seconds: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
        sample_time: SampleTime | None = None,
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")
        if not targets:
            raise ValueError("the scraper needs at least one target URL")
        self.targets = [t if "://" in t else f"http://{t}" for t in targets]
        self.store = store
        self.interval_seconds = float(interval_seconds)
        self.timeout_seconds = timeout_seconds
        self.mapper = SeriesMapper(catalogue, cluster=cluster, attribution=attribution)
        self.clock = clock
        self._sample_time: SampleTime = sample_time or clock.time
        self._runner: Runner | None = None  # its own, from start()
        self._lock = threading.Lock()
        self.scrapes = 0
        self.rows_written = 0
        self.last_results: tuple[ScrapeResult, ...] = ()
        self._skipped: dict[str, int] = {}  # per target: series skipped at its last scrape

    def _now(self) -> pd.Timestamp:
        value = self._sample_time()
        return to_utc(pd.Timestamp(value, unit="s") if isinstance(value, (int, float)) else value)

    def fetch(self, url: str) -> str:
        """The target's exposition text, all of it within ``timeout_seconds`` (a target that trickles
        its answer fails the scrape there) and at most ``MAX_EXPOSITION_BYTES``."""
        status, body = fetch(url, timeout_s=self.timeout_seconds, max_bytes=MAX_EXPOSITION_BYTES,
                             headers={"Accept": "text/plain;version=0.0.4"})
        if status != 200:
            raise ConnectionError(f"HTTP {status}")
        return body.decode("utf-8")

    def scrape_once(self) -> tuple[ScrapeResult, ...]:
        """Scrape every target once and append its rows to the store."""
        with self._lock:
            results = []
            for url in self.targets:
                stamp = self._now()
                notes = ReadNotes()
                try:
                    frame = parse_exposition(self.fetch(url), self.mapper, stamp, notes)
                    rows = self.store.append(frame) if len(frame) else 0
                    report = self.store.last_append.report
                    if report is not None and report.rejected:  # never dropped without a word
                        log.warning("scrape of %s: %s", url, report.summary())
                    results.append(ScrapeResult(url, True, rows, skipped_series=notes.skipped_series))
                    if notes.skipped_series != self._skipped.get(url, 0):  # said when it changes, not every scrape
                        log.warning("scrape of %s: %s", url, "; ".join(notes.lines()[:3]))
                    self._skipped[url] = notes.skipped_series
                    log.debug("scrape url=%s rows=%d", url, rows)
                except (OSError, ValueError) as error:  # refused, too slow (deadline), too large, bad text
                    message = f"{type(error).__name__}: {error}"
                    results.append(ScrapeResult(url, False, 0, message))
                    log.warning("scrape of %s failed: %s", url, message)
                else:
                    self.rows_written += rows
            self.scrapes += 1
            self.last_results = tuple(results)
            return self.last_results

    def register(self, runner: Runner) -> Job:
        """Add the scrape rounds to ``runner``: now, then every interval on its clock."""
        return runner.add("scrape", self.scrape_once, every(self.interval_seconds, runner.clock), at_once=True)

    def start(self) -> Scraper:
        """Scrape now, then every interval on ``clock``, on a runner of its own (a failed round is
        logged, never fatal)."""
        if self._runner is not None:
            raise RuntimeError("the scraper is already started")
        self._runner = Runner(self.clock, name="gpuwarden-scraper")
        self.register(self._runner)
        self._runner.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current round; safe to call twice."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop(timeout)

    def __enter__(self) -> Scraper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ScrapeResult", "Scraper", "parse_exposition"]
