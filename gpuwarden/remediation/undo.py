"""Undo: apply the inverse an applied action recorded (uncordon, untaint, resume), once.

The inverse is the one the audit entry carries (``undo``), so an undo after a restart does the
same as one before it; a failed undo is recorded (error, retry, refused), never raised.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.fleet import Action, ActionKind, Cluster
from gpuwarden.fleet.clock import Clock

from .audit import AuditEntry, AuditLog, Outcome, Record, action_entry, action_from_record


def inverse(action: Action) -> Action | None:
    """The action that takes ``action`` back, where a generic one exists."""
    why = f"undo {action.kind.value}"
    if action.kind in (ActionKind.CORDON, ActionKind.DRAIN):
        return Action(ActionKind.UNCORDON, action.target, why)
    if action.kind == ActionKind.TAINT:
        return Action(ActionKind.UNTAINT, action.target, why, {"taint": action.params.get("taint")})
    if action.kind == ActionKind.SUSPEND:
        return Action(ActionKind.RESUME, action.target, why)
    return None


def undo_applied(audit: AuditLog, cluster: Cluster, entry_id: str, by: str, *, clock: Clock,
                 mode: Any) -> AuditEntry:
    """Undo the applied action ``entry_id`` of ``audit`` on ``cluster``, recording the outcome
    there. ValueError (one line) if there is none, it was already undone, or it has no inverse."""
    records = audit.records()
    applied = next((r for r in records if r.get("entry_id") == entry_id), None)
    if applied is None or applied.get("outcome") != Outcome.APPLIED.value:
        raise ValueError(f"no applied action with id {entry_id} in the audit log")
    done = next((r for r in records if r.get("undo_of") == entry_id and r.get("outcome") == Outcome.UNDONE.value), None)
    if done is not None:
        raise ValueError(f"action {entry_id} was already undone at {done.get('at')} by {done.get('by')}")
    if not applied.get("undo"):
        raise ValueError(f"{applied.get('kind')} {applied.get('target')} cannot be undone (no inverse: "
                         f"an evicted pod is recreated by its controller, a notice stays)")
    action = action_from_record(applied["undo"])

    def record(outcome: Outcome, message: str, findings: tuple[Record, ...] = ()) -> AuditEntry:
        entry = action_entry(clock.now(), mode, outcome, action, message, by=by, findings=findings, undo_of=entry_id)
        audit.record(entry)
        return entry

    try:
        result = cluster.apply(action)
    except Exception as error:  # noqa: BLE001 as in the applier: a failed undo is recorded, never raised
        return record(Outcome.ERROR, f"{type(error).__name__}: {error}")
    if not result.ok:
        return record(Outcome.RETRY if result.temporary else Outcome.REFUSED, result.message)
    return record(Outcome.UNDONE, result.message, tuple(applied.get("findings") or ()))
