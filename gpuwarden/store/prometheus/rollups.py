"""The rollup reader: sums computed inside Prometheus, so a 1,000-GPU, 30-day report pulls no raw
sample.

:func:`read_state_rollup` reads the recording rules' 5-minute rollups (one series per GPU,
namespace and state; ``rules/gpuwarden-recording.rules.yml``) summed per bucket (an hour):
1,000 GPUs x 30 days x a few states is a few million numbers instead of 173 million raw rows.
:func:`read_rollup` sums the 1-minute recorded indicators (``gpu:gpuwarden_idle:bool`` and
friends), or, without rules, the same expressions as PromQL subqueries over the raw series.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pandas as pd

from gpuwarden.fleet import IDENTITY_COLUMN_NAMES

from ..series import SeriesMapper
from .client import MAX_POINTS_PER_SERIES, PrometheusClient, log, promql_duration
from .expressions import FAKE_BUSY_EXPR, IDLE_EXPR, ROLLUP_LABELS, STATE_ROLLUPS, with_matchers

# A rollup row stands for every pod of its namespace on its GPU (the rollups sum the pod away).
ROLLUP_POD = "*"

_STATE_ROLLUP_LABELS = (*ROLLUP_LABELS, "state")
_ROLLUP_GPU_LABELS = (*ROLLUP_LABELS[:ROLLUP_LABELS.index("namespace") + 1], "pod")  # the GPU, its namespace and pod


def read_state_rollup(client: PrometheusClient, mapper: SeriesMapper, start_s: float, end_s: float, bucket_s: float,
                      lag_s: float) -> pd.DataFrame | None:
    """The idle taxonomy per GPU, namespace and state, summed per bucket of ``bucket_s`` from the
    rules' 5-minute rollups; None when Prometheus holds no rollup series in the window.

    A rollup recorded at ``T`` covers the rule evaluations up to ``T - lag_s`` (the rules'
    offset), so a bucket ``(b - bucket, b]`` sums the rollups recorded in ``(b - bucket + lag,
    b + lag]``: consecutive buckets tile time exactly, as the rollups do.

    Columns: ``timestamp`` (bucket start, buckets aligned to multiples of ``bucket_s``), the
    identity columns (``pod`` is :data:`ROLLUP_POD` where a namespace held the GPU), ``state``,
    ``seconds``, ``used_seconds`` (seconds x activity), ``energy_joules``, ``memory_byte_seconds``.
    """
    first_end = math.floor(start_s / bucket_s) * bucket_s + bucket_s  # the bucket holding start
    window = promql_duration(bucket_s - 0.001)
    grouping = ", ".join(_STATE_ROLLUP_LABELS)
    started = time.perf_counter()
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {figure: [] for figure in STATE_ROLLUPS}
    keys: dict[tuple[str, ...], int] = {}
    points = 0
    # Requests of a week (or of 11,000 buckets, if longer): each series comes back once per
    # request, and per-series work is what a report pays for (day-long requests cost 3.5x the CPU
    # at 1,000 GPUs x 30 days); longer ones hold more decoded points at once (RSS). Evaluated one
    # lag after each bucket's end.
    chunk = min(MAX_POINTS_PER_SERIES - 1, max(1, math.ceil(7 * 86400.0 / bucket_s))) * bucket_s
    chunks = [(first + lag_s, last + lag_s)
              for first, last in client.chunks(first_end, end_s + bucket_s, bucket_s, chunk=chunk)]

    def fetch(job: tuple[str, float, float]) -> tuple[str, list[dict[str, Any]]]:
        figure, first, last = job
        promql = f"sum by ({grouping}) (sum_over_time({client.selected(STATE_ROLLUPS[figure])}[{window}]))"
        return figure, client.matrix(promql, first, last, bucket_s)

    for figures in (["seconds"], ["used_seconds", "energy_joules", "memory_byte_seconds"]):
        jobs = [(figure, first, last) for figure in figures for first, last in chunks]
        with ThreadPoolExecutor(max_workers=max(1, min(client.concurrency, len(jobs)))) as pool:
            for figure, found in pool.map(fetch, jobs):
                for series in found:
                    values = series.get("values") or []
                    if not values:
                        continue
                    labels = series.get("metric", {})
                    key = tuple(labels.get(label, "") for label in _STATE_ROLLUP_LABELS)
                    code = keys.setdefault(key, len(keys))
                    stamps = np.fromiter((v[0] for v in values), dtype=np.float64, count=len(values)) - bucket_s - lag_s
                    numbers = np.array([v[1] for v in values], dtype=np.float64)
                    parts[figure].append((np.full(len(values), code, np.int64), np.round(stamps).astype(np.int64), numbers))
                    points += len(values)
        if figures == ["seconds"] and not parts["seconds"]:
            return None  # no rollups: the caller reads raw samples
    frame = _state_rollup_frame(mapper, parts, list(keys))
    log.info("prometheus rollup read: %d points -> %d rows in %.2fs", points, len(frame), time.perf_counter() - started)
    return frame


def _state_rollup_frame(mapper: SeriesMapper, parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]],
                        keys: list[tuple[str, ...]]) -> pd.DataFrame:
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
    identities = [mapper.identity(dict(zip(_STATE_ROLLUP_LABELS, key))) for key in keys]
    valid = np.array([identity is not None for identity in identities] + [False], dtype=bool)
    codes = merged["key"].to_numpy()
    merged = merged[valid[codes]]
    codes = merged["key"].to_numpy()
    out: dict[str, object] = {"timestamp": pd.to_datetime(merged["t"].to_numpy() * 1_000_000_000, utc=True)}
    names = IDENTITY_COLUMN_NAMES[1:]
    namespace_at = names.index("namespace")
    for position, name in enumerate(names):
        if name == "attribution":  # a rollup row is classified already: pod-less rows say which
            continue
        per_key = [identity[position] if identity is not None else None for identity in identities]
        if name == "pod":  # held by some pod of the namespace (which one the rollups do not keep)
            per_key = [ROLLUP_POD if identity is not None and identity[namespace_at] else None for identity in identities]
        values = np.asarray(per_key, dtype=object)[codes] if len(codes) else np.empty(0, dtype=object)
        out[name] = pd.array(values, dtype="Int64") if name == "gpu_index" else pd.Categorical(values)
    state_index = _STATE_ROLLUP_LABELS.index("state")
    out["state"] = pd.Categorical(np.asarray([k[state_index] for k in keys], dtype=object)[codes] if len(codes) else [])
    for figure in STATE_ROLLUPS:
        out[figure] = merged[figure].fillna(0.0).to_numpy(dtype=np.float64)
    return pd.DataFrame(out).sort_values("timestamp", kind="stable", ignore_index=True)


def read_rollup(client: PrometheusClient, mapper: SeriesMapper, start_s: float, end_s: float, step_s: float,
                rule_interval: float, by: str = "gpu", use_rules: bool = True) -> pd.DataFrame:
    """GPU-seconds per window of ``step_s`` for every GPU (``by="gpu"``) or namespace
    (``by="namespace"``), computed inside Prometheus from the 1-minute recorded indicators (or,
    without ``use_rules``, the same expressions as subqueries over raw series).

    Columns: ``timestamp`` (window start), the identity (``cluster, node, gpu_uuid, gpu_index,
    model, mig_instance, namespace, pod, team, project``; for namespaces ``cluster, namespace,
    team``), ``observed_gpu_seconds``, ``idle_gpu_seconds``, ``allocated_idle_gpu_seconds``,
    ``fake_busy_gpu_seconds`` and ``hoarded_memory_byte_seconds`` (memory held by allocated
    GPUs while idle, integrated over time).
    """
    if by not in ("gpu", "namespace"):
        raise ValueError("by must be 'gpu' or 'namespace'")
    # Prometheus 2 range selectors include both ends: a window 1 ms short of the step keeps
    # an evaluation on a window boundary from being counted in two windows.
    window, resolution = promql_duration(step_s - 0.001), promql_duration(rule_interval)
    grouping = "cluster, namespace" if by == "namespace" else ", ".join(_ROLLUP_GPU_LABELS)
    recorded = {"idle": "gpu:gpuwarden_idle:bool", "allocated_idle": "gpu:gpuwarden_allocated_idle:bool",
                "fake_busy": "gpu:gpuwarden_fake_busy:bool", "hoarded_memory": "gpu:gpuwarden_hoarded_memory:bytes"}
    selector = client.selector

    def source(name: str) -> str:
        if use_rules:
            return client.selected(recorded[name])
        raw = {
            "idle": with_matchers(IDLE_EXPR, selector),
            "allocated_idle": with_matchers(IDLE_EXPR, ", ".join(filter(None, [selector, 'pod!=""']))),
            "fake_busy": with_matchers(FAKE_BUSY_EXPR, selector),
        }
        if name == "hoarded_memory":
            fb = with_matchers('DCGM_FI_DEV_FB_USED{pod!=""}', selector)
            return f"({fb} * 1048576 * ({raw['allocated_idle']}))"
        return f"({raw[name]})"

    def integral(name: str, function: str = "sum_over_time") -> str:
        inner = source(name)
        inner = f"{inner}[{window}]" if use_rules else f"{inner}[{window}:{resolution}]"
        return f"sum by ({grouping}) ({function}({inner})) * {rule_interval:g}"

    figures = {
        "observed_gpu_seconds": integral("idle", "count_over_time"),
        "idle_gpu_seconds": integral("idle"),
        "allocated_idle_gpu_seconds": integral("allocated_idle"),
        "fake_busy_gpu_seconds": integral("fake_busy"),
        "hoarded_memory_byte_seconds": integral("hoarded_memory"),
    }
    # Evaluate at window ends: the value at t covers (t - step, t].
    records: dict[tuple[float, tuple[str, ...]], dict[str, float]] = {}
    for figure, promql in figures.items():
        for first, last in client.chunks(start_s + step_s, end_s + step_s, step_s):
            for series in client.matrix(promql, first, last, step_s):
                labels = series.get("metric", {})
                key = tuple(labels.get(label, "") for label in _ROLLUP_GPU_LABELS)
                for stamp, value in series.get("values", []):
                    records.setdefault((float(stamp) - step_s, key), {})[figure] = float(value)
    return _rollup_frame(mapper, records, list(figures), by)


def _rollup_frame(mapper: SeriesMapper, records: dict[tuple[float, tuple[str, ...]], dict[str, float]],
                  figures: list[str], by: str) -> pd.DataFrame:
    rows = []
    for (stamp, key), values in sorted(records.items(), key=lambda item: (item[0][0], item[0][1])):
        labels = dict(zip(_ROLLUP_GPU_LABELS, key))
        row: dict[str, object]
        if by == "gpu":
            identity = mapper.identity(labels)
            if identity is None:
                continue
            row = dict(zip(IDENTITY_COLUMN_NAMES[1:], identity))
        else:
            namespace = labels["namespace"] or None
            team = mapper.attribution(namespace, None)[0] if mapper.attribution and namespace else None
            row = {"cluster": labels["cluster"] or mapper.cluster, "namespace": namespace, "team": team}
        row["timestamp"] = pd.Timestamp(stamp, unit="s", tz="UTC")
        row.update({figure: values.get(figure, 0.0) for figure in figures})
        rows.append(row)
    identity_columns = list(IDENTITY_COLUMN_NAMES[1:]) if by == "gpu" else ["cluster", "namespace", "team"]
    frame = pd.DataFrame(rows, columns=["timestamp", *identity_columns, *figures])
    for column in identity_columns:
        frame[column] = frame[column].astype("Int64") if column == "gpu_index" else frame[column].astype("category")
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    return frame
