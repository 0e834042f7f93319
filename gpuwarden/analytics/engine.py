"""The engine under every report: classify each GPU-interval, price it, and add it to a ledger.

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

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from gpuwarden.fleet import PriceTier
from gpuwarden.fleet.semantics import iso_utc, mig_share, profile_slices, to_utc, to_utc_or_none

from .inventory import Inventory
from .params import STATE_CODES, STATES, AnalyticsError, IdleParams
from .pricebook import PriceBook
from .quality import NON_NEGATIVE_COLUMNS, RATIO_COLUMNS, QualityCounts, count_counter_resets, sanitize_arrays, sanitize_gauges

log = logging.getLogger("gpuwarden.analytics")

# Reading raw samples instead of the recording-rule rollups: points read per GPU-day at the
# default 60 s step, ~16 metric families x 1,440, against 4 rollup figures x 24 hours x ~1.3
# states a GPU visits per hour (docs/scale.md).
RAW_READ_SLOWDOWN = "about 180x more points to read, so"

COLUMNS: tuple[str, ...] = (
    "timestamp", "cluster", "node", "gpu_uuid", "mig_instance", "model", "namespace", "pod", "team", "project",
    "attribution", "gpu_util_ratio", "sm_active_ratio", "mem_used_bytes", "mem_total_bytes", "power_watts",
)
REQUIRED: tuple[str, ...] = ("timestamp", "gpu_uuid", "pod")
IDENTITY = ("cluster", "node", "gpu_uuid", "mig_instance", "model")
HOLDER = ("namespace", "pod", "team", "project")
_S = 1_000_000_000  # ns per second
DEFAULT_STEP_NS = 60 * _S  # the embedded store's resolution; used when no interval can be measured

UNALLOCATED = STATE_CODES["unallocated"]
IDLE_UNATTRIBUTED = STATE_CODES["idle_unattributed"]
ALLOCATED_IDLE = STATE_CODES["allocated_idle"]
HOARDED = STATE_CODES["hoarded"]
FAKE_BUSY = STATE_CODES["fake_busy"]
STARVED = STATE_CODES["starved"]
UNDERUTILIZED = STATE_CODES["underutilized"]
BUSY = STATE_CODES["busy"]
UNMEASURED = STATE_CODES["unmeasured"]
N_STATES = len(STATES)
# Holder codes: >= 0 a pod; NO_POD: known to be unallocated; UNATTRIBUTED: nobody could know.
NO_POD = -1
UNATTRIBUTED = -2


class _Registry:
    """Strings (or tuples) to dense integer codes, stable across chunks."""

    def __init__(self) -> None:
        self.index: dict = {}
        self.values: list = []

    def code(self, value) -> int:
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.values)
            self.values.append(value)
        return found

    def local(self, frame: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A column's chunk-local codes (-1 for null; any integer width) and the global code of each
        local code."""
        if name not in frame.columns:
            return np.full(len(frame), -1, np.int8), np.empty(0, np.int64)
        series = frame[name]
        if not isinstance(series.dtype, pd.CategoricalDtype):
            series = series.astype("category")
        return series.cat.codes.to_numpy(), self.mapping(series.cat.categories)

    def local_arrow(self, table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`local` for an Arrow column (dictionary-encoded or not)."""
        if name not in table.column_names:
            return np.full(table.num_rows, -1, np.int8), np.empty(0, np.int64)
        column = table.column(name)
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()  # unifies dictionaries
        indices = array.indices
        codes = pc.fill_null(indices, -1).to_numpy() if indices.null_count else indices.to_numpy()
        return codes, self.mapping(array.dictionary.to_pylist())

    def mapping(self, categories) -> np.ndarray:
        return np.array([self.code(str(c)) for c in categories], dtype=np.int64)


def _inst_share(shares: list) -> np.ndarray:
    return np.asarray(shares, dtype=np.float64)


@dataclass
class _Tail:
    """The classifier context carried from one chunk to the next (a few rows per GPU instance)."""

    inst: np.ndarray
    ts: np.ndarray
    holder: np.ndarray
    idle: np.ndarray
    fake: np.ndarray
    act: np.ndarray
    branch: np.ndarray
    origin: np.ndarray

    @classmethod
    def empty(cls) -> "_Tail":
        i = np.empty(0, np.int64)
        return cls(i, i, i, np.empty(0, bool), np.empty(0, bool), np.empty(0), np.empty(0, bool), i)


@dataclass
class Ledger:
    """Classified, priced GPU time over a window; see the module doc. Hours are GPU-hours."""

    start: pd.Timestamp
    end: pd.Timestamp
    rows: pd.DataFrame
    instances: pd.DataFrame
    timeseries: pd.DataFrame
    quality: dict
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
        self._strings = {name: _Registry() for name in (*IDENTITY, *HOLDER)}
        self._instances = _Registry()  # (gpu code, mig code) -> instance
        self._holders = _Registry()  # (namespace, pod, team, project) codes -> holder
        self._inst_meta: dict[str, list] = {k: [] for k in ("cluster", "node", "model", "share", "price", "owned", "watts")}
        self._inst_profile: list[str | None] = []  # MIG profile per instance (None: a whole GPU)
        self._gpu_instances: dict[int, list[int]] = {}  # gpu code -> its instance codes
        self._inst_first: list[int] = []
        self._inst_last: list[int] = []
        self._inst_samples: list[int] = []
        self._inst_sm: list[int] = []
        self._tail = _Tail.empty()
        self._classes = _Registry()  # (share, price, owned) of instances, for the time series
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
        gauges = sanitize_arrays({name: _arrow_floats(table, name) for name in (*RATIO_COLUMNS, *NON_NEGATIVE_COLUMNS)},
                                 self.counts)
        ts_ns = _arrow_ns(table.column("timestamp"))
        if "attribution" in names:
            column = table.column("attribution")
            if pa.types.is_dictionary(column.type):
                column = column.cast(column.type.value_type)
            known = pc.fill_null(pc.equal(column.cast(pa.string()), "known"), False).to_numpy(zero_copy_only=False)
        else:
            known = np.zeros(n, bool)
        self._add_arrays(ts_ns, local, gauges, np.arange(n) if self.keep_rows else None, np.asarray(known, bool))

    def _add_arrays(self, ts_ns: np.ndarray, local: dict, gauges: dict, positions: np.ndarray | None,
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

    def _instance_codes(self, local: dict, bad: np.ndarray) -> np.ndarray:
        gpu, mig = local["gpu_uuid"][0].astype(np.int64), local["mig_instance"][0]
        n_mig = len(local["mig_instance"][1]) + 1
        size = (len(local["gpu_uuid"][1]) + 1) * n_mig
        packed = np.maximum(gpu, 0) * n_mig + (mig.astype(np.int64) + 1)
        packed[bad] = size - 1
        inverse, uniques, first = _dense_factorize(packed, size)
        mapping = np.full(len(uniques), -1, np.int64)
        for position, (value, row) in enumerate(zip(uniques, first)):
            if bad[row]:
                continue
            key = (self._global(local["gpu_uuid"], row), self._global(local["mig_instance"], row))
            code = self._instances.code(key)
            meta = tuple(self._global(local[name], row) for name in ("cluster", "node", "model"))
            if code == len(self._inst_meta["cluster"]):
                self._new_instance(key, meta)
            elif meta != (self._inst_meta["cluster"][code], self._inst_meta["node"][code], self._inst_meta["model"][code]):
                self._set_instance(code, meta)  # the GPU moved or was relabelled: the latest wins
            mapping[position] = code
        return mapping[inverse]

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

    def _holder_codes(self, local: dict, bad: np.ndarray) -> np.ndarray:
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
        inverse, uniques, first = _dense_factorize(packed, size + 1)
        mapping = np.array([-1 if unheld[row] else self._holders.code(tuple(self._global(local[n], row) for n in HOLDER))
                            for row in first], dtype=np.int64)
        return mapping[inverse]

    # -- the classifier --------------------------------------------------------------------------
    def _classify(self, inst, ts, holder, gauges, positions) -> None:
        p = self.params
        util, sm = gauges["gpu_util_ratio"], gauges["sm_active_ratio"]
        measured = ~np.isnan(sm)
        act = np.where(measured, sm, util)
        with np.errstate(invalid="ignore"):
            fake = measured & (sm < p.idle_activity) & (util >= p.fake_busy_util)
            idle = (act < p.idle_activity) & ~fake

        # One sort of [carried context; this chunk] by (instance, time): the context of an
        # instance sorts before its new rows (a radix sort when instance codes fit 16 bits).
        tail = self._tail
        n_tail = len(tail.inst)
        c_inst = np.concatenate([tail.inst, inst])
        c_ts = np.concatenate([tail.ts, ts])
        order = _sort_order(c_inst, c_ts, presorted_time=_monotonic(ts))
        c_inst, c_ts = c_inst[order], c_ts[order]
        c_holder = np.concatenate([tail.holder, holder])[order]
        c_idle = np.concatenate([tail.idle, idle])[order]
        c_fake = np.concatenate([tail.fake, fake])[order]
        c_act = np.concatenate([tail.act, act])[order]
        carried = order < n_tail
        src = order - n_tail  # row of this chunk (negative for carried rows)
        # Duplicated timestamps of one instance: keep the last row read.
        dup = np.zeros(len(c_inst), bool)
        dup[:-1] = (c_inst[1:] == c_inst[:-1]) & (c_ts[1:] == c_ts[:-1])
        if dup.any():
            self.counts.duplicate_rows += int((dup & ~carried).sum())
            keep = ~dup
            c_inst, c_ts, c_holder, c_idle, c_fake, c_act, carried, src = (
                a[keep] for a in (c_inst, c_ts, c_holder, c_idle, c_fake, c_act, carried, src))
        n = len(c_inst)
        index = np.arange(n)
        new_inst = np.ones(n, bool)
        new_inst[1:] = c_inst[1:] != c_inst[:-1]
        dt = np.zeros(n, np.int64)
        dt[1:] = np.diff(c_ts)
        if self.step_ns is None:
            steps = dt[~new_inst & (dt > 0)]
            if len(steps) == 0:
                # One sample per GPU so far: it stands for the default interval (said in a note).
                self.step_assumed = True
                step = DEFAULT_STEP_NS
            else:
                self.step_ns = step = int(np.median(steps))
        else:
            step = self.step_ns
        max_gap = int(p.resolved_max_gap(pd.Timedelta(step, unit="ns")).value)
        gap = ~new_inst & (dt > max_gap)
        seg_start = new_inst | gap
        dur = np.where(seg_start, step, dt)
        seg_start[1:] |= c_holder[1:] != c_holder[:-1]

        # Trailing window of up to W samples within the segment.
        seg_first = np.maximum.accumulate(np.where(seg_start, index, 0))
        lo = np.maximum(index - (p.window_samples - 1), seg_first)
        count = index + 1 - lo
        has_act = ~np.isnan(c_act)
        idle_n = _window_count(c_idle, lo)
        fake_n = _window_count(c_fake, lo)
        act_n = _window_count(has_act, lo)
        act_sum = _window_sum(np.where(has_act, c_act, 0.0), lo)

        allocated = c_holder >= 0
        unattributed = c_holder == UNATTRIBUTED  # classified by activity alone, never "unallocated"
        state = np.full(n, BUSY, np.int8)
        state[act_sum < p.underutilized_below * act_n] = UNDERUTILIZED  # mean activity below the threshold
        state[idle_n >= p.starved_idle_share * count] = STARVED
        plain_idle = c_idle & (idle_n >= p.idle_window_share * count - 1e-9)
        branch = plain_idle & allocated
        state[branch] = ALLOCATED_IDLE
        state[plain_idle & unattributed] = IDLE_UNATTRIBUTED
        state[c_fake & (2 * fake_n >= count)] = FAKE_BUSY
        state[(allocated | unattributed) & ~has_act] = UNMEASURED
        state[c_holder == NO_POD] = UNALLOCATED
        branch &= state == ALLOCATED_IDLE
        # Idle stretches: their origin is the start of their first interval; carried rows bring the
        # origin of a stretch that began in an earlier chunk.
        origin_at = c_ts - dur
        if n_tail:
            branch[carried] = tail.branch[src[carried] + n_tail]
            origin_at[carried] = np.where(branch[carried], tail.origin[src[carried] + n_tail], origin_at[carried])
        run_start = branch.copy()
        run_start[1:] &= seg_start[1:] | ~branch[:-1]
        origin = origin_at[np.maximum.accumulate(np.where(run_start, index, 0))]
        candidates = np.flatnonzero(branch & ~carried & (c_ts - origin > int(p.hoard_grace.value)))
        if len(candidates):
            rows = src[candidates]
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = gauges["mem_used_bytes"][rows] / gauges["mem_total_bytes"][rows]
            state[candidates[ratio >= p.hoard_mem_ratio]] = HOARDED

        # Carry the last rows of every instance into the next chunk.
        group_start = np.flatnonzero(new_inst)
        group_end = np.r_[group_start[1:], n]  # exclusive
        depth = max(p.window_samples - 1, 1)
        back = np.arange(depth, 0, -1)
        keep = (group_end[:, None] - back[None, :]).ravel()  # ascending: groups are in row order
        keep = keep[keep >= np.repeat(group_start, depth)]
        self._tail = _Tail(c_inst[keep], c_ts[keep], c_holder[keep], c_idle[keep], c_fake[keep], c_act[keep],
                           branch[keep], np.where(branch[keep], origin[keep], c_ts[keep]))

        # This chunk's rows, in (instance, time) order. Carried rows stay in the arrays (masking
        # ten arrays costs more than the sums) and are left out of every sum.
        gap &= ~carried
        self.counts.gaps += int(gap.sum())
        gap_ns = np.where(gap, dt - step, 0)
        rows = np.where(carried, 0, src) if n_tail else src
        measured_rows = measured[rows]
        if n_tail:
            measured_rows &= ~carried
        self._update_instances(c_inst, c_ts, measured_rows, group_start, carried if n_tail else None)
        self._aggregate(c_inst, c_ts, c_holder, state, dur, gap_ns, c_act, measured_rows,
                        gauges["mem_used_bytes"][rows], gauges["power_watts"][rows], carried if n_tail else None)
        if self.keep_rows:
            mine = ~carried
            self._row_parts.append(pd.DataFrame({
                "position": positions[src[mine]], "inst": c_inst[mine], "timestamp_ns": c_ts[mine], "state": state[mine],
                "duration_seconds": dur[mine] / _S, "activity": c_act[mine], "sm_measured": measured_rows[mine],
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

    def _update_instances(self, inst, ts, measured, group_start, carried=None) -> None:
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

    def _aggregate(self, inst, ts, holder, state, dur, gap_ns, act, measured, mem_used, power, carried=None) -> None:
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
            typical = np.asarray(self._inst_meta["watts"], dtype=np.float64) * _inst_share(self._inst_meta["share"])
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
        return mapping[inst]

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

        def name(registry: str, code: int):
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
        share = np.array([c[0] if c[0] >= 0 else shares[-1 - c[0]] for c in classes], dtype=np.float64)[klass]
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


def _arrow_ns(column: pa.ChunkedArray) -> np.ndarray:
    """Timestamps as int64 ns since the epoch (UTC; naive counts as UTC), int64 min for null."""
    if not pa.types.is_timestamp(column.type):
        stamps = pd.to_datetime(column.to_pandas(), utc=True, errors="coerce")
        return pd.DatetimeIndex(stamps).as_unit("ns").asi8
    if column.type.unit != "ns":
        column = column.cast(pa.timestamp("ns", tz=column.type.tz))
    return column.to_numpy().view(np.int64)  # a null is NaT, int64 min


def _arrow_floats(table: pa.Table, name: str) -> np.ndarray:
    """A gauge as float64 with NaN for null (``pd.to_numeric(errors="coerce")`` for other types)."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    column = table.column(name)
    if pa.types.is_floating(column.type) or pa.types.is_integer(column.type):
        if column.type != pa.float64():
            column = column.cast(pa.float64())
        return column.to_numpy()
    return pd.to_numeric(column.to_pandas(), errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


def _dense_factorize(packed: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Like :func:`_factorize` for values in ``[0, size)``, by a lookup table when ``size`` is small."""
    if size > max(4 * len(packed), 1 << 22):
        return _factorize(packed)
    first = np.full(size, -1, np.int64)
    first[packed[::-1]] = np.arange(len(packed) - 1, -1, -1)
    uniques = np.flatnonzero(first >= 0)
    remap = np.empty(size, np.int64)
    remap[uniques] = np.arange(len(uniques))
    return remap[packed], uniques, first[uniques]


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, unique values (in order of appearance) and the first row of each, by hashing."""
    codes, uniques = pd.factorize(values)
    first = np.empty(len(uniques), np.int64)
    first[codes[::-1]] = np.arange(len(values) - 1, -1, -1)
    return codes.astype(np.int64), np.asarray(uniques, dtype=np.int64), first


def _window_sum(values: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Sum of ``values[lo[i]:i+1]`` for every i (float)."""
    cumulative = np.zeros(len(values) + 1, dtype=np.float64)
    np.cumsum(values, out=cumulative[1:])
    return cumulative[1:] - cumulative[lo]


def _window_count(flags: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Count of true ``flags[lo[i]:i+1]`` for every i (exact integers)."""
    cumulative = np.zeros(len(flags) + 1, dtype=np.int64)
    np.cumsum(flags, out=cumulative[1:])
    return cumulative[1:] - cumulative[lo]


def _monotonic(ts: np.ndarray) -> bool:
    return len(ts) < 2 or bool((ts[1:] >= ts[:-1]).all())


def _sort_order(inst: np.ndarray, ts: np.ndarray, presorted_time: bool = True) -> np.ndarray:
    """Order by (instance, time), stable for equal pairs. Rows usually arrive in time order, so a
    stable sort by instance is enough (a radix sort when instance codes fit 16 bits)."""
    if not presorted_time:
        return np.lexsort((ts, inst))
    if len(inst) and inst.max() < 2**15:
        return np.argsort(inst.astype(np.int16), kind="stable")
    return np.argsort(inst, kind="stable")


# -- reading ---------------------------------------------------------------------------------------


def _day_windows(start: pd.Timestamp, end: pd.Timestamp, chunk: pd.Timedelta) -> Iterator[tuple[pd.Timestamp, pd.Timestamp]]:
    cursor = start
    while cursor < end:
        boundary = min(end, (cursor.floor(chunk) + chunk) if chunk >= pd.Timedelta(hours=1) else cursor + chunk)
        yield cursor, boundary
        cursor = boundary


def _ledger_from_rollups(source, builder: LedgerBuilder, start, end) -> Ledger | None:
    """The ledger from a source's recording-rule rollups; None (with a warning) when it has none."""
    read_start, read_end = start, end
    if start is None or end is None:
        span = source.time_range()
        if span is None:
            return None
        read_start = start if start is not None else to_utc(span[0])
        read_end = end if end is not None else to_utc(span[1]) + pd.Timedelta(microseconds=1)
    started = time.perf_counter()
    frame = source.read_state_rollup(read_start, read_end, bucket=builder.bucket)
    if frame is None:
        message = ("no gpuwarden recording-rule rollups (gpu:gpuwarden_state_seconds:5m) in this window: reading raw "
                   f"samples instead ({RAW_READ_SLOWDOWN} far slower over long windows); load rules/gpuwarden-recording.rules.yml "
                   "into Prometheus (see docs/prometheus.md)")
        log.warning(message)
        builder.fallback_note = message
        return None
    builder.add_rollup(frame, source.rollup_resolution)
    ledger = builder.finish(start, end)
    ledger.notes.append(f"read from the recording-rule rollups ({len(frame):,} rows at "
                        f"{source.rollup_resolution.total_seconds() / 60:g}-minute resolution, summed per "
                        f"{builder.bucket.total_seconds() / 3600:g} h) in {time.perf_counter() - started:.1f} s; no raw sample read")
    ledger.quality["source"] = "rollup"
    return ledger


def build_ledger(data, start=None, end=None, price_book: PriceBook | None = None, inventory: Inventory | None = None,
                 params: IdleParams | None = None, bucket: str | pd.Timedelta = "1h",
                 chunk: str | pd.Timedelta = "1D", keep_rows: bool = False, price: bool = True) -> Ledger:
    """Classify and price fleet samples over ``[start, end)``.

    ``data`` is a DataFrame of fleet samples or a samples source (``read(start, end, columns)`` and
    ``time_range()``, e.g. :class:`~gpuwarden.store.LocalStore`), which is read ``chunk`` at a time
    with only the columns analytics needs. A source with a ``sample_interval`` (Prometheus reads on
    a grid) gives the interval, so one sample per GPU is enough; otherwise it is the median interval. ``price=False`` skips pricing (for traces of GPU models no
    price book knows); costs are then 0.
    """
    params = params or IdleParams()
    interval = getattr(data, "sample_interval", None)  # a source that knows its grid (Prometheus) says so
    if params.step is None and interval is not None:
        params = replace(params, step=pd.Timedelta(interval))
    builder = LedgerBuilder(price_book, inventory, params, bucket, keep_rows, price)
    start, end = to_utc_or_none(start), to_utc_or_none(end)
    if not isinstance(data, pd.DataFrame) and not keep_rows and getattr(data, "rollups", False) \
            and callable(getattr(data, "read_state_rollup", None)):
        ledger = _ledger_from_rollups(data, builder, start, end)
        if ledger is not None:
            return ledger
    if isinstance(data, pd.DataFrame):
        if "timestamp" not in data.columns:
            raise AnalyticsError("fleet samples lack column timestamp")
        frame = data
        stamps = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce")
        if start is not None or end is not None:
            mask = np.ones(len(frame), bool)
            if start is not None:
                mask &= (stamps >= start).to_numpy()
            if end is not None:
                mask &= (stamps < end).to_numpy()
            frame, stamps = frame[mask], stamps[mask]
        if frame.empty or stamps.isna().all():
            builder.add(frame)
            return builder.finish(start, end)
        # Same chunks as a source would give (so the carried context is exercised the same way).
        if not stamps.is_monotonic_increasing:
            order = np.argsort(stamps.to_numpy(), kind="stable")
            frame, stamps = frame.iloc[order], stamps.iloc[order]
        values = pd.DatetimeIndex(stamps).as_unit("ns")
        lo_all = start if start is not None else values.min()
        hi_all = end if end is not None else values.max() + pd.Timedelta(1, unit="ns")
        if values.isna().any():
            builder.add(frame[values.isna()])  # counted and dropped as unidentified
        for lo, hi in _day_windows(lo_all, hi_all, pd.Timedelta(chunk)):
            a, b = values.searchsorted(lo, "left"), values.searchsorted(hi, "left")
            if b > a:
                builder.add(frame.iloc[a:b])
        return builder.finish(start, end)
    if not hasattr(data, "read"):
        raise AnalyticsError(f"cannot read fleet samples from {type(data).__name__}; pass a DataFrame or a samples source")
    read_start, read_end = start, end
    if start is None or end is None:
        span = data.time_range()
        if span is None:
            return builder.finish(start, end)
        read_start = start if start is not None else to_utc(span[0])
        read_end = end if end is not None else to_utc(span[1]) + pd.Timedelta(microseconds=1)
    # Read the next chunk in a thread while this one is classified (Parquet decoding releases the
    # GIL). A source with ``read_arrow`` (the local store) hands over Arrow tables: no pandas.
    arrow = callable(getattr(data, "read_arrow", None))
    read, add = (data.read_arrow, builder.add_arrow) if arrow else (data.read, builder.add)
    windows = list(_day_windows(read_start, read_end, pd.Timedelta(chunk)))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuwarden-read") as pool:
        pending = pool.submit(read, *windows[0], columns=list(COLUMNS)) if windows else None
        for position in range(len(windows)):
            part = pending.result()
            pending = (pool.submit(read, *windows[position + 1], columns=list(COLUMNS))
                       if position + 1 < len(windows) else None)
            if part is not None:
                add(part)
            del part
    # An open window ends one step after the newest sample, as for a DataFrame.
    return builder.finish(start, end)
