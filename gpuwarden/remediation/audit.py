"""The audit log: append-only JSON lines, the actuator's memory across restarts.

Each entry carries what was done (kind, target, params), why (the findings behind it: kind, GPU,
node and key evidence), on which snapshot, the outcome, and who decided. Everything the actuator
must remember after a restart (the hourly limit, the approval queue, the circuit breaker, what can
be undone) is rebuilt from these lines; there is no other state file.

The log's bad-input rules live here, once (issue 35); every reader goes through :func:`read_audit`:

- a torn last line (a crash mid-write) is fenced before anything is appended: :func:`append_line`
  starts a new line when the file does not end with one, so the record appended is never glued to
  the torn bytes, and the torn line stays alone, skipped when read;
- each line is read on its own (split on ``\\n`` only, at most :data:`MAX_LINE_BYTES`); one that is
  not a JSON object, has no outcome, or lacks what its outcome needs (:data:`_NEEDS`: an approval its
  id, action kind and target; a decision its id and who; a reset who) is skipped; a field of the
  wrong type (:data:`FIELDS`) is read as absent. Every such line is counted and said (one warning
  per read naming the lines; ``gpuwarden actuator list`` prints it), never a crash. A trip of the
  breaker needs nothing but its outcome: a damaged one still holds the breaker open;
- a log that is not there is never created by reading it or by a decision about it (no folder, no
  lock file): :func:`locked` refuses it (:class:`AuditLogMissing`); only a writer's
  :func:`append_line` creates the log and its folder.
"""

from __future__ import annotations

import enum
import fcntl
import json
import logging
import os
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable, Iterator, Mapping

from gpuwarden.fleet import Action, ActionKind, Finding
from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.inputs import MAX_AUDIT_FILE_BYTES, checked_input

log = logging.getLogger("gpuwarden.actuator")

Record = dict[str, Any]  # one JSON line of the log, as written and as read back
# Where `gpuwarden actuator` and `gpuwarden metrics` keep and read the log by default. The log is the
# actuator's memory (an open breaker, the hourly count, approvals, the pace): the path never moves.
DEFAULT_AUDIT_PATH = Path(".gpuwarden/actuator/audit.jsonl")
MAX_LINE_BYTES = 4 * 1024 * 1024  # an entry is a few KB; a longer line is skipped unread, never loaded whole


class AuditLogMissing(UserError, ValueError):
    """No audit log at the path a command was given (and that command does not write a new one)."""


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


def parse_at(at: object) -> datetime | None:
    """A record's ISO time (``at``, ``snapshot_at``, a pace's ``next_at``), one without an offset read
    as UTC (as the Actions page reads it); None if absent, unreadable or not a string."""
    try:
        parsed = datetime.fromisoformat(at) if isinstance(at, str) and at else None
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed is not None and parsed.tzinfo is None else parsed


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


# -- reading: the typing rules ---------------------------------------------------------------------------
_BAD = object()  # what a check returns for a value of the wrong type
Check = Callable[[Any, list[str], str], Any]  # (value, names said wrong so far, its name) -> value or _BAD
_ACTION_KINDS = frozenset(k.value for k in ActionKind)


def _leaf(accepts: Callable[[Any], bool]) -> Check:
    return lambda value, said, name: value if accepts(value) else _BAD


def _time(value: Any, said: list[str], name: str) -> Any:
    at = parse_at(value)
    if at is None:
        return _BAD
    return value if datetime.fromisoformat(value).tzinfo else at.isoformat()  # no offset: UTC, as parse_at reads it


def _typed(value: Mapping[str, Any], fields: Mapping[str, Check], said: list[str], prefix: str = "") -> Record:
    """``value`` without its fields of the wrong type; their names are added to ``said``."""
    out = dict(value)
    for name, check in fields.items():
        if out.get(name) is None:
            continue
        checked = check(out[name], said, f"{prefix}{name}")
        if checked is _BAD:
            del out[name]
            said.append(f"{prefix}{name}")
        else:
            out[name] = checked
    return out


def _object(fields: Mapping[str, Check], needs: tuple[str, ...] = ()) -> Check:
    def check(value: Any, said: list[str], name: str) -> Any:
        if not isinstance(value, dict):
            return _BAD
        out = _typed(value, fields, said, f"{name}.")
        return _BAD if any(out.get(n) in (None, "") for n in needs) else out
    return check


def _objects(fields: Mapping[str, Check]) -> Check:
    one = _object(fields)

    def check(value: Any, said: list[str], name: str) -> Any:
        out = [one(item, said, name) for item in value] if isinstance(value, list) else [_BAD]
        return _BAD if any(item is _BAD for item in out) else out
    return check


_TEXT = _leaf(lambda v: isinstance(v, str))
_ACTION_KIND = _leaf(lambda v: isinstance(v, str) and v in _ACTION_KINDS)
_MAPPING = _leaf(lambda v: isinstance(v, dict))
_NUMBER = _leaf(lambda v: isinstance(v, int | float) and not isinstance(v, bool))
_ACTION = {"kind": _ACTION_KIND, "target": _TEXT, "reason": _TEXT, "params": _MAPPING}
_FINDING = {"kind": _TEXT, "severity": _TEXT, "node": _TEXT, "gpu_uuid": _TEXT, "confidence": _NUMBER,
            "first_seen": _TEXT, "last_seen": _TEXT, "evidence": _MAPPING}
_PARAMS = {"window": _leaf(lambda v: type(v) is int and v >= 0), "next_at": _time, "verdict": _TEXT, "node": _TEXT,
           "pool": _TEXT, "detector": _TEXT, "taint": _TEXT}  # those the pace and repair read back
# Every field a reader uses, and its type; None stands for absent (the writer writes it so).
FIELDS: dict[str, Check] = {
    "entry_id": _TEXT, "at": _time, "snapshot_at": _time, "mode": _TEXT, "kind": _TEXT, "target": _TEXT,
    "reason": _TEXT, "message": _TEXT, "by": _TEXT, "comment": _TEXT, "undo_of": _TEXT,
    "approval_id": _leaf(lambda v: isinstance(v, str) or type(v) is int), "params": _object(_PARAMS),
    "findings": _objects(_FINDING), "undo": _object(_ACTION, needs=("kind", "target")),
}


def _given(value: Any) -> bool:
    return value not in (None, "")


_ENTRY_NEEDS: dict[str, Callable[[Any], bool]] = {"kind": _given, "target": _given}  # what an entry is about
# What an outcome's meaning rests on; a line without it is skipped. Outcomes not named need what an
# entry is about; a trip of the breaker needs nothing (damaged, it still holds the breaker open) and
# an outcome this release does not know is kept for what it says.
_NEEDS: dict[str, dict[str, Callable[[Any], bool]]] = {
    Outcome.AWAITING_APPROVAL.value: {"approval_id": _given, "kind": lambda v: v in _ACTION_KINDS, "target": _given},
    Outcome.APPROVED.value: {"approval_id": _given, "by": _given},
    Outcome.REJECTED.value: {"approval_id": _given, "by": _given},
    Outcome.UNDONE.value: {**_ENTRY_NEEDS, "undo_of": _given},
    Outcome.BREAKER_OPEN.value: {},
    Outcome.BREAKER_RESET.value: {"by": _given},
}


def typed_record(value: object) -> tuple[Record | None, str | None]:
    """A parsed line as the readers may use it (None: skipped) and what is said about it (None: nothing)."""
    if not isinstance(value, dict):
        return None, "skipped, not a JSON object"
    outcome = value.get("outcome")
    if not isinstance(outcome, str) or not outcome:
        return None, "skipped, no outcome (a string)"
    said: list[str] = []
    record = _typed(value, FIELDS, said)
    known = outcome in {o.value for o in Outcome}
    missing = [n for n, ok in _NEEDS.get(outcome, _ENTRY_NEEDS if known else {}).items() if not ok(record.get(n))]
    wrong = f" ({', '.join(said)} of the wrong type)" if said else ""
    if missing:
        return None, f"skipped, a {outcome} entry without a usable {', '.join(missing)}{wrong}"
    return record, (f"read without {', '.join(said)} (of the wrong type)" if said else None)


def _line_record(line: bytes) -> tuple[Record | None, str | None]:
    try:
        value = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # a torn write, a number of 5,000 digits, absurd nesting
        return None, "skipped, not a complete JSON line (a write cut short?)"
    return typed_record(value)


@dataclass(frozen=True)
class AuditRead:
    """What a read of the log gives: the records readers use, and one note per line not read as
    written (``PATH:LINE: why``)."""

    records: list[Record]
    notes: tuple[str, ...] = ()

    def summary(self, shown: int = 3) -> str:
        more = f"; and {len(self.notes) - shown} more" if len(self.notes) > shown else ""
        return f"{len(self.notes)} line(s) of the audit log not read as written: {'; '.join(self.notes[:shown])}{more}"


def read_audit(path: str | Path) -> AuditRead:
    """Every line of the log at ``path`` by the rules above; InputFileError if it is no regular file."""
    checked_input(path, "the audit log", MAX_AUDIT_FILE_BYTES)  # a link to /dev/zero would read for ever
    records: list[Record] = []
    notes: list[str] = []
    with Path(path).open("rb") as handle:  # bytes: a line ends at \n only, as append_line ends it
        number = 0
        while line := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := handle.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass  # the rest of the line, read past in bounded pieces
                notes.append(f"{path}:{number}: skipped, longer than {MAX_LINE_BYTES:,} bytes")
                continue
            if not line.strip():
                continue
            record, note = _line_record(line)
            if note:
                notes.append(f"{path}:{number}: {note}")
            if record is not None:
                records.append(record)
    return AuditRead(records, tuple(notes))


def audit_at(path: str | Path) -> Path | None:
    """``path`` when a log is there, None when nothing is (InputFileError for a directory, a FIFO...)."""
    return checked_input(path, "the audit log", MAX_AUDIT_FILE_BYTES, missing_ok=True)


class AuditLog:
    """Append-only JSON lines; each entry is written in one ``write`` under a file lock and flushed
    before the caller goes on, so the actuator and a dashboard can append to the same file. Opening
    it creates nothing: the first entry recorded creates the file and its folder."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self.entries: list[AuditEntry] = []
        self._memory: list[Record] = []  # without a path, records live here
        self._cache: tuple[tuple[int, int], list[Record]] | None = None  # (size, mtime) -> records
        self._said: tuple[str, ...] = ()  # the notes last warned about: said again only when they change
        self._lock = threading.Lock()
        if self.path:  # a directory, a FIFO or a link to /dev/null here would lose every record: refused
            audit_at(self.path)

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
            read = read_audit(self.path)
            if read.notes and read.notes != self._said:
                log.warning("%s", read.summary())
            self._said = read.notes
            self._cache = (key, read.records)
        return list(self._cache[1])

    @staticmethod
    def read(path: str | Path) -> list[Record]:
        """The records of the log at ``path``; the lines not read as written are said in one warning."""
        read = read_audit(path)
        if read.notes:
            log.warning("%s", read.summary())
        return read.records


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the log, so check-then-append (a decision) is atomic across processes.
    Only beside a log that is there: a decision about a log that is not creates nothing."""
    if audit_at(path) is None:
        raise AuditLogMissing(f"no audit log at {path}")
    with open(f"{path}.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def append_line(path: Path, record: Record) -> None:
    """Append ``record`` as one line. A file that does not end with a newline ends with a torn
    write: a newline goes first (in the same write), so the torn bytes stay a line of their own."""
    line = (json.dumps(record, default=str) + "\n").encode()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            end = handle.seek(0, os.SEEK_END)
            if end and os.pread(handle.fileno(), 1, end - 1) != b"\n":
                line = b"\n" + line
            handle.write(line)
            handle.flush()
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
