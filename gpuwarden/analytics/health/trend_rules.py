"""Gentle precursors: a counter whose rate climbs slowly against the GPU's own history, and a GPU a
few percent slower than the GPUs running the same job, window after window.

The burst rules (:mod:`.warning_rules`) judge one hour against a peer floor; a link degrading over
4-12 hours at a few errors an hour never clears that bar before its fatal XID. Here:

- **Rising counter** (:func:`rising_counter`): per GPU and row, the samples with new events in the
  trailing window against the GPU's own earlier history (reset-aware increments, see
  ``fleet.semantics.counter_increments``; a gap is one increment), with a short prior at its peer
  group's median rate. The test is the exact one for two Poisson rates: given ``N`` events in all,
  how many fall in the recent window is binomial with the window's share of the exposure, so a GPU
  that was always noisy, however noisy, is its own baseline (scale-free). The rise must also be
  large (``trend_min_ratio`` times the baseline rate), not fading (the newer half of the window
  holds at least as many as the older half, the newest quarter at least half its share: a storm
  that has ended is not a rise), and the GPU must have ``trend_min_history_s`` of
  history before the window.
- **Mild straggler** (:func:`mild_straggler`): slower than the median of its node-mates busy at the
  same time (the same job, on one model) by ``straggler_mild_margin`` and by
  ``straggler_mild_spread`` robust spreads of those mates, and slower than its model and pool's
  peers too, in at least ``straggler_mild_share`` of its busy samples over ``straggler_mild_persist_s``.

Both are precursors: :func:`emit_precursor` gives a finding whose only evidence is one of these a
taint at most, never a cordon (the strong rule's own sustained evidence still cordons as before).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
from scipy.special import betainc

from gpuwarden.fleet import ActionKind, FindingKind, Severity
from gpuwarden.fleet.node_actions import CORDONING_ACTIONS

from .catalogue import recommended_action
from .finding_builder import _NS, FindingBuilder
from .node_rules import node_median


class Rise:
    """Per row: log10 p of the rise (0 where untested), the rate ratio to the baseline and both rates
    (per hour), from the window that gave the smallest p."""

    def __init__(self, n: int) -> None:
        self.log10_p = np.zeros(n)
        self.ratio = np.full(n, np.nan)
        self.recent_per_hour = np.full(n, np.nan)
        self.baseline_per_hour = np.full(n, np.nan)
        self.window_s = np.zeros(n)


def rate_rise(b: FindingBuilder, events: np.ndarray) -> Rise:
    """The rise test of :func:`rising_counter` over ``events`` (increments per row), for every
    window of ``trend_windows_s``: returns per row the window with the smallest p."""
    s, c = b.s, b.config
    hit = (np.nan_to_num(np.asarray(events, dtype=float)) > 0).astype(float)
    gpu = s["gpu"]
    out = Rise(len(s))
    if not hit.any():
        return out
    # the peer prior: the median rate of the GPU's model and pool (samples with events per hour), floored
    hours = np.bincount(gpu, weights=s["dt_s"]) / 3600.0
    rate = np.bincount(gpu, weights=hit) / np.maximum(hours, 1e-9)
    groups = b.groups()
    group_of_gpu = np.full(rate.size, -1, dtype=np.int64)
    group_of_gpu[gpu] = groups
    peer = np.full(rate.size, c.trend_peer_floor_per_hour)
    for g in np.unique(group_of_gpu[group_of_gpu >= 0]):
        members = group_of_gpu == g
        peer[members] = max(float(np.median(rate[members])), c.trend_peer_floor_per_hour)
    cumulative = np.concatenate([[0.0], np.cumsum(hit)])
    ts = s["ts"]

    def count(seconds: float, rows: np.ndarray) -> np.ndarray:  # trailing sums at ``rows`` only
        return cumulative[rows + 1] - cumulative[s.window_start(seconds)[rows]]

    def span_h(start: np.ndarray, rows: np.ndarray) -> np.ndarray:  # as GpuSeries.window_hours
        return ((ts[rows] - ts[start]) / 1e9 + s.step_s) / 3600.0

    # rows with a window's worth of history at all, and enough events in the longest window
    candidates = np.flatnonzero((ts - ts[s.first]) / 1e9 >= c.trend_min_history_s)
    candidates = candidates[count(max(c.trend_windows_s), candidates) >= c.trend_min_events]
    for window in c.trend_windows_s:
        start = s.window_start(window)[candidates]
        recent = cumulative[candidates + 1] - cumulative[start]
        keep = recent >= c.trend_min_events
        rows, recent, start = candidates[keep], recent[keep], start[keep]
        recent_h = span_h(start, rows)
        base_n = cumulative[start] - cumulative[s.first[rows]]
        base_h = span_h(s.first[rows], rows) - recent_h
        newer, newest = count(window / 2, rows), count(window / 4, rows)
        # rising, and not a burst that has faded: the newer half holds at least as many as the older
        # half, and the newest quarter at least half its share of the window's
        ok = (base_h * 3600.0 >= c.trend_min_history_s) & (newer >= recent - newer) & (newest >= recent / 8)
        rows, recent, recent_h, base_n, base_h = rows[ok], recent[ok], recent_h[ok], base_n[ok], base_h[ok]
        if not rows.size:
            continue
        prior_n = base_n + peer[gpu[rows]] * c.trend_prior_hours
        prior_h = base_h + c.trend_prior_hours
        k = recent
        share = recent_h / (recent_h + prior_h)
        # P(X >= k), X ~ Binomial(k + prior_n, share): the regularised incomplete beta (real-valued n)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = betainc(k, prior_n + 1.0, share)
            logp = np.log10(np.clip(p, 1e-300, 1.0))
        ratio = (k / recent_h) / (prior_n / prior_h)
        logp = np.where(ratio >= c.trend_min_ratio, logp, 0.0)
        better = logp < out.log10_p[rows]
        take = rows[better]
        out.log10_p[take] = logp[better]
        out.ratio[take] = ratio[better]
        out.recent_per_hour[take] = (k / recent_h)[better]
        out.baseline_per_hour[take] = (prior_n / prior_h)[better]
        out.window_s[take] = window
    return out


def rising_counter(b: FindingBuilder, events: np.ndarray) -> tuple[np.ndarray, Rise]:
    """Rows where the counter's event rate has risen well above the GPU's own history
    (``log10 p < log10(trend_alpha)``), and the test's figures."""
    rise = rate_rise(b, events)
    return rise.log10_p < np.log10(b.config.trend_alpha), rise


def rise_evidence(rise: Rise, rows: np.ndarray) -> dict:
    """Evidence of the rise over an episode's rows (empty where the rise never held)."""
    tested = rows[rise.log10_p[rows] < 0]
    if not tested.size:
        return {}
    best = tested[np.argmin(rise.log10_p[tested])]
    return {"rise_log10_p": rise.log10_p[best], "rise_window_hours": rise.window_s[best] / 3600.0,
            "rise_rate_per_hour": rise.recent_per_hour[best], "own_baseline_rate_per_hour": rise.baseline_per_hour[best],
            "rise_vs_own_history": rise.ratio[best]}


def mild_straggler(b: FindingBuilder, clock: np.ndarray, eligible: np.ndarray, excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows where a GPU has been slower than its busy node-mates (and its peers) for most of
    ``straggler_mild_persist_s``; and its deviation from the node-mates' median (log clock).

    ``clock`` is the trailing mean of the log clock against peers at the same operating point,
    ``eligible`` the rows with enough busy samples, ``excluded`` rows that must not count (throttled,
    an XID, a heavier load, the node slow as a whole)."""
    s, c = b.s, b.config
    usable = eligible & ~excluded & np.isfinite(clock)
    mates = node_median(b, clock, usable, c.node_wide_min_gpus)
    deviation = clock - mates
    spread = _node_spread(b, deviation, usable)
    slow = (usable & np.isfinite(mates) & (deviation <= -c.straggler_mild_margin)
            & (deviation <= -c.straggler_mild_spread * spread) & (clock <= -c.straggler_mild_margin / 2))
    judged = s.window_count(usable & np.isfinite(mates), c.straggler_mild_persist_s)
    held = s.window_count(slow, c.straggler_mild_persist_s)
    enough = judged >= b.min_samples(c.straggler_mild_persist_s * 0.75)
    flag = slow & enough & (held >= c.straggler_mild_share * np.maximum(judged, 1))
    return flag, deviation


def _node_spread(b: FindingBuilder, deviation: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Per row: 1.4826 x the median absolute deviation from their median of the node's usable GPUs
    at this time (how far apart the GPUs of one job normally sit), at least 0.005 (0.5% of clock)."""
    mad = node_median(b, np.abs(deviation), usable, b.config.node_wide_min_gpus)
    return np.maximum(1.4826 * np.nan_to_num(mad, nan=0.0), 0.005)


def emit_precursor(b: FindingBuilder, kind: FindingKind, strong: np.ndarray, gentle: np.ndarray, severity: Severity,
                   evidence: Callable[[np.ndarray], dict], confidence: Callable[[np.ndarray], float],
                   sustain_s: float, names: tuple[str, str] = ("burst", "rise"),
                   may_cordon: np.ndarray | None = None) -> None:
    """One finding per episode of ``strong | gentle`` (evidence ``basis``: which of ``names`` held). The catalogue's action (a cordon) stands only
    where the strong rule alone would have given it: one of its own episodes inside lasted
    ``sustain_s``, counting only rows where ``may_cordon`` holds (a counter burst judged before the
    GPU has its own history counts for the finding, not for its cordon). Anything else, and every
    episode that only the gentle rule holds, taints at most: a precursor is a warning, never a cordon."""
    flag = strong | gentle
    before = len(b.findings)
    b.emit(kind, flag, severity, evidence, confidence)
    idx, starts = b.episodes(flag)
    if not idx.size:
        return
    ends = np.r_[starts[1:], idx.size] - 1
    action = recommended_action(kind)
    gap = int(b.config.episode_gap_s * _NS)
    ts = b.s["ts"]
    for n, (a, z) in enumerate(zip(starts.tolist(), ends.tolist())):
        finding = b.findings[before + n]
        rows = idx[a:z + 1]
        strong_rows = rows[strong[rows]]
        early = strong_rows[:0] if may_cordon is None else strong_rows[~may_cordon[strong_rows]]
        cordon_rows = strong_rows if may_cordon is None else strong_rows[may_cordon[strong_rows]]
        details = dict(finding.evidence)
        details["basis"] = (names[1] if not strong_rows.size else
                            names[0] if strong_rows.size == rows.size else f"{names[0]} and {names[1]}")
        recommended = finding.recommended_action
        if action in CORDONING_ACTIONS:
            lasted = _longest_episode_s(ts[cordon_rows], gap)
            details["sustained_minutes"] = round(lasted / 60.0, 1)
            if early.size:
                details["burst_minutes_before_own_history"] = round(_longest_episode_s(ts[early], gap) / 60.0, 1)
            recommended = action if cordon_rows.size and lasted >= sustain_s else ActionKind.TAINT
        b.findings[before + n] = replace(finding, evidence=details, recommended_action=recommended)


def _longest_episode_s(ts: np.ndarray, gap_ns: int) -> float:
    """The longest run of ``ts`` (sorted) with no gap above ``gap_ns``, in seconds (0 for none)."""
    if ts.size == 0:
        return 0.0
    cut = np.flatnonzero(np.diff(ts) > gap_ns) + 1
    first, last = np.r_[0, cut], np.r_[cut, ts.size] - 1
    return float(np.max(ts[last] - ts[first])) / _NS
