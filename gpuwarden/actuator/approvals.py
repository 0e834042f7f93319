"""Approvals kept in the actuator's JSON-lines audit log, so the dashboard and the actuator (two
processes) share one queue that survives restarts.

MINIMAL STAND-IN written on the dashboard branch to the interface agreed with the actuator
(``pending`` / ``decide``); the actuator's own implementation replaces this file at merge.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

MINIMAL_STAND_IN = True


@dataclass(frozen=True)
class PendingApproval:
    approval_id: str
    kind: str
    target: str
    reason: str
    findings: tuple[dict, ...]  # kind, gpu_uuid, node, key evidence of each finding behind it
    planned_at: str  # ISO-8601 UTC


def _entries(audit_path) -> list[dict]:
    path = Path(audit_path)
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash is not an approval
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def pending(audit_path) -> list[PendingApproval]:
    """Actions waiting for a person, oldest first, rebuilt from the log."""
    waiting: dict[str, PendingApproval] = {}
    for entry in _entries(audit_path):
        approval_id = entry.get("approval_id")
        if approval_id is None:
            continue
        approval_id = str(approval_id)
        if entry.get("outcome") == "awaiting-approval":
            waiting[approval_id] = PendingApproval(
                approval_id, str(entry.get("kind", "")), str(entry.get("target", "")), str(entry.get("reason", "")),
                tuple(entry.get("findings") or ()), str(entry.get("at", "")))
        else:
            waiting.pop(approval_id, None)
    return list(waiting.values())


def decide(audit_path, approval_id: str, approve: bool, by: str, comment: str = "") -> None:
    """Append the decision on ``approval_id`` to the log; ValueError if it is unknown or decided."""
    approval_id = str(approval_id)
    waiting = {p.approval_id: p for p in pending(audit_path)}
    if approval_id not in waiting:
        raise ValueError(f"approval {approval_id!r} is unknown or already decided; waiting: {sorted(waiting) or 'none'}")
    if not by.strip():
        raise ValueError("by: the name of the person deciding is required")
    item = waiting[approval_id]
    record = {"at": datetime.now(timezone.utc).isoformat(), "outcome": "approved" if approve else "rejected",
              "approval_id": approval_id, "kind": item.kind, "target": item.target, "reason": item.reason,
              "by": by.strip(), "comment": comment}
    with Path(audit_path).open("a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
