"""The Actions page's tables: the actuator's audit log (read by the log's own rules,
:func:`.audit.read_audit`: a line cut short by a crash or of the wrong type is skipped or read
without its bad fields, and named, never fatal), pending approvals, and for each action what it
would touch: the workloads it would evict and what the safety limits would say (pure: no Streamlit)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

from gpuwarden.remediation import SafetyLimits
from gpuwarden.remediation.audit import read_audit
from gpuwarden.fleet.inputs import InputFileError
from gpuwarden.fleet.protocols import ClusterSnapshot, WorkloadPhase

AUDIT_ENV = "GPUWARDEN_AUDIT"  # the actuator's audit log (JSON lines); default beside the store
AUDIT_COLUMNS = ["at", "mode", "outcome", "kind", "target", "reason", "message", "approval_id", "by", "comment"]
EVICTING_KINDS = ("drain", "preempt", "suspend")
NODE_REMOVING_KINDS = ("cordon", "drain")


def audit_path(store_path: str | None) -> Path | None:
    explicit = os.environ.get(AUDIT_ENV, "").strip()
    if explicit:
        return Path(explicit)
    return Path(store_path) / "actuator" / "audit.jsonl" if store_path else None


def read_entries(path: Path | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Entries in log order and one ``file:line: why`` note per line not read as written (torn, not
    an object, of the wrong type); a path that is no regular file is one note, never a hang."""
    if path is None or not path.exists():
        return [], []
    try:
        read = read_audit(path)
    except InputFileError as error:
        return [], [str(error)]
    return read.records, list(read.notes)


def load_audit(path: Path | None, entries: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """Entries newest first; an empty frame (with the columns) when there is no log yet.
    ``entries``: those :func:`read_entries` already read from ``path`` (not read again)."""
    if entries is None:
        entries, _ = read_entries(path)
    frame = pd.DataFrame(entries, columns=AUDIT_COLUMNS) if entries else pd.DataFrame(columns=AUDIT_COLUMNS)
    frame["at"] = pd.to_datetime(frame["at"], utc=True, format="ISO8601", errors="coerce")
    frame["approval_id"] = frame["approval_id"].map(lambda v: None if v is None or pd.isna(v) else str(v))
    return frame.sort_values("at", ascending=False, kind="stable", ignore_index=True)


def outcome_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """How many actions ended each way, per kind (rows) and outcome (columns)."""
    if frame.empty:
        return pd.DataFrame()
    return frame.pivot_table(index="kind", columns="outcome", values="target", aggfunc="count", fill_value=0)


def actuator_status(path: Path | None, frame: pd.DataFrame, last_round: datetime | None) -> str:
    """'never-ran', 'planned-nothing' or 'acted': a log file or a cluster snapshot means it ran."""
    if not frame.empty:
        return "acted"
    ran = (path is not None and path.exists()) or last_round is not None
    return "planned-nothing" if ran else "never-ran"


def evictions(snapshot: ClusterSnapshot | None, kind: str, target: str) -> pd.DataFrame:
    """Workloads an action would stop: every running one with a pod on the node for a drain; the
    workload itself for preempt/suspend. GPU-hours: GPUs held times hours run (work lost unless it
    checkpoints)."""
    columns = ["workload", "team", "gpus", "gpu_hours_run", "checkpointable"]
    if snapshot is None or kind not in EVICTING_KINDS:
        return pd.DataFrame(columns=columns)
    rows = []
    for state in snapshot.workloads:
        if state.phase != WorkloadPhase.RUNNING:
            continue
        name = state.workload.key
        on_node = [p for p in state.placements if p.node == target]
        if kind == "drain" and not on_node:
            continue
        if kind != "drain" and name != target:
            continue
        request = state.workload.gpus
        per_gpu = request.gpu_equivalents if request.mig_profile else request.fraction_milli / 1000.0
        gpus = per_gpu * len(on_node) if kind == "drain" else state.workload.total_gpu_equivalents
        rows.append({"workload": name, "team": state.workload.team, "gpus": gpus,
                     "gpu_hours_run": gpus * state.progress_seconds / 3600.0, "checkpointable": state.workload.checkpointable})
    return pd.DataFrame(rows, columns=columns)


DEFAULT_LIMITS = SafetyLimits()


def limit_check(snapshot: ClusterSnapshot | None, frame: pd.DataFrame, kind: str, target: str,
                limits: SafetyLimits = DEFAULT_LIMITS) -> str:
    """What the actuator's safety limits would say if this action were applied now (one line)."""
    if not frame.empty:
        applied = frame[frame["outcome"] == "applied"]
        newest = frame["at"].max()
        recent = applied[applied["at"] > newest - timedelta(hours=1)] if pd.notna(newest) else applied.iloc[0:0]
        if len(recent) >= limits.max_actions_per_hour:
            return f"blocked: {len(recent)} actions applied in the last hour; limit {limits.max_actions_per_hour}"
    if kind in NODE_REMOVING_KINDS and snapshot is not None:
        cordoned = set(snapshot.cordoned) | {target}
        ratio = len(cordoned) / max(1, len(snapshot.nodes))
        if ratio > limits.max_cordoned_node_ratio:
            return (f"blocked: would leave {len(cordoned)} of {len(snapshot.nodes)} nodes cordoned ({ratio:.0%}); "
                    f"limit {limits.max_cordoned_node_ratio:.0%}")
        return f"within limits: {len(cordoned)} of {len(snapshot.nodes)} nodes cordoned after it ({ratio:.0%})"
    if kind in NODE_REMOVING_KINDS:
        return "unknown: no cluster snapshot to check the cordoned-node limit against"
    return "within limits"
