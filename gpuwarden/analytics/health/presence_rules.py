"""A GPU whose series stop while other GPUs of its node keep reporting: it fell off the bus, or its
exporter lost it (dcgm-exporter drops a GPU DCGM can no longer read). Either way nobody can see it.

The node's own timeline is the reference: the times at which any GPU of the node has a sample.
A GPU missing from that timeline for ``series_lost_after_s`` (after its first sample) is a
finding, first seen when the silence had lasted that long (as a live scan would report it). A
whole node going silent (exporter or node down) leaves no node-mate reporting: no GPU finding here
(:mod:`.coverage` notes it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwarden.fleet import Finding, FindingKind

from .catalogue import EARLY_WARNING_KINDS, FAULT_ACTIONS
from .finding_builder import FindingBuilder

_NS = 1_000_000_000


def series_lost_findings(b: FindingBuilder) -> None:
    s = b.s
    if len(s) == 0:
        return
    severity, fault = EARLY_WARNING_KINDS[FindingKind.GPU_SERIES_LOST], FAULT_ACTIONS[FindingKind.GPU_SERIES_LOST]
    after_ns = int(b.config.series_lost_after_s * _NS)
    ts, gpu, node = s["ts"], s["gpu"], s["node"]
    for node_code in np.unique(node).tolist():
        on_node = node == node_code
        timeline = np.unique(ts[on_node])
        for gpu_code in np.unique(gpu[on_node]).tolist():
            seen = np.unique(ts[on_node & (gpu == gpu_code)])
            for last_seen, missing in _silences(timeline, seen):
                if missing[-1] - last_seen < after_ns:
                    continue
                first = int(missing[np.searchsorted(missing, last_seen + after_ns)])
                if b.report_from_ns is not None and int(missing[-1]) < b.report_from_ns:
                    continue
                mates = int(np.unique(gpu[on_node & (ts == missing[-1])]).size)
                row = int(np.flatnonzero(gpu == gpu_code)[0])
                b.findings.append(Finding(
                    kind=FindingKind.GPU_SERIES_LOST, severity=severity, node=str(s.nodes[node_code]),
                    gpu_uuid=str(s.gpus[gpu_code]), recommended_action=fault.action, confidence=0.8,
                    evidence={"signal": "series presence", "last_sample": _iso(last_seen),
                              "silent_minutes": round((int(missing[-1]) - last_seen) / _NS / 60.0, 1),
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


def _iso(ns: int) -> str:
    return pd.Timestamp(ns, tz="UTC").isoformat()
