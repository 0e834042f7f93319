"""XID storms: application XIDs that strike many GPUs at once are one job-level finding.

A gang's crash raises an application XID (13, 31, 43, 45, 68: ``catalogue.APPLICATION_XIDS``, the
rows of ``xid_catalogue.csv`` with ``implicates_gpu`` false) on every GPU it held, within seconds;
a fleet can log thousands of XID 45s for one crash. Each is the workload's fault, not the GPU's,
so none may cordon, and one finding per GPU buries the one that matters. After the per-GPU rules
ran, this pass folds them:

- **by workload**: application-XID findings on GPUs held by pods of one workload (same namespace,
  pod names equal once the replica ordinal and generated suffix are cut: ``train-worker-3``,
  ``train-worker-7``) whose episodes start within ``storm_window_s`` of each other, on at least
  ``storm_min_workload_gpus`` GPUs;
- **by time**: what is left, when such episodes chain within ``storm_window_s`` over at least
  ``storm_min_nodes`` nodes (the pods were not attributed, or were many workloads of one event).

Each storm becomes one ``xid-storm`` finding (INFO, no node action) naming the workload, its nodes
and GPUs, the codes and the events; the folded per-GPU findings go. Findings of every other kind
are untouched: a hardware XID or a precursor on a GPU inside the storm is still its own finding.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

import pandas as pd

from gpuwarden.fleet import Finding, FindingKind, Severity

from .catalogue import APPLICATION_XIDS, XID_RULES, recommended_action
from .scan_config import HealthConfig

APP_XID_KINDS = frozenset(XID_RULES[code].kind for code in APPLICATION_XIDS)
MAX_NAMED_NODES = 50  # evidence lists at most this many node names (the count is always whole)
# A replica's ordinal (-3), a ReplicaSet / Job pod suffix (-7d9f8b6c4d, -x2k4q): cut from the end.
_SUFFIX = re.compile(r"(-([0-9]+|[a-z0-9]{5}|[a-f0-9]{8,10}))+$")


def workload_stem(namespace: str | None, pod: str | None) -> str | None:
    """``namespace/name`` of the workload a pod belongs to, by name (None: no pod)."""
    if not pod:
        return None
    stem = _SUFFIX.sub("", pod) or pod
    return f"{namespace}/{stem}" if namespace else stem


def fold_xid_storms(findings: list[Finding], frame: pd.DataFrame, config: HealthConfig) -> list[Finding]:
    """``findings`` with every storm of application XIDs folded into one ``xid-storm`` finding."""
    app = [f for f in findings if f.kind in APP_XID_KINDS]
    if len(app) < min(config.storm_min_workload_gpus, config.storm_min_nodes):
        return findings
    owners = _owners(app, frame)
    storms: list[list[Finding]] = []
    by_workload: dict[str, list[Finding]] = defaultdict(list)
    for f in app:
        owner = owners.get(id(f))
        if owner is not None:
            by_workload[owner].append(f)
    folded: set[int] = set()
    for members in by_workload.values():
        for storm in chains(members, config.storm_window_s):
            if len({f.gpu_uuid for f in storm}) >= config.storm_min_workload_gpus:
                storms.append(storm)
                folded.update(id(f) for f in storm)
    rest = [f for f in app if id(f) not in folded]
    for storm in chains(rest, config.storm_window_s):
        if len({f.node for f in storm}) >= config.storm_min_nodes:
            storms.append(storm)
            folded.update(id(f) for f in storm)
    if not storms:
        return findings
    kept = [f for f in findings if id(f) not in folded]
    return kept + [_storm_finding(storm, owners) for storm in storms]


def chains(findings: Iterable[Finding], window_s: float) -> list[list[Finding]]:
    """Findings in runs whose starts are each within ``window_s`` of the previous start."""
    chains: list[list[Finding]] = []
    for f in sorted(findings, key=lambda f: (f.first_seen, f.node, f.gpu_uuid or "")):
        if chains and (f.first_seen - chains[-1][-1].first_seen).total_seconds() <= window_s:
            chains[-1].append(f)
        else:
            chains.append([f])
    return chains


def _owners(app: list[Finding], frame: pd.DataFrame) -> dict[int, str]:
    """The workload holding each finding's GPU when its episode began (the sample at or just before)."""
    if "pod" not in frame.columns or not len(frame):
        return {}
    columns = ["gpu_uuid", "timestamp", "pod"] + (["namespace"] if "namespace" in frame.columns else [])
    held = frame.loc[frame["pod"].notna(), columns]
    held = held[held["gpu_uuid"].isin({f.gpu_uuid for f in app})]
    if not len(held):
        return {}
    stamps = pd.to_datetime(held["timestamp"], utc=True)
    groups = {gpu: part for gpu, part in held.assign(ts=stamps).sort_values("ts").groupby("gpu_uuid", sort=False)}
    owners: dict[int, str] = {}
    for f in app:
        part = groups.get(f.gpu_uuid)
        if part is None:
            continue
        before = part[part["ts"] <= pd.Timestamp(f.first_seen)]
        row = (before if len(before) else part).iloc[-1 if len(before) else 0]
        stem = workload_stem(str(row["namespace"]) if "namespace" in part and pd.notna(row["namespace"]) else None,
                             str(row["pod"]))
        if stem:
            owners[id(f)] = stem
    return owners


def _storm_finding(storm: list[Finding], owners: dict[int, str]) -> Finding:
    nodes = sorted({f.node for f in storm})
    workloads = sorted({owners[id(f)] for f in storm if id(f) in owners})
    first = min(storm, key=lambda f: (f.first_seen, f.node))
    return Finding(
        kind=FindingKind.XID_STORM, severity=Severity.INFO, node=first.node, gpu_uuid=None,
        evidence={
            "workload": workloads[0] if len(workloads) == 1 else None, "workloads": workloads[:MAX_NAMED_NODES],
            "node_count": len(nodes), "nodes": nodes[:MAX_NAMED_NODES],
            "gpu_count": len({(f.node, f.gpu_uuid) for f in storm}),
            "xids": sorted({int(f.evidence.get("xid", 0)) for f in storm}),
            "events": int(sum(float(f.evidence.get("events", 0) or 0) for f in storm)),
            "window_seconds": round((max(f.first_seen for f in storm) - first.first_seen).total_seconds(), 1),
            "note": "application XIDs on many GPUs at once: the workload crashed; no GPU is implicated, never cordons",
        },
        recommended_action=recommended_action(FindingKind.XID_STORM),
        confidence=max(f.confidence for f in storm),
        first_seen=first.first_seen, last_seen=max(f.last_seen for f in storm),
        active=any(f.active for f in storm), model=first.model, pool=first.pool,
    )
