"""Observability collapse: the minutes before a GPU falls off the bus, its observability thins out.
Series vanish now and then while the values still look normal, scrapes of its node's exporter slow
down and return fewer samples, and ``up`` flaps (a study of a production fleet's detachments,
arXiv 2603.28781). Any one of these happens on healthy nodes every day (a target restarts, a scrape
times out once, Prometheus itself restarts); several together, on one node while its peers' scrapes
go on as before, are worth a person's look.

Signals, judged on the fleet's sampling grid over a trailing ``window_s`` (30 minutes):

- **series thinning** (per GPU): the GPU missing at ``min_missed`` or more of its node's samples
  while node-mates report, in two separate runs or more (flickering; one silence from then on is
  ``gpu-series-lost``); not counted within ``settle_s`` after a node or target gap (the GPUs of a
  rebooted node come back one by one);
- **scrape slowing** (per node, scrape health only): a successful scrape slower than its own
  baseline (the ``baseline_s`` before the window) by ``slow_k`` robust deviations and ``slow_ratio``
  times its median, beyond what the whole fleet's scrapes slowed at that time (a busy Prometheus
  slows every target);
- **samples lost** (per node, scrape health only): a successful scrape returning fewer samples than
  any in its baseline and ``samples_drop_share`` below its median, beyond the fleet's own change;
- **``up`` flapping** (per node): ``min_flaps`` or more 1 -> 0 transitions of the target's ``up``
  in the window (without scrape health: the node's series vanishing while most of the fleet reports).

A finding (``observability-collapse``, warning) needs ``min_signals`` of them at once: per GPU when
its own series thin (evidence: the signals, the GPU's missed samples, the node's scrape figures),
per node (``gpu_uuid`` null) when the node's scrapes collapse with no GPU singled out. It never
recommends an action: it is a watch, and the cordon stays with the XID (79) or with
``gpu-series-lost``. Without scrape health (a samples file) only series presence is judged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwarden.fleet import Finding, FindingKind

from .catalogue import EARLY_WARNING_KINDS, FAULT_ACTIONS
from .finding_builder import FindingBuilder
from .scrape_grid import ScrapeGrid, window_sum

_NS = 1_000_000_000


@dataclass(frozen=True)
class CollapseConfig:
    """Thresholds of the observability-collapse rule (durations in seconds)."""

    window_s: float = 1800.0
    baseline_s: float = 6 * 3600.0
    min_signals: int = 2
    min_missed: int = 3
    settle_s: float = 300.0
    slow_k: float = 6.0
    slow_ratio: float = 2.0
    slow_min_steps: int = 2
    samples_drop_share: float = 0.03
    samples_min_steps: int = 2
    min_flaps: int = 2
    min_baseline_steps: int = 20
    presence_only_min_missed: int = 6  # without scrape health, a GPU thinning this much is a finding alone


DEFAULT_COLLAPSE = CollapseConfig()
SIGNALS = ("series_thinning", "scrape_slowing", "samples_lost", "up_flapping")


def collapse_findings(b: FindingBuilder, scrape: pd.DataFrame | None = None,
                      config: CollapseConfig = DEFAULT_COLLAPSE) -> None:
    """Append the scan's observability-collapse findings to ``b.findings``."""
    if len(b.s) == 0:
        return
    grid = ScrapeGrid(b.s, scrape, settle_s=config.settle_s)
    w = grid.steps(config.window_s)
    thinning_gpu = _thinning(grid, config, w)
    signals = {
        "series_thinning": np.zeros_like(grid.node_present),
        "scrape_slowing": window_sum(_slow(grid, config, w) & ~grid.settling, w) >= config.slow_min_steps,
        "samples_lost": window_sum(_dropped(grid, config, w) & ~grid.settling, w) >= config.samples_min_steps,
        "up_flapping": grid.flaps(w) >= config.min_flaps,
    }
    for g in range(thinning_gpu.shape[0]):
        signals["series_thinning"][grid.gpu_node[g]] |= thinning_gpu[g]
    count = sum(v.astype(np.int64) for v in signals.values())
    flagged = count >= config.min_signals
    strong = _thinning(grid, config, w, config.presence_only_min_missed) if not grid.has_scrape else None
    for g in range(thinning_gpu.shape[0]):
        node = grid.gpu_node[g]
        flag = flagged[node] & thinning_gpu[g]
        if strong is not None:  # presence only: series thinning is all there is to see
            flag |= strong[g]
        _emit(b, grid, config, signals, flag, node, g)
    no_gpu = flagged & ~signals["series_thinning"]
    for node in range(no_gpu.shape[0]):
        _emit(b, grid, config, signals, no_gpu[node], node, None)


def _thinning(grid: ScrapeGrid, config: CollapseConfig, w: int, min_missed: int | None = None) -> np.ndarray:
    """(GPU, grid) -> its series thins: missed ``min_missed`` times while its node reports, in two
    separate runs or more (flickering; one silence from then on is ``gpu-series-lost``'s)."""
    mates = grid.node_present[grid.gpu_node] & ~grid.settling[grid.gpu_node]
    missed = mates & ~grid.gpu_present & grid.gpu_seen_before
    runs = missed & ~np.concatenate([np.zeros((missed.shape[0], 1), dtype=bool), missed[:, :-1]], axis=1)
    least = config.min_missed if min_missed is None else min_missed
    return (window_sum(missed, w) >= least) & (window_sum(runs, w) >= 2)


def _baseline(values: np.ndarray, config: CollapseConfig, w: int, steps: int) -> tuple[np.ndarray, ...]:
    """Per node and grid point: median, robust scale (IQR / 1.349) and minimum of ``values`` over
    the baseline (the ``baseline_s`` before the trailing window)."""
    frame = pd.DataFrame(values.T)
    rolling = frame.rolling(steps, min_periods=config.min_baseline_steps)
    shifted = [r.shift(w).to_numpy().T for r in (rolling.median(), rolling.quantile(0.75), rolling.quantile(0.25),
                                                 rolling.min())]
    median, q75, q25, low = shifted
    return median, (q75 - q25) / 1.349, low


def _fleet_ratio(ratio: np.ndarray, least: int = 3) -> np.ndarray:
    """The fleet's median of a per-node ratio at each grid point; 1 where fewer than ``least`` nodes
    have one (a node is not its own peer)."""
    out = np.full(ratio.shape[1], 1.0)
    cols = np.isfinite(ratio).sum(axis=0) >= least
    if cols.any():
        with np.errstate(all="ignore"):
            out[cols] = np.nanmedian(ratio[:, cols], axis=0)
    return out


def _slow(grid: ScrapeGrid, config: CollapseConfig, w: int) -> np.ndarray:
    duration = np.where(grid.scrape_ok, grid.duration, np.nan)
    median, scale, _ = _baseline(duration, config, w, grid.steps(config.baseline_s))
    with np.errstate(all="ignore"):
        ratio = duration / median
        floor = np.maximum(np.nan_to_num(scale), np.maximum(0.05 * median, 0.01))
        slow = (duration > median + config.slow_k * floor) & (ratio >= config.slow_ratio * np.maximum(1.0, _fleet_ratio(ratio)))
    grid.memo["duration_baseline"] = median
    return np.asarray(np.nan_to_num(slow, nan=0.0), dtype=bool)


def _dropped(grid: ScrapeGrid, config: CollapseConfig, w: int) -> np.ndarray:
    samples = np.where(grid.scrape_ok, grid.samples, np.nan)
    median, _, low = _baseline(samples, config, w, grid.steps(config.baseline_s))
    with np.errstate(all="ignore"):
        ratio = samples / median
        fleet = np.minimum(1.0, _fleet_ratio(ratio))
        dropped = (samples < low) & (ratio <= fleet - config.samples_drop_share)
    grid.memo["samples_baseline"] = median
    return np.asarray(np.nan_to_num(dropped, nan=0.0), dtype=bool)


def _emit(b: FindingBuilder, grid: ScrapeGrid, config: CollapseConfig, signals: dict[str, np.ndarray],
          flag: np.ndarray, node: int, gpu: int | None) -> None:
    idx = np.flatnonzero(flag)
    if b.report_from_ns is not None and idx.size:
        idx = idx[grid.times[idx] >= b.report_from_ns]
    if idx.size == 0:
        return
    gap = max(1, grid.steps(b.config.episode_gap_s))
    starts = np.flatnonzero(np.diff(idx, prepend=-(gap + 1)) > gap)
    severity, fault = EARLY_WARNING_KINDS[FindingKind.OBSERVABILITY_COLLAPSE], FAULT_ACTIONS[FindingKind.OBSERVABILITY_COLLAPSE]
    row = grid.first_row(node, gpu)
    s = b.s
    for k, start in enumerate(starts):
        episode = idx[start: starts[k + 1] if k + 1 < len(starts) else idx.size]
        first, last = int(episode[0]), int(episode[-1])
        seen = sorted(name for name in SIGNALS if signals[name][node, episode].any())
        evidence = {"signals": [name for name in SIGNALS if signals[name][node, first]], "signals_in_episode": seen,
                    "window_minutes": round(config.window_s / 60.0, 1),
                    "scrape_health": "read" if grid.has_scrape else "none in this source: series presence only",
                    **grid.evidence(node, gpu, first, config.window_s), "recovery": fault.recovery,
                    "note": "observability is collapsing here while peers' stay normal: series vanish, scrapes slow or "
                            "lose samples, up flaps; a GPU may be about to fall off the bus (watch it; no action)"}
        b.findings.append(Finding(
            kind=FindingKind.OBSERVABILITY_COLLAPSE, severity=severity, node=str(s.nodes[grid.node_codes[node]]),
            gpu_uuid=None if gpu is None else str(s.gpus[grid.gpu_codes[gpu]]), recommended_action=fault.action,
            confidence=round(min(0.9, 0.3 + 0.15 * len(evidence["signals"])), 2), evidence=evidence,
            first_seen=pd.Timestamp(int(grid.times[first]), tz="UTC").to_pydatetime(),
            last_seen=pd.Timestamp(int(grid.times[last]), tz="UTC").to_pydatetime(),
            active=bool(int(grid.times[last]) >= b.now_ns - int(b.config.active_within_s * _NS)),
            model=str(s.models[s["model"][row]]), pool=str(s.pools[s["pool"][row]]),
        ))
