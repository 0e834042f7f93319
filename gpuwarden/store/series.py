"""Exported series -> fleet-samples rows: the metric catalogue inverted, for the scraper and Prometheus.

Series become fleet-samples rows through the metric catalogue (``gpuwarden/fleet/
metric_catalogue.csv``), inverted here, so that the scraper and :class:`~gpuwarden.store.
prometheus.PrometheusSource` turn the very same series into the very same rows:

- a ``value`` row gives its column as ``value / scale``;
- a ``pattern`` row gives the column its label fills in (``gpuwarden_xid_errors_total{xid="48"}``
  -> ``xid_48_total``);
- the ``bits`` row (throttle reasons) gives ``throttle_reasons_bitmask`` back as the OR of the bits
  whose series read 1;
- ``mem_total_bytes`` is ``FB_USED + FB_FREE`` (the derived ``mem_free_bytes`` source) unless the
  catalogue exports it directly;
- identity comes from the DCGM labels: ``node`` (else ``Hostname``) -> node, ``UUID`` -> gpu_uuid, ``gpu`` ->
  gpu_index, ``modelName`` -> model, ``GPU_I_ID``/``GPU_I_PROFILE`` -> mig_instance ("1:3g.40gb"),
  ``pod``/``namespace`` as they are (empty -> null), also on dcgm-exporter's DRA series
  (``--kubernetes-enable-dra``: ``dra_claim_*`` labels besides; ``dra_claim_namespace`` /
  ``dra_claim_name`` -> dra_claim "<namespace>/<name>", gpuwarden's exporter writes the same labels),
  except where ``dra_mig_device_uuid`` marks a whole GPU's series copied for a pod holding one of its
  MIG devices: that pod does not hold the GPU, so the row has no pod and no claim. ``cluster`` is a ``cluster`` label when the
  series has one (a Prometheus target or external label), else the ``cluster`` you give.
  ``team``/``project`` are ``team``/``project`` labels when present, else ``attribution(namespace,
  pod)``; the default attribution charges a pod's namespace as its team (namespace-per-team).

``attribution`` is the ``state`` label of ``gpuwarden_pod_attribution_state`` (known | off |
failed) where the exporter serves it; without that series a pod label proves attribution answered
("known") and a GPU without one is null (not recorded; analytics reads it as "off").

``gpuwarden_gpu_lost`` feeds no column but makes the row exist: a lost GPU is a row of nulls (its
memory total carried from its other rows), as the simulator and the local store have it. Series
the catalogue does not name (exporter self-metrics) are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwarden.fleet import ATTRIBUTION_STATES, IDENTITY_COLUMN_NAMES, METRIC_COLUMN_NAMES, THROTTLE_REASONS
from gpuwarden.fleet.catalogue import MetricSpec, load_catalogue

from .schema import PANDAS_DTYPES, empty_samples

Attribution = Callable[[str | None, str | None], "tuple[str | None, str | None]"]
_MIB_FREE = "mem_free_bytes"
# Where two attribution states meet in one row (the state changed within a step), the worse wins.
_STATE_ORDER: tuple[str, ...] = ("known", "off", "failed")
_STATE_RANK: dict[str, int] = {name: rank for rank, name in enumerate(_STATE_ORDER)}
assert set(_STATE_ORDER) == set(ATTRIBUTION_STATES)


def namespace_is_team(namespace: str | None, pod: str | None) -> tuple[str | None, str | None]:
    """Default attribution: a pod's namespace is the team it is charged to; no project."""
    return namespace, None


@dataclass(frozen=True)
class _Target:
    kind: str  # value | pattern | bits | mem_free | presence | state
    spec: MetricSpec
    column: str | None = None


class SeriesMapper:
    """The metric catalogue inverted: exported series -> fleet-samples identity and columns."""

    def __init__(
        self,
        catalogue: Sequence[MetricSpec] | None = None,
        *,
        cluster: str = "default",
        attribution: Attribution | None = namespace_is_team,
    ) -> None:
        self.catalogue = tuple(catalogue) if catalogue is not None else load_catalogue()
        self.cluster = cluster
        self.attribution = attribution
        self._targets: dict[str, _Target] = {}
        direct = {spec.source_column for spec in self.catalogue if spec.transform == "value"}
        for spec in self.catalogue:
            if spec.metric in self._targets:
                continue
            if spec.transform == "value" and spec.source_column in METRIC_COLUMN_NAMES:
                if spec.source_column not in {t.column for t in self._targets.values()}:
                    self._targets[spec.metric] = _Target("value", spec, spec.source_column)
            elif spec.transform == "value" and spec.source_column == "gpu_lost":
                # No column, but a lost GPU's row must exist (with nulls), as in the local store.
                self._targets[spec.metric] = _Target("presence", spec)
            elif spec.transform == "value" and spec.source_column == _MIB_FREE and "mem_total_bytes" not in direct:
                self._targets[spec.metric] = _Target("mem_free", spec)
            elif spec.transform == "pattern":
                self._targets[spec.metric] = _Target("pattern", spec)
            elif spec.transform == "bits" and spec.source_column == "throttle_reasons_bitmask":
                self._targets[spec.metric] = _Target("bits", spec, "throttle_reasons_bitmask")
            elif spec.transform == "state" and spec.source_column == "attribution":
                self._targets[spec.metric] = _Target("state", spec, "attribution")
        self._identity_cache: dict[tuple, tuple] = {}

    # -- which series ---------------------------------------------------------------------------
    def target(self, metric: str) -> _Target | None:
        return self._targets.get(metric)

    def metrics_for(self, columns: Iterable[str] | None = None) -> list[str]:
        """Exported metric names needed to fill ``columns`` (all metric columns when None)."""
        wanted = set(METRIC_COLUMN_NAMES if columns is None else columns)
        names = []
        for metric, target in self._targets.items():
            if target.kind in ("value", "bits") and target.column in wanted:
                names.append(metric)
            elif target.kind == "mem_free" and "mem_total_bytes" in wanted:
                names.append(metric)
            elif target.kind == "pattern" and any(target.spec.source_regex().match(c) for c in wanted):
                names.append(metric)
        names += [m for m, t in self._targets.items() if t.kind == "presence"]
        if "mem_total_bytes" in wanted:  # FB_USED is half of mem_total_bytes
            used = [m for m, t in self._targets.items() if t.column == "mem_used_bytes"]
            names += [m for m in used if m not in names]
        return names

    def state_metrics(self) -> list[str]:
        """Exported metric names that fill the ``attribution`` column."""
        return [m for m, t in self._targets.items() if t.kind == "state"]

    def column_of(self, metric: str, labels: Mapping[str, str]) -> str | None:
        """The samples column one series feeds (None for bits / derived / unknown)."""
        target = self._targets.get(metric)
        if target is None:
            return None
        if target.kind == "value":
            return target.column
        if target.kind == "pattern":
            key = labels.get(target.spec.label)
            if key is None:
                return None
            head, _, tail = target.spec.source_column.partition("*")
            column = f"{head}{key}{tail}"
            return column if column in METRIC_COLUMN_NAMES else None
        return None

    # -- identity -------------------------------------------------------------------------------
    def identity(self, labels: Mapping[str, str]) -> tuple | None:
        """(cluster, node, gpu_uuid, gpu_index, model, mig_instance, namespace, pod, dra_claim, team, project,
        attribution), or None for a series that names no GPU."""
        key = (
            labels.get("cluster", ""), labels.get("node") or labels.get("Hostname", ""), labels.get("UUID", ""),
            labels.get("gpu", ""), labels.get("modelName", ""), labels.get("GPU_I_ID", ""),
            labels.get("GPU_I_PROFILE", ""), labels.get("namespace", ""), labels.get("pod", ""),
            labels.get("team", ""), labels.get("project", ""), labels.get("dra_mig_device_uuid", ""),
            labels.get("dra_claim_namespace", ""), labels.get("dra_claim_name", ""),
        )
        cached = self._identity_cache.get(key)
        if cached is not None:
            return cached
        cluster, node, uuid, gpu, model, mig_id, mig_profile, namespace, pod, team, project, dra_mig, claim_ns, claim = key
        if not uuid or not node:
            return None
        try:
            index = int(gpu)
        except ValueError:
            return None
        mig = f"{mig_id}:{mig_profile}" if mig_id else None
        if dra_mig and not mig_id:  # dcgm-exporter's DRA copy of a whole GPU's series for a MIG device's pod
            namespace = pod = claim = ""
        claim_v = f"{claim_ns or namespace}/{claim}" if claim else None
        namespace_v, pod_v = namespace or None, pod or None
        team_v, project_v = team or None, project or None
        if (team_v is None or project_v is None) and self.attribution is not None and (namespace_v or pod_v):
            guess_team, guess_project = self.attribution(namespace_v, pod_v)
            team_v = team_v if team_v is not None else guess_team
            project_v = project_v if project_v is not None else guess_project
        # A pod label proves attribution answered; without one nobody can tell "no pod" from "not looked".
        attribution = "known" if pod_v else None
        identity = (cluster or self.cluster, node, uuid, index, model, mig, namespace_v, pod_v, claim_v, team_v, project_v,
                    attribution)
        if len(self._identity_cache) > 200_000:
            self._identity_cache.clear()
        self._identity_cache[key] = identity
        return identity


class FrameAssembler:
    """Collects series (label set, timestamps, values) and pivots them into fleet-samples rows.

    Rows are keyed by (identity, timestamp); every distinct identity (a GPU with a given pod) is
    its own row, as the exporter's series are. Vectorised, so a Prometheus range read of millions
    of points assembles in numpy, not in a Python loop per point.
    """

    def __init__(self, mapper: SeriesMapper) -> None:
        self.mapper = mapper
        self._identities: dict[tuple, int] = {}
        self._parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self._bits: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._presence: list[tuple[np.ndarray, np.ndarray]] = []
        self._states: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, metric: str, labels: Mapping[str, str], times_ns: np.ndarray, values: np.ndarray) -> None:
        target = self.mapper.target(metric)
        if target is None or len(values) == 0:
            return
        identity = self.mapper.identity(labels)
        if identity is None:
            return
        ident = self._identities.setdefault(identity, len(self._identities))
        ids = np.full(len(values), ident, dtype=np.int64)
        times_ns = np.asarray(times_ns, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        ok = ~np.isnan(values)
        if not ok.all():
            ids, times_ns, values = ids[ok], times_ns[ok], values[ok]
        if target.kind == "presence":
            self._presence.append((ids, times_ns))
            return
        if target.kind == "state":
            state = labels.get(target.spec.label, "")
            if state in _STATE_RANK and values.size:
                live = values >= 0.5  # only the current state's series reads 1
                self._states.append((ids[live], times_ns[live], np.full(int(live.sum()), _STATE_RANK[state], np.int8)))
            return
        if target.kind == "bits":
            bit = THROTTLE_REASONS.get(labels.get(target.spec.label, ""))
            if bit is None:
                return
            scaled = values / target.spec.scale
            self._bits.append((ids, times_ns, np.where(scaled >= 0.5, bit, 0).astype(np.int64)))
            return
        column = _MIB_FREE if target.kind == "mem_free" else self.mapper.column_of(metric, labels)
        if column is None:
            return
        self._parts.setdefault(column, []).append((ids, times_ns, values / target.spec.scale))

    def frame(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The fleet-samples table (schema dtypes), sorted by time then identity."""
        wanted = list(columns) if columns is not None else list(PANDAS_DTYPES)
        pieces = [p for parts in self._parts.values() for p in parts] + self._bits + self._presence
        if not pieces:
            return empty_samples()[wanted]
        ids = np.concatenate([p[0] for p in pieces])
        times = np.concatenate([p[1] for p in pieces])
        n_ident = max(1, len(self._identities))
        base_times = np.unique(times)
        # One int64 key per row, time-major and identity-minor, so sorted keys are sorted rows.
        row_keys = np.unique(np.searchsorted(base_times, times).astype(np.int64) * n_ident + ids)
        row_ids, row_times = row_keys % n_ident, base_times[row_keys // n_ident]
        n = row_keys.size

        def positions(part_ids: np.ndarray, part_times: np.ndarray) -> np.ndarray:
            return np.searchsorted(row_keys, np.searchsorted(base_times, part_times).astype(np.int64) * n_ident + part_ids)

        out: dict[str, object] = {}
        values: dict[str, np.ndarray] = {}
        for column, parts in self._parts.items():
            array = np.full(n, np.nan)
            for part_ids, part_times, part_values in parts:
                array[positions(part_ids, part_times)] = part_values
            values[column] = array
        if "mem_total_bytes" not in values and "mem_used_bytes" in values and _MIB_FREE in values:
            values["mem_total_bytes"] = values["mem_used_bytes"] + values[_MIB_FREE]
        if self._bits:
            mask = np.full(n, -1, dtype=np.int64)
            for part_ids, part_times, part_bits in self._bits:
                where = positions(part_ids, part_times)
                mask[where] = np.where(mask[where] < 0, 0, mask[where])
                np.bitwise_or.at(mask, where, part_bits)
            values["throttle_reasons_bitmask"] = mask.astype("float64")
            values["throttle_reasons_bitmask"][mask < 0] = np.nan
        identities = list(self._identities)
        out["timestamp"] = pd.DatetimeIndex(row_times.astype("datetime64[ns]")).tz_localize("UTC")
        for position, name in enumerate(IDENTITY_COLUMN_NAMES[1:]):
            per_identity = [identity[position] for identity in identities]
            if name == "gpu_index":
                out[name] = pd.array(np.asarray(per_identity, dtype=np.int64)[row_ids], dtype="Int64")
                continue
            categories = sorted({v for v in per_identity if v is not None})
            lookup = {v: i for i, v in enumerate(categories)}
            codes = np.array([lookup.get(v, -1) if v is not None else -1 for v in per_identity], dtype=np.int64)
            out[name] = pd.Categorical.from_codes(codes[row_ids], categories=categories)
        if self._states and "attribution" in out:
            out["attribution"] = self._attribution(out["attribution"], row_keys, base_times, n_ident)
        for name in METRIC_COLUMN_NAMES:
            array = values.get(name, np.full(n, np.nan))
            out[name] = pd.array(np.round(array), dtype="Float64").astype("Int64") if PANDAS_DTYPES[name] == "Int64" else array
        frame = pd.DataFrame(out)
        if "mem_total_bytes" in wanted and frame["mem_total_bytes"].isna().any():
            # A GPU that answered without memory figures (lost) keeps its known total; rows of a
            # GPU whose total was never seen in this batch cannot be rows (the column is required).
            known = frame.groupby("gpu_uuid", sort=False, observed=True)["mem_total_bytes"].transform(lambda s: s.ffill().bfill())
            frame["mem_total_bytes"] = known
            frame = frame[frame["mem_total_bytes"].notna()].reset_index(drop=True)
        return frame[wanted]


    def _attribution(self, default: pd.Categorical, row_keys: np.ndarray, base_times: np.ndarray, n_ident: int) -> pd.Categorical:
        """The ``attribution`` column: the exporter's state series where a row has one (state
        points make no rows of their own), else the identity's default."""
        rank = np.full(len(row_keys), -1, np.int8)
        for ids, times, ranks in self._states:
            where = np.searchsorted(base_times, times)
            known_time = where < len(base_times)
            where = np.minimum(where, len(base_times) - 1)
            known_time &= base_times[where] == times
            keys = where.astype(np.int64) * n_ident + ids
            position = np.minimum(np.searchsorted(row_keys, keys), len(row_keys) - 1)
            hit = known_time & (row_keys[position] == keys)
            np.maximum.at(rank, position[hit], ranks[hit])
        fallback = np.asarray(default.astype(object), dtype=object)
        chosen = np.where(rank >= 0, np.array(_STATE_ORDER, dtype=object)[np.maximum(rank, 0)], fallback)
        categories = sorted({v for v in chosen if v is not None})
        lookup = {v: i for i, v in enumerate(categories)}
        return pd.Categorical.from_codes([lookup[v] if v is not None else -1 for v in chosen], categories=categories)

__all__ = ["Attribution", "FrameAssembler", "SeriesMapper", "namespace_is_team"]
