"""The figures of ``gpuwarden metrics serve`` that come from rooms analytics may not import: the
actuator's state from its audit log (read through the actuator's own approval queue, never
changed) and the queue from the scheduling planner run on a cluster snapshot."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

from gpuwarden.remediation import approvals
from gpuwarden.remediation.audit import AuditLog, Record, breaker_open_in
from gpuwarden.analytics.metrics_snapshot import ActuatorFigures, QueueFigure
from gpuwarden.fleet.protocols import ClusterSnapshot
from gpuwarden.fleet.semantics import to_utc


def _seconds(text: object) -> float | None:
    try:
        return to_utc(datetime.fromisoformat(str(text))).timestamp()
    except (TypeError, ValueError):
        return None


def actuator_figures(records: list[Record], now_seconds: float) -> ActuatorFigures:
    waiting = approvals.pending_from(records)
    planned = [s for s in (_seconds(p.planned_at) for p in waiting) if s is not None]
    outcomes = Counter((str(r.get("outcome", "")), str(r.get("kind") or "none")) for r in records if r.get("outcome"))
    stamps = [s for s in (_seconds(r.get("at")) for r in records) if s is not None]
    return ActuatorFigures(
        breaker_open=breaker_open_in(records), pending_approvals=len(waiting),
        oldest_pending_age_seconds=max(0.0, now_seconds - min(planned)) if planned else 0.0,
        actions_by_outcome=dict(outcomes), newest_entry_timestamp_seconds=max(stamps) if stamps else None)


def read_actuator(audit_path: Path, now_seconds: float) -> ActuatorFigures | None:
    """None when there is no audit log (the actuator never ran here): no actuator metrics at all."""
    if not audit_path.exists():
        return None
    return actuator_figures(AuditLog.read(audit_path), now_seconds)


def queue_figures(snapshot: ClusterSnapshot) -> tuple[QueueFigure, ...]:
    """Pending workloads, their GPUs and the longest wait per team, in the planner's own queue."""
    from gpuwarden.scheduling.queue_report import pending_table, plan_with

    table = pending_table(snapshot, plan_with(snapshot))
    if table.empty:
        return ()
    sums = table.groupby("team").agg(workloads=("workload", "size"), gpus=("gpus", "sum"),
                                     wait=("waiting_hours", "max")).reset_index()
    return tuple(QueueFigure(str(r.team), int(r.workloads), float(r.gpus), float(r.wait) * 3600.0)
                 for r in sums.itertuples(index=False))
