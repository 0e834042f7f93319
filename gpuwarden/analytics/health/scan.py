"""Health scan: fleet samples in, de-duplicated findings out.

``scan(frame, now)`` runs two families over a window of fleet samples:

1. **Rules for known faults** (``catalogue.XID_RULES``): a new XID event of a tracked code, NVML's
   recovery action, a pending or failed row remap, a double-bit ECC error no XID explains.
   Application XIDs (13, 31, 43, 45, 68) become INFO findings for the workload owner and never
   recommend an action on the node.
2. **Early warning** by peer-relative anomaly detection (``detectors``): single-bit ECC errors and
   correctable row remaps bursting over the peer baseline (HBM degrading, before a DBE or a remap
   failure), PCIe replays (climbing before a GPU falls off the bus, or a storm), thermal and
   power-brake throttle share, temperature above peers, and a GPU slower than its peers at the same
   load with no throttle or error (straggler).

Every signal is computed causally (trailing windows), so a finding's ``first_seen`` is when a
live scan would first have reported it. A finding is one episode of one condition on one GPU;
conditions that come back within ``episode_gap_s`` extend the episode. ``FindingLog`` merges the
findings of successive scans (what the actuator and the evaluation harness do).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pandas as pd
from scipy.stats import poisson

from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.semantics import to_utc

from .catalogue import APPLICATION_XIDS, EARLY_WARNING_KINDS, NVML_RECOVERY, XID_RULES, action_for
from .detectors import CounterBurstDetector, PeerDeviationDetector
from .features import NVLINK_COUNTERS, GpuSeries, gpu_series

_NS = 1_000_000_000


@dataclass(frozen=True)
class HealthConfig:
    """Thresholds of the scan. Defaults were tuned on simulator seeds 1 and 2 only (see
    ``evaluation.TUNING_SEEDS``); the reported figures use other seeds."""

    episode_gap_s: float = 3600.0  # a condition absent this long ends its finding
    active_within_s: float = 600.0  # a finding seen this recently is "active"
    # HBM: single-bit ECC errors + correctable row remaps
    hbm_windows_s: tuple[float, ...] = (3600.0, 6 * 3600.0)
    hbm_alpha: float = 1e-6
    hbm_min_rate_per_hour: float = 0.5
    hbm_min_events: int = 5
    # PCIe replays
    pcie_window_s: float = 3600.0
    pcie_alpha: float = 1e-6
    pcie_min_rate_per_hour: float = 0.5
    pcie_min_events: int = 5
    pcie_storm_per_minute: float = 100.0
    # NVLink CRC / replay / recovery errors (summed over the GPU's links)
    nvlink_windows_s: tuple[float, ...] = (3600.0,)
    nvlink_alpha: float = 1e-6
    nvlink_min_rate_per_hour: float = 0.5
    nvlink_min_events: int = 5
    # Counters are judged by how many samples show new events (a burst within one sample is one
    # event: bursts are what noise looks like, spread-out events what wear looks like), against the
    # larger of the peer group's rate and the GPU's own earlier rate (its history up to
    # ``own_history_lag_s`` before the window, with ``own_prior_hours`` of the peer rate as a prior).
    own_history_lag_s: float = 3600.0
    peer_rate_quantile: float = 0.75
    own_prior_hours: float = 2.0
    # Without this much own history a GPU could be a steadily noisy one: it then needs this many
    # more decades of improbability against its peers alone.
    own_min_history_hours: float = 3.0
    no_history_extra_decades: float = 14.0
    # cooling: temperature no load, ambient or node-mates explain, against the GPU's own history
    cooling_window_s: float = 1800.0
    cooling_history_hours: int = 6
    cooling_excess_celsius: float = 8.0
    cooling_excess_no_history_celsius: float = 18.0
    cooling_min_samples: int = 10
    # throttle share (hardware thermal / power brake / hardware slowdown)
    throttle_window_s: float = 600.0
    throttle_share: float = 0.5
    throttle_min_samples: int = 3
    # temperature above peers at the same load
    hot_window_s: float = 1800.0
    # straggler: clock and power below peers at the same load, no throttle, no error
    straggler_window_s: float = 3600.0
    straggler_min_samples: int = 30
    # robust scales below peers: clock must be clearly low; power at least somewhat low (a heavier
    # phase runs a lower clock at higher power: that is load, not a slow GPU)
    straggler_threshold: float = 4.0
    straggler_min_scale: float = 0.025
    straggler_max_power_excess: float = 0.05  # log power vs peers: a slower clock at more power is load
    dbe_explained_within_s: float = 300.0
    # Early warnings recommend a cordon only once sustained this long (before that: a taint).
    cordon_after_s: float = 1800.0
    straggler_cordon_after_s: float = 2700.0


DEFAULT_CONFIG = HealthConfig()


def scan(frame: pd.DataFrame, now: datetime | pd.Timestamp | None = None, config: HealthConfig | None = None,
         pools: Mapping[str, str] | None = None, report_from: datetime | pd.Timestamp | None = None) -> list[Finding]:
    """Findings over the fleet samples in ``frame`` up to ``now`` (default: the newest sample).

    ``pools`` maps node name -> node pool for peer grouping (default: the node name without a
    trailing ``-<number>``). ``report_from``: samples before it are context only (a streaming scan
    already judged them with more history); conditions there raise no finding of their own.
    Returns findings sorted by severity (critical first), then time.
    """
    config = config or DEFAULT_CONFIG
    if frame is None or len(frame) == 0:
        return []
    if now is not None:
        cutoff = to_utc(now)
        frame = frame[pd.to_datetime(frame["timestamp"], utc=True) <= cutoff]
        if len(frame) == 0:
            return []
    series = gpu_series(frame, pools)
    if len(series) == 0:
        return []
    now_ns = int(series["ts"].max()) if now is None else int(cutoff.value)
    builder = _Builder(series, config, now_ns)
    if report_from is not None:
        builder.report_from_ns = int(to_utc(report_from).value)
    _xid_rules(builder)
    _state_rules(builder)
    _hbm(builder)
    _pcie(builder)
    _nvlink(builder)
    _throttle(builder)
    _cooling(builder)
    _straggler(builder)
    order = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(builder.findings, key=lambda f: (order[f.severity], f.first_seen, f.node, f.gpu_uuid or "", f.kind))


class _Builder:
    def __init__(self, series: GpuSeries, config: HealthConfig, now_ns: int) -> None:
        self.s = series
        self.config = config
        self.now_ns = now_ns
        self.report_from_ns: int | None = None
        self.findings: list[Finding] = []

    def groups(self) -> np.ndarray:
        """Peer group label per row: model and node pool."""
        s = self.s
        n_pools = max(len(s.pools), 1)
        return s["model"] * n_pools + s["pool"]

    def group_label(self, code: int) -> str:
        s = self.s
        n_pools = max(len(s.pools), 1)
        return f"{s.models[code // n_pools]} / {s.pools[code % n_pools]}"

    def episodes(self, flag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows where ``flag`` holds, and the start (into those rows) of each episode."""
        idx = np.flatnonzero(flag)
        if self.report_from_ns is not None and idx.size:
            idx = idx[self.s["ts"][idx] >= self.report_from_ns]
        if idx.size == 0:
            return idx, idx
        ts, gpu = self.s["ts"][idx], self.s["gpu"][idx]
        gap = int(self.config.episode_gap_s * _NS)
        new = np.r_[True, (gpu[1:] != gpu[:-1]) | ((ts[1:] - ts[:-1]) > gap)]
        return idx, np.flatnonzero(new)

    def emit(self, kind: FindingKind, flag: np.ndarray, severity: Severity, action: ActionKind | None,
             evidence: Callable[[np.ndarray], dict], confidence: Callable[[np.ndarray], float],
             sustain_s: float = 0.0) -> None:
        """One finding per episode of ``flag``; ``evidence`` and ``confidence`` see the episode's rows.
        With ``sustain_s``, a cordon is recommended only once the episode has lasted that long; a
        shorter one only taints (noise is brief, wear persists)."""
        idx, starts = self.episodes(flag)
        if idx.size == 0:
            return
        ends = np.r_[starts[1:], idx.size] - 1
        s = self.s
        for a, b in zip(starts.tolist(), ends.tolist()):
            rows = idx[a:b + 1]
            first, last = int(s["ts"][rows[0]]), int(s["ts"][rows[-1]])
            details = {k: _plain(v) for k, v in evidence(rows).items()}
            recommended = action
            if sustain_s and action in (ActionKind.CORDON, ActionKind.DRAIN):
                lasted_s = (last - first) / _NS
                details["sustained_minutes"] = round(lasted_s / 60.0, 1)
                if lasted_s < sustain_s:
                    recommended = ActionKind.TAINT
            self.findings.append(Finding(
                kind=kind, severity=severity, node=str(s.nodes[s["node"][rows[-1]]]),
                gpu_uuid=str(s.gpus[s["gpu"][rows[0]]]), evidence=details, recommended_action=recommended,
                confidence=float(np.clip(confidence(rows), 0.0, 1.0)),
                first_seen=pd.Timestamp(first, tz="UTC").to_pydatetime(),
                last_seen=pd.Timestamp(last, tz="UTC").to_pydatetime(),
                active=bool(last >= self.now_ns - int(self.config.active_within_s * _NS)),
                model=str(s.models[s["model"][rows[0]]]), pool=str(s.pools[s["pool"][rows[0]]]),
            ))


def _plain(value):
    if isinstance(value, (np.floating, float)):
        if not np.isfinite(value):
            return None
        return int(value) if float(value).is_integer() and abs(value) < 2**53 else round(float(value), 4)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _xid_rules(b: _Builder) -> None:
    s = b.s
    for code, rule in XID_RULES.items():
        inc = s[f"inc_xid_{code}_total"]
        if not inc.any():
            continue
        if code in (63, 64):
            continue  # folded into the row-remap state rules below (XID or NVML state, one finding)
        b.emit(rule.kind, inc > 0, rule.severity, rule.action,
               lambda rows, code=code, rule=rule, inc=inc: {
                   "signal": f"xid_{code}_total", "xid": code, "title": rule.title, "events": inc[rows].sum(),
                   "recovery": rule.recovery, "implicates_gpu": rule.implicates_gpu,
                   **({"note": "application fault: the GPU is not implicated; never cordons"} if code in APPLICATION_XIDS else {}),
               },
               lambda rows, rule=rule: rule.confidence)
    inc = s["inc_xid_other_total"]
    if inc.any():
        b.emit(FindingKind.XID_OTHER, inc > 0, Severity.WARNING, None,
               lambda rows: {"signal": "xid_other_total", "events": inc[rows].sum(), "recovery": "inspect",
                             "note": "an XID code without its own column; read the kernel log for the code"},
               lambda rows: 0.5)


def _state_rules(b: _Builder) -> None:
    s = b.s
    # Row remapping: XID 63 / pending flag; XID 64 / failure flag.
    for kind, code, gauge in ((FindingKind.ROW_REMAP_PENDING, 63, "remapped_rows_pending"), (FindingKind.ROW_REMAP_FAILURE, 64, "remapped_rows_failure")):
        rule = XID_RULES[code]
        inc = s[f"inc_xid_{code}_total"]
        state = np.nan_to_num(s[gauge]) > 0
        flag = (inc > 0) | state
        b.emit(kind, flag, rule.severity, rule.action,
               lambda rows, code=code, gauge=gauge, inc=inc, state=state, rule=rule: {
                   "signal": f"xid_{code}_total / {gauge}", "xid": code, "title": rule.title,
                   "xid_events": inc[rows].sum(), f"{gauge}": bool(state[rows].any()),
                   "remapped_rows_uncorrectable_total": _nanmax(s["remapped_rows_uncorrectable_total"][rows]),
                   "recovery": rule.recovery},
               lambda rows, rule=rule: rule.confidence)
    # NVML's recovery action.
    action_value = np.nan_to_num(s["recovery_action"]).astype(int)
    for value, (kind, recovery) in NVML_RECOVERY.items():
        flag = action_value == value
        b.emit(kind, flag, Severity.CRITICAL, action_for(recovery),
               lambda rows, value=value, recovery=recovery: {
                   "signal": "recovery_action", "value": value, "recovery": recovery,
                   "note": "NVML GPU recovery action"},
               lambda rows: 0.95)
    # A double-bit ECC error that no XID 48/94/95 explains (drivers that do not log the XID).
    dbe = s["inc_ecc_dbe_volatile_total"]
    if dbe.any():
        window = b.config.dbe_explained_within_s
        explained = sum(b.s.window_sum(s[f"inc_xid_{c}_total"], window) for c in (48, 94, 95)) > 0
        recovery, severity, action = EARLY_WARNING_KINDS[FindingKind.UNCORRECTABLE_ECC]
        b.emit(FindingKind.UNCORRECTABLE_ECC, (dbe > 0) & ~explained, severity, action,
               lambda rows: {"signal": "ecc_dbe_volatile_total", "events": dbe[rows].sum(), "recovery": recovery,
                             "note": "double-bit ECC errors with no XID 48/94/95 logged"},
               lambda rows: 0.9)


def _nanmax(values: np.ndarray):
    """Largest measured value, or None when nothing was measured (no All-NaN warning)."""
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else None


def _burst(b: _Builder, events: np.ndarray, windows: tuple[float, ...], alpha: float, min_rate: float,
           min_events: int) -> tuple[np.ndarray, CounterBurstDetector, dict[float, np.ndarray]]:
    """log10 p of the samples with new events in each trailing window (the smallest over windows),
    the detector fitted on the peer groups, and the event-sample counts per window."""
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
    return best, detector, counts


def _hbm(b: _Builder) -> None:
    s, c = b.s, b.config
    events = s["inc_ecc_sbe_volatile_total"] + s["inc_remapped_rows_correctable_total"]
    if not events.any():
        return
    best, detector, counts = _burst(b, events, c.hbm_windows_s, c.hbm_alpha, c.hbm_min_rate_per_hour, c.hbm_min_events)
    flag = best < detector.offset_
    floor = s.last_reset()
    recent = s.window_sum(events, 1800, floor)
    before = s.lag_sum(events, 1800, 1800)
    groups = b.groups()
    recovery, severity, action = EARLY_WARNING_KINDS[FindingKind.HBM_DEGRADING]
    short, long = min(c.hbm_windows_s), max(c.hbm_windows_s)
    b.emit(FindingKind.HBM_DEGRADING, flag, severity, action,
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
           lambda rows: 0.5 + 0.05 * (-best[rows].min() - 6.0), sustain_s=c.cordon_after_s)


def _nvlink(b: _Builder) -> None:
    s, c = b.s, b.config
    events = sum(s[f"inc_{name}"] for name in NVLINK_COUNTERS)
    if not np.any(events):
        return
    best, detector, counts = _burst(b, events, c.nvlink_windows_s, c.nvlink_alpha, c.nvlink_min_rate_per_hour,
                                    c.nvlink_min_events)
    flag = best < detector.offset_
    floor = s.last_reset()
    short = min(c.nvlink_windows_s)
    totals = {name: s.window_sum(s[f"inc_{name}"], short, floor) for name in NVLINK_COUNTERS}
    groups = b.groups()
    recovery, severity, action = EARLY_WARNING_KINDS[FindingKind.NVLINK_DEGRADING]
    b.emit(FindingKind.NVLINK_DEGRADING, flag, severity, action,
           lambda rows: {
               "signal": "nvlink_{crc_flit,crc_data,replay,recovery}_errors_total",
               **{f"{name.removeprefix('nvlink_').removesuffix('_total')}_last_{int(short // 60)}m": totals[name][rows[-1]]
                  for name in NVLINK_COUNTERS},
               f"samples_with_errors_last_{int(short // 60)}m": counts[short][rows[-1]],
               "peer_baseline_per_hour": detector.expected(np.array([[0.0, 1.0]]), groups[rows[:1]])[0],
               "log10_p": best[rows].min(), "recovery": recovery,
               "note": "NVLink errors climbing above the peer baseline and the GPU's own history: "
                       "an NVLink fault (XID 74) often follows"},
           lambda rows: 0.5 + 0.05 * (-best[rows].min() - 6.0), sustain_s=c.cordon_after_s)


def _pcie(b: _Builder) -> None:
    s, c = b.s, b.config
    events = s["inc_pcie_replay_total"]
    if not events.any():
        return
    score, detector, counts = _burst(b, events, (c.pcie_window_s,), c.pcie_alpha, c.pcie_min_rate_per_hour,
                                     c.pcie_min_events)
    count = s.window_sum(events, c.pcie_window_s, s.last_reset())
    anomalous = score < detector.offset_
    per_minute = events / s["dt_s"] * 60.0
    storm_steps = s.window_count(per_minute >= c.pcie_storm_per_minute, c.pcie_window_s)
    peak = _window_max(s, per_minute, c.pcie_window_s)
    storm = anomalous & (storm_steps > 0)
    degrading = anomalous & (storm_steps == 0)
    for kind, flag in ((FindingKind.PCIE_REPLAY_STORM, storm), (FindingKind.PCIE_DEGRADING, degrading)):
        recovery, severity, action = EARLY_WARNING_KINDS[kind]
        b.emit(kind, flag, severity, action,
               lambda rows, recovery=recovery, kind=kind: {
                   "signal": "pcie_replay_total", f"replays_last_{int(c.pcie_window_s // 60)}m": count[rows[-1]],
                   "peak_replays_per_minute": peak[rows].max(), "log10_p": score[rows].min(), "recovery": recovery,
                   "note": ("sustained replay storm: check the link / riser / slot" if kind == FindingKind.PCIE_REPLAY_STORM
                            else "PCIe replays climbing: a GPU falling off the bus (XID 79) often follows")},
               lambda rows: 0.5 + 0.05 * (-score[rows].min() - 6.0), sustain_s=c.cordon_after_s)


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


def _throttle(b: _Builder) -> None:
    s, c = b.s, b.config
    measured = s.window_count(s["throttle_measured"] > 0, c.throttle_window_s)
    enough = measured >= c.throttle_min_samples
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
        recovery, severity, action = EARLY_WARNING_KINDS[kind]
        b.emit(kind, flag, severity, action,
               lambda rows, share=share, recovery=recovery, column=column: {
                   "signal": f"throttle_reasons_bitmask ({column.replace('_', ' ')})",
                   f"share_last_{int(c.throttle_window_s // 60)}m": share[rows].max(),
                   "clock_vs_peers": float(np.exp(np.nanmin(clock[rows]))) if np.isfinite(clock[rows]).any() else None,
                   "temperature_above_peers_celsius": np.nanmax(excess[rows]) if np.isfinite(excess[rows]).any() else None,
                   "recovery": recovery},
               lambda rows, share=share: 0.6 + 0.35 * share[rows].max())


def _cooling(b: _Builder) -> None:
    """A GPU warming on its own: its temperature residual (load, fleet ambient and node-mates taken
    out, see ``features.temperature_residual``) above its own recent history. A whole node running
    warm moves its node-mates too and is not a GPU fault; a slot that always runs a few degrees warm
    is its own history."""
    s, c = b.s, b.config
    residual = s["temp_residual"]
    if not np.isfinite(residual).any():
        return
    recent, n_recent = s.window_mean(residual, c.cooling_window_s)
    baseline = _own_hourly_baseline(s, residual, c.cooling_history_hours)
    excess = recent - np.where(np.isfinite(baseline), baseline, 0.0)
    limit = np.where(np.isfinite(baseline), c.cooling_excess_celsius, c.cooling_excess_no_history_celsius)
    flag = (n_recent >= c.cooling_min_samples) & np.isfinite(excess) & (excess >= limit)
    recovery, severity, action = EARLY_WARNING_KINDS[FindingKind.COOLING_DEGRADING]
    temperature = s["temperature_celsius"]
    b.emit(FindingKind.COOLING_DEGRADING, flag, severity, action,
           lambda rows: {"signal": "temperature_celsius at comparable power vs node-mates and the GPU's own history",
                         f"excess_over_own_history_celsius_{int(c.cooling_window_s // 60)}m": np.nanmax(excess[rows]),
                         "own_history_baseline_celsius": None if not np.isfinite(baseline[rows[0]]) else baseline[rows[0]],
                         "temperature_celsius": _nanmax(temperature[rows]),
                         "recovery": recovery,
                         "note": "warming alone (not with its node-mates, not from load): fan, heatsink or "
                                 "coolant; thermal slowdown or shutdown may follow"},
           lambda rows: 0.6 + 0.02 * float(np.nanmax(excess[rows]) - c.cooling_excess_celsius))


def _own_hourly_baseline(s: GpuSeries, values: np.ndarray, history_hours: int) -> np.ndarray:
    """Per row: the median of the GPU's hourly means over the ``history_hours`` hours before the
    current hour (at least 3 of them; NaN otherwise). Causal: the current hour is never included."""
    ts, gpu = s["ts"], s["gpu"]
    hour = ts // (3600 * _NS) - ts.min() // (3600 * _NS)  # clock hours: chunked scans see the same cells
    n_gpu, n_hour = int(gpu.max()) + 1, int(hour.max()) + 1
    cell = gpu * n_hour + hour
    valid = np.isfinite(values)
    total = np.bincount(cell[valid], weights=values[valid], minlength=n_gpu * n_hour)
    count = np.bincount(cell[valid], minlength=n_gpu * n_hour)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(count >= 10, total / np.maximum(count, 1), np.nan).reshape(n_gpu, n_hour)
    table = pd.DataFrame(means.T).rolling(history_hours, min_periods=3).median().shift(1)
    return table.to_numpy().T.reshape(-1)[cell]


def _straggler(b: _Builder) -> None:
    """Slower than its peers at the same operating point, whether or not its power drops (a GPU
    whose clock sags at unchanged power is as slow as one that also draws less). Only active samples
    count (an idle GPU's clock says nothing), and a slower clock at higher power is a heavier load."""
    s, c = b.s, b.config
    window = c.straggler_window_s
    active = s["active"] > 0
    clock, n_clock = s.window_mean(np.where(active, np.clip(s["log_clock_ratio"], -0.7, 0.7), np.nan), window)
    power, _ = s.window_mean(np.where(active, np.clip(s["log_power_ratio"], -0.7, 0.7), np.nan), window)
    throttled = s.window_count((s["thermal"] + s["power_brake"] + s["hw_slowdown"]) > 0, window) > 0
    errors = s.window_sum(sum(s[f"inc_xid_{code}_total"] for code in XID_RULES) + s["inc_xid_other_total"], window) > 0
    eligible = n_clock >= c.straggler_min_samples
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
    flag = score < detector.offset_
    recovery, severity, action = EARLY_WARNING_KINDS[FindingKind.STRAGGLER]
    b.emit(FindingKind.STRAGGLER, flag, severity, action,
           lambda rows: {"signal": "sm_clock_mhz vs peers at the same operating point (power not higher)",
                         f"clock_vs_peers_{int(window // 60)}m": float(np.exp(clock[rows].min())),
                         f"power_vs_peers_{int(window // 60)}m": (float(np.exp(np.nanmin(power[rows])))
                                                                  if np.isfinite(power[rows]).any() else None),
                         "deviation_in_thresholds": -score[rows].min(), "peer_group": b.group_label(int(groups[rows[0]])),
                         "recovery": recovery,
                         "note": "slower than its peers with no throttle reason and no XID: it slows every gang it joins"},
           lambda rows: 0.5 + 0.2 * (-score[rows].min() - 1.0), sustain_s=c.straggler_cordon_after_s)


class FindingLog:
    """Findings merged across scans: one entry per key and episode, first seen kept, last seen and
    evidence taken from the newest scan. ``gap_s`` is the episode gap (as in :class:`HealthConfig`)."""

    def __init__(self, gap_s: float = DEFAULT_CONFIG.episode_gap_s) -> None:
        self.gap = pd.Timedelta(seconds=gap_s)
        self._by_key: dict[tuple, list[Finding]] = {}

    def merge(self, findings: Iterable[Finding]) -> None:
        for finding in findings:
            episodes = self._by_key.setdefault(finding.key, [])
            for i, known in enumerate(episodes):
                if finding.first_seen <= known.last_seen + self.gap and finding.last_seen >= known.first_seen - self.gap:
                    newer = finding if finding.last_seen >= known.last_seen else known
                    episodes[i] = replace(
                        newer, first_seen=min(known.first_seen, finding.first_seen),
                        last_seen=max(known.last_seen, finding.last_seen),
                        confidence=max(known.confidence, finding.confidence))
                    break
            else:
                episodes.append(finding)

    def findings(self) -> list[Finding]:
        return sorted((f for episodes in self._by_key.values() for f in episodes), key=lambda f: (f.first_seen, f.key))

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())


class StreamingScanner:
    """Scans a stream of sample chunks (in time order) the way a periodic live scan would, keeping
    ``context_s`` of earlier samples so trailing windows are full at each chunk's start."""

    def __init__(self, config: HealthConfig | None = None, context_s: float | None = None,
                 pools: Mapping[str, str] | None = None) -> None:
        self.config = config or DEFAULT_CONFIG
        longest = max(max(self.config.hbm_windows_s), max(self.config.nvlink_windows_s), self.config.straggler_window_s,
                      self.config.pcie_window_s, (self.config.cooling_history_hours + 1) * 3600.0)
        self.context = pd.Timedelta(seconds=context_s if context_s is not None else longest + 600)
        self.pools = pools
        self.log = FindingLog(self.config.episode_gap_s)
        self._tail: pd.DataFrame | None = None

    def feed(self, chunk: pd.DataFrame) -> list[Finding]:
        if chunk.empty:  # nothing new (below, iloc[-0:] would be the whole tail, reported again)
            return []
        frame = chunk if self._tail is None else pd.concat([self._tail, chunk], ignore_index=True)
        stamps = pd.to_datetime(frame["timestamp"], utc=True)  # once per feed: frame = [tail, chunk]
        report_from = None if self._tail is None or self._tail.empty else stamps.iloc[-len(chunk):].min()
        found = scan(frame, config=self.config, pools=self.pools, report_from=report_from)
        self.log.merge(found)
        self._tail = frame[(stamps > stamps.max() - self.context).to_numpy()]
        return found

    def findings(self) -> list[Finding]:
        return self.log.findings()
