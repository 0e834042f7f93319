"""The approval queue, kept in the audit log so the dashboard and the actuator share it and it
survives restarts.

An action waits for a person from its ``awaiting-approval`` entry until a decision entry
(``approved`` or ``rejected``, appended by :func:`decide`) names its ``approval_id``. In approve
mode the actuator applies approved actions at its next round and audits them (applied / error),
carrying the approver's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from collections.abc import Iterable

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .audit import AuditLog, Outcome, Record, append_line, locked, parse_at

REJECTED_QUIET = timedelta(hours=24)  # a rejected action is not asked again for this long


@dataclass(frozen=True)
class PendingApproval:
    approval_id: str
    kind: str
    target: str
    reason: str
    findings: tuple[Record, ...]  # kind, gpu_uuid, node, key evidence of each finding behind it
    planned_at: str  # ISO-8601 UTC


_DECISIONS = (Outcome.APPROVED.value, Outcome.REJECTED.value)


def _queue(records: Iterable[Record]) -> tuple[dict[str, Record], dict[str, Record]]:
    """(waiting, decided): awaiting-approval records by id, and the decision record of each decided id."""
    waiting: dict[str, Record] = {}
    decided: dict[str, Record] = {}
    for record in records:
        approval_id = record.get("approval_id")
        if approval_id is None:
            continue
        approval_id = str(approval_id)
        outcome = record.get("outcome")
        if outcome == Outcome.AWAITING_APPROVAL.value:
            waiting.setdefault(approval_id, record)
        elif outcome in _DECISIONS and approval_id not in decided:
            decided[approval_id] = record
    return waiting, decided


def pending_from(records: Iterable[Record]) -> list[PendingApproval]:
    waiting, decided = _queue(records)
    return [
        PendingApproval(approval_id, r.get("kind", ""), r.get("target", ""), r.get("reason", ""),
                        tuple(r.get("findings") or ()), r.get("at", ""))
        for approval_id, r in waiting.items() if approval_id not in decided
    ]


def approved_not_applied(records: list[Record]) -> list[tuple[Record, Record]]:
    """(awaiting record, approval record) of approved actions no later entry has carried out."""
    waiting, decided = _queue(records)
    done = {str(r["approval_id"]) for r in records if r.get("approval_id") is not None
            and r.get("outcome") not in (Outcome.AWAITING_APPROVAL.value, *_DECISIONS)}
    return [(waiting[i], d) for i, d in decided.items()
            if d.get("outcome") == Outcome.APPROVED.value and i in waiting and i not in done]


def already_asked(records: list[Record], now: datetime) -> set[tuple[str, str]]:
    """(kind, target) of actions a person need not be asked about again at ``now``: waiting for a
    person, approved and not yet applied (held by the window or the pace), or rejected recently."""
    asked = {(p.kind, p.target) for p in pending_from(records)}
    asked |= {(str(a.get("kind")), str(a.get("target"))) for a, _ in approved_not_applied(records)}
    quiet_since = now - REJECTED_QUIET
    by_id = {str(r["approval_id"]): r for r in records
             if r.get("outcome") == Outcome.AWAITING_APPROVAL.value and r.get("approval_id") is not None}
    asked |= {(by_id[str(r["approval_id"])]["kind"], by_id[str(r["approval_id"])]["target"]) for r in records
              if r.get("outcome") == Outcome.REJECTED.value and str(r.get("approval_id")) in by_id
              and (parse_at(r.get("at")) or quiet_since) > quiet_since}
    return asked


def pending(audit_path: str | Path) -> list[PendingApproval]:
    """Actions waiting for a person, oldest first, rebuilt from the log (empty if there is none)."""
    path = Path(audit_path)
    return pending_from(AuditLog.read(path)) if path.exists() else []


def decision_record(approval_id: str, approve: bool, by: str, comment: str, at: datetime) -> Record:
    return {
        "outcome": Outcome.APPROVED.value if approve else Outcome.REJECTED.value, "approval_id": str(approval_id),
        "by": by, "comment": comment, "at": at.isoformat(),
    }


def check_decidable(records: list[Record], approval_id: str) -> Record:
    """The awaiting record of ``approval_id``; ValueError (one line) if unknown or already decided."""
    waiting, decided = _queue(records)
    approval_id = str(approval_id)
    if approval_id in decided:
        d = decided[approval_id]
        raise ValueError(f"approval {approval_id} was already {d.get('outcome')} by {d.get('by') or 'someone'} "
                         f"at {d.get('at')}")
    if approval_id not in waiting:
        known = ", ".join(p.approval_id for p in pending_from(records)) or "none"
        raise ValueError(f"no action awaits approval with id {approval_id}; waiting: {known}")
    return waiting[approval_id]


def decide(audit_path: str | Path, approval_id: str, approve: bool, by: str, comment: str = "",
           clock: Clock = SYSTEM_CLOCK) -> None:
    """Append the decision, timed by ``clock``; ValueError (one clear line) if the id is unknown or
    already decided."""
    if not str(by).strip():
        raise ValueError("a decision needs the name of who made it (by)")
    path = Path(audit_path)
    with locked(path):  # check and append as one step, so two people cannot both decide
        records = AuditLog.read(path) if path.exists() else []
        check_decidable(records, approval_id)
        append_line(path, decision_record(approval_id, approve, by, comment, clock.now()))
