"""Fleet samples from a Prometheus server (or anything with its HTTP API: Thanos, Mimir, VictoriaMetrics).

``PrometheusSource`` implements the ``SamplesSource`` protocol. ``read(start, end, columns)``
issues one ``query_range`` per exported metric family per chunk of the window, at ``step``
(aligned to multiples of the step, so repeated reads see the same grid), and turns the series back
into fleet-samples rows through the metric catalogue (the same inversion the embedded scraper
uses, :class:`~gpuwarden.store.scraper.SeriesMapper`). Rows are stamped with the grid time; a row
holds the newest sample of the step before it (``last_over_time(metric[step])``).

A 1,000-GPU, 30-day report must not pull raw samples: :meth:`PrometheusSource.read_rollup` asks
Prometheus for GPU-seconds per GPU or per namespace per window (an hour, a day), computed from the
recording rules shipped in ``rules/`` (``gpu:gpuwarden_idle:bool`` and friends, one point a
minute), or, with ``use_rules=False``, from the same expressions as PromQL subqueries over the raw
series. 1,000 GPUs x 30 days x 1 h is 720,000 numbers per figure instead of 173 million raw rows.

Errors: Prometheus unreachable, timing out or answering 5xx / 429 is retried ``retries`` times
with exponential backoff, then raises :class:`PrometheusUnavailable`; a query Prometheus rejects
(bad PromQL, too many samples) raises :class:`PrometheusQueryError` with Prometheus' own message.
Both are :class:`~gpuwarden.store.schema.SamplesError`, which the CLI prints as one line.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from gpuwarden.fleet import IDENTITY_COLUMN_NAMES
from gpuwarden.fleet.catalogue import MetricSpec

from .local import _utc
from .schema import PANDAS_DTYPES, SamplesError, empty_samples
from .scraper import Attribution, FrameAssembler, SeriesMapper, namespace_is_team

log = logging.getLogger("gpuwarden.store.prometheus")

# Prometheus refuses query_range results of more than 11,000 points per series.
MAX_POINTS_PER_SERIES = 11_000

# Idle: no kernels running (activity, i.e. SM activity where GPM measures it else NVML
# utilisation, below 2%), fake-busy excluded; fake-busy: NVML utilisation >= 10% while SM activity
# < 2%. These are gpuwarden.analytics.promrules.raw_expressions() for the default IdleParams, the
# thresholds the recording rules and the analytics share (tests/test_rules.py keeps them equal;
# the store may not import analytics).
IDLE_EXPR = ("((DCGM_FI_PROF_SM_ACTIVE or DCGM_FI_DEV_GPU_UTIL / 100) < bool 0.02) * (1 - (((DCGM_FI_PROF_SM_ACTIVE < bool 0.02)"
             " * (DCGM_FI_DEV_GPU_UTIL >= bool 10)) or (DCGM_FI_PROF_SM_ACTIVE or DCGM_FI_DEV_GPU_UTIL / 100) * 0))")
FAKE_BUSY_EXPR = "(DCGM_FI_PROF_SM_ACTIVE < bool 0.02) * (DCGM_FI_DEV_GPU_UTIL >= bool 10)"
# Hoarded memory: framebuffer bytes held by an allocated GPU while it is idle (FB_USED is MiB).
HOARDED_EXPR = 'DCGM_FI_DEV_FB_USED{pod!=""} * 1048576 * gpu:gpuwarden_allocated_idle:bool'


def _with_matchers(expr: str, matchers: str) -> str:
    """``expr`` with ``matchers`` (e.g. ``pod!=""``) added to each DCGM selector in it."""
    if not matchers:
        return expr
    out = []
    for token in expr.split(" "):
        head = token.lstrip("(")
        if head.startswith("DCGM_FI_"):
            prefix = token[: len(token) - len(head)]
            tail = head[len(head.rstrip(")")):]
            name = head.rstrip(")")
            name = name[:-1] + f", {matchers}}}" if name.endswith("}") else f"{name}{{{matchers}}}"
            token = prefix + name + tail
        out.append(token)
    return " ".join(out)


# The 5-minute rollups of the generated recording rules (gpuwarden.analytics.promrules.ROLLUP_METRICS;
# tests/test_rules.py keeps the two equal): one series per GPU, holder pod and state.
STATE_ROLLUPS = {
    "seconds": "gpu:gpuwarden_state_seconds:5m",
    "used_seconds": "gpu:gpuwarden_used_seconds:5m",
    "energy_joules": "gpu:gpuwarden_energy_joules:5m",
    "memory_byte_seconds": "gpu:gpuwarden_memory_byte_seconds:5m",
}
_STATE_ROLLUP_LABELS = ("cluster", "node", "Hostname", "UUID", "gpu", "modelName", "GPU_I_ID", "GPU_I_PROFILE",
                        "namespace", "pod", "team", "project", "state")

_ROLLUP_GPU_LABELS = ("cluster", "node", "Hostname", "UUID", "gpu", "modelName", "GPU_I_ID", "GPU_I_PROFILE", "namespace", "pod")


class PrometheusError(SamplesError):
    """Anything that stops a Prometheus read; the message is one line for the user."""


class PrometheusUnavailable(PrometheusError):
    """Prometheus did not answer usefully (down, timing out, 5xx) after every retry."""


class PrometheusQueryError(PrometheusError):
    """Prometheus answered and rejected the query; ``prometheus_message`` is its own words."""

    def __init__(self, message: str, prometheus_message: str = "", error_type: str = "") -> None:
        super().__init__(message)
        self.prometheus_message = prometheus_message
        self.error_type = error_type


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def _seconds(value: float | str | pd.Timedelta) -> float:
    """Seconds from a number, a Timedelta, or a Prometheus duration ("15s", "1h30m", "7d")."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, pd.Timedelta):
        return value.total_seconds()
    text = str(value).strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise PrometheusError(f"{value!r} is not a duration; expected e.g. 15s, 1m, 1h30m, 7d")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def _promql_duration(seconds: float) -> str:
    whole = int(round(seconds))
    if abs(seconds - whole) > 1e-9 or whole <= 0:
        return f"{int(round(seconds * 1000))}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


class PrometheusSource:
    """Read fleet samples from Prometheus' HTTP API.

    ``url``: the base URL (``http://prometheus:9090``, or a path prefix such as
    ``https://host/prometheus``). ``step``: the grid of ``read`` (seconds or "1m"; default 60 s,
    matching the embedded store's resolution; use the scrape interval for every raw sample).
    ``chunk``: the most time one request covers (default 1 day; also capped at 11,000 points).
    ``selector``: extra label matchers added to every series, e.g. ``'cluster="prod"'``.
    ``bearer_token`` / ``bearer_token_file``, ``ca_file``, ``cert_file`` + ``key_file`` (mutual
    TLS), ``insecure_skip_verify``: how to reach a secured server. ``timeout``: seconds per
    request; ``retries``: extra attempts after the first for connection errors, timeouts, 429 and
    5xx, waiting ``backoff * 2**attempt`` seconds (capped at ``max_backoff``, with jitter).
    ``rule_interval``: the evaluation interval of the shipped recording rules (``rules/``: 1 m).
    ``lookback``: how old a sample a grid point may show (default: one step); raise it when the
    step equals the scrape interval and scrapes jitter.
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
        bearer_token: str | None = None,
        bearer_token_file: str | Path | None = None,
        ca_file: str | Path | None = None,
        cert_file: str | Path | None = None,
        key_file: str | Path | None = None,
        insecure_skip_verify: bool = False,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        concurrency: int = 4,
        rule_interval: float | str = "1m",
        history: float | str = "400d",
        lookback: float | str | None = None,
        rollups: bool = True,
        rollup_interval: float | str = "5m",
    ) -> None:
        if not url or "://" not in url:
            raise PrometheusError(f"--prometheus-url {url!r} is not a URL; expected e.g. http://prometheus:9090")
        self.url = url.rstrip("/")
        self.step = _seconds(step)
        self.chunk = _seconds(chunk)
        if self.step <= 0 or self.chunk <= 0:
            raise PrometheusError("step and chunk must be positive durations")
        self.selector = selector.strip().strip("{}")
        # Each grid point takes the newest sample of the last step (1 ms short: Prometheus 2
        # range selectors include both ends), not Prometheus' 5-minute lookback: a series that
        # ended (a pod replaced on a GPU) must not linger as a second row where no staleness
        # marker ends it (backfilled blocks, some long-term stores).
        self.lookback = _seconds(lookback) if lookback is not None else self.step - 0.001
        if self.lookback <= 0:
            raise PrometheusError("lookback must be a positive duration")
        self.mapper = SeriesMapper(catalogue, cluster=cluster, attribution=attribution)
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.concurrency = max(1, int(concurrency))
        self.rule_interval = _seconds(rule_interval)
        # Reports read the recording-rule rollups (gpu:gpuwarden_*:5m) where they exist.
        self.rollups = bool(rollups)
        self.rollup_interval = _seconds(rollup_interval)
        self.history = _seconds(history)
        self._headers = {"Accept": "application/json", "User-Agent": "gpuwarden"}
        if bearer_token_file is not None:
            try:
                bearer_token = Path(bearer_token_file).read_text().strip()
            except OSError as error:
                raise PrometheusError(f"cannot read the bearer token file {bearer_token_file}: {error.strerror or error}") from None
        if bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
        self._ssl = self._ssl_context(ca_file, cert_file, key_file, insecure_skip_verify) if self.url.startswith("https") else None

    @staticmethod
    def _ssl_context(ca_file, cert_file, key_file, insecure: bool) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            if cert_file:
                context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        except (OSError, ssl.SSLError) as error:
            raise PrometheusError(f"TLS settings for Prometheus are unusable: {error}") from None
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    # -- HTTP ----------------------------------------------------------------------------------
    def _request(self, path: str, params: dict[str, str]) -> Any:
        """POST a query form to ``/api/v1/...``; the ``data`` of a success answer."""
        body = urllib.parse.urlencode(params).encode()
        endpoint = f"{self.url}{path}"
        query = params.get("query", "")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1)) * (0.8 + 0.4 * random.random())
                log.info("retrying %s in %.2fs (attempt %d/%d): %s", endpoint, delay, attempt + 1, self.retries + 1, last)
                time.sleep(delay)
            request = urllib.request.Request(endpoint, data=body, method="POST", headers={
                **self._headers, "Content-Type": "application/x-www-form-urlencoded"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout, context=self._ssl) as response:  # noqa: S310
                    payload = response.read()
                status = 200
            except urllib.error.HTTPError as error:
                status, payload = error.code, error.read()
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
                reason = getattr(error, "reason", error)
                last = f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason
                continue
            answer = self._decode(payload)
            if status == 200 and answer.get("status") == "success":
                return answer.get("data")
            message = answer.get("error") or payload[:200].decode("utf-8", "replace").strip() or "no message"
            if status in (401, 403):
                raise PrometheusError(f"Prometheus at {self.url} refused the request (HTTP {status}: {message}); "
                                      "check the bearer token (--prometheus-token-file)")
            if status == 429 or status >= 500:
                # Prometheus answers 503 for a query that timed out server-side: that is not retried.
                if answer.get("errorType") == "timeout":
                    raise PrometheusQueryError(f"Prometheus timed out evaluating {query!r}: {message}; "
                                               "ask for a shorter window or a coarser step", message, "timeout")
                last = f"HTTP {status}: {message}"
                continue
            if answer.get("errorType") or status in (400, 422):
                raise PrometheusQueryError(f"Prometheus rejected the query {query!r}: {message}", message,
                                           str(answer.get("errorType", "")))
            raise PrometheusError(f"unexpected answer from Prometheus at {endpoint} (HTTP {status}): {message}")
        raise PrometheusUnavailable(
            f"Prometheus at {self.url} is unavailable after {self.retries + 1} attempt(s): {last}")

    @staticmethod
    def _decode(payload: bytes) -> dict:
        try:
            answer = json.loads(payload)
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    def query(self, promql: str, at: datetime | str | float | None = None) -> list[dict]:
        """An instant query; the ``result`` list (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{self._epoch(at):.3f}"
        data = self._request("/api/v1/query", params)
        return data.get("result", []) if isinstance(data, dict) else []

    def query_range(self, promql: str, start: datetime | str | float, end: datetime | str | float,
                    step: float | str | None = None) -> list[dict]:
        """A range query, split into chunks of at most ``chunk`` and 11,000 points; the series
        of every chunk, concatenated (a series may appear once per chunk)."""
        step_s = self.step if step is None else _seconds(step)
        results: list[dict] = []
        for first, last in self._chunks(self._epoch(start), self._epoch(end), step_s, inclusive=True):
            data = self._request("/api/v1/query_range", {
                "query": promql, "start": f"{first:.3f}", "end": f"{last:.3f}", "step": _promql_duration(step_s)})
            results.extend(data.get("result", []) if isinstance(data, dict) else [])
        return results

    @staticmethod
    def _epoch(value: datetime | str | float | pd.Timestamp) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        return _utc(value).value / 1e9

    def _chunks(self, start: float, end: float, step: float, inclusive: bool = False,
                chunk: float | None = None) -> list[tuple[float, float]]:
        """Grid-aligned [first, last] evaluation times covering [start, end) (or [start, end]),
        at most ``chunk`` (default: the source's) and 11,000 points each."""
        first = math.ceil(start / step - 1e-9) * step
        last = math.floor(end / step + 1e-9) * step
        if not inclusive and last >= end - 1e-9:
            last -= step
        if last < first:
            return []
        per_chunk = max(1, min(MAX_POINTS_PER_SERIES - 1, int((chunk or self.chunk) // step)))
        chunks = []
        while first <= last + 1e-9:
            upper = min(last, first + (per_chunk - 1) * step)
            chunks.append((first, upper))
            first = upper + step
        return chunks

    def _matrix(self, promql: str, first: float, last: float, step: float) -> list[dict]:
        data = self._request("/api/v1/query_range", {
            "query": promql, "start": f"{first:.3f}", "end": f"{last:.3f}", "step": _promql_duration(step)})
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            return []
        return data.get("result", [])

    def _selector(self, metric: str) -> str:
        return f"{metric}{{{self.selector}}}" if self.selector else metric

    @property
    def sample_interval(self) -> pd.Timedelta:
        """The grid of :meth:`read`: what one row stands for (analytics uses it as the step)."""
        return pd.Timedelta(seconds=self.step)

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
        start_s, end_s = self._epoch(start), self._epoch(end)
        metric_columns = [c for c in wanted if c not in IDENTITY_COLUMN_NAMES]
        # Rows exist where a GPU has series; with only identity columns asked, read a cheap one.
        metrics = self.mapper.metrics_for(metric_columns or ["mem_total_bytes"])
        if "attribution" in wanted:  # the exporter's gpuwarden_pod_attribution_state, where it serves it
            metrics += [m for m in self.mapper.state_metrics() if m not in metrics]
        if not metrics:
            return empty_samples()[wanted]
        jobs = [(metric, first, last) for first, last in self._chunks(start_s, end_s, self.step) for metric in metrics]
        if not jobs:
            return empty_samples()[wanted]
        assembler = FrameAssembler(self.mapper)

        def fetch(job: tuple[str, float, float]) -> tuple[str, list[dict]]:
            metric, first, last = job
            promql = f"last_over_time({self._selector(metric)}[{_promql_duration(self.lookback)}])"
            return metric, self._matrix(promql, first, last, self.step)

        started = time.perf_counter()
        points = 0
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(jobs))) as pool:
            for metric, series_list in pool.map(fetch, jobs):
                for series in series_list:
                    values = series.get("values") or []
                    if not values:
                        continue
                    stamps = np.fromiter((v[0] for v in values), dtype=np.float64, count=len(values))
                    numbers = np.array([v[1] for v in values], dtype=np.float64)
                    times_ns = np.round(stamps * 1000).astype(np.int64) * 1_000_000
                    assembler.add(metric, series.get("metric", {}), times_ns, numbers)
                    points += len(values)
        frame = assembler.frame(wanted)
        log.info("prometheus read %d metric(s) x %d chunk(s): %d points -> %d rows in %.2fs",
                 len(metrics), len(jobs) // len(metrics), points, len(frame), time.perf_counter() - started)
        return frame

    def time_range(self) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        """Oldest and newest GPU sample within ``history`` of now, or None when there is none.

        Two cheap steps each: an hourly subquery finds the hour, a fine range query over that
        hour finds the sample.
        """
        anchor = self._anchor()
        if anchor is None:
            return None
        span = self._span(anchor)
        if span is None and self.rollups:  # rollups only (raw samples expired or never kept)
            span = self._span(self._selector(STATE_ROLLUPS["seconds"]))
        return span

    def _span(self, anchor: str) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        """Oldest and newest sample of ``anchor``, with queries that read little: the newest by
        looking back 1 h, 1 d, 7 d, ... from now (``count(last_over_time(x[W]))``), then the 5-minute
        slot inside that window; the oldest from an instant ``count(x)`` at each day of the history
        (seeks, not a full read), then the 5-minute slot inside the first day; then 15 s steps inside
        each slot. A 30-day store of 100,000 series answers in seconds."""
        series = f"timestamp({anchor})"
        now = time.time()
        newest = self._scalar(f"max({series})", now)
        if newest is None:
            for look in (3600.0, 86400.0, 7 * 86400.0, 31 * 86400.0, self.history):
                if not self._scalar(f"count(last_over_time({anchor}[{_promql_duration(look)}]))", now):
                    continue
                slots = self._active_steps(anchor, now - look, now, max(300.0, look / 2000))
                if slots and look > 3600.0:  # narrow a long window to its last day, then 5 minutes
                    slots = self._active_steps(anchor, slots[-1] - max(300.0, look / 2000), slots[-1], 300.0) or slots
                slot = slots[-1] if slots else now
                values = self._range_values(f"max({series})", slot - 300.0, slot + 300.0, 15.0)
                newest = max(values) if values else slot
                break
            if newest is None:
                return None
        first_day = newest
        try:
            days = [float(t) for result in self._matrix(f"count({anchor})", math.floor((newest - self.history) / 86400) * 86400,
                                                           newest, 86400.0) for t, v in result.get("values", [])]
            first_day = min(days) if days else newest
        except PrometheusQueryError:
            pass  # too big to scan here: the oldest day with a sample at midnight is a bound
        slots = self._active_steps(anchor, first_day - 86400.0, first_day, 300.0)
        first = slots[0] if slots else first_day
        values = self._range_values(f"min({series})", first - 300.0, first + 15.0, 15.0)
        oldest = min(values) if values else first - 300.0
        # At a 15 s grid, timestamp() gives each series' newest sample at the grid point, which can
        # be up to 15 s after its first: look again at 1 s around it (a window trimmed to the data
        # must not cut off its first seconds).
        fine = self._range_values(f"min({series})", oldest - 15.0, oldest, 1.0)
        oldest = min([oldest, *fine])
        return pd.Timestamp(min(oldest, newest), unit="s", tz="UTC"), pd.Timestamp(newest, unit="s", tz="UTC")

    def _active_steps(self, anchor: str, start: float, end: float, step: float) -> list[float]:
        """Grid times t (multiples of ``step``, first >= start, last >= end) whose (t - step, t]
        holds a sample of ``anchor``."""
        first = math.floor(start / step) * step + step
        last = math.ceil(end / step) * step
        found: list[float] = []
        while first <= last:
            upper = min(last, first + (MAX_POINTS_PER_SERIES - 2) * step)
            for result in self._matrix(f"count(last_over_time({anchor}[{_promql_duration(step - 0.001)}]))", first, upper, step):
                found.extend(float(t) for t, v in result.get("values", []) if float(v) > 0)
            first = upper + step
        return sorted(found)

    def _anchor(self) -> str | None:
        """A metric every GPU has (FB_USED: memory is measured even where activity is not)."""
        for column in ("mem_used_bytes", "gpu_util_ratio", "power_watts"):
            names = [m for m, t in self.mapper._targets.items() if t.column == column]
            if names:
                return self._selector(names[0])
        return None

    def _scalar(self, promql: str, at: float) -> float | None:
        result = self.query(promql, at)
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value

    def _range_values(self, promql: str, start: float, end: float, step: float) -> list[float]:
        step = max(step, (end - start) / (MAX_POINTS_PER_SERIES - 1))
        values: list[float] = []
        for series in self._matrix(promql, start, end, step):
            values.extend(float(v[1]) for v in series.get("values", []))
        return [v for v in values if not math.isnan(v)]

    # -- aggregation pushed into Prometheus ------------------------------------------------------
    @property
    def rollup_resolution(self) -> pd.Timedelta:
        return pd.Timedelta(seconds=self.rollup_interval)

    def read_state_rollup(self, start: datetime | str, end: datetime | str, bucket: float | str = "1h") -> pd.DataFrame | None:
        """The idle taxonomy per GPU, holder and state, summed per ``bucket`` from the recording
        rules' 5-minute rollups (``gpu:gpuwarden_state_seconds:5m{state=...}`` and friends); None
        when Prometheus holds no rollup series in the window (the rules are not loaded).

        Columns: ``timestamp`` (bucket start, buckets aligned to multiples of ``bucket``), the
        identity columns, ``state``, ``seconds``, ``used_seconds`` (seconds x activity),
        ``energy_joules``, ``memory_byte_seconds``. No raw sample leaves Prometheus.
        """
        bucket_s = _seconds(bucket)
        start_s, end_s = self._epoch(start), self._epoch(end)
        first_end = math.floor(start_s / bucket_s) * bucket_s + bucket_s  # the bucket holding start
        window = _promql_duration(bucket_s - 0.001)
        grouping = ", ".join(_STATE_ROLLUP_LABELS)
        started = time.perf_counter()
        parts: dict[str, list] = {figure: [] for figure in STATE_ROLLUPS}
        keys: dict[tuple, int] = {}
        points = 0
        # Requests of a week each (hourly points are few), several at once.
        chunks = self._chunks(first_end, end_s + bucket_s, bucket_s, chunk=max(self.chunk, 7 * 86400.0))

        def fetch(job: tuple[str, float, float]) -> tuple[str, list[dict]]:
            figure, first, last = job
            promql = f"sum by ({grouping}) (sum_over_time({self._selector(STATE_ROLLUPS[figure])}[{window}]))"
            return figure, self._matrix(promql, first, last, bucket_s)

        for figures in (["seconds"], ["used_seconds", "energy_joules", "memory_byte_seconds"]):
            jobs = [(figure, first, last) for figure in figures for first, last in chunks]
            with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(jobs)))) as pool:
                for figure, found in pool.map(fetch, jobs):
                    for series in found:
                        values = series.get("values") or []
                        if not values:
                            continue
                        labels = series.get("metric", {})
                        key = tuple(labels.get(label, "") for label in _STATE_ROLLUP_LABELS)
                        code = keys.setdefault(key, len(keys))
                        stamps = np.fromiter((v[0] for v in values), dtype=np.float64, count=len(values)) - bucket_s
                        numbers = np.array([v[1] for v in values], dtype=np.float64)
                        parts[figure].append((np.full(len(values), code, np.int64), np.round(stamps).astype(np.int64),
                                              numbers))
                        points += len(values)
            if figures == ["seconds"] and not parts["seconds"]:
                return None  # no rollups: the caller reads raw samples
        frame = self._state_rollup_frame(parts, list(keys))
        log.info("prometheus rollup read: %d points -> %d rows in %.2fs", points, len(frame), time.perf_counter() - started)
        return frame

    def _state_rollup_frame(self, parts: dict[str, list], keys: list[tuple]) -> pd.DataFrame:
        def table(figure: str) -> pd.DataFrame:
            chunks = parts[figure]
            if not chunks:
                return pd.DataFrame({"key": np.empty(0, np.int64), "t": np.empty(0, np.int64), figure: np.empty(0)})
            return pd.DataFrame({"key": np.concatenate([c[0] for c in chunks]), "t": np.concatenate([c[1] for c in chunks]),
                                 figure: np.concatenate([c[2] for c in chunks])})

        merged = table("seconds")
        for figure in ("used_seconds", "energy_joules", "memory_byte_seconds"):
            merged = merged.merge(table(figure).groupby(["key", "t"], as_index=False).sum(), on=["key", "t"], how="left")
        merged = merged[merged["seconds"] > 0]
        identities = []
        for key in keys:
            labels = dict(zip(_STATE_ROLLUP_LABELS, key))
            identities.append(self.mapper.identity(labels))
        valid = np.array([identity is not None for identity in identities] + [False], dtype=bool)
        codes = merged["key"].to_numpy()
        merged = merged[valid[codes]]
        codes = merged["key"].to_numpy()
        out: dict[str, object] = {"timestamp": pd.to_datetime(merged["t"].to_numpy() * 1_000_000_000, utc=True)}
        for position, name in enumerate(IDENTITY_COLUMN_NAMES[1:]):
            per_key = [identity[position] if identity is not None else None for identity in identities]
            if name == "attribution":  # a rollup row is classified already: pod-less rows say which
                continue
            values = np.asarray(per_key, dtype=object)[codes] if len(codes) else np.empty(0, dtype=object)
            out[name] = pd.array(values, dtype="Int64") if name == "gpu_index" else pd.Categorical(values)
        state_index = _STATE_ROLLUP_LABELS.index("state")
        out["state"] = pd.Categorical(np.asarray([k[state_index] for k in keys], dtype=object)[codes] if len(codes) else [])
        for figure in STATE_ROLLUPS:
            out[figure] = merged[figure].fillna(0.0).to_numpy(dtype=np.float64)
        return pd.DataFrame(out).sort_values("timestamp", kind="stable", ignore_index=True)

    def read_rollup(self, start: datetime | str, end: datetime | str, step: float | str = "1h",
                    by: str = "gpu", use_rules: bool = True) -> pd.DataFrame:
        """GPU-seconds per window of ``step`` for every GPU (``by="gpu"``) or namespace
        (``by="namespace"``), computed inside Prometheus.

        Columns: ``timestamp`` (window start), the identity (``cluster, node, gpu_uuid, gpu_index,
        model, mig_instance, namespace, pod, team, project``; for namespaces ``cluster, namespace,
        team``), ``observed_gpu_seconds``, ``idle_gpu_seconds``, ``allocated_idle_gpu_seconds``,
        ``fake_busy_gpu_seconds`` and ``hoarded_memory_byte_seconds`` (memory held by allocated
        GPUs while idle, integrated over time). With ``use_rules`` it reads the recorded series
        of ``rules/gpuwarden-recording.rules.yml``; without, the same expressions as subqueries.
        """
        if by not in ("gpu", "namespace"):
            raise ValueError("by must be 'gpu' or 'namespace'")
        step_s = _seconds(step)
        # Prometheus 2 range selectors include both ends: a window 1 ms short of the step keeps
        # an evaluation on a window boundary from being counted in two windows.
        window, resolution = _promql_duration(step_s - 0.001), _promql_duration(self.rule_interval)
        grouping = "cluster, namespace" if by == "namespace" else ", ".join(_ROLLUP_GPU_LABELS)

        recorded = {"idle": "gpu:gpuwarden_idle:bool", "allocated_idle": "gpu:gpuwarden_allocated_idle:bool",
                    "fake_busy": "gpu:gpuwarden_fake_busy:bool", "hoarded_memory": "gpu:gpuwarden_hoarded_memory:bytes"}

        def source(name: str) -> str:
            if use_rules:
                return self._selector(recorded[name])
            raw = {
                "idle": _with_matchers(IDLE_EXPR, self.selector),
                "allocated_idle": _with_matchers(IDLE_EXPR, ", ".join(filter(None, [self.selector, 'pod!=""']))),
                "fake_busy": _with_matchers(FAKE_BUSY_EXPR, self.selector),
            }
            if name == "hoarded_memory":
                fb = _with_matchers('DCGM_FI_DEV_FB_USED{pod!=""}', self.selector)
                return f"({fb} * 1048576 * ({raw['allocated_idle']}))"
            return f"({raw[name]})"

        def integral(name: str, function: str = "sum_over_time") -> str:
            inner = source(name)
            inner = f"{inner}[{window}]" if use_rules else f"{inner}[{window}:{resolution}]"
            return f"sum by ({grouping}) ({function}({inner})) * {self.rule_interval:g}"

        figures = {
            "observed_gpu_seconds": integral("idle", "count_over_time"),
            "idle_gpu_seconds": integral("idle"),
            "allocated_idle_gpu_seconds": integral("allocated_idle"),
            "fake_busy_gpu_seconds": integral("fake_busy"),
            "hoarded_memory_byte_seconds": integral("hoarded_memory"),
        }
        # Evaluate at window ends: the value at t covers (t - step, t].
        start_s = self._epoch(start) + step_s
        end_s = self._epoch(end) + step_s
        records: dict[tuple, dict[str, float]] = {}
        for figure, promql in figures.items():
            for first, last in self._chunks(start_s, end_s, step_s):
                for series in self._matrix(promql, first, last, step_s):
                    labels = series.get("metric", {})
                    key = tuple(labels.get(label, "") for label in _ROLLUP_GPU_LABELS)
                    for stamp, value in series.get("values", []):
                        records.setdefault((float(stamp) - step_s, key), {})[figure] = float(value)
        return self._rollup_frame(records, list(figures), by)

    def _rollup_frame(self, records: dict, figures: list[str], by: str) -> pd.DataFrame:
        rows = []
        for (stamp, key), values in sorted(records.items(), key=lambda item: (item[0][0], item[0][1])):
            labels = dict(zip(_ROLLUP_GPU_LABELS, key))
            if by == "gpu":
                identity = self.mapper.identity(labels)
                if identity is None:
                    continue
                row = dict(zip(IDENTITY_COLUMN_NAMES[1:], identity))
            else:
                namespace = labels["namespace"] or None
                team = self.mapper.attribution(namespace, None)[0] if self.mapper.attribution and namespace else None
                row = {"cluster": labels["cluster"] or self.mapper.cluster, "namespace": namespace, "team": team}
            row["timestamp"] = pd.Timestamp(stamp, unit="s", tz="UTC")
            row.update({figure: values.get(figure, 0.0) for figure in figures})
            rows.append(row)
        identity = list(IDENTITY_COLUMN_NAMES[1:]) if by == "gpu" else ["cluster", "namespace", "team"]
        frame = pd.DataFrame(rows, columns=["timestamp", *identity, *figures])
        for column in identity:
            if column == "gpu_index":
                frame[column] = frame[column].astype("Int64")
            else:
                frame[column] = frame[column].astype("category")
        frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
        return frame


__all__ = ["PrometheusError", "PrometheusQueryError", "PrometheusSource", "PrometheusUnavailable"]
