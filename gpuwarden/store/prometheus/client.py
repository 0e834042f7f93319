"""The HTTP query client of Prometheus' API (also Thanos, Mimir, VictoriaMetrics): requests,
retries, errors, durations and grid-aligned range chunks. Knows nothing of fleet samples.

Errors: Prometheus unreachable or answering 5xx / 429 is retried ``retries`` times with
exponential backoff, then raises :class:`PrometheusUnavailable`, as does no whole answer within
``timeout`` (at once: the deadline covers the request, not each socket read); an answer of the
wrong shape (valid JSON, not what the query API gives) is a :class:`PrometheusError` naming what
was expected; a query Prometheus rejects
(bad PromQL, too many samples) raises :class:`PrometheusQueryError` with Prometheus' own message.
Both are :class:`~gpuwarden.store.schema.SamplesError`, which the CLI prints as one line.
"""

from __future__ import annotations

import json
import logging
import math
import random
import ssl
import time
import urllib.parse
from datetime import datetime
from pathlib import Path
from typing import Any, TypeAlias

import pandas as pd

from gpuwarden.fleet.durations import DurationError, parse_duration_seconds
from gpuwarden.fleet.inputs import MAX_SECRET_FILE_BYTES, checked_input
from gpuwarden.fleet.semantics import to_utc
from ..http_fetch import AnswerTooLarge, DeadlineExceeded, fetch
from ..schema import SamplesError

log = logging.getLogger("gpuwarden.store.prometheus")

# Prometheus refuses query_range results of more than 11,000 points per series.
MAX_POINTS_PER_SERIES = 11_000
# The largest answer read (a day of 1,000 GPUs' series at 60 s is ~150 MB of JSON).
MAX_ANSWER_BYTES = 1 << 30

Moment: TypeAlias = datetime | str | float | pd.Timestamp


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


def duration_seconds(value: float | str | pd.Timedelta) -> float:
    """Seconds from a number, a Timedelta, or a Prometheus duration ("15s", "1h30m", "7d")."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, pd.Timedelta):
        return float(value.total_seconds())
    try:
        return parse_duration_seconds(str(value))
    except DurationError as error:
        raise PrometheusError(str(error)) from None


def promql_duration(seconds: float) -> str:
    """A PromQL duration for ``seconds`` ("1h", "90s", "4999ms")."""
    whole = int(round(seconds))
    if abs(seconds - whole) > 1e-9 or whole <= 0:
        return f"{int(round(seconds * 1000))}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def epoch_seconds(value: Moment) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    return float(to_utc(value).value / 1e9)


class PrometheusClient:
    """Queries against Prometheus' HTTP API.

    ``url``: the base URL (``http://prometheus:9090``, or a path prefix such as
    ``https://host/prometheus``). ``chunk``: the most time one range request covers (also capped
    at 11,000 points). ``selector``: extra label matchers added to every series, e.g.
    ``'cluster="prod"'``. ``bearer_token`` / ``bearer_token_file``, ``ca_file``, ``cert_file`` +
    ``key_file`` (mutual TLS), ``insecure_skip_verify``: how to reach a secured server.
    ``timeout``: seconds per request, the whole of it (a server that trickles its answer is cut off
    there, :mod:`..http_fetch`); ``retries``: extra attempts after the first for connection
    errors, timeouts, 429 and 5xx, waiting ``backoff * 2**attempt`` seconds (capped at
    ``max_backoff``, with jitter). ``concurrency``: requests in flight at once.
    """

    def __init__(
        self,
        url: str,
        *,
        chunk: float | str = "1d",
        selector: str = "",
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
    ) -> None:
        if not url or "://" not in url:
            raise PrometheusError(f"--prometheus-url {url!r} is not a URL; expected e.g. http://prometheus:9090")
        self.url = url.rstrip("/")
        self.chunk = duration_seconds(chunk)
        if self.chunk <= 0:
            raise PrometheusError("step and chunk must be positive durations")
        self.selector = selector.strip().strip("{}")
        self.timeout = float(timeout)  # seconds for the whole of one request (head and body), not per read
        self.max_answer_bytes = MAX_ANSWER_BYTES
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.concurrency = max(1, int(concurrency))
        self._headers = {"Accept": "application/json", "User-Agent": "gpuwarden"}
        if bearer_token_file is not None:
            checked_input(bearer_token_file, "the bearer token file", MAX_SECRET_FILE_BYTES)
            try:
                bearer_token = Path(bearer_token_file).read_text().strip()
            except OSError as error:
                raise PrometheusError(f"cannot read the bearer token file {bearer_token_file}: {error.strerror or error}") from None
        if bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
        self._ssl = self._ssl_context(ca_file, cert_file, key_file, insecure_skip_verify) if self.url.startswith("https") else None

    @staticmethod
    def _ssl_context(ca_file: str | Path | None, cert_file: str | Path | None, key_file: str | Path | None,
                     insecure: bool) -> ssl.SSLContext:
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

    def _request(self, path: str, params: dict[str, str]) -> Any:
        """POST a query form to ``/api/v1/...``; the ``data`` of a success answer."""
        body = urllib.parse.urlencode(params).encode()
        endpoint = f"{self.url}{path}"
        query = params.get("query", "")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1)) * (0.8 + 0.4 * random.random())  # noqa: S311
                log.info("retrying %s in %.2fs (attempt %d/%d): %s", endpoint, delay, attempt + 1, self.retries + 1, last)
                time.sleep(delay)
            try:
                status, payload = fetch(endpoint, timeout_s=self.timeout, max_bytes=self.max_answer_bytes, method="POST",
                                        body=body, ssl_context=self._ssl,
                                        headers={**self._headers, "Content-Type": "application/x-www-form-urlencoded"})
            except AnswerTooLarge as error:
                raise PrometheusError(f"Prometheus at {self.url}: {error} for {query!r}; ask for a shorter window, "
                                      "a coarser --prometheus-step or a narrower --prometheus-selector") from None
            except DeadlineExceeded:
                # Not retried: a server this slow holds the report for timeout x attempts otherwise.
                raise PrometheusUnavailable(
                    f"Prometheus at {self.url} gave no whole answer within {self.timeout:g} s (--prometheus-timeout) "
                    f"for {query or path!r}; raise --prometheus-timeout or ask for a shorter window") from None
            except OSError as error:  # refused, reset, TLS
                last = f"{type(error).__name__}: {error}"
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
    def _decode(payload: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(payload)
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    def query(self, promql: str, at: Moment | None = None) -> list[dict[str, Any]]:
        """An instant query; the ``result`` list (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{epoch_seconds(at):.3f}"
        data = self._request("/api/v1/query", params)
        return self._result(data, ("vector", "matrix"), promql)

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        """The label sets of the series ``match`` selects within [start, end] (Prometheus' series
        API: the index only, no samples read)."""
        data = self._request("/api/v1/series", {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})
        if not isinstance(data, list) or not all(_is_labels(labels) for labels in data):
            raise self._unexpected(f"the series of {match!r}", "a list of label sets ({name: value})", data)
        return data

    def query_range(self, promql: str, start: Moment, end: Moment, step: float | str = 60.0) -> list[dict[str, Any]]:
        """A range query, split into chunks of at most ``chunk`` and 11,000 points; the series
        of every chunk, concatenated (a series may appear once per chunk)."""
        step_s = duration_seconds(step)
        results: list[dict[str, Any]] = []
        for first, last in self.chunks(epoch_seconds(start), epoch_seconds(end), step_s, inclusive=True):
            results.extend(self.matrix(promql, first, last, step_s))
        return results

    def chunks(self, start: float, end: float, step: float, inclusive: bool = False,
               chunk: float | None = None) -> list[tuple[float, float]]:
        """Grid-aligned [first, last] evaluation times covering [start, end) (or [start, end]),
        at most ``chunk`` (default: the client's) and 11,000 points each."""
        first = math.ceil(start / step - 1e-9) * step
        last = math.floor(end / step + 1e-9) * step
        if not inclusive and last >= end - 1e-9:
            last -= step
        if last < first:
            return []
        per_chunk = max(1, min(MAX_POINTS_PER_SERIES - 1, int((chunk or self.chunk) // step)))
        out = []
        while first <= last + 1e-9:
            upper = min(last, first + (per_chunk - 1) * step)
            out.append((first, upper))
            first = upper + step
        return out

    def matrix(self, promql: str, first: float, last: float, step: float) -> list[dict[str, Any]]:
        """One range request evaluated at ``first, first + step, ..., last``; its series."""
        data = self._request("/api/v1/query_range", {
            "query": promql, "start": f"{first:.3f}", "end": f"{last:.3f}", "step": promql_duration(step)})
        return self._result(data, ("matrix",), promql)

    def _result(self, data: Any, result_types: tuple[str, ...], promql: str) -> list[dict[str, Any]]:
        """The ``result`` of a query answer, checked before use: each series a ``metric`` label set
        and its ``value`` ([time, "number"], a vector) or ``values`` (a list of them, a matrix).
        Anything else is an unexpected answer naming what was expected (a proxy or another API on
        the URL, mostly)."""
        if not isinstance(data, dict) or not isinstance(data.get("result"), (list, type(None))):
            raise self._unexpected(promql, f'{{"resultType": "{result_types[0]}", "result": [...]}}', data)
        kind = data.get("resultType")
        if kind in ("scalar", "string") or not data.get("result"):
            return []  # a query of a constant, or nothing at all
        if kind not in result_types:
            raise self._unexpected(promql, " or ".join(f'resultType "{t}"' for t in result_types), kind)
        points = "value" if kind == "vector" else "values"
        expected = ('{"metric": {labels}, "value": [time, "number"]}' if points == "value"
                    else '{"metric": {labels}, "values": [[time, "number"], ...]}')
        for position, series in enumerate(data["result"]):
            if not (isinstance(series, dict) and _is_labels(series.get("metric"))):
                raise self._unexpected(promql, f"result[{position}] as {expected}", series)
            pairs = [series.get("value")] if points == "value" else series.get("values")
            if not isinstance(pairs, list) or not all(_is_point(pair) for pair in pairs):
                raise self._unexpected(promql, f"result[{position}] as {expected}", series)
        return list(data["result"])

    def _unexpected(self, what: str, expected: str, got: Any) -> PrometheusError:
        shown = json.dumps(got, default=str)[:120]
        return PrometheusError(f"unexpected answer from Prometheus at {self.url} for {what}: expected {expected}, "
                               f"got {shown} (is --prometheus-url a Prometheus query API?)")

    def scalar(self, promql: str, at: float) -> float | None:
        """The first value of an instant query; None when there is none (or NaN)."""
        result = self.query(promql, at)
        if not result:
            return None
        value = float(result[0]["value"][1])  # checked by query(): a number in a string
        return None if math.isnan(value) else value

    def range_values(self, promql: str, start: float, end: float, step: float) -> list[float]:
        """Every non-NaN value of a range query over [start, end] (step widened to fit one request)."""
        step = max(step, (end - start) / (MAX_POINTS_PER_SERIES - 1))
        values: list[float] = []
        for series in self.matrix(promql, start, end, step):
            values.extend(float(v[1]) for v in series.get("values", []))
        return [v for v in values if not math.isnan(v)]

    def selected(self, metric: str) -> str:
        """``metric`` with the client's extra label matchers."""
        return f"{metric}{{{self.selector}}}" if self.selector else metric


def _is_labels(labels: Any) -> bool:
    return isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())


def _is_point(pair: Any) -> bool:
    """``[time, "number"]`` as Prometheus writes a sample ("NaN", "+Inf" included)."""
    if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (int, float))
            and not isinstance(pair[0], bool) and isinstance(pair[1], str)):
        return False
    try:
        float(pair[1])
    except ValueError:
        return False
    return True
