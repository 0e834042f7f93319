"""The ledger under every report: each classified GPU-interval priced and summed.

Input is fleet samples, either a DataFrame or a :class:`~gpuwarden.store.SamplesSource` read one
UTC day at a time (only the columns in :data:`COLUMNS`), so memory stays flat whatever the window.
Each chunk is turned into numpy arrays sorted by GPU instance and time; the classifier's context
(the last ``window_samples - 1`` samples of every GPU and the start of its current idle stretch) is
carried into the next chunk, so a chunked run gives the same answer as reading everything at once.

Time accounting: a sample stands for the interval since the previous sample of the same GPU (or MIG
instance), ``timestamp - previous``. The first sample of a GPU, and the first after a gap longer
than ``max_gap``, stand for one nominal ``step`` (the median interval unless given). GPU-hours are
weighted by the instance's share of its GPU (:mod:`.ledger_instances`: a MIG ``3g`` instance is 3/7),
so a GPU's hours add up to the time it was observed whatever its MIG layout.

The ledger holds sums per (GPU instance, holder pod and the DRA claim it held it through, state): GPU-hours, used hours (GPU-hours times
activity: the useful SM time where GPM measures it), cost, energy and memory held; and per (time
bucket, state) (tables built by :mod:`.ledger_tables`). Every report is a groupby over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .classifier import Context, activity, classify
from .codes import Registry, arrow_floats, arrow_ns, dense_factorize
from .inventory import Inventory
from .ledger_instances import InstanceBook, Local, global_code
from .ledger_tables import HOLDER, classified_rows, ledger_rows, quality_summary, reported_window, series_table
from .params import STATE_CODES, AnalyticsError, IdleParams
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
    "timestamp", "cluster", "node", "gpu_uuid", "mig_instance", "model", "namespace", "pod", "dra_claim", "team",
    "project", "attribution", "gpu_util_ratio", "sm_active_ratio", "mem_used_bytes", "mem_total_bytes", "power_watts",
)
REQUIRED: tuple[str, ...] = ("timestamp", "gpu_uuid", "pod")
IDENTITY = ("cluster", "node", "gpu_uuid", "mig_instance", "model")


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
        self._holders: Registry[tuple[int, ...]] = Registry()  # (namespace, pod, team, project, claim) codes -> holder
        self.instances = InstanceBook(self._strings, self.inventory, self.price_book, price)
        self._tail = Context.empty()
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
        inst = self.instances.codes(local, bad)
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

    def _holder_codes(self, local: dict[str, Local], bad: np.ndarray) -> np.ndarray:
        pod = local["pod"][0]
        packed = np.zeros(len(pod), np.int64)
        size = 1
        for name in HOLDER:
            width = len(local[name][1]) + 1
            if size * width >= 1 << 62:  # the key would overflow int64: number the combinations so far densely
                packed, uniques, _ = dense_factorize(packed, size)
                size = len(uniques)
            packed *= width
            packed += local[name][0]
            packed += 1
            size *= width
        unheld = bad | (pod < 0)
        packed = np.where(unheld, size, packed)
        inverse, uniques, first = dense_factorize(packed, size + 1)
        mapping = np.array([-1 if unheld[row] else self._holders.code(tuple(global_code(local[n], row) for n in HOLDER))
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
        self.instances.seen_rows(c.inst, c.ts, measured_rows, c.group_start, carried)
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
        inst = self.instances.codes(local, bad)
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
            self.instances.seen(code, first + self.step_ns, last + bucket_ns - self.step_ns, count, count)

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
            typical = self.instances.typical_watts()
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
        klass = self.instances.price_class(run_inst)
        n_class = len(self.instances.classes.values)
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

    # -- result ----------------------------------------------------------------------------------
    def finish(self, start: pd.Timestamp | None = None, end: pd.Timestamp | None = None) -> Ledger:
        step = pd.Timedelta(self.step_ns or DEFAULT_STEP_NS, unit="ns")
        params = replace(self.params, step=step, max_gap=self.params.resolved_max_gap(step))
        instances = self.instances.table()
        notes: list[str] = [self.fallback_note] if self.fallback_note else []
        if self.step_assumed and self.step_ns is None:
            notes.append(f"every GPU has a single sample in the window, so each stands for {step.total_seconds():g} s "
                         "(the default interval); widen the window (--since) for a measured one")
        start, end, trimmed = reported_window(instances, start, end, step)
        notes += [trimmed] if trimmed else []
        if self.price:  # every report names the book and where each node's tier came from
            notes += [f"price book: {self.price_book.identity}", self.inventory.tier_note(instances["node"].dropna().unique())]
        energy_price = self.price_book.energy_price_per_kwh()
        rows = ledger_rows(self._parts, instances, self.instances, self._holders.values, energy_price)
        series = series_table(self._series, self.instances, energy_price)
        quality = quality_summary(self.counts, rows, instances, start, end, params, bool(self.step_assumed and self.step_ns is None))
        ledger = Ledger(start, end, rows, instances, series, quality, params, self.price_book, self.bucket, notes)
        if self.keep_rows:
            ledger.classified = classified_rows(self._row_parts, instances)  # type: ignore[attr-defined]
        return ledger
