"""Turning a per-row condition over a GPU's series into findings: one finding per episode of the
condition on one GPU, with its evidence, confidence, recommended action (the fault catalogue's for
its kind) and first / last seen."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.node_actions import CORDONING_ACTIONS

from .catalogue import recommended_action
from .features import GpuSeries
from .scan_config import HealthConfig

_NS = 1_000_000_000


class FindingBuilder:
    """Findings of one scan over ``series`` up to ``now_ns``; the rules call :meth:`emit`."""

    def __init__(self, series: GpuSeries, config: HealthConfig, now_ns: int) -> None:
        self.s = series
        self.config = config
        self.now_ns = now_ns
        self.report_from_ns: int | None = None
        self.findings: list[Finding] = []
        self.memo: dict[str, object] = {}  # per-scan values several rules share (node_rules), by name

    def groups(self) -> np.ndarray:
        """Peer group label per row: model and node pool."""
        s = self.s
        n_pools = max(len(s.pools), 1)
        return s["model"] * n_pools + s["pool"]

    def min_samples(self, seconds: float) -> int:
        """Samples that cover ``seconds`` at this series' step (``fleet.sampling``'s rule): thresholds
        are durations, so a 15 s fleet needs four times the samples of a 60 s one."""
        return max(1, int(np.ceil(seconds / self.s.step_s - 1e-9)))

    def group_label(self, code: int) -> str:
        s = self.s
        n_pools = max(len(s.pools), 1)
        return f"{s.models[code // n_pools]} / {s.pools[code % n_pools]}"

    def episodes(self, flag: np.ndarray, unit: str = "gpu") -> tuple[np.ndarray, np.ndarray]:
        """Rows where ``flag`` holds, and the start (into those rows) of each episode of one ``unit``
        (``"gpu"``, or ``"node"``: the rows of all its GPUs in time order)."""
        idx = np.flatnonzero(flag)
        if self.report_from_ns is not None and idx.size:
            idx = idx[self.s["ts"][idx] >= self.report_from_ns]
        if idx.size == 0:
            return idx, idx
        if unit == "node":
            idx = idx[np.lexsort((self.s["ts"][idx], self.s["node"][idx]))]
        ts, of = self.s["ts"][idx], self.s[unit][idx]
        gap = int(self.config.episode_gap_s * _NS)
        new = np.r_[True, (of[1:] != of[:-1]) | ((ts[1:] - ts[:-1]) > gap)]
        return idx, np.flatnonzero(new)

    def emit(self, kind: FindingKind, flag: np.ndarray, severity: Severity,
             evidence: Callable[[np.ndarray], dict], confidence: Callable[[np.ndarray], float],
             sustain_s: float = 0.0, unit: str = "gpu") -> None:
        """One finding per episode of ``flag``, recommending the catalogue's action for ``kind``;
        ``evidence`` and ``confidence`` see the episode's rows. With ``sustain_s``, a cordon (or
        drain) is recommended only once the episode has lasted that long; a shorter one only taints
        (noise is brief, wear persists). ``unit="node"``: one finding per episode of the node
        (``gpu_uuid`` None), for conditions its GPUs share."""
        idx, starts = self.episodes(flag, unit)
        if idx.size == 0:
            return
        action = recommended_action(kind)
        ends = np.r_[starts[1:], idx.size] - 1
        s = self.s
        for a, b in zip(starts.tolist(), ends.tolist()):
            rows = idx[a:b + 1]
            first, last = int(s["ts"][rows[0]]), int(s["ts"][rows[-1]])
            details = {k: _plain(v) for k, v in evidence(rows).items()}
            recommended = action
            if sustain_s and action in CORDONING_ACTIONS:
                lasted_s = (last - first) / _NS
                details["sustained_minutes"] = round(lasted_s / 60.0, 1)
                if lasted_s < sustain_s:
                    recommended = ActionKind.TAINT
            self.findings.append(Finding(
                kind=kind, severity=severity, node=str(s.nodes[s["node"][rows[-1]]]),
                gpu_uuid=str(s.gpus[s["gpu"][rows[0]]]) if unit == "gpu" else None, evidence=details, recommended_action=recommended,
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


def nanmax(values: np.ndarray):
    """Largest measured value, or None when nothing was measured (no All-NaN warning)."""
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else None
