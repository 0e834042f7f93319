"""``PrometheusSource``: the ``SamplesSource`` over Prometheus (raw samples, rollups, time range),
wiring the client, the series mapper and the readers of this package together."""

from __future__ import annotations

from datetime import datetime
from collections.abc import Sequence
from typing import Any

import pandas as pd

from gpuwarden.fleet.catalogue import MetricSpec

from ..schema import PANDAS_DTYPES, empty_samples
from ..series import Attribution, SeriesMapper, namespace_is_team
from . import rollups, samples, scrape_health, timerange
from .node_labels import read_node_labels
from .attribution import PodAttribution
from .series_checks import ReadNotes
from .client import Moment, PrometheusClient, PrometheusError, duration_seconds, epoch_seconds
from .expressions import ROLLUP_LAG_INTERVALS, STATE_ROLLUPS


class PrometheusSource(PrometheusClient):
    """Read fleet samples from Prometheus' HTTP API (connection options: :class:`PrometheusClient`).

    ``step``: the grid of ``read`` (seconds or "1m"; default 60 s, matching the embedded store's
    resolution; use the scrape interval for every raw sample). ``chunk``: the most time one request
    covers (default 1 day). ``rule_interval``: the evaluation interval of the shipped recording
    rules (``rules/``: 1 m); ``rollup_interval``: that of their rollups (5 m). ``rollups``: reports
    read the rollups where they exist. ``history``: how far back ``time_range`` looks.
    ``lookback``: how old a sample a grid point may show (default: one step); raise it when the
    step equals the scrape interval and scrapes jitter. ``pod_attribution``: whether a GPU without a
    pod label is unallocated where the exporter does not say (:mod:`.attribution`: auto | on | off).
    ``notes`` lists what the reads met and how they read it (series skipped or kept, XID events from
    dcgm-exporter's gauge, the attribution rule): every report prints them.
    """

    def __init__(
        self,
        url: str,
        *,
        step: float | str = 60.0,
        chunk: float | str = "1d",
        selector: str = "",
        cluster: str = "default",
        attribution: Attribution | None = namespace_is_team,
        catalogue: Sequence[MetricSpec] | None = None,
        rule_interval: float | str = "1m",
        history: float | str = "400d",
        lookback: float | str | None = None,
        rollups: bool = True,
        rollup_interval: float | str = "5m",
        pod_attribution: str = "auto",
        **connection: Any,
    ) -> None:
        """``connection``: the keyword options of :class:`PrometheusClient` (token, TLS, timeout,
        retries, backoff, concurrency)."""
        super().__init__(url, chunk=chunk, selector=selector, **connection)
        self.step = duration_seconds(step)
        if self.step <= 0:
            raise PrometheusError("step and chunk must be positive durations")
        # Each grid point takes the newest sample of the last step (1 ms short: Prometheus 2
        # range selectors include both ends), not Prometheus' 5-minute lookback: a series that
        # ended (a pod replaced on a GPU) must not linger as a second row where no staleness
        # marker ends it (backfilled blocks, some long-term stores).
        self.lookback = duration_seconds(lookback) if lookback is not None else self.step - 0.001
        if self.lookback <= 0:
            raise PrometheusError("lookback must be a positive duration")
        self.mapper = SeriesMapper(catalogue, cluster=cluster, attribution=attribution)
        self.rule_interval = duration_seconds(rule_interval)
        # Reports read the recording-rule rollups (gpu:gpuwarden_*:5m) where they exist.
        self.rollups = bool(rollups)
        self.rollup_interval = duration_seconds(rollup_interval)
        self.history = duration_seconds(history)
        try:
            self.attribution = PodAttribution(pod_attribution)
        except ValueError as error:
            raise PrometheusError(str(error)) from None
        self.read_notes = ReadNotes()

    @property
    def pod_attribution(self) -> str:
        return self.attribution.rule

    @pod_attribution.setter
    def pod_attribution(self, rule: str) -> None:
        try:
            self.attribution = PodAttribution(rule, self.attribution.lookback_s)
        except ValueError as error:
            raise PrometheusError(str(error)) from None

    @property
    def notes(self) -> list[str]:
        """What the reads so far met, and the attribution rule used."""
        rule = self.attribution.note()
        return [*([rule] if rule else []), *self.read_notes.lines()]

    def query_range(self, promql: str, start: Moment, end: Moment, step: float | str | None = None) -> list[dict[str, Any]]:
        """A range query at ``step`` (default: the source's), split into chunks."""
        return super().query_range(promql, start, end, self.step if step is None else step)

    @property
    def sample_interval(self) -> pd.Timedelta:
        """The grid of :meth:`read`: what one row stands for (analytics uses it as the step)."""
        return pd.Timedelta(seconds=self.step)

    @property
    def rollup_resolution(self) -> pd.Timedelta:
        return pd.Timedelta(seconds=self.rollup_interval)

    # -- SamplesSource -------------------------------------------------------------------------
    def read(self, start: datetime | str | None = None, end: datetime | str | None = None,
             columns: Sequence[str] | None = None) -> pd.DataFrame:
        """Fleet samples with ``start <= timestamp < end`` on the ``step`` grid, sorted by time.

        ``start`` defaults to the oldest sample, ``end`` to just after the newest.
        """
        wanted = list(columns) if columns is not None else list(PANDAS_DTYPES)
        unknown = [c for c in wanted if c not in PANDAS_DTYPES]
        if unknown:
            raise KeyError(f"unknown samples column(s) {', '.join(unknown)}; allowed: {', '.join(PANDAS_DTYPES)}")
        if start is None or end is None:
            span = self.time_range()
            if span is None:
                return empty_samples()[wanted]
            start = start if start is not None else span[0]
            end = end if end is not None else span[1] + pd.Timedelta(seconds=self.step)
        end_s = epoch_seconds(end)
        anchor = self._anchor()
        if "attribution" in wanted and anchor is not None:
            self.attribution.refresh(self, anchor, end_s, self.mapper.state_metrics())
        frame = samples.read_samples(self, self.mapper, epoch_seconds(start), end_s, wanted, self.step, self.lookback,
                                     self.read_notes)
        return self.attribution.apply(frame)

    def read_scrape_health(self, start: datetime | str, end: datetime | str) -> pd.DataFrame:
        """How the scrapes of each GPU exporter target went, per node, on the ``read`` grid
        (:mod:`.scrape_health`): ``up``, scrape duration and samples scraped, for the health scan's
        observability-collapse rule. Empty where no GPU series names its target."""
        anchor = self._anchor()
        if anchor is None:
            return scrape_health.empty_scrape_health()
        return scrape_health.read_scrape_health(self, anchor, epoch_seconds(start), epoch_seconds(end), self.step,
                                                max(self.lookback, self.step))

    def time_range(self) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        """Oldest and newest GPU sample within ``history`` of now, or None when there is none
        (the rollups' when raw samples expired or were never kept)."""
        anchor = self._anchor()
        if anchor is None:
            return None
        span = timerange.sample_span(self, anchor, self.history)
        if span is None and self.rollups:
            span = timerange.sample_span(self, self.selected(STATE_ROLLUPS["seconds"]), self.history)
        return span

    def node_labels(self, start: datetime | str, end: datetime | str) -> dict[str, dict[str, str]]:
        """node -> its labels as kube-state-metrics' ``kube_node_labels`` spells them (the price
        tier labels: :mod:`gpuwarden.fleet.price_tiers`); empty without kube-state-metrics."""
        return read_node_labels(self, epoch_seconds(start), epoch_seconds(end))

    def _anchor(self) -> str | None:
        """A metric every GPU has (FB_USED: memory is measured even where activity is not)."""
        for column in ("mem_used_bytes", "gpu_util_ratio", "power_watts"):
            names = self.mapper.metrics_for([column])
            if names:
                return self.selected(names[0])
        return None

    # -- aggregation pushed into Prometheus ------------------------------------------------------
    def read_state_rollup(self, start: datetime | str, end: datetime | str, bucket: float | str = "1h") -> pd.DataFrame | None:
        """The idle taxonomy per GPU, namespace and state, summed per ``bucket`` from the
        recording rules' 5-minute rollups (:func:`.rollups.read_state_rollup`); None when there
        are none in the window (the rules are not loaded). The pod-attribution rule applies to them
        as to raw samples (:meth:`.attribution.PodAttribution.apply_states`)."""
        frame = rollups.read_state_rollup(self, self.mapper, epoch_seconds(start), epoch_seconds(end),
                                          duration_seconds(bucket), ROLLUP_LAG_INTERVALS * self.rule_interval)
        anchor = self._anchor()
        if frame is None or anchor is None:
            return frame
        self.attribution.refresh(self, anchor, epoch_seconds(end), self.mapper.state_metrics())
        return self.attribution.apply_states(frame)

    def read_rollup(self, start: datetime | str, end: datetime | str, step: float | str = "1h",
                    by: str = "gpu", use_rules: bool = True) -> pd.DataFrame:
        """GPU-seconds per window of ``step`` per GPU or namespace (:func:`.rollups.read_rollup`)."""
        return rollups.read_rollup(self, self.mapper, epoch_seconds(start), epoch_seconds(end), duration_seconds(step),
                                   self.rule_interval, by, use_rules)
