"""A plain, row-by-row implementation of the idle classifier and pricing: the specification in a
form anyone can read, a cross-check for the vectorised engine (the tests compare the two sample by
sample), and the baseline of ``bench/bench_analytics.py`` (``groupby("gpu_uuid").apply`` over it).

It reads a whole window at once (no chunks) and does no bad-input accounting beyond what the rules
need: duplicates (keep the last), gaps (``max_gap``), negative or out-of-range gauges (ignored).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pandas as pd

from gpuwarden.fleet.sampling import sampling_step_ns
from gpuwarden.fleet.semantics import mig_share

from .inventory import Inventory
from .params import IdleParams
from .pricebook import PriceBook
from .state_codes import DEFAULT_STEP_NS

_NAN = float("nan")


def _gauge(value, ratio: bool) -> float:
    if value is None or value is pd.NA:
        return _NAN
    value = float(value)
    if math.isnan(value) or value < 0 or (ratio and value > 1.0 + 1e-9):
        return _NAN
    return value


def classify_gpu(group: pd.DataFrame, params: IdleParams, step_ns: int, max_gap_ns: int) -> list[tuple]:
    """``(position, state, duration_ns)`` for the rows of one GPU instance, in time order."""
    group = group.assign(ref_ts=pd.DatetimeIndex(group["timestamp"]).as_unit("ns").asi8, ref_pos=np.arange(len(group)))
    group = group.sort_values("ref_ts", kind="stable").drop_duplicates("ref_ts", keep="last")
    window: deque = deque(maxlen=params.window_samples)
    out = []
    prev_ts = prev_holder = None
    prev_branch = False
    origin = 0
    grace = int(params.hoard_grace.value)
    for row in group.itertuples(index=False):
        ts = row.ref_ts
        pod = row.pod if isinstance(row.pod, str) else None
        attribution = getattr(row, "attribution", None)
        if pod is not None:
            holder = tuple(v if isinstance(v, str) else None for v in (row.namespace, pod, row.team, row.project))
        else:  # no pod: known to be free only where attribution answered
            holder = None if attribution == "known" else "unattributed"
        util = _gauge(row.gpu_util_ratio, True)
        sm = _gauge(row.sm_active_ratio, True)
        measured = not math.isnan(sm)
        act = sm if measured else util
        fake = measured and sm < params.idle_activity and util >= params.fake_busy_util
        idle = act < params.idle_activity and not fake
        gap = prev_ts is not None and ts - prev_ts > max_gap_ns
        duration = step_ns if prev_ts is None or gap else ts - prev_ts
        if prev_ts is None or gap or holder != prev_holder:
            window.clear()
            prev_branch = False
        window.append((idle, fake, act))
        s_idle = sum(w[0] for w in window) / len(window)
        s_fake = sum(w[1] for w in window) / len(window)
        acts = [w[2] for w in window if not math.isnan(w[2])]
        mean = sum(acts) / len(acts) if acts else _NAN
        unattributed = holder == "unattributed"
        allocated = holder is not None and not unattributed
        state = "busy"
        if mean < params.underutilized_below:
            state = "underutilized"
        if allocated and s_idle >= params.starved_idle_share and any(a >= params.starved_burst_activity for a in acts):
            state = "starved"
        branch = idle and s_idle >= params.idle_window_share and allocated
        if branch:
            state = "allocated_idle"
        if unattributed and idle and s_idle >= params.idle_window_share:
            state = "idle_unattributed"
        if fake and s_fake >= 0.5:
            state = "fake_busy"
        if (allocated or unattributed) and math.isnan(act):
            state = "unmeasured"
        if holder is None:
            state = "unallocated"
        branch = branch and state == "allocated_idle"
        if branch:
            if not prev_branch:
                origin = ts - duration
            used = _gauge(row.mem_used_bytes, False)
            total = _gauge(row.mem_total_bytes, False)
            ratio = used / total if total and not math.isnan(total) else _NAN
            if ts - origin > grace and ratio >= params.hoard_mem_ratio:
                state = "hoarded"
        prev_branch = branch
        prev_ts, prev_holder = ts, holder
        out.append((row.ref_pos, state, duration))
    return out


def states_by_gpu(frame: pd.DataFrame, params: IdleParams | None = None, step=None, max_gap=None,
                  price_book: PriceBook | None = None, inventory: Inventory | None = None) -> pd.DataFrame:
    """Row-by-row: ``frame.groupby(gpu instance).apply(...)`` giving GPU-hours and cost per GPU
    instance and state (columns gpu_uuid, mig_instance, state, gpu_hours, cost). Whole GPUs only
    are priced at share 1; MIG instances by :func:`~gpuwarden.fleet.semantics.mig_share`, with the
    GPU's other instances in the frame as siblings (as the engine counts them)."""
    params = params or IdleParams()
    price_book = price_book or PriceBook.default()
    inventory = inventory or Inventory.default()
    stamps = pd.DatetimeIndex(frame["timestamp"]).as_unit("ns").asi8
    if step is None:
        step = params.step
    if step is not None:
        step_ns = int(pd.Timedelta(step).value)
    else:
        instance = frame.groupby([frame["gpu_uuid"].astype(str), frame["mig_instance"].astype(object).fillna("")],
                                 sort=False).ngroup().to_numpy()
        step_ns = sampling_step_ns(stamps, instance) or DEFAULT_STEP_NS
    max_gap_ns = int(params.resolved_max_gap(pd.Timedelta(step_ns, unit="ns")).value) if max_gap is None else int(pd.Timedelta(max_gap).value)
    energy_price = price_book.energy_price_per_kwh()

    profiles = frame.dropna(subset=["mig_instance"]).groupby(frame["gpu_uuid"].astype(str))["mig_instance"].unique()

    def per_gpu(group: pd.DataFrame) -> pd.DataFrame:
        first = group.iloc[0]
        mig = first["mig_instance"] if isinstance(first["mig_instance"], str) else None
        siblings = [str(p) for p in profiles.get(str(group.name[0]), []) if p != mig]
        share = mig_share(mig, str(first["model"]), siblings)
        _pool, tier = inventory.lookup(str(first["node"]))
        price = price_book.hourly(str(first["model"]), tier)
        owned = tier.value == "owned"
        watts_default = price_book.model(str(first["model"])).typical_watts * share
        hours: dict[str, float] = {}
        cost: dict[str, float] = {}
        power = group["power_watts"].to_numpy(dtype="float64", na_value=np.nan)
        for position, state, duration in classify_gpu(group, params, step_ns, max_gap_ns):
            h = duration / 3.6e12
            watts = power[position]
            watts = watts_default if math.isnan(watts) or watts < 0 else watts
            hours[state] = hours.get(state, 0.0) + share * h
            cost[state] = cost.get(state, 0.0) + share * h * price + (watts / 1000 * h * energy_price if owned else 0.0)
        return pd.DataFrame({"state": list(hours), "gpu_hours": list(hours.values()), "cost": [cost[s] for s in hours]})

    keys = [frame["gpu_uuid"].astype(str), frame["mig_instance"].astype(object).fillna("")]
    out = frame.groupby(keys, sort=True, group_keys=True).apply(per_gpu, include_groups=False)
    out = out.reset_index(level=[0, 1]).reset_index(drop=True)
    return out.rename(columns={out.columns[0]: "gpu_uuid", out.columns[1]: "mig_instance"})
