"""A GPU whose series stop while other GPUs of its node keep reporting: it fell off the bus, or its
exporter lost it (dcgm-exporter drops a GPU DCGM can no longer read). Either way nobody can see it.

The node's own timeline is the reference: the times at which any GPU of the node has a sample.
A GPU missing from that timeline for ``series_lost_after_s`` (after its first sample) is a
finding, first seen when the silence had lasted that long (as a live scan would report it).

The silence is timed only while node-mates reported, scrape by scrape: an ordinary scrape gap is
no GPU's fault. A whole node going silent (exporter or node down, a Prometheus restart) leaves no
node-mate reporting: no GPU finding here (:mod:`.coverage` notes it). Nor does the time across such
a gap count (an interval between two of the node's samples longer than ``_GAP_STEPS`` steps): every
GPU of the node went at once, and one that comes back a few scrapes after its node-mates (a reboot,
an exporter restart) was silent only those scrapes. Where scrape health was read (Prometheus), a
step in which a scrape of one of the node's targets failed (``up`` below 1) does not count either
(a node whose GPUs two exporters serve: one target down hides its GPUs while the other reports).
A GPU that falls off the bus while its node-mates go on is still found after ``series_lost_after_s``
of their samples, and XID 79 (:mod:`.fault_rules`) acts whatever the series do. Many nodes of one
failure domain vanishing together are folded into one event by :mod:`.domain_rules`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwarden.fleet import Finding, FindingKind

from .catalogue import EARLY_WARNING_KINDS, FAULT_ACTIONS
from .finding_builder import FindingBuilder
from .scrape_grid import failed_scrape_times

_NS = 1_000_000_000
_GAP_STEPS = 3.0  # an interval between two of a node's samples longer than this many steps is a node gap


def series_lost_findings(b: FindingBuilder, scrape: pd.DataFrame | None = None) -> None:
    """``scrape``: the scrape-health frame where the source has one (see the module docstring)."""
    s = b.s
    if len(s) == 0:
        return
    severity, fault = EARLY_WARNING_KINDS[FindingKind.GPU_SERIES_LOST], FAULT_ACTIONS[FindingKind.GPU_SERIES_LOST]
    after_ns = int(b.config.series_lost_after_s * _NS)
    max_gap_ns = int(_GAP_STEPS * s.step_s * _NS)
    failed = failed_scrape_times(scrape)
    ts, gpu, node = s["ts"], s["gpu"], s["node"]
    for node_code in np.unique(node).tolist():
        on_node = node == node_code
        timeline = np.unique(ts[on_node])
        node_failed = failed.get(str(s.nodes[node_code]), np.empty(0, dtype=np.int64))
        for gpu_code in np.unique(gpu[on_node]).tolist():
            seen = np.unique(ts[on_node & (gpu == gpu_code)])
            for last_seen, missing in _silences(timeline, seen):
                clock = _mates_clock(last_seen, missing, max_gap_ns, node_failed)
                if clock[-1] < after_ns:
                    continue
                first = int(missing[np.searchsorted(clock, after_ns)])
                if b.report_from_ns is not None and int(missing[-1]) < b.report_from_ns:
                    continue
                mates = int(np.unique(gpu[on_node & (ts == missing[-1])]).size)
                row = int(np.flatnonzero(gpu == gpu_code)[0])
                b.findings.append(Finding(
                    kind=FindingKind.GPU_SERIES_LOST, severity=severity, node=str(s.nodes[node_code]),
                    gpu_uuid=str(s.gpus[gpu_code]), recommended_action=fault.action, confidence=0.8,
                    evidence={"signal": "series presence", "last_sample": _iso(last_seen),
                              "silent_minutes": round((int(missing[-1]) - last_seen) / _NS / 60.0, 1),
                              "silent_minutes_while_mates_reported": round(float(clock[-1]) / _NS / 60.0, 1),
                              "node_mates_reporting": mates, "recovery": fault.recovery,
                              "note": "its series stopped while other GPUs of the node kept reporting: it fell off "
                                      "the bus, or its exporter lost it"},
                    first_seen=pd.Timestamp(first, tz="UTC").to_pydatetime(),
                    last_seen=pd.Timestamp(int(missing[-1]), tz="UTC").to_pydatetime(),
                    active=bool(int(missing[-1]) >= b.now_ns - int(b.config.active_within_s * _NS)),
                    model=str(s.models[s["model"][row]]), pool=str(s.pools[s["pool"][row]]),
                ))


def _silences(timeline: np.ndarray, seen: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(last time seen, the node's times it then missed) for each run of the node's times at which
    the GPU, already seen, has no sample."""
    missing = ~np.isin(timeline, seen) & (timeline > seen[0])
    if not missing.any():
        return []
    index = np.flatnonzero(missing)
    runs = np.split(index, np.flatnonzero(np.diff(index) > 1) + 1)
    out = []
    for run in runs:
        before = seen[seen < timeline[run[0]]]
        out.append((int(before[-1]), timeline[run]))
    return out


def _mates_clock(last_seen: int, missing: np.ndarray, max_gap_ns: int, failed: np.ndarray) -> np.ndarray:
    """For each of the node's times the GPU missed, how long it had been silent while its node-mates
    reported: the intervals between consecutive node samples, except node gaps (longer than
    ``max_gap_ns``) and steps in which a scrape of the node failed (``failed``)."""
    previous = np.concatenate([[last_seen], missing[:-1]])
    interval = missing - previous
    counted = (interval <= max_gap_ns) & ~np.isin(missing, failed)
    return np.cumsum(np.where(counted, interval, 0))


def _iso(ns: int) -> str:
    return pd.Timestamp(ns, tz="UTC").isoformat()
