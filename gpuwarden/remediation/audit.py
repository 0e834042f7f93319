"""The audit log: append-only JSON lines, the actuator's memory across restarts.

Each entry carries what was done (kind, target, params), why (the findings behind it: kind, GPU,
node and key evidence), on which snapshot, the outcome, and who decided. Everything the actuator
must remember after a restart (the hourly limit, the approval queue, the circuit breaker, what can
be undone) is rebuilt from these lines; there is no other state file.

A line that does not parse (a write cut short by a crash) is skipped with one warning naming the
file and line, never a crash: the entries around it stay readable.
"""

from __future__ import annotations

import enum
import fcntl
import json
import logging
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Iterator, Mapping

from gpuwarden.fleet import Action, Finding
from gpuwarden.fleet.inputs import MAX_AUDIT_FILE_BYTES, checked_input

log = logging.getLogger("gpuwarden.actuator")

Record = dict[str, Any]  # one JSON line of the log, as written and as read back
# Where `gpuwarden actuator` and `gpuwarden metrics` keep and read the log by default. The log is the
# actuator's memory (an open breaker, the hourly count, approvals, the pace): the path never moves.
DEFAULT_AUDIT_PATH = Path(".gpuwarden/actuator/audit.jsonl")


class Mode(str, enum.Enum):
    """How the actuator acts (recorded on every entry): observe, approve or auto."""

    OBSERVE = "observe"
    APPROVE = "approve"
    AUTO = "auto"

EVIDENCE_KEYS_KEPT = 8  # the first few evidence items are the key ones; a finding's full frame stays in analytics


class Outcome(str, enum.Enum):
    PLANNED = "planned"  # observe mode: would be applied
    AWAITING_APPROVAL = "awaiting-approval"
    APPROVED = "approved"  # a person said yes; applied at the next round
    REJECTED = "rejected"  # a person said no
    APPLIED = "applied"
    REFUSED = "refused"  # the cluster said no, for good (403, 422...)
    RETRY = "retry-later"  # the cluster said not now (a PDB's 429, 5xx, timeouts after back-off)
    BLOCKED = "blocked-by-limit"  # a safety limit or the open circuit breaker (observe: would be)
    ERROR = "error"
    NOT_APPLIED = "not-applied"  # an earlier error or a lost lease stopped the plan
    BREAKER_OPEN = "breaker-open"
    BREAKER_RESET = "breaker-reset"
    UNDONE = "undone"  # a person took an applied action back; ``undo_of`` names it
    HELD = "held-by-pace"  # a disruptive action waiting for its pool and detector's pace (auto; observe: would be)
    PACED = "paced"  # a pace event: a disruptive action started, proven or failed, and the window it leaves


def parse_at(at: str | None) -> datetime | None:
    """A record's ISO time (``at``, ``snapshot_at``, a pace's ``next_at``); None if absent or unreadable."""
    try:
        return datetime.fromisoformat(at) if at else None
    except ValueError:
        return None


def breaker_open_in(records: Iterable[Mapping[str, Any]]) -> bool:
    """The circuit breaker's state the log leaves: open after its last open entry, until a reset."""
    state = False
    for record in records:
        if record.get("outcome") == Outcome.BREAKER_OPEN.value:
            state = True
        elif record.get("outcome") == Outcome.BREAKER_RESET.value:
            state = False
    return state


def finding_record(finding: Finding) -> Record:
    evidence = dict(list(finding.evidence.items())[:EVIDENCE_KEYS_KEPT])
    return {
        "kind": finding.kind, "severity": finding.severity.value, "node": finding.node, "gpu_uuid": finding.gpu_uuid,
        "confidence": finding.confidence, "first_seen": finding.first_seen.isoformat(),
        "last_seen": finding.last_seen.isoformat(), "evidence": evidence,
    }


def action_record(action: Action | None) -> Record | None:
    if action is None:
        return None
    return {"kind": action.kind.value, "target": action.target, "reason": action.reason, "params": dict(action.params)}


def action_from_record(record: Mapping[str, Any]) -> Action:
    return Action(record["kind"], record["target"], record.get("reason", ""), dict(record.get("params") or {}))


def new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    mode: Any  # Mode; typed loosely: tests and readers hand it the mode's string too
    outcome: Outcome
    kind: str
    target: str
    reason: str
    message: str = ""
    approval_id: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    findings: tuple[Record, ...] = ()
    snapshot_at: datetime | None = None
    entry_id: str = field(default_factory=new_id)
    by: str = ""  # who decided: "actuator" for automation, a person's name for approvals and undo
    undo: Record | None = None  # the action that takes this one back (applied entries)
    undo_of: str | None = None

    def as_dict(self) -> Record:
        return {
            "entry_id": self.entry_id, "at": self.at.isoformat(), "mode": getattr(self.mode, "value", self.mode),
            "outcome": Outcome(self.outcome).value, "kind": self.kind, "target": self.target, "reason": self.reason,
            "message": self.message, "approval_id": self.approval_id, "params": dict(self.params),
            "findings": list(self.findings), "snapshot_at": self.snapshot_at.isoformat() if self.snapshot_at else None,
            "by": self.by, "undo": self.undo, "undo_of": self.undo_of,
        }


def action_entry(at: datetime, mode: Any, outcome: Outcome, action: Action, message: str = "", *, by: str,
                 approval_id: str | None = None, findings: tuple[Record, ...] = (), snapshot_at: datetime | None = None,
                 undo: Action | None = None, undo_of: str | None = None) -> AuditEntry:
    """The entry recording ``outcome`` for ``action`` (the applier's and undo's one shape)."""
    return AuditEntry(at, mode, outcome, action.kind.value, action.target, action.reason, message, approval_id,
                      dict(action.params), tuple(findings), snapshot_at, new_id(), by, action_record(undo), undo_of)


class AuditLog:
    """Append-only JSON lines; each entry is written in one ``write`` under a file lock and flushed
    before the caller goes on, so the actuator and a dashboard can append to the same file."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self.entries: list[AuditEntry] = []
        self._memory: list[Record] = []  # without a path, records live here
        self._cache: tuple[tuple[int, int], list[Record]] | None = None  # (size, mtime) -> records
        self._lock = threading.Lock()
        if self.path:  # a directory, a FIFO or a link to /dev/null here would lose every record: refused
            checked_input(self.path, "the audit log", MAX_AUDIT_FILE_BYTES, missing_ok=True)
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, entry: AuditEntry) -> None:
        with self._lock:
            self.entries.append(entry)
            self.append_record(entry.as_dict())

    def append_record(self, record: Record) -> None:
        if self.path is None:
            self._memory.append(record)
            return
        append_line(self.path, record)

    def records(self) -> list[Record]:
        """Every entry ever written (this process's and others'), oldest first."""
        if self.path is None:
            return list(self._memory)
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        key = (stat.st_size, stat.st_mtime_ns)  # re-read only when the file changed (another process may append)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, AuditLog.read(self.path))
        return list(self._cache[1])

    @staticmethod
    def read(path: str | Path) -> list[Record]:
        out: list[Record] = []
        checked_input(path, "the audit log", MAX_AUDIT_FILE_BYTES)  # a link to /dev/zero would read for ever
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("%s:%d: not a JSON line (a write cut short?); skipped", path, number)
                    continue
                if isinstance(record, dict):
                    out.append(record)
                else:
                    log.warning("%s:%d: not a JSON object; skipped", path, number)
        return out


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the log, so check-then-append (a decision) is atomic across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def append_line(path: Path, record: Record) -> None:
    line = (json.dumps(record, default=str) + "\n").encode()
    with open(path, "ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.write(line)
            handle.flush()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
