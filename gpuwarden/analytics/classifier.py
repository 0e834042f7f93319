"""The idle classifier: numpy arrays of one chunk of samples in, a state per sample out.

Pure: no pandas, no prices, no registries. The caller gives each sample's GPU-instance code,
time, holder code (:mod:`.state_codes`), activity and memory ratio, and the :class:`Context` the
previous chunk left; :func:`classify` returns the states, the interval each sample stands for and
the context for the next chunk, so a chunked run gives the same states as one read of everything.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpuwarden.fleet.sampling import sampling_step_ns

from .params import IdleParams
from .state_codes import (
    ALLOCATED_IDLE,
    BUSY,
    DEFAULT_STEP_NS,
    FAKE_BUSY,
    HOARDED,
    IDLE_UNATTRIBUTED,
    NO_POD,
    STARVED,
    UNALLOCATED,
    UNATTRIBUTED,
    UNDERUTILIZED,
    UNMEASURED,
)

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]


@dataclass
class Activity:
    """Per sample: activity (SM activity where measured, else NVML utilisation), whether SM
    activity was measured, and the idle and fake-busy flags."""

    act: Floats
    measured: Flags
    idle: Flags
    fake: Flags


def activity(util: Floats, sm: Floats, params: IdleParams) -> Activity:
    measured = ~np.isnan(sm)
    act = np.where(measured, sm, util)
    with np.errstate(invalid="ignore"):
        fake = measured & (sm < params.idle_activity) & (util >= params.fake_busy_util)
        idle = (act < params.idle_activity) & ~fake
    return Activity(act, measured, idle, fake)


@dataclass
class Context:
    """What the classifier carries from one chunk to the next: the last few samples of every GPU
    instance and where its current idle stretch began."""

    inst: Ints
    ts: Ints
    holder: Ints
    idle: Flags
    fake: Flags
    act: Floats
    branch: Flags
    origin: Ints

    @classmethod
    def empty(cls) -> Context:
        i = np.empty(0, np.int64)
        return cls(i, i, i, np.empty(0, bool), np.empty(0, bool), np.empty(0), np.empty(0, bool), i)


@dataclass
class Classified:
    """The chunk's samples and the carried context, sorted by (instance, time), duplicates dropped.

    ``carried`` marks context rows (not this chunk's: leave them out of every sum); ``src`` is each
    row's position in the chunk (negative for carried rows); ``group_start`` where each instance's
    rows begin. ``dur`` is the interval each sample stands for (ns), ``dt`` the time since the
    previous sample and ``gap`` a silence longer than ``max_gap`` before it (this chunk's rows only).
    """

    inst: Ints
    ts: Ints
    holder: Ints
    act: Floats
    state: npt.NDArray[np.int8]
    dur: Ints
    dt: Ints
    gap: Flags
    carried: Flags
    src: Ints
    group_start: Ints
    duplicates: int  # rows of this chunk dropped as a repeated (instance, time)
    step_ns: int  # the nominal interval used
    step_measured: bool  # False: no interval could be measured, DEFAULT_STEP_NS was assumed
    context: Context  # for the next chunk


def classify(inst: Ints, ts: Ints, holder: Ints, activity: Activity, mem_ratio: Floats, context: Context,
             params: IdleParams, step_ns: int | None) -> Classified:
    """States of one chunk (see :mod:`.params` for the taxonomy). ``mem_ratio`` is memory used over
    total per sample (for hoarding); ``step_ns`` the nominal interval, or None to measure it as
    the median interval of this chunk."""
    p = params
    # One sort of [carried context; this chunk] by (instance, time): the context of an
    # instance sorts before its new rows (a radix sort when instance codes fit 16 bits).
    n_tail = len(context.inst)
    c_inst = np.concatenate([context.inst, inst])
    c_ts = np.concatenate([context.ts, ts])
    order = _sort_order(c_inst, c_ts, presorted_time=_monotonic(ts))
    c_inst, c_ts = c_inst[order], c_ts[order]
    c_holder = np.concatenate([context.holder, holder])[order]
    c_idle = np.concatenate([context.idle, activity.idle])[order]
    c_fake = np.concatenate([context.fake, activity.fake])[order]
    c_act = np.concatenate([context.act, activity.act])[order]
    carried = order < n_tail
    src = order - n_tail  # row of this chunk (negative for carried rows)
    # Duplicated timestamps of one instance: keep the last row read.
    dup = np.zeros(len(c_inst), bool)
    dup[:-1] = (c_inst[1:] == c_inst[:-1]) & (c_ts[1:] == c_ts[:-1])
    duplicates = 0
    if dup.any():
        duplicates = int((dup & ~carried).sum())
        keep = ~dup
        c_inst, c_ts, c_holder, src = c_inst[keep], c_ts[keep], c_holder[keep], src[keep]
        c_idle, c_fake, carried, c_act = c_idle[keep], c_fake[keep], carried[keep], c_act[keep]
    n = len(c_inst)
    index = np.arange(n)
    new_inst = np.ones(n, bool)
    new_inst[1:] = c_inst[1:] != c_inst[:-1]
    dt = np.zeros(n, np.int64)
    dt[1:] = np.diff(c_ts)
    step_measured = True
    if step_ns is None:
        measured = sampling_step_ns(c_ts, c_inst)  # sorted by (instance, time): no sort
        # None: one sample per GPU so far; it stands for the default interval (the caller says so).
        step, step_measured = (DEFAULT_STEP_NS, False) if measured is None else (measured, True)
    else:
        step = step_ns
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
    # Starved needs a workload waiting on input: a pod holds the GPU, and between its idle samples
    # it runs real bursts. A GPU flickering at a few percent (NVML
    # utilisation alone shows that on an idle GPU) is idle or underutilised, not starved.
    burst_n = _window_count(has_act & (c_act >= p.starved_burst_activity), lo)
    state = np.full(n, BUSY, np.int8)
    state[act_sum < p.underutilized_below * act_n] = UNDERUTILIZED  # mean activity below the threshold
    state[allocated & (burst_n > 0) & (idle_n >= p.starved_idle_share * count)] = STARVED
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
        branch[carried] = context.branch[src[carried] + n_tail]
        origin_at[carried] = np.where(branch[carried], context.origin[src[carried] + n_tail], origin_at[carried])
    run_start = branch.copy()
    run_start[1:] &= seg_start[1:] | ~branch[:-1]
    origin = origin_at[np.maximum.accumulate(np.where(run_start, index, 0))]
    candidates = np.flatnonzero(branch & ~carried & (c_ts - origin > int(p.hoard_grace.value)))
    if len(candidates):
        state[candidates[mem_ratio[src[candidates]] >= p.hoard_mem_ratio]] = HOARDED

    # Carry the last rows of every instance into the next chunk.
    group_start = np.flatnonzero(new_inst)
    group_end = np.r_[group_start[1:], n]  # exclusive
    depth = max(p.window_samples - 1, 1)
    back = np.arange(depth, 0, -1)
    keep = (group_end[:, None] - back[None, :]).ravel()  # ascending: groups are in row order
    keep = keep[keep >= np.repeat(group_start, depth)]
    following = Context(c_inst[keep], c_ts[keep], c_holder[keep], c_idle[keep], c_fake[keep], c_act[keep],
                        branch[keep], np.where(branch[keep], origin[keep], c_ts[keep]))
    return Classified(c_inst, c_ts, c_holder, c_act, state, dur, dt, gap & ~carried, carried, src, group_start,
                      duplicates, step, step_measured, following)


def _window_sum(values: Floats, lo: Ints) -> Floats:
    """Sum of ``values[lo[i]:i+1]`` for every i (float)."""
    cumulative = np.zeros(len(values) + 1, dtype=np.float64)
    np.cumsum(values, out=cumulative[1:])
    return cumulative[1:] - cumulative[lo]


def _window_count(flags: Flags, lo: Ints) -> Ints:
    """Count of true ``flags[lo[i]:i+1]`` for every i (exact integers)."""
    cumulative = np.zeros(len(flags) + 1, dtype=np.int64)
    np.cumsum(flags, out=cumulative[1:])
    return cumulative[1:] - cumulative[lo]


def _monotonic(ts: Ints) -> bool:
    return len(ts) < 2 or bool((ts[1:] >= ts[:-1]).all())


def _sort_order(inst: Ints, ts: Ints, presorted_time: bool = True) -> Ints:
    """Order by (instance, time), stable for equal pairs. Rows usually arrive in time order, so a
    stable sort by instance is enough (a radix sort when instance codes fit 16 bits)."""
    if not presorted_time:
        return np.lexsort((ts, inst))
    if len(inst) and inst.max() < 2**15:
        return np.argsort(inst.astype(np.int16), kind="stable")
    return np.argsort(inst, kind="stable")
