"""Early warning by peer-relative anomaly detection (``detectors``): HBM single-bit ECC errors and
correctable row remaps, NVLink and PCIe errors bursting over the peer baseline and the GPU's own
history; throttle share; cooling worse than the GPU's own history; a straggler slower than its
peers at the same load with no throttle or error. Every signal uses trailing windows only."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import poisson

from gpuwarden.fleet import FindingKind

from .catalogue import EARLY_WARNING_KINDS, FAULT_ACTIONS, XID_RULES
from .detectors import CounterBurstDetector, PeerDeviationDetector
from .features import NVLINK_COUNTERS, GpuSeries
from .finding_builder import _NS, FindingBuilder, nanmax
from .node_rules import node_condition_findings, node_median, node_share, node_warm
from .trend_rules import emit_precursor, mild_straggler, rise_evidence, rising_counter

# Throttle kinds whose node-wide rows are a node condition of this kind.
_NODE_THROTTLE = {FindingKind.THERMAL_THROTTLE: FindingKind.NODE_WIDE_THERMAL,
                  FindingKind.POWER_BRAKE_THROTTLE: FindingKind.NODE_WIDE_SLOWDOWN,
                  FindingKind.HW_SLOWDOWN: FindingKind.NODE_WIDE_SLOWDOWN}


def early_warning_findings(b: FindingBuilder) -> None:
    """Every early-warning detector over ``b``'s series; findings go to ``b.findings``. What the
    GPUs of a node show together goes to one node finding instead (``node_rules``)."""
    _hbm(b)
    _pcie(b)
    _nvlink(b)
    shared: dict[FindingKind, list[tuple[str, np.ndarray]]] = {}
    _throttle(b, shared)
    _cooling(b)
    _straggler(b, shared)
    _straggler_alone(b)
    node_condition_findings(b, shared)


def _burst(b: FindingBuilder, events: np.ndarray, windows: tuple[float, ...], alpha: float, min_rate: float,
           min_events: int) -> tuple[np.ndarray, CounterBurstDetector, dict[float, np.ndarray], np.ndarray]:
    """log10 p of the samples with new events in each trailing window (the smallest over windows),
    the detector fitted on the peer groups, the event-sample counts per window, and whether each
    row's GPU has ``own_min_history_hours`` of its own history before the shortest window (and its
    lag): a burst judged before that may taint, never cordon (``emit_precursor``'s ``may_cordon``),
    for a link that errs steadily from its first sample is a noisy link, not a failing one."""
    s, c = b.s, b.config
    gpu = s["gpu"]
    hit = (np.nan_to_num(events) > 0).astype(float)
    totals = np.bincount(gpu, weights=hit)
    hours = np.bincount(gpu, weights=s["dt_s"]) / 3600.0
    group_of_gpu = np.zeros(totals.size, dtype=np.int64)
    groups = b.groups()
    group_of_gpu[gpu] = groups
    present = np.bincount(gpu) > 0
    detector = CounterBurstDetector(alpha=alpha, min_rate_per_hour=min_rate, min_events=min_events,
                                    quantile=c.peer_rate_quantile).fit(
        np.column_stack([totals[present], hours[present]]), groups=group_of_gpu[present])
    floor = s.last_reset()  # events before a reset (GPU reset / repair) do not count after it
    peer_rate = detector.expected(np.column_stack([np.zeros(len(s)), np.ones(len(s))]), groups)
    best = np.zeros(len(s))
    counts: dict[float, np.ndarray] = {}
    for window in windows:
        count = s.window_sum(hit, window, floor)
        counts[window] = count
        rows = np.flatnonzero(count >= min_events)
        if not rows.size:
            continue
        hours_now = s.window_hours(window, floor)[rows]
        # The GPU's own rate before this window (and a lag): a steadily noisy GPU is not a burst.
        # (across counter resets: a driver reload does not make a noisy link quiet)
        lag = window + c.own_history_lag_s
        before = s.window_sum(hit, 1e9)[rows] - s.window_sum(hit, lag)[rows]
        before_hours = np.maximum(s.window_hours(1e9)[rows] - lag / 3600.0, 0.0)
        own_rate = (before + peer_rate[rows] * c.own_prior_hours) / (before_hours + c.own_prior_hours)
        mu = hours_now * np.maximum(peer_rate[rows], own_rate)
        with np.errstate(divide="ignore"):
            logp = np.log10(np.maximum(poisson.sf(count[rows] - 1, np.maximum(mu, 1e-12)), 1e-300))
        logp = np.where(before_hours >= c.own_min_history_hours, logp, np.minimum(logp + c.no_history_extra_decades, 0.0))
        best[rows] = np.minimum(best[rows], logp)
    lag_h = (min(windows) + c.own_history_lag_s) / 3600.0
    return best, detector, counts, s.window_hours(1e9) - lag_h >= c.own_min_history_hours


def _hbm(b: FindingBuilder) -> None:
    s, c = b.s, b.config
    events = s["inc_ecc_sbe_volatile_total"] + s["inc_remapped_rows_correctable_total"]
    if not events.any():
        return
    best, detector, counts, seasoned = _burst(b, events, c.hbm_windows_s, c.hbm_alpha, c.hbm_min_rate_per_hour,
                                              c.hbm_min_events)
    flag = best < detector.offset_
    floor = s.last_reset()
    recent = s.window_sum(events, 1800, floor)
    before = s.lag_sum(events, 1800, 1800)
    groups = b.groups()
    severity, recovery = EARLY_WARNING_KINDS[FindingKind.HBM_DEGRADING], FAULT_ACTIONS[FindingKind.HBM_DEGRADING].recovery
    short, long = min(c.hbm_windows_s), max(c.hbm_windows_s)
    emit_precursor(b, FindingKind.HBM_DEGRADING, flag, np.zeros(len(s), dtype=bool), severity,
           lambda rows: {
               "signal": "ecc_sbe_volatile_total + remapped_rows_correctable_total",
               f"samples_with_errors_last_{int(short // 60)}m": counts[short][rows[-1]],
               f"samples_with_errors_last_{int(long // 3600)}h": counts[long][rows[-1]],
               "sbe_errors": s["inc_ecc_sbe_volatile_total"][rows[0]:rows[-1] + 1].sum(),
               "correctable_remaps": s["inc_remapped_rows_correctable_total"][rows[0]:rows[-1] + 1].sum(),
               "peer_baseline_per_hour": detector.expected(np.array([[0.0, 1.0]]), groups[rows[:1]])[0],
               "log10_p": best[rows].min(),
               "trend_last30m_vs_previous30m": f"{recent[rows[-1]]:.0f} vs {before[rows[-1]]:.0f}",
               "recovery": recovery,
               "note": "single-bit ECC errors and correctable remaps above the peer baseline and the GPU's own "
                       "history: a double-bit error or a remap failure may follow"},
           lambda rows: 0.5 + 0.05 * (-best[rows].min() - 6.0), c.cordon_after_s, may_cordon=seasoned)


def _nvlink(b: FindingBuilder) -> None:
    s, c = b.s, b.config
    events = sum(s[f"inc_{name}"] for name in NVLINK_COUNTERS)
    if not np.any(events):
        return
    best, detector, counts, seasoned = _burst(b, events, c.nvlink_windows_s, c.nvlink_alpha,
                                              c.nvlink_min_rate_per_hour, c.nvlink_min_events)
    flag = best < detector.offset_
    rising, rise = rising_counter(b, events)
    floor = s.last_reset()
    short = min(c.nvlink_windows_s)
    totals = {name: s.window_sum(s[f"inc_{name}"], short, floor) for name in NVLINK_COUNTERS}
    groups = b.groups()
    severity, recovery = EARLY_WARNING_KINDS[FindingKind.NVLINK_DEGRADING], FAULT_ACTIONS[FindingKind.NVLINK_DEGRADING].recovery
    emit_precursor(b, FindingKind.NVLINK_DEGRADING, flag, rising, severity,
           lambda rows: {
               "signal": "nvlink_{crc_flit,crc_data,replay,recovery}_errors_total",
               **{f"{name.removeprefix('nvlink_').removesuffix('_total')}_last_{int(short // 60)}m": totals[name][rows[-1]]
                  for name in NVLINK_COUNTERS},
               f"samples_with_errors_last_{int(short // 60)}m": counts[short][rows[-1]],
               "peer_baseline_per_hour": detector.expected(np.array([[0.0, 1.0]]), groups[rows[:1]])[0],
               "log10_p": best[rows].min(), **rise_evidence(rise, rows), "recovery": recovery,
               "note": "NVLink errors climbing above the peer baseline or the GPU's own history: "
                       "an NVLink fault (XID 74) often follows"},
           lambda rows: 0.5 + 0.05 * (-min(best[rows].min(), rise.log10_p[rows].min()) - 6.0), c.cordon_after_s,
           may_cordon=seasoned)


def _pcie(b: FindingBuilder) -> None:
    s, c = b.s, b.config
    events = s["inc_pcie_replay_total"]
    if not events.any():
        return
    score, detector, counts, seasoned = _burst(b, events, (c.pcie_window_s,), c.pcie_alpha, c.pcie_min_rate_per_hour,
                                               c.pcie_min_events)
    count = s.window_sum(events, c.pcie_window_s, s.last_reset())
    anomalous = score < detector.offset_
    per_minute = events / s["dt_s"] * 60.0
    storm_steps = s.window_count(per_minute >= c.pcie_storm_per_minute, c.pcie_window_s)
    peak = _window_max(s, per_minute, c.pcie_window_s)
    storm = anomalous & (storm_steps > 0)
    degrading = anomalous & (storm_steps == 0)
    rising, rise = rising_counter(b, events)
    # a storm is its own finding: replays climbing over a window that holds one are the storm's
    rising &= s.window_count(per_minute >= c.pcie_storm_per_minute, max(c.trend_windows_s)) == 0
    for kind, flag, gentle in ((FindingKind.PCIE_REPLAY_STORM, storm, np.zeros(len(s), dtype=bool)),
                               (FindingKind.PCIE_DEGRADING, degrading, rising)):
        severity, recovery = EARLY_WARNING_KINDS[kind], FAULT_ACTIONS[kind].recovery
        emit_precursor(b, kind, flag, gentle, severity,
               lambda rows, recovery=recovery, kind=kind: {
                   "signal": "pcie_replay_total", f"replays_last_{int(c.pcie_window_s // 60)}m": count[rows[-1]],
                   "peak_replays_per_minute": peak[rows].max(), "log10_p": score[rows].min(),
                   **rise_evidence(rise, rows), "recovery": recovery,
                   "note": ("sustained replay storm: check the link / riser / slot" if kind == FindingKind.PCIE_REPLAY_STORM
                            else "PCIe replays climbing: a GPU falling off the bus (XID 79) often follows")},
               lambda rows: 0.5 + 0.05 * (-min(score[rows].min(), rise.log10_p[rows].min()) - 6.0), c.cordon_after_s,
               may_cordon=seasoned)


def _window_max(s: GpuSeries, values: np.ndarray, seconds: float) -> np.ndarray:
    """Trailing maximum, approximated on a one-minute grid by a short loop over lags (windows here
    are minutes long)."""
    values = np.nan_to_num(np.asarray(values, dtype=float))
    out = values.copy()
    steps = int(round(seconds / s.step_s))
    start = s.window_start(seconds)
    for lag in range(1, max(steps, 1)):
        index = np.arange(len(values)) - lag
        ok = index >= start
        out[ok] = np.maximum(out[ok], values[index[ok]])
    return out


def _throttle(b: FindingBuilder, shared: dict[FindingKind, list[tuple[str, np.ndarray]]]) -> None:
    s, c = b.s, b.config
    measured = s.window_count(s["throttle_measured"] > 0, c.throttle_window_s)
    enough = measured >= b.min_samples(c.throttle_min_s)
    excess, _ = s.window_mean(s["temp_excess"], c.hot_window_s)
    clock, _ = s.window_mean(s["log_clock_ratio"], c.throttle_window_s)
    any_throttle = np.zeros(len(s), dtype=bool)
    for kind, column in ((FindingKind.THERMAL_THROTTLE, "thermal"), (FindingKind.POWER_BRAKE_THROTTLE, "power_brake"), (FindingKind.HW_SLOWDOWN, "hw_slowdown")):
        hits = s.window_count(s[column] > 0, c.throttle_window_s)
        share = np.where(enough, hits / np.maximum(measured, 1), 0.0)
        any_throttle |= hits > 0
        flag = enough & (share >= c.throttle_share)
        if not flag.any():
            continue
        # Most of the node's busy GPUs throttling for this reason at all (idle GPUs have no say):
        # the node's (inlet air, a power brake on the node's supply), not its GPUs'.
        node_wide = node_share(b, hits > 0, (hits > 0) | (s["active"] > 0), min_gpus=2)  # two failing at once: rare
        if kind == FindingKind.THERMAL_THROTTLE:  # on a node running warm as a whole, whatever its load
            node_wide |= node_warm(b)
        shared.setdefault(_NODE_THROTTLE[kind], []).append(
            (f"throttle_reasons_bitmask ({column.replace('_', ' ')})", flag & node_wide))
        flag &= ~node_wide
        severity, recovery = EARLY_WARNING_KINDS[kind], FAULT_ACTIONS[kind].recovery
        b.emit(kind, flag, severity,
               lambda rows, share=share, recovery=recovery, column=column: {
                   "signal": f"throttle_reasons_bitmask ({column.replace('_', ' ')})",
                   f"share_last_{int(c.throttle_window_s // 60)}m": share[rows].max(),
                   "clock_vs_peers": float(np.exp(np.nanmin(clock[rows]))) if np.isfinite(clock[rows]).any() else None,
                   "temperature_above_peers_celsius": np.nanmax(excess[rows]) if np.isfinite(excess[rows]).any() else None,
                   "recovery": recovery},
               lambda rows, share=share: 0.6 + 0.35 * share[rows].max())


def _cooling(b: FindingBuilder) -> None:
    """A GPU warming on its own: its temperature residual (load, fleet ambient and node-mates taken
    out, see ``features.temperature_residual``) above its own recent history. A whole node running
    warm moves its node-mates too and is not a GPU fault; a slot that always runs a few degrees warm
    is its own history."""
    s, c = b.s, b.config
    residual = s["temp_residual"]
    if not np.isfinite(residual).any():
        return
    recent, n_recent = s.window_mean(residual, c.cooling_window_s)
    baseline = _own_hourly_baseline(s, residual, c.cooling_history_hours, b.min_samples(600.0))
    excess = recent - np.where(np.isfinite(baseline), baseline, 0.0)
    limit = np.where(np.isfinite(baseline), c.cooling_excess_celsius, c.cooling_excess_no_history_celsius)
    flag = (n_recent >= b.min_samples(c.cooling_min_s)) & np.isfinite(excess) & (excess >= limit)
    severity, recovery = EARLY_WARNING_KINDS[FindingKind.COOLING_DEGRADING], FAULT_ACTIONS[FindingKind.COOLING_DEGRADING].recovery
    temperature = s["temperature_celsius"]
    b.emit(FindingKind.COOLING_DEGRADING, flag, severity,
           lambda rows: {"signal": "temperature_celsius at comparable power vs node-mates and the GPU's own history",
                         f"excess_over_own_history_celsius_{int(c.cooling_window_s // 60)}m": np.nanmax(excess[rows]),
                         "own_history_baseline_celsius": None if not np.isfinite(baseline[rows[0]]) else baseline[rows[0]],
                         "temperature_celsius": nanmax(temperature[rows]),
                         "recovery": recovery,
                         "note": "warming alone (not with its node-mates, not from load): fan, heatsink or "
                                 "coolant; thermal slowdown or shutdown may follow"},
           lambda rows: 0.6 + 0.02 * float(np.nanmax(excess[rows]) - c.cooling_excess_celsius))


def _straggler_alone(b: FindingBuilder) -> None:
    """A GPU with no peers to judge it by (alone in its model and pool at its operating point: a
    one-GPU fleet, a model's only card) against its own history instead: its active clock over the
    window at least ``node_slow_margin`` (log) below its own hourly baseline, at power not higher than
    its own, with no throttle reason and no XID. A GPU slow from its first sample has no history to
    be slower than: that is said by no finding (it needs peers)."""
    s, c = b.s, b.config
    window = c.straggler_window_s
    alone = (s["active"] > 0) & ~np.isfinite(s["log_clock_ratio"])
    if not alone.any():
        return
    with np.errstate(divide="ignore", invalid="ignore"):
        log_clock = np.where(alone & (s["sm_clock_mhz"] > 0), np.log(s["sm_clock_mhz"]), np.nan)
        log_power = np.where(alone & (s["power_watts"] > 0), np.log(s["power_watts"]), np.nan)
    recent, n_recent = s.window_mean(log_clock, window)
    recent_power, _ = s.window_mean(log_power, window)
    per_hour = b.min_samples(600.0)
    clock_drop = recent - _own_hourly_baseline(s, log_clock, c.cooling_history_hours, per_hour)
    power_rise = recent_power - _own_hourly_baseline(s, log_power, c.cooling_history_hours, per_hour)
    throttled = s.window_count((s["thermal"] + s["power_brake"] + s["hw_slowdown"]) > 0, window) > 0
    errors = s.window_sum(sum(s[f"inc_xid_{code}_total"] for code in XID_RULES) + s["inc_xid_other_total"], window) > 0
    flag = (alone & (n_recent >= b.min_samples(c.straggler_min_active_s)) & np.isfinite(clock_drop)
            & (clock_drop <= -c.node_slow_margin) & ~(np.nan_to_num(power_rise) > c.straggler_max_power_excess)
            & ~throttled & ~errors)
    severity, recovery = EARLY_WARNING_KINDS[FindingKind.STRAGGLER], FAULT_ACTIONS[FindingKind.STRAGGLER].recovery
    b.emit(FindingKind.STRAGGLER, flag, severity,
           lambda rows: {"signal": "sm_clock_mhz vs the GPU's own history (no peers at its operating point)",
                         f"clock_vs_own_history_{int(window // 60)}m": float(np.exp(np.nanmin(clock_drop[rows]))),
                         "recovery": recovery,
                         "note": "slower than it used to be with no throttle reason and no XID; no peer to compare with"},
           lambda rows: 0.5 + min(0.3, -float(np.nanmin(clock_drop[rows]))), sustain_s=c.straggler_cordon_after_s)


def _own_hourly_baseline(s: GpuSeries, values: np.ndarray, history_hours: int, min_per_hour: int) -> np.ndarray:
    """Per row: the median of the GPU's hourly means (of at least ``min_per_hour`` samples) over the
    ``history_hours`` hours before the current hour (at least 3 of them; NaN otherwise). Causal: the
    current hour is never included."""
    ts, gpu = s["ts"], s["gpu"]
    hour = ts // (3600 * _NS) - ts.min() // (3600 * _NS)  # clock hours: chunked scans see the same cells
    n_gpu, n_hour = int(gpu.max()) + 1, int(hour.max()) + 1
    cell = gpu * n_hour + hour
    valid = np.isfinite(values)
    total = np.bincount(cell[valid], weights=values[valid], minlength=n_gpu * n_hour)
    count = np.bincount(cell[valid], minlength=n_gpu * n_hour)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(count >= min_per_hour, total / np.maximum(count, 1), np.nan).reshape(n_gpu, n_hour)
    table = pd.DataFrame(means.T).rolling(history_hours, min_periods=3).median().shift(1)
    return table.to_numpy().T.reshape(-1)[cell]


def _straggler(b: FindingBuilder, shared: dict[FindingKind, list[tuple[str, np.ndarray]]]) -> None:
    """Slower than its peers at the same operating point, whether or not its power drops (a GPU
    whose clock sags at unchanged power is as slow as one that also draws less). Only active samples
    count (an idle GPU's clock says nothing), and a slower clock at higher power is a heavier load.
    Slower than its node-mates too: when most of a node is slow together, that is the node's
    (a power cap, a clock policy: ``node_rules``), and a GPU there is a straggler only when it is
    slower than its node-mates as well."""
    s, c = b.s, b.config
    window = c.straggler_window_s
    active = s["active"] > 0
    clock, n_clock = s.window_mean(np.where(active, np.clip(s["log_clock_ratio"], -0.7, 0.7), np.nan), window)
    power, _ = s.window_mean(np.where(active, np.clip(s["log_power_ratio"], -0.7, 0.7), np.nan), window)
    throttled = s.window_count((s["thermal"] + s["power_brake"] + s["hw_slowdown"]) > 0, window) > 0
    errors = s.window_sum(sum(s[f"inc_xid_{code}_total"] for code in XID_RULES) + s["inc_xid_other_total"], window) > 0
    eligible = n_clock >= b.min_samples(c.straggler_min_active_s)
    if not eligible.any():
        return
    X = clock[:, None]
    groups = b.groups()
    fit_rows = np.flatnonzero(eligible)[:: max(1, int(np.flatnonzero(eligible).size // 200_000))]
    detector = PeerDeviationDetector(threshold=c.straggler_threshold, min_scale=c.straggler_min_scale,
                                     direction="low", require="all").fit(X[fit_rows], groups=groups[fit_rows])
    not_load = ~(np.nan_to_num(power) > c.straggler_max_power_excess)
    rows = np.flatnonzero(eligible & ~throttled & ~errors & not_load)
    score = np.zeros(len(s))
    if rows.size:
        score[rows] = detector.score_samples(X[rows], groups[rows])
    slow = score < detector.offset_
    # The node as a whole: most of its GPUs slow together (a clock policy), or its busy GPUs' clock
    # well below their model and pool's whatever the power (a node power cap: at their lower power
    # they are each other's peers).
    pool_clock, _ = s.window_mean(np.where(active, s["log_clock_vs_pool"], np.nan), window)
    node_pool_clock = node_median(b, pool_clock, eligible, c.node_wide_min_gpus)
    node_wide = eligible & (node_share(b, slow, eligible & ~errors) | (node_pool_clock <= -c.node_slow_margin))
    # Slower than its node-mates too: half of a node's busy GPUs slower than the rest together (one
    # job's GPUs under a policy, with a faster job beside them) are the node's too; fewer are
    # stragglers (two faulty GPUs of eight are two findings). With no node-mate to compare with, not
    # while its window still holds a node-wide slowdown.
    mates = node_median(b, clock, eligible & ~errors, c.node_wide_min_gpus)  # fewer: two slow of three set the median
    below = slow & (clock - mates <= -c.straggler_node_margin)
    several = node_share(b, below, eligible & ~errors, share=0.5)  # as many GPUs as a node-wide condition
    node_wide |= several
    # Fewer busy GPUs than a node-wide condition needs (one job of two or three GPUs on a node under
    # a clock policy or power cap): every one of them (two at least) slow at once, none well below the
    # others, and drawing less power than its peers as a lower clock target makes them, is the node's
    # too. One slow GPU beside a normal one, or slow GPUs at their peers' power (a clock that sags
    # with no lower power: no node setting does that), are still stragglers.
    with_mates = node_median(b, clock, eligible & ~errors, 2)
    together = (slow & (clock - with_mates > -c.straggler_node_margin)
                & (np.nan_to_num(power, nan=0.0) <= -c.straggler_max_power_excess))
    node_wide |= eligible & node_share(b, together, eligible & ~errors, min_gpus=2, share=1.0)
    after_node_wide = s.window_count(node_wide, window) > 0
    after_several = s.window_count(several, window) > 0  # its window still holds the slow spell of several
    flag = np.where(np.isfinite(mates), below & ~after_several, slow & ~after_node_wide)
    # a mild straggler: a few percent slower than its node-mates (the same job), window after window
    mild, mild_deviation = mild_straggler(b, clock, eligible, throttled | errors | ~not_load | after_several | after_node_wide)
    # the node's rows that show it themselves (gpus_affected counts those, not every busy GPU)
    shared.setdefault(FindingKind.NODE_WIDE_SLOWDOWN, []).append(
        ("sm_clock_mhz of the node's busy GPUs vs their peers and their model and pool's",
         node_wide & (slow | (pool_clock <= -c.node_slow_margin))))
    # The node's only busy GPU, slow at lower power: a clock policy or power cap on its node looks the
    # same, and no node-mate can tell them apart. A warning (taint), never a cordon, on that alone.
    alone = ~np.isfinite(with_mates) & (np.nan_to_num(power, nan=0.0) <= -c.straggler_max_power_excess)
    # The node's only busy GPU, slow at lower power: a clock policy or power cap on its node looks the
    # same, and no node-mate can tell them apart. A warning (taint), never a cordon, on that alone.
    alone = ~np.isfinite(with_mates) & (np.nan_to_num(power, nan=0.0) <= -c.straggler_max_power_excess)
    severity, recovery = EARLY_WARNING_KINDS[FindingKind.STRAGGLER], FAULT_ACTIONS[FindingKind.STRAGGLER].recovery
    emit_precursor(b, FindingKind.STRAGGLER, flag, mild, severity,
           lambda rows: {"signal": "sm_clock_mhz vs peers at the same operating point (power not higher)",
                         f"clock_vs_peers_{int(window // 60)}m": float(np.exp(clock[rows].min())),
                         f"power_vs_peers_{int(window // 60)}m": (float(np.exp(np.nanmin(power[rows])))
                                                                  if np.isfinite(power[rows]).any() else None),
                         "clock_vs_node_mates": (float(np.exp(np.nanmin(clock[rows] - mates[rows])))
                                                 if np.isfinite(mates[rows]).any() else None),
                         "deviation_in_thresholds": -score[rows].min(), "peer_group": b.group_label(int(groups[rows[0]])),
                         "persistent_clock_vs_node_mates": (float(np.exp(np.nanmax(mild_deviation[rows[mild[rows]]])))
                                                            if mild[rows].any() else None),
                         "recovery": recovery,
                         "note": "slower than its peers with no throttle reason and no XID: it slows every gang it joins"},
           lambda rows: 0.5 + 0.2 * max(-score[rows].min() - 1.0, 0.0) if not mild[rows].all() else 0.5,
           c.straggler_cordon_after_s, names=("peer outlier", "persistent"), may_cordon=~alone)
