"""Undo: apply the inverse an applied action recorded (uncordon, untaint, resume), once.

The inverse is the one the audit entry carries (``undo``), so an undo after a restart does the
same as one before it; a failed undo is recorded (error, retry, refused), never raised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuwarden.fleet import Action, ActionKind

from .audit import AuditEntry, Outcome, action_from_record

if TYPE_CHECKING:
    from .apply import Actuator


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


def undo_applied(actuator: Actuator, entry_id: str, by: str) -> AuditEntry:
    """Undo the applied action ``entry_id``. ValueError (one line) if there is none, it was
    already undone, or it has no inverse."""
    records = actuator.audit.records()
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
    try:
        result = actuator.cluster.apply(action)
    except Exception as error:  # noqa: BLE001 as in Actuator._apply: a failed undo is recorded, never raised
        return actuator._entry(Outcome.ERROR, action, f"{type(error).__name__}: {error}", by=by, undo_of=entry_id)
    if not result.ok:
        outcome = Outcome.RETRY if result.temporary else Outcome.REFUSED
        return actuator._entry(outcome, action, result.message, by=by, undo_of=entry_id)
    return actuator._entry(Outcome.UNDONE, action, result.message, by=by, undo_of=entry_id,
                           findings=tuple(applied.get("findings") or ()))
