"""The ledger under every report: each classified GPU-interval priced and summed.

Input is fleet samples, either a DataFrame or a :class:`~gpuwarden.store.SamplesSource` read one
UTC day at a time (only the columns in :data:`COLUMNS`), so memory stays flat whatever the window.
Each chunk is turned into numpy arrays sorted by GPU instance and time; the classifier's context
(the last ``window_samples - 1`` samples of every GPU and the start of its current idle stretch) is
carried into the next chunk, so a chunked run gives the same answer as reading everything at once.

Time accounting: a sample stands for the interval since the previous sample of the same GPU (or MIG
instance), ``timestamp - previous``. The first sample of a GPU, and the first after a gap longer
than ``max_gap``, stand for one nominal ``step`` (the median interval unless given). GPU-hours are
weighted by the instance's share of its GPU (:func:`gpuwarden.fleet.semantics.mig_share`: a MIG ``3g``
instance is 3/7), so a GPU's hours add up to the time it was observed whatever its MIG layout. The
ledger keeps sums per instance, not per time, so the siblings of an instance whose profile cannot be
read are the other instances its GPU showed over the window.

The ledger holds sums per (GPU instance, holder pod, state): GPU-hours, used hours (GPU-hours times
activity: the useful SM time where GPM measures it), cost, energy and memory held; and per (time
bucket, state). Every report in :mod:`gpuwarden.analytics.reports` is a groupby over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpuwarden.fleet.vocabulary import PriceTier
from gpuwarden.fleet.semantics import iso_utc, mig_share, profile_slices

from .classifier import Context, activity, classify
from .codes import Registry, arrow_floats, arrow_ns, dense_factorize
from .inventory import Inventory
from .params import STATE_CODES, STATES, AnalyticsError, IdleParams
from .pricebook import PriceBook
from .quality import (
    NON_NEGATIVE_COLUMNS,
    RATIO_COLUMNS,
    QualityCounts,
    count_counter_resets,
    sanitize_arrays,
    sanitize_gauges,
)
from .state_codes import (
    DEFAULT_STEP_NS,
    N_STATES,
    NO_POD,
    UNALLOCATED,
    UNATTRIBUTED,
    UNMEASURED,
)
from .state_codes import NS_PER_SECOND as _S

COLUMNS: tuple[str, ...] = (
    "timestamp", "cluster", "node", "gpu_uuid", "mig_instance", "model", "namespace", "pod", "team", "project",
    "attribution", "gpu_util_ratio", "sm_active_ratio", "mem_used_bytes", "mem_total_bytes", "power_watts",
)
REQUIRED: tuple[str, ...] = ("timestamp", "gpu_uuid", "pod")
IDENTITY = ("cluster", "node", "gpu_uuid", "mig_instance", "model")
HOLDER = ("namespace", "pod", "team", "project")
Local = tuple[np.ndarray, np.ndarray]  # a column's chunk-local codes and the global code of each


@dataclass
class Ledger:
    """Classified, priced GPU time over a window; see the module doc. Hours are GPU-hours."""

    start: pd.Timestamp
    end: pd.Timestamp
    rows: pd.DataFrame
    instances: pd.DataFrame
    timeseries: pd.DataFrame
    quality: dict[str, Any]
    params: IdleParams
    price_book: PriceBook
    bucket: pd.Timedelta
    notes: list[str] = field(default_factory=list)
    """What a reader must know about the window (trimmed to the data, an assumed interval)."""

    @property
    def fleet_cost(self) -> float:
        return float(self.rows["cost"].sum())

    @property
    def gpu_hours(self) -> float:
        return float(self.rows["gpu_hours"].sum())


class LedgerBuilder:
    """Feed chunks of fleet samples with :meth:`add`; :meth:`finish` returns the :class:`Ledger`."""

    def __init__(self, price_book: PriceBook | None = None, inventory: Inventory | None = None,
                 params: IdleParams | None = None, bucket: str | pd.Timedelta = "1h", keep_rows: bool = False,
                 price: bool = True) -> None:
        self.price_book = price_book or PriceBook.default()
        self.inventory = inventory or Inventory.default()
        self.params = params or IdleParams()
        self.bucket = pd.Timedelta(bucket)
        self.keep_rows = keep_rows
        self.price = price
        self.step_ns: int | None = None if self.params.step is None else int(self.params.step.value)
        self.step_assumed = False
        self.fallback_note: str | None = None
        self.counts = QualityCounts()
        self._strings: dict[str, Registry[str]] = {name: Registry() for name in (*IDENTITY, *HOLDER)}
        self._instances: Registry[tuple[int, int]] = Registry()  # (gpu code, mig code) -> instance
        self._holders: Registry[tuple[int, ...]] = Registry()  # (namespace, pod, team, project) codes -> holder
        self._inst_meta: dict[str, list[Any]] = {k: [] for k in ("cluster", "node", "model", "share", "price", "owned", "watts")}
        self._inst_profile: list[str | None] = []  # MIG profile per instance (None: a whole GPU)
        self._gpu_instances: dict[int, list[int]] = {}  # gpu code -> its instance codes
        self._inst_first: list[int] = []
        self._inst_last: list[int] = []
        self._inst_samples: list[int] = []
        self._inst_sm: list[int] = []
        self._tail = Context.empty()
        self._classes: Registry[tuple[float, float, bool]] = Registry()  # (share key, price, owned), for the time series
        self._parts: list[pd.DataFrame] = []
        self._series: list[pd.DataFrame] = []
        self._row_parts: list[pd.DataFrame] = []

    # -- per chunk -------------------------------------------------------------------------------
    def add(self, frame: pd.DataFrame) -> None:
        missing = [c for c in REQUIRED if c not in frame.columns]
        if missing:
            raise AnalyticsError(f"fleet samples lack column(s) {', '.join(missing)}; analytics needs {', '.join(COLUMNS)}")
        self.counts.rows_read += len(frame)
        if frame.empty:
            return
        count_counter_resets(frame, self.counts)
        ts = frame["timestamp"]
        if not isinstance(ts.dtype, pd.DatetimeTZDtype):
            ts = pd.to_datetime(ts, utc=True, errors="coerce")
        ts_ns = pd.DatetimeIndex(ts).tz_convert("UTC").as_unit("ns").asi8
        local = {name: self._strings[name].local(frame, name) for name in (*IDENTITY, *HOLDER)}
        gauges = sanitize_gauges(frame, self.counts)
        positions = frame.index.to_numpy() if self.keep_rows else None
        if "attribution" in frame.columns:
            known = (frame["attribution"].astype(object) == "known").to_numpy(dtype=bool)
        else:
            known = np.zeros(len(frame), bool)
        self._add_arrays(ts_ns, local, gauges, positions, known)

    def add_arrow(self, table: pa.Table) -> None:
        """:meth:`add` for an Arrow table of fleet samples (e.g. :meth:`LocalStore.read_arrow`), with
        no pandas conversion: the same result as ``add(table.to_pandas())``."""
        names = table.column_names
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise AnalyticsError(f"fleet samples lack column(s) {', '.join(missing)}; analytics needs {', '.join(COLUMNS)}")
        n = table.num_rows
        self.counts.rows_read += n
        if n == 0:
            return
        counters = [c for c in names if c.endswith("_total")]
        if counters and "gpu_uuid" in names:
            count_counter_resets(table.select(["timestamp", "gpu_uuid", *counters]).to_pandas(), self.counts)
        local = {name: self._strings[name].local_arrow(table, name) for name in (*IDENTITY, *HOLDER)}
        gauges = sanitize_arrays({name: arrow_floats(table, name) for name in (*RATIO_COLUMNS, *NON_NEGATIVE_COLUMNS)},
                                 self.counts)
        ts_ns = arrow_ns(table.column("timestamp"))
        if "attribution" in names:
            column = table.column("attribution")
            if pa.types.is_dictionary(column.type):
                column = column.cast(column.type.value_type)
            known = pc.fill_null(pc.equal(column.cast(pa.string()), "known"), False).to_numpy(zero_copy_only=False)
        else:
            known = np.zeros(n, bool)
        self._add_arrays(ts_ns, local, gauges, np.arange(n) if self.keep_rows else None, np.asarray(known, bool))

    def _add_arrays(self, ts_ns: np.ndarray, local: dict[str, Local], gauges: dict[str, np.ndarray], positions: np.ndarray | None,
                    known: np.ndarray) -> None:
        bad = (ts_ns == np.iinfo(np.int64).min) | (local["gpu_uuid"][0] < 0)
        any_bad = bool(bad.any())
        if any_bad:
            self.counts.rows_dropped_unidentified += int(bad.sum())
        inst = self._instance_codes(local, bad)
        holder = self._holder_codes(local, bad)
        # No pod label and attribution not known to have answered: nobody could see the holder.
        holder[(holder == NO_POD) & ~known] = UNATTRIBUTED
        if any_bad:
            rows = np.flatnonzero(~bad)
            inst, ts_ns, holder = inst[rows], ts_ns[rows], holder[rows]
            gauges = {k: v[rows] for k, v in gauges.items()}
            positions = positions[rows] if positions is not None else None
        if len(inst):
            self._classify(inst, ts_ns, holder, gauges, positions)

    @staticmethod
    def _global(local: tuple[np.ndarray, np.ndarray], row: int) -> int:
        codes, mapping = local
        return int(mapping[codes[row]]) if codes[row] >= 0 else -1

    def _instance_codes(self, local: dict[str, Local], bad: np.ndarray) -> np.ndarray:
        gpu, mig = local["gpu_uuid"][0].astype(np.int64), local["mig_instance"][0]
        n_mig = len(local["mig_instance"][1]) + 1
        size = (len(local["gpu_uuid"][1]) + 1) * n_mig
        packed = np.maximum(gpu, 0) * n_mig + (mig.astype(np.int64) + 1)
        packed[bad] = size - 1
        inverse, uniques, first = dense_factorize(packed, size)
        mapping = np.full(len(uniques), -1, np.int64)
        for position, row in enumerate(first):
            if bad[row]:
                continue
            key = (self._global(local["gpu_uuid"], row), self._global(local["mig_instance"], row))
            code = self._instances.code(key)
            meta = (self._global(local["cluster"], row), self._global(local["node"], row), self._global(local["model"], row))
            if code == len(self._inst_meta["cluster"]):
                self._new_instance(key, meta)
            elif meta != (self._inst_meta["cluster"][code], self._inst_meta["node"][code], self._inst_meta["model"][code]):
                self._set_instance(code, meta)  # the GPU moved or was relabelled: the latest wins
            mapping[position] = code
        return np.asarray(mapping[inverse], dtype=np.int64)

    def _instance_pricing(self, meta: tuple[int, int, int]) -> tuple[float, bool, float]:
        model = self._strings["model"].values[meta[2]] if meta[2] >= 0 else "(unknown model)"
        node = self._strings["node"].values[meta[1]] if meta[1] >= 0 else "(unknown node)"
        _pool, tier = self.inventory.lookup(node)
        if not self.price:
            return 0.0, False, 0.0
        price = self.price_book.hourly(model, tier)  # raises naming the model
        return price, tier is PriceTier.OWNED, self.price_book.model(model).typical_watts

    def _new_instance(self, key: tuple[int, int], meta: tuple[int, int, int]) -> None:
        mig = self._strings["mig_instance"].values[key[1]] if key[1] >= 0 else None
        price, owned, watts = self._instance_pricing(meta)
        for name, value in zip(("cluster", "node", "model", "share", "price", "owned", "watts"),
                               (*meta, 1.0, price, owned, watts)):
            self._inst_meta[name].append(value)
        self._inst_profile.append(mig)
        siblings = self._gpu_instances.setdefault(key[0], [])
        siblings.append(len(self._inst_profile) - 1)
        for code in siblings:  # a new sibling changes what an unreadable profile is left
            self._inst_meta["share"][code] = self._instance_share(code, siblings)
        self._inst_first.append(np.iinfo(np.int64).max)
        self._inst_last.append(np.iinfo(np.int64).min)
        self._inst_samples.append(0)
        self._inst_sm.append(0)

    def _instance_share(self, code: int, gpu_instances: list[int]) -> float:
        model_code = self._inst_meta["model"][code]
        model = self._strings["model"].values[model_code] if model_code >= 0 else None
        siblings = [self._inst_profile[other] for other in gpu_instances if other != code]
        return mig_share(self._inst_profile[code], model, siblings)

    def _share_key(self, code: int) -> float | int:
        """The share itself where it is settled, else ``-1 - code`` (an unreadable MIG profile,
        whose share may still change as siblings appear; read at :meth:`finish`)."""
        profile = self._inst_profile[code]
        if profile is None or profile_slices(profile) is not None:
            return float(self._inst_meta["share"][code])
        return -1 - code

    def _set_instance(self, code: int, meta: tuple[int, int, int]) -> None:
        price, owned, watts = self._instance_pricing(meta)
        for name, value in zip(("cluster", "node", "model", "price", "owned", "watts"), (*meta, price, owned, watts)):
            self._inst_meta[name][code] = value

    def _holder_codes(self, local: dict[str, Local], bad: np.ndarray) -> np.ndarray:
        pod = local["pod"][0]
        packed = np.zeros(len(pod), np.int64)
        size = 1
        for name in HOLDER:
            width = len(local[name][1]) + 1
            packed *= width
            packed += local[name][0]
            packed += 1
            size *= width
        unheld = bad | (pod < 0)
        packed = np.where(unheld, size, packed)
        inverse, uniques, first = dense_factorize(packed, size + 1)
        mapping = np.array([-1 if unheld[row] else self._holders.code(tuple(self._global(local[n], row) for n in HOLDER))
                            for row in first], dtype=np.int64)
        return np.asarray(mapping[inverse], dtype=np.int64)

    # -- the classifier --------------------------------------------------------------------------
    def _classify(self, inst: np.ndarray, ts: np.ndarray, holder: np.ndarray, gauges: dict[str, np.ndarray],
                  positions: np.ndarray | None) -> None:
        flags = activity(gauges["gpu_util_ratio"], gauges["sm_active_ratio"], self.params)
        with np.errstate(invalid="ignore", divide="ignore"):
            mem_ratio = gauges["mem_used_bytes"] / gauges["mem_total_bytes"]
        n_tail = len(self._tail.inst)
        c = classify(inst, ts, holder, flags, mem_ratio, self._tail, self.params, self.step_ns)
        self._tail = c.context
        self.counts.duplicate_rows += c.duplicates
        if self.step_ns is None:
            if c.step_measured:
                self.step_ns = c.step_ns
            else:
                self.step_assumed = True  # said in a note
        # This chunk's rows, in (instance, time) order. Carried rows stay in the arrays (masking
        # ten arrays costs more than the sums) and are left out of every sum.
        carried = c.carried if n_tail else None
        self.counts.gaps += int(c.gap.sum())
        gap_ns = np.where(c.gap, c.dt - c.step_ns, 0)
        rows = np.where(c.carried, 0, c.src) if n_tail else c.src
        measured_rows = flags.measured[rows]
        if n_tail:
            measured_rows &= ~c.carried
        self._update_instances(c.inst, c.ts, measured_rows, c.group_start, carried)
        self._aggregate(c.inst, c.ts, c.holder, c.state, c.dur, gap_ns, c.act, measured_rows,
                        gauges["mem_used_bytes"][rows], gauges["power_watts"][rows], carried)
        if self.keep_rows:
            assert positions is not None  # given whenever rows are kept
            mine = ~c.carried
            self._row_parts.append(pd.DataFrame({
                "position": positions[c.src[mine]], "inst": c.inst[mine], "timestamp_ns": c.ts[mine],
                "state": c.state[mine], "duration_seconds": c.dur[mine] / _S, "activity": c.act[mine],
                "sm_measured": measured_rows[mine],
            }))

    def add_rollup(self, frame: pd.DataFrame, resolution: pd.Timedelta) -> None:
        """Rows already classified by the recording rules (``PrometheusSource.read_state_rollup``):
        per bucket, GPU, holder and state, the seconds, used seconds, energy and memory held. They
        go into the same sums as classified samples, so every report reads them unchanged."""
        self.counts.rows_read += len(frame)
        if frame.empty:
            return
        self.step_ns = int(pd.Timedelta(resolution).value)
        local = {name: self._strings[name].local(frame, name) for name in (*IDENTITY, *HOLDER)}
        state = frame["state"].astype(object).map(STATE_CODES).to_numpy(dtype="float64", na_value=np.nan)
        bad = (local["gpu_uuid"][0] < 0) | np.isnan(state)
        if bad.any():
            self.counts.rows_dropped_unidentified += int(bad.sum())
        inst = self._instance_codes(local, bad)
        holder = self._holder_codes(local, bad)
        state = np.nan_to_num(state, nan=UNALLOCATED).astype(np.int8)
        # The rules called it unallocated only where attribution answered; any other pod-less row
        # was classified by activity alone.
        holder[(holder == NO_POD) & (state != UNALLOCATED)] = UNATTRIBUTED
        keep = np.flatnonzero(~bad)
        ts = pd.DatetimeIndex(frame["timestamp"]).as_unit("ns").asi8[keep]
        inst, holder, state = inst[keep], holder[keep], state[keep]
        seconds = frame["seconds"].to_numpy(dtype=np.float64)[keep]
        with np.errstate(invalid="ignore", divide="ignore"):
            per_second = {name: frame[name].to_numpy(dtype=np.float64)[keep] / seconds
                          for name in ("used_seconds", "energy_joules", "memory_byte_seconds")}
        order = np.lexsort((ts, inst))
        inst, ts, holder, state, seconds = inst[order], ts[order], holder[order], state[order], seconds[order]
        per_second = {name: values[order] for name, values in per_second.items()}
        samples = np.maximum(np.round(seconds * _S / self.step_ns), 1).astype(np.int64)
        self._aggregate(inst, ts, holder, state, seconds * _S, np.zeros(len(inst), np.int64), per_second["used_seconds"],
                        np.ones(len(inst), bool), per_second["memory_byte_seconds"], per_second["energy_joules"])
        # First and last sample of each instance: a bucket's first rollup ends one rollup after its
        # start; its last ends at the bucket's end at the latest.
        bucket_ns = int(self.bucket.value)
        table = pd.DataFrame({"inst": inst, "ts": ts, "samples": samples}).groupby("inst").agg(
            first=("ts", "min"), last=("ts", "max"), samples=("samples", "sum"))
        for code, first, last, count in zip(table.index.tolist(), table["first"].tolist(), table["last"].tolist(),
                                            table["samples"].tolist()):
            first, last = first + self.step_ns, last + bucket_ns - self.step_ns
            self._inst_first[code] = min(self._inst_first[code], first)
            self._inst_last[code] = max(self._inst_last[code], last)
            self._inst_samples[code] += count
            self._inst_sm[code] += count

    def _update_instances(self, inst: np.ndarray, ts: np.ndarray, measured: np.ndarray, group_start: np.ndarray,
                          carried: np.ndarray | None = None) -> None:
        """First and last timestamps and sample counts per instance; rows are sorted by (instance,
        time) and ``group_start`` is where each instance's rows begin (carried rows first)."""
        if not len(inst):
            return
        uniques = inst[group_start]
        group_end = np.r_[group_start[1:], len(inst)]  # exclusive
        counts = group_end - group_start
        sm_counts = np.add.reduceat(measured.view(np.int8), group_start, dtype=np.int64)
        first_idx = group_start
        if carried is not None:  # carried rows come first in their instance: skip them
            held = np.bincount(np.searchsorted(group_start, np.flatnonzero(carried), "right") - 1, minlength=len(group_start))
            counts = counts - held
            first_idx = group_start + held
        first_ts = ts[np.minimum(first_idx, len(ts) - 1)]
        last_ts = ts[group_end - 1]
        for code, first, last, c, sm in zip(uniques.tolist(), first_ts.tolist(), last_ts.tolist(), counts.tolist(),
                                            sm_counts.tolist()):
            if c == 0:
                continue
            if first < self._inst_first[code]:
                self._inst_first[code] = first
            if last > self._inst_last[code]:
                self._inst_last[code] = last
            self._inst_samples[code] += c
            self._inst_sm[code] += sm

    def _aggregate(self, inst: np.ndarray, ts: np.ndarray, holder: np.ndarray, state: np.ndarray, dur: np.ndarray,
                   gap_ns: np.ndarray, act: np.ndarray, measured: np.ndarray, mem_used: np.ndarray, power: np.ndarray,
                   carried: np.ndarray | None = None) -> None:
        """Sums per (instance, holder, state) and per (time bucket, state, price class).

        Rows are in (instance, time) order, so equal keys come in runs: sums are taken per run first
        (``np.add.reduceat``), then grouped. Per-row work is kept to durations; the instance's GPU
        share and price are applied to the sums. Rows flagged ``carried`` get the key -1 and their
        sums are dropped."""
        n_holders = len(self._holders.values) + 2  # pods, NO_POD and UNATTRIBUTED
        key = inst * n_holders
        key += holder
        key += 2
        key *= N_STATES
        key += state
        if carried is not None:
            key[carried] = -1
        bucket_ns = int(self.bucket.value)
        buckets = ts // bucket_ns
        change = np.empty(len(key), bool)
        change[0] = True
        np.not_equal(key[1:], key[:-1], out=change[1:])
        change[1:] |= buckets[1:] != buckets[:-1]
        starts = np.flatnonzero(change)
        nan_act = np.isnan(act)
        act0 = np.fmax(act, 0.0)  # NaN -> 0
        np.minimum(act0, 1.0, out=act0)
        power_nan = np.isnan(power)
        if power_nan.any():  # no power reading: the model's typical watts times the instance's share
            typical = np.asarray(self._inst_meta["watts"], dtype=np.float64) * np.asarray(self._inst_meta["share"], dtype=np.float64)
            watts = power.copy()
            watts[power_nan] = typical[inst[power_nan]]
        else:
            watts = power
        dur = dur.astype(np.float64)
        runs = {
            "dur": np.add.reduceat(dur, starts),
            "dur_act": np.add.reduceat(np.multiply(dur, act0, out=act0), starts),
            "dur_watts": np.add.reduceat(dur * watts, starts),
            "dur_fallback": np.add.reduceat(np.where(measured | nan_act, 0.0, dur), starts),
            "dur_mem": np.add.reduceat(dur * np.fmax(mem_used, 0.0), starts),  # NaN -> 0 (never negative here)
            "gap": np.add.reduceat(gap_ns.astype(np.float64), starts) if gap_ns.any() else np.zeros(len(starts)),
            "samples": np.diff(np.r_[starts, len(key)]).astype(np.float64),
        }
        run_key = key[starts]
        valid = run_key >= 0
        run_key, run_inst, run_state, run_bucket = run_key[valid], inst[starts][valid], state[starts][valid], buckets[starts][valid]
        runs = {name: values[valid] for name, values in runs.items()}

        codes, uniques = pd.factorize(run_key)
        size = len(uniques)
        uniques = np.asarray(uniques, dtype=np.int64)
        sums = {name: np.bincount(codes, weights=values, minlength=size) for name, values in runs.items()}
        part = pd.DataFrame({"inst": uniques // N_STATES // n_holders, "holder": uniques // N_STATES % n_holders - 2,
                             "state": uniques % N_STATES, **sums})
        self._parts.append(part)
        self.counts.unmeasured_samples += int(part.loc[part["state"] == UNMEASURED, "samples"].sum())

        # Time series: per (bucket, state, instance price class); share and price applied later.
        if not len(run_key):
            return
        klass = self._price_class(run_inst)
        n_class = len(self._classes.values)
        base = int(run_bucket.min())
        run_unattributed = (holder[starts][valid] == UNATTRIBUTED).astype(np.int64)
        key = (((run_bucket - base) * N_STATES + run_state) * 2 + run_unattributed) * n_class + klass
        codes, uniques = pd.factorize(key)
        size = len(uniques)
        uniques = np.asarray(uniques, dtype=np.int64)
        self._series.append(pd.DataFrame({
            "bucket_ns": (uniques // n_class // 2 // N_STATES + base) * bucket_ns,
            "state": uniques // n_class // 2 % N_STATES, "unattributed": (uniques // n_class % 2).astype(bool),
            "klass": uniques % n_class,
            **{name: np.bincount(codes, weights=runs[name], minlength=size) for name in ("dur", "dur_act", "dur_watts")},
        }))

    def _price_class(self, inst: np.ndarray) -> np.ndarray:
        """Instances with the same (share, price, owned) share a class: the time series keeps
        classes instead of instances."""
        meta = self._inst_meta
        mapping = np.array([self._classes.code((self._share_key(i), meta["price"][i], meta["owned"][i]))
                            for i in range(len(meta["share"]))], dtype=np.int64)
        return np.asarray(mapping[inst], dtype=np.int64)

    # -- result ----------------------------------------------------------------------------------
    def finish(self, start: pd.Timestamp | None = None, end: pd.Timestamp | None = None) -> Ledger:
        step = pd.Timedelta(self.step_ns or DEFAULT_STEP_NS, unit="ns")
        params = replace(self.params, step=step, max_gap=self.params.resolved_max_gap(step))
        instances = self._instance_table()
        notes: list[str] = [self.fallback_note] if self.fallback_note else []
        if self.step_assumed and self.step_ns is None:
            notes.append(f"every GPU has a single sample in the window, so each stands for {step.total_seconds():g} s "
                         "(the default interval); widen the window (--since) for a measured one")
        requested = (start, end)
        if len(instances):
            # The window covered by data: its first sample stands for one step before it, its last
            # ends one step after. A window asked wider (--since 7d over 2 days) is trimmed, so
            # averages over time (GPUs in the inventory, buy vs rent) are not diluted by empty days.
            covered_start = instances["first_seen"].min() - step
            covered_end = instances["last_seen"].max() + step
            if start is None or pd.Timestamp(start) < covered_start:
                start = covered_start if start is not None else instances["first_seen"].min()
            if end is None or pd.Timestamp(end) > covered_end:
                end = covered_end
        else:
            start = start if start is not None else pd.Timestamp(0, tz="UTC")
            end = end if end is not None else start
        start, end = pd.Timestamp(start), pd.Timestamp(end)
        if requested[0] is not None and requested[1] is not None and (start, end) != tuple(pd.Timestamp(t) for t in requested):
            notes.append(f"window trimmed to the data held: asked {iso_utc(requested[0])} to {iso_utc(requested[1])}, "
                         f"reported {iso_utc(start)} to {iso_utc(end)} ({(end - start).total_seconds() / 3600:.2f} h)")
        rows = self._ledger_rows(instances)
        series = self._series_table()
        late = instances[instances["first_seen"] > start + params.max_gap]
        early = instances[instances["last_seen"] < end - params.max_gap - step]
        quality = {
            "rows_read": self.counts.rows_read,
            "rows_dropped_unidentified": self.counts.rows_dropped_unidentified,
            "duplicate_rows": self.counts.duplicate_rows,
            "negative_values": dict(self.counts.negative_values),
            "out_of_range_values": dict(self.counts.out_of_range_values),
            "gaps": self.counts.gaps,
            "gap_gpu_hours": float(rows["gap_hours"].sum()),
            "unmeasured_samples": self.counts.unmeasured_samples,
            "unmeasured_gpu_hours": float(rows.loc[rows["state"] == "unmeasured", "gpu_hours"].sum()),
            "counter_resets": dict(self.counts.counter_resets),
            "gpus_appearing_late": sorted(set(late["gpu_uuid"].astype(str))),
            "gpus_leaving_early": sorted(set(early["gpu_uuid"].astype(str))),
            "step_seconds": step.total_seconds(),
            "source": "samples",
        }
        quality["step_assumed"] = bool(self.step_assumed and self.step_ns is None)
        ledger = Ledger(start, end, rows, instances, series, quality, params, self.price_book, self.bucket, notes)
        if self.keep_rows:
            ledger.classified = self._classified(instances)  # type: ignore[attr-defined]
        return ledger

    def _instance_table(self) -> pd.DataFrame:
        keys = self._instances.values
        strings = self._strings

        def name(registry: str, code: int) -> str | None:
            return strings[registry].values[code] if code >= 0 else None

        nodes = [name("node", c) for c in self._inst_meta["node"]]
        lookups = [self.inventory.lookup(n or "") for n in nodes]
        samples = np.asarray(self._inst_samples, dtype=np.int64)
        sm = np.asarray(self._inst_sm, dtype=np.int64)
        source = np.where(sm == samples, "sm_active", np.where(sm == 0, "gpu_util_fallback", "mixed"))
        frame = pd.DataFrame({
            "inst": np.arange(len(keys), dtype=np.int64),
            "cluster": [name("cluster", c) for c in self._inst_meta["cluster"]],
            "node": nodes,
            "gpu_uuid": [name("gpu_uuid", k[0]) for k in keys],
            "mig_instance": [name("mig_instance", k[1]) for k in keys],
            "model": [name("model", c) for c in self._inst_meta["model"]],
            "pool": [lookup[0] for lookup in lookups],
            "tier": [lookup[1].value for lookup in lookups],
            "share": np.asarray(self._inst_meta["share"], dtype=np.float64),
            "price_per_hour": np.asarray(self._inst_meta["price"], dtype=np.float64),
            "first_seen": pd.to_datetime(np.asarray(self._inst_first, dtype=np.int64), utc=True),
            "last_seen": pd.to_datetime(np.asarray(self._inst_last, dtype=np.int64), utc=True),
            "samples": samples,
            "sm_samples": sm,
            "activity_source": source,
        })
        return frame

    def _ledger_rows(self, instances: pd.DataFrame) -> pd.DataFrame:
        raw_columns = ["dur", "dur_act", "dur_watts", "dur_fallback", "dur_mem", "gap", "samples"]
        if self._parts:
            parts = pd.concat(self._parts, ignore_index=True)
            parts = parts.groupby(["inst", "holder", "state"], sort=True, as_index=False)[raw_columns].sum()
        else:
            parts = pd.DataFrame({c: pd.Series(dtype="int64" if c in ("inst", "holder", "state") else "float64")
                                  for c in ["inst", "holder", "state", *raw_columns]})
        meta = instances.set_index("inst")
        inst = parts["inst"].to_numpy()
        out = pd.DataFrame({c: meta[c].reindex(inst).to_numpy() for c in
                            ("cluster", "node", "gpu_uuid", "mig_instance", "model", "pool", "tier")})
        holders = self._holders.values
        for position, column in enumerate(HOLDER):
            registry = self._strings[column]
            out[column] = [None if h < 0 or holders[h][position] < 0 else registry.values[holders[h][position]]
                           for h in parts["holder"]]
        out["state"] = pd.Categorical.from_codes(parts["state"].astype(int), categories=list(STATES))
        # False where nobody could see who held the GPU (no pod label, attribution off or failed).
        out["attributed"] = parts["holder"].to_numpy() != UNATTRIBUTED
        share = meta["share"].reindex(inst).to_numpy(dtype=np.float64)
        price = meta["price_per_hour"].reindex(inst).to_numpy(dtype=np.float64)
        owned = np.asarray(self._inst_meta["owned"], dtype=bool)[inst] if len(inst) else np.zeros(0, bool)
        to_hours = 1.0 / (3600.0 * _S)
        hours = parts["dur"].to_numpy() * to_hours
        energy = parts["dur_watts"].to_numpy() * to_hours / 1000.0
        out["gpu_hours"] = share * hours
        out["hours"] = hours
        out["used_hours"] = share * parts["dur_act"].to_numpy() * to_hours
        out["cost"] = share * hours * price + np.where(owned, energy * self.price_book.energy_price_per_kwh(), 0.0)
        out["energy_kwh"] = energy
        out["fallback_hours"] = share * parts["dur_fallback"].to_numpy() * to_hours
        out["mem_gib_hours"] = parts["dur_mem"].to_numpy() * to_hours / 2**30
        out["gap_hours"] = share * parts["gap"].to_numpy() * to_hours
        out["samples"] = parts["samples"].to_numpy().astype(np.int64)
        # A deterministic order whatever the chunking (codes follow first appearance).
        order = ["gpu_uuid", "mig_instance", "namespace", "pod", "team", "project"]
        keys = out[order].astype(object).fillna("").astype(str)
        keys["state"] = parts["state"].to_numpy()
        if not len(out):
            return out
        priority = [*order, "state"]
        ranks = np.lexsort(tuple(keys[c].to_numpy() for c in reversed(priority)))
        return out.iloc[ranks].reset_index(drop=True)

    def _series_table(self) -> pd.DataFrame:
        if not self._series:
            return pd.DataFrame({"bucket": pd.Series(dtype="datetime64[ns, UTC]"), "state": pd.Series(dtype="object"),
                                 "attributed": pd.Series(dtype=bool), "gpu_hours": [], "used_hours": [], "cost": []})
        series = pd.concat(self._series, ignore_index=True)
        classes = self._classes.values
        klass = series["klass"].to_numpy()
        shares = self._inst_meta["share"]
        share = np.array([c[0] if c[0] >= 0 else shares[int(-1 - c[0])] for c in classes], dtype=np.float64)[klass]
        price = np.array([c[1] for c in classes], dtype=np.float64)[klass]
        owned = np.array([c[2] for c in classes], dtype=bool)[klass]
        to_hours = 1.0 / (3600.0 * _S)
        gpu_hours = share * series["dur"].to_numpy() * to_hours
        energy = series["dur_watts"].to_numpy() * to_hours / 1000.0
        work = pd.DataFrame({
            "bucket_ns": series["bucket_ns"], "state": series["state"], "attributed": ~series["unattributed"].to_numpy(),
            "gpu_hours": gpu_hours,
            "used_hours": share * series["dur_act"].to_numpy() * to_hours,
            "cost": gpu_hours * price + np.where(owned, energy * self.price_book.energy_price_per_kwh(), 0.0),
        })
        work = work.groupby(["bucket_ns", "state", "attributed"], sort=True, as_index=False)[["gpu_hours", "used_hours", "cost"]].sum()
        work.insert(0, "bucket", pd.to_datetime(work.pop("bucket_ns"), utc=True))
        work["state"] = pd.Categorical.from_codes(work["state"].astype(int), categories=list(STATES))
        return work

    def _classified(self, instances: pd.DataFrame) -> pd.DataFrame:
        rows = pd.concat(self._row_parts, ignore_index=True) if self._row_parts else pd.DataFrame(
            {"position": [], "inst": [], "timestamp_ns": [], "state": [], "duration_seconds": [], "activity": [], "sm_measured": []})
        meta = instances.set_index("inst")
        out = pd.DataFrame({
            # An array, not a Series: a Series would be aligned on the row positions of the index.
            "timestamp": pd.DatetimeIndex(pd.to_datetime(rows["timestamp_ns"].to_numpy(np.int64), utc=True)),
            "gpu_uuid": meta["gpu_uuid"].reindex(rows["inst"]).to_numpy(),
            "mig_instance": meta["mig_instance"].reindex(rows["inst"]).to_numpy(),
            "node": meta["node"].reindex(rows["inst"]).to_numpy(),
            "state": pd.Categorical.from_codes(rows["state"].astype(int), categories=list(STATES)),
            "duration_seconds": rows["duration_seconds"].to_numpy(),
            "activity": rows["activity"].to_numpy(),
            "activity_source": np.where(rows["sm_measured"].astype(bool), "sm_active", "gpu_util_fallback"),
        }, index=rows["position"].to_numpy())
        return out
