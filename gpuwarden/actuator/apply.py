"""Applying a plan through the ``Cluster`` protocol, under a mode, safety limits and an audit log.

Modes:
- ``observe``: nothing is applied; each planned action is recorded as ``planned`` when it first
  appears (a plan that stands round after round is not recorded again).
- ``approve``: actions wait in an approval queue (``approve(id)`` / ``reject(id)``); nothing is
  applied until an operator approves, and limits are checked again at that moment.
- ``auto``: actions are applied at once, within the limits.

Every outcome (planned, awaiting-approval, applied, refused, blocked-by-limit, error) is written to
the audit log before the next action is tried, so a plan interrupted half-way leaves a record of
exactly what was done and what was not.
"""

from __future__ import annotations

import enum
import itertools
import json
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

from gpuwarden.fleet import Action, ActionKind, Cluster

from .plan import Plan, PlannedAction


class Mode(str, enum.Enum):
    OBSERVE = "observe"
    APPROVE = "approve"
    AUTO = "auto"


class Outcome(str, enum.Enum):
    PLANNED = "planned"
    AWAITING_APPROVAL = "awaiting-approval"
    APPLIED = "applied"
    REFUSED = "refused"  # the cluster said no
    BLOCKED = "blocked-by-limit"
    REJECTED = "rejected"  # an operator said no
    ERROR = "error"
    NOT_APPLIED = "not-applied"  # an earlier error stopped the plan


@dataclass(frozen=True)
class SafetyLimits:
    """Limits that hold in approve and auto modes (observe applies nothing)."""

    max_actions_per_hour: int = 10
    max_cordoned_node_ratio: float = 0.1  # never take more than this share of nodes out of scheduling

    def __post_init__(self) -> None:
        if self.max_actions_per_hour < 0:
            raise ValueError(f"max_actions_per_hour: {self.max_actions_per_hour} must be >= 0")
        if not 0.0 <= self.max_cordoned_node_ratio <= 1.0:
            raise ValueError(f"max_cordoned_node_ratio: {self.max_cordoned_node_ratio} not in 0..1")


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    mode: Mode
    outcome: Outcome
    kind: str
    target: str
    reason: str
    message: str = ""
    approval_id: int | None = None

    def as_json(self) -> str:
        return json.dumps({
            "at": self.at.isoformat(), "mode": self.mode.value, "outcome": self.outcome.value, "kind": self.kind,
            "target": self.target, "reason": self.reason, "message": self.message, "approval_id": self.approval_id,
        })


class AuditLog:
    """Append-only JSON lines; each entry is flushed before the caller goes on."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self.entries: list[AuditEntry] = []
        self._lock = threading.Lock()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, entry: AuditEntry) -> None:
        with self._lock:
            self.entries.append(entry)
            if self.path:
                with self.path.open("a") as handle:
                    handle.write(entry.as_json() + "\n")
                    handle.flush()

    @staticmethod
    def read(path: str | Path) -> list[dict]:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


_REMOVES_NODE = (ActionKind.CORDON, ActionKind.DRAIN)


class Actuator:
    """Applies plans to one cluster. Not thread-safe across instances; one per cluster."""

    def __init__(self, cluster: Cluster, mode: Mode | str = Mode.OBSERVE, limits: SafetyLimits = SafetyLimits(),
                 audit: AuditLog | None = None, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self.cluster = cluster
        self.mode = Mode(mode)
        self.limits = limits
        self.audit = audit or AuditLog()
        self.clock = clock
        self.awaiting: dict[int, PlannedAction] = {}
        self._observed: set[tuple[str, str]] = set()  # observe mode records a standing plan once
        self._ids = itertools.count(1)
        self._applied_at: list[datetime] = []
        self._lock = threading.Lock()

    def _entry(self, outcome: Outcome, planned: PlannedAction, message: str = "", approval_id: int | None = None) -> AuditEntry:
        action = planned.action
        entry = AuditEntry(self.clock(), self.mode, outcome, action.kind.value, action.target, action.reason, message, approval_id)
        self.audit.record(entry)
        return entry

    def execute(self, plan: Plan) -> list[AuditEntry]:
        """Carry out ``plan`` under the current mode. Returns the audit entries it wrote."""
        with self._lock:
            if self.mode == Mode.OBSERVE:
                out = [self._entry(Outcome.PLANNED, p) for p in plan.actions if p.key not in self._observed]
                self._observed = {p.key for p in plan.actions}
                return out
            out: list[AuditEntry] = []
            pending_keys = {p.key for p in self.awaiting.values()}
            for position, planned in enumerate(plan.actions):
                if self.mode == Mode.APPROVE:
                    if planned.key in pending_keys:
                        continue  # already waiting for an operator
                    approval_id = next(self._ids)
                    self.awaiting[approval_id] = planned
                    out.append(self._entry(Outcome.AWAITING_APPROVAL, planned, approval_id=approval_id))
                else:
                    entry = self._apply(planned)
                    out.append(entry)
                    if entry.outcome == Outcome.ERROR:
                        out += [self._entry(Outcome.NOT_APPLIED, rest, "an earlier action failed")
                                for rest in plan.actions[position + 1:]]
                        break
            return out

    def approve(self, approval_id: int) -> AuditEntry:
        with self._lock:
            planned = self.awaiting.pop(approval_id, None)
            if planned is None:
                raise KeyError(f"no action awaits approval with id {approval_id}; waiting: {sorted(self.awaiting)}")
            return self._apply(planned, approval_id)

    def reject(self, approval_id: int) -> AuditEntry:
        with self._lock:
            planned = self.awaiting.pop(approval_id, None)
            if planned is None:
                raise KeyError(f"no action awaits approval with id {approval_id}; waiting: {sorted(self.awaiting)}")
            return self._entry(Outcome.REJECTED, planned, approval_id=approval_id)

    def _apply(self, planned: PlannedAction, approval_id: int | None = None) -> AuditEntry:
        why_not = self._limit_reached(planned.action)
        if why_not:
            return self._entry(Outcome.BLOCKED, planned, why_not, approval_id)
        try:
            result = self.cluster.apply(planned.action)
        except Exception as error:  # the protocol says never raise; a client bug or outage still must be recorded
            return self._entry(Outcome.ERROR, planned, f"{type(error).__name__}: {error}", approval_id)
        if not result.ok:
            return self._entry(Outcome.REFUSED, planned, result.message, approval_id)
        self._applied_at.append(self.clock())
        return self._entry(Outcome.APPLIED, planned, result.message, approval_id)

    def _limit_reached(self, action: Action) -> str | None:
        hour_ago = self.clock() - timedelta(hours=1)
        self._applied_at = [t for t in self._applied_at if t > hour_ago]
        if len(self._applied_at) >= self.limits.max_actions_per_hour:
            return f"{len(self._applied_at)} actions in the last hour; limit {self.limits.max_actions_per_hour}"
        if action.kind in _REMOVES_NODE:
            snapshot = self.cluster.snapshot()
            cordoned = set(snapshot.cordoned) | {action.target}
            ratio = len(cordoned) / max(1, len(snapshot.nodes))
            if ratio > self.limits.max_cordoned_node_ratio:
                return (f"would leave {len(cordoned)} of {len(snapshot.nodes)} nodes cordoned ({ratio:.0%}); "
                        f"limit {self.limits.max_cordoned_node_ratio:.0%}")
        return None
