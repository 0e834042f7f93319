"""Applying a plan through the ``Cluster`` protocol, under a mode, safety limits and an audit log.

Modes:
- ``observe``: nothing is applied. The limits are still evaluated as if the plan were carried out,
  so each planned action is recorded as ``planned`` or as ``blocked-by-limit`` ("would be
  blocked"); a plan that stands round after round is recorded once.
- ``approve``: actions wait in the approval queue (:mod:`gpuwarden.remediation.approvals`); an
  approved action is applied at the next round (or at once through :meth:`Actuator.approve`),
  with the limits checked at that moment.
- ``auto``: actions are applied at once, within the limits.

Safety: the hourly limit counts applied actions in the audit log (so restarts do not reset it),
in the last hour of the injected clock (a ``FakeClock`` moves it);
the node share counts cordoned nodes and nodes carrying a gpuwarden taint. When a limit is reached
the circuit breaker opens: nothing more is applied, a metric and an Event say so, and a person
resets it (``gpuwarden actuator reset``). Every outcome is written to the audit log before the next
action is tried, so a plan interrupted half-way leaves a record of exactly what was done. With a
maintenance window (:mod:`.maintenance`), disruptive actions outside it are held back: recorded
once as blocked, never tripping the breaker, and applied at a round inside it. Options: pacing by
outcome (:mod:`.pacing`), repair (:mod:`.repair`), node conditions in every mode (:mod:`.node_health`).
"""

from __future__ import annotations

import enum
import logging
import threading
from datetime import datetime, timedelta
from collections.abc import Callable
from typing import TypedDict, Unpack

from prometheus_client import Gauge

from gpuwarden.fleet import Action, Cluster, ClusterSnapshot
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock
from gpuwarden.fleet.protocols import EventSink

from . import approvals
from .audit import (AuditEntry, AuditLog, Outcome, Record, action_from_record, action_record, breaker_open_in,
                    finding_record, new_id)
from .limits import Budget, SafetyLimits, applied_since, parse_at
from .maintenance import MaintenanceWindow
from .node_health import publish_health
from .pacing import Pacer, PacingPolicy, Verdict
from .plan import Plan, PlannedAction
from .repair import Repair
from .undo import inverse, undo_applied

log = logging.getLogger("gpuwarden.actuator")

BREAKER_GAUGE = Gauge("gpuwarden_actuator_circuit_open",
                      "1 while the actuator's circuit breaker is open (a safety limit was reached; a person must reset it)")
REJECTED_QUIET = timedelta(hours=24)  # a rejected action is not asked again for this long


class _EntryContext(TypedDict, total=False):
    """What an approved action's audit entries carry over from its awaiting entry and decision."""

    approval_id: str | None
    findings: tuple[Record, ...]
    snapshot_at: datetime | None
    by: str | None


class Mode(str, enum.Enum):
    OBSERVE = "observe"
    APPROVE = "approve"
    AUTO = "auto"


class Actuator:
    """Applies plans to one cluster. One per cluster; its state lives in the audit log."""

    def __init__(self, cluster: Cluster, mode: Mode | str = Mode.OBSERVE, limits: SafetyLimits | None = None,
                 audit: AuditLog | None = None, clock: Clock = SYSTEM_CLOCK,
                 leader: Callable[[], bool] | None = None, name: str = "actuator",
                 window: MaintenanceWindow | None = None, pacing: PacingPolicy | None = None,
                 repair_after_healthy_seconds: float | None = None, node_conditions: bool = False) -> None:
        """``pacing`` (auto and approve modes; None: only the limits), ``repair_after_healthy_seconds`` (None:
        never) and ``node_conditions`` (``GPUHealthy`` each round, every mode) are off by default."""
        self.cluster = cluster
        self.mode = Mode(mode)
        self.limits = limits or SafetyLimits()
        self.audit = audit or AuditLog()
        self.clock = clock
        self.leader = leader or (lambda: True)
        self.name = name
        self.window = window
        self._held: set[tuple[str, str]] = set()  # held back by the window: recorded once while it is shut
        self._observed: set[tuple[str, str, str]] = set()  # observe mode records a standing plan once
        self._breaker_noted: set[tuple[str, str]] = set()
        self._lock = threading.RLock()
        self.pacer = Pacer(pacing, self.audit.records()) if pacing is not None else None
        self.repair = Repair(repair_after_healthy_seconds) if repair_after_healthy_seconds is not None else None
        self.node_conditions = node_conditions
        self._paced: set[tuple[str, str]] = set()  # held by the pace: recorded once while held
        BREAKER_GAUGE.set(1 if self.breaker_open else 0)

    # -- state rebuilt from the audit log ----------------------------------------------------------
    def applied_in_last_hour(self) -> int:
        return applied_since(self.audit.records(), self.clock.now() - timedelta(hours=1))

    @property
    def breaker_open(self) -> bool:
        return breaker_open_in(self.audit.records())

    @property
    def awaiting(self) -> dict[str, approvals.PendingApproval]:
        return {p.approval_id: p for p in approvals.pending_from(self.audit.records())}

    # -- recording ---------------------------------------------------------------------------------
    def _entry(self, outcome: Outcome, action: Action, message: str = "", approval_id: str | None = None,
               findings: tuple[Record, ...] = (), snapshot_at: datetime | None = None, by: str | None = None,
               undo: Action | None = None, undo_of: str | None = None) -> AuditEntry:
        entry = AuditEntry(self.clock.now(), self.mode, outcome, action.kind.value, action.target, action.reason, message,
                           approval_id, dict(action.params), tuple(findings), snapshot_at, new_id(),
                           by or self.name, action_record(undo), undo_of)
        self.audit.record(entry)
        return entry

    def _held_back(self, action: Action) -> str | None:
        """Why the maintenance window holds ``action`` back now (None: it may go)."""
        return self.window.holds_back(action, self.clock.now()) if self.window is not None else None

    @staticmethod
    def _findings(planned: PlannedAction) -> tuple[Record, ...]:
        return tuple(finding_record(f) for f in planned.findings)

    # -- a round -----------------------------------------------------------------------------------
    def execute(self, plan: Plan, snapshot: ClusterSnapshot | None = None) -> list[AuditEntry]:
        """Carry out ``plan`` under the current mode. Returns the audit entries it wrote."""
        with self._lock:
            budget = Budget(self, snapshot)
            if self.node_conditions:
                publish_health(self.cluster, plan.health)
            if self.mode == Mode.OBSERVE:
                return self._observe(plan, budget)
            out: list[AuditEntry] = []
            if self.mode == Mode.APPROVE:
                out += self._observe_pace(plan, budget)
                out += self._apply_approved(budget)
                done = {(e.kind, e.target) for e in out}  # the plan was made before these were applied
                return out + self._queue(Plan(tuple(p for p in plan.actions if p.key not in done), plan.skipped,
                                              plan.snapshot_at))
            breaker = self.breaker_open
            if not breaker:
                self._breaker_noted.clear()
            if self.window is None or self.window.is_open(self.clock.now()):
                self._held.clear()
            out += self._judge(plan, budget, breaker)
            for position, planned in enumerate(plan.actions):
                action, findings = planned.action, self._findings(planned)
                if not self.leader():
                    out += [self._entry(Outcome.NOT_APPLIED, rest.action, "not the leader (lease lost): stopped acting",
                                        findings=self._findings(rest), snapshot_at=plan.snapshot_at)
                            for rest in plan.actions[position:]]
                    break
                if breaker:
                    out += self._hold_once(self._breaker_noted, planned, Outcome.BLOCKED, "circuit breaker open: "
                                           "waiting for a person (gpuwarden actuator reset)", plan.snapshot_at)
                    continue
                held = self._held_back(action)
                if held:
                    out += self._hold_once(self._held, planned, Outcome.BLOCKED, held, plan.snapshot_at)
                    continue
                paced = self._pace_holds(planned, budget)
                if paced:
                    out += self._hold_once(self._paced, planned, Outcome.HELD, paced, plan.snapshot_at)
                    continue
                self._paced.discard(planned.key)
                why = budget.why_not(action)
                if why:
                    out.append(self._entry(Outcome.BLOCKED, action, why, findings=findings, snapshot_at=plan.snapshot_at))
                    out.append(self._trip(why))
                    self._breaker_noted.add(planned.key)
                    breaker = True
                    continue
                entry = self._apply(action, budget, findings=findings, snapshot_at=plan.snapshot_at)
                out.append(entry)
                out += self._paced_outcome(planned, entry, budget)
                if entry.outcome == Outcome.ERROR:
                    out += [self._entry(Outcome.NOT_APPLIED, rest.action, "an earlier action failed",
                                        findings=self._findings(rest), snapshot_at=plan.snapshot_at)
                            for rest in plan.actions[position + 1:]]
                    break
            return out

    def _hold_once(self, seen: set[tuple[str, str]], planned: PlannedAction, outcome: Outcome, message: str,
                   snapshot_at: datetime | None) -> list[AuditEntry]:
        """A hold (the breaker, the window, the pace) recorded once while it stands."""
        if planned.key in seen:
            return []
        seen.add(planned.key)
        return [self._entry(outcome, planned.action, message, findings=self._findings(planned), snapshot_at=snapshot_at)]

    def _observe(self, plan: Plan, budget: Budget) -> list[AuditEntry]:
        out, seen = [], set()
        breaker = self.breaker_open
        starts: dict[tuple[str, str], int] = {}  # what auto mode would start this round, per pool and detector
        for planned in plan.actions:
            held = self._held_back(planned.action)
            paced = None if held or breaker else self._pace_holds(planned, budget, starts)
            why = held or ("circuit breaker open" if breaker else budget.why_not(planned.action))
            if paced:
                outcome, message = Outcome.HELD, f"would be held: {paced}"
            elif held:
                outcome, message = Outcome.BLOCKED, f"would be blocked: {held}"  # a schedule, not a fault
            elif why:
                breaker = True  # auto mode would stop here: everything after it is blocked too
                outcome, message = Outcome.BLOCKED, f"would be blocked: {why}"
            else:
                budget.take(planned.action)
                outcome, message = Outcome.PLANNED, ""
            key = (*planned.key, outcome.value)
            seen.add(key)
            if key not in self._observed:
                out.append(self._entry(outcome, planned.action, message, findings=self._findings(planned),
                                       snapshot_at=plan.snapshot_at))
        self._observed = seen
        return out

    # -- pacing and repair -------------------------------------------------------------------------------
    def _pace_holds(self, planned: PlannedAction, budget: Budget,
                    starts: dict[tuple[str, str], int] | None = None) -> str | None:
        return None if self.pacer is None else self.pacer.holds(planned.action, planned.findings, budget.current(),
                                                                self.clock.now(), starts)

    def _paced_outcome(self, planned: PlannedAction, entry: AuditEntry, budget: Budget) -> list[AuditEntry]:
        if self.pacer is None:
            return []
        verdict = self.pacer.outcome(planned.action, planned.findings, budget.current(), self.clock.now(),
                                     entry.outcome in (Outcome.APPLIED, Outcome.RETRY), entry.outcome.value)
        return [self._pace_entry(verdict)] if verdict is not None else []

    def _pace_entry(self, verdict: Verdict) -> AuditEntry:
        self.audit.record(entry := verdict.entry(self.clock.now(), self.mode, self.name))
        return entry

    def _observe_pace(self, plan: Plan, budget: Budget) -> list[AuditEntry]:
        """Pace verdicts on what is in flight (proven, failed) on this round's snapshot."""
        if self.pacer is None:
            return []
        return [self._pace_entry(v) for v in self.pacer.observe(budget.current(), plan.health, self.clock.now())]

    def _judge(self, plan: Plan, budget: Budget, breaker: bool) -> list[AuditEntry]:
        """Pace verdicts on what is in flight, then repair's uncordons (unpaced: they give capacity back)."""
        now, current = self.clock.now(), budget.current()
        out = self._observe_pace(plan, budget)
        if self.repair is not None and not breaker:
            out += [self._apply(a, budget, by="repair") for a in self.repair.actions(self.audit.records(), current,
                                                                                     plan.health, now)]
        return out

    def _queue(self, plan: Plan) -> list[AuditEntry]:
        records = self.audit.records()
        # waiting for a person, or approved and held (by the window or the pace): never asked again
        waiting = {(p.kind, p.target) for p in approvals.pending_from(records)}
        waiting |= {(str(a.get("kind")), str(a.get("target"))) for a, _ in approvals.approved_not_applied(records)}
        quiet_since = self.clock.now() - REJECTED_QUIET
        by_id = {str(r["approval_id"]): r for r in records
                 if r.get("outcome") == Outcome.AWAITING_APPROVAL.value and r.get("approval_id") is not None}
        rejected = {(by_id[str(r["approval_id"])]["kind"], by_id[str(r["approval_id"])]["target"]) for r in records
                    if r.get("outcome") == Outcome.REJECTED.value and str(r.get("approval_id")) in by_id
                    and (parse_at(r.get("at")) or quiet_since) > quiet_since}
        out = []
        for planned in plan.actions:
            if planned.key in waiting or planned.key in rejected:
                continue  # already waiting for a person, or a person said no recently
            out.append(self._entry(Outcome.AWAITING_APPROVAL, planned.action, approval_id=new_id(),
                                   findings=self._findings(planned), snapshot_at=plan.snapshot_at))
        return out

    def _apply_approved(self, budget: Budget) -> list[AuditEntry]:
        out = []
        for awaiting, decision in approvals.approved_not_applied(self.audit.records()):
            action = action_from_record(awaiting)
            kwargs: _EntryContext = {
                "approval_id": str(awaiting["approval_id"]), "findings": tuple(awaiting.get("findings") or ()),
                "snapshot_at": parse_at(awaiting.get("snapshot_at")), "by": decision.get("by") or "operator"}
            if not self.leader():
                out.append(self._entry(Outcome.NOT_APPLIED, action, "not the leader (lease lost)", **kwargs))
                continue
            if self._held_back(action):
                continue  # it stays approved and is applied at the first round inside the window
            paced = self._pace_holds_approved(action, kwargs, budget)
            if paced:  # recorded once, without its approval id: it stays approved and waits for the pace
                if (action.kind.value, action.target) not in self._paced:
                    self._paced.add((action.kind.value, action.target))
                    out.append(self._entry(Outcome.HELD, action, f"approved; {paced}", by=kwargs.get("by"),
                                           findings=kwargs.get("findings", ()), snapshot_at=kwargs.get("snapshot_at")))
                continue
            self._paced.discard((action.kind.value, action.target))
            entry = self._guarded_apply(action, budget, **kwargs)
            out += [entry, *self._approved_pace_outcome(action, kwargs, entry, budget)]
        return out

    def _pace_holds_approved(self, action: Action, context: _EntryContext, budget: Budget) -> str | None:
        """The pace over an approved action (approve mode is paced like auto: a person approving
        fifty cordons at once still gets the slow start); its findings are the awaiting entry's."""
        if self.pacer is None:
            return None
        return self.pacer.holds(action, context.get("findings", ()), budget.current(), self.clock.now())

    def _approved_pace_outcome(self, action: Action, context: _EntryContext, entry: AuditEntry,
                               budget: Budget) -> list[AuditEntry]:
        if self.pacer is None or entry.outcome == Outcome.BLOCKED:
            return []
        verdict = self.pacer.outcome(action, context.get("findings", ()), budget.current(), self.clock.now(),
                                     entry.outcome in (Outcome.APPLIED, Outcome.RETRY), entry.outcome.value)
        return [self._pace_entry(verdict)] if verdict is not None else []

    def _guarded_apply(self, action: Action, budget: Budget, **kwargs: Unpack[_EntryContext]) -> AuditEntry:
        if self.breaker_open:
            return self._entry(Outcome.BLOCKED, action, "circuit breaker open: waiting for a person", **kwargs)
        why = budget.why_not(action)
        if why:
            entry = self._entry(Outcome.BLOCKED, action, why, **kwargs)
            self._trip(why)
            return entry
        return self._apply(action, budget, **kwargs)

    def _apply(self, action: Action, budget: Budget, **kwargs: Unpack[_EntryContext]) -> AuditEntry:
        try:
            result = self.cluster.apply(action)
        except Exception as error:  # noqa: BLE001 the protocol says never raise; a client bug or outage still must be recorded
            return self._entry(Outcome.ERROR, action, f"{type(error).__name__}: {error}", **kwargs)
        if result.ok:
            budget.take(action)
            return self._entry(Outcome.APPLIED, action, result.message, undo=result.undo or inverse(action), **kwargs)
        outcome = Outcome.RETRY if result.temporary else Outcome.REFUSED
        return self._entry(outcome, action, result.message, **kwargs)

    # -- the circuit breaker ---------------------------------------------------------------------
    def _trip(self, why: str) -> AuditEntry:
        BREAKER_GAUGE.set(1)
        message = f"circuit breaker opened: {why}; nothing more is applied until a person resets it"
        log.warning("actuator: %s", message)
        if isinstance(self.cluster, EventSink):
            try:
                self.cluster.record_event("CircuitBreakerOpen", message)
            except Exception as error:  # noqa: BLE001 the Event is a courtesy; the audit entry and metric are the record
                log.warning("actuator: could not post the breaker Event: %s", error)
        return self._note(Outcome.BREAKER_OPEN, why, message, self.name)

    def reset_breaker(self, by: str, comment: str = "") -> AuditEntry:
        with self._lock:
            BREAKER_GAUGE.set(0)
            self._breaker_noted.clear()
            return self._note(Outcome.BREAKER_RESET, comment or "reset", f"reset by {by}", by)

    def _note(self, outcome: Outcome, reason: str, message: str, by: str) -> AuditEntry:
        entry = AuditEntry(self.clock.now(), self.mode, outcome, "circuit-breaker", self.name, reason, message, by=by)
        self.audit.record(entry)
        return entry

    # -- people ------------------------------------------------------------------------------------
    def approve(self, approval_id: str, by: str = "operator", comment: str = "") -> AuditEntry:
        """Record the approval and apply the action now (limits checked). ValueError if not waiting."""
        with self._lock:
            awaiting = self._decide(approval_id, True, by, comment)
            action = action_from_record(awaiting)
            held = self._held_back(action)
            if held:  # recorded without its approval id, so the approval stays waiting to be applied
                return self._entry(Outcome.BLOCKED, action, f"approved; {held} (applied at the first round inside it)",
                                   by=by)
            context: _EntryContext = {"approval_id": str(approval_id), "by": by,
                                      "findings": tuple(awaiting.get("findings") or ()),
                                      "snapshot_at": parse_at(awaiting.get("snapshot_at"))}
            budget = Budget(self, None)
            paced = self._pace_holds_approved(action, context, budget)
            if paced:  # as with the window: it stays approved and goes at a round the pace allows
                self._paced.add((action.kind.value, action.target))
                return self._entry(Outcome.HELD, action, f"approved; {paced} (applied at a later round once the "
                                   "pace allows)", by=by, findings=context["findings"])
            entry = self._guarded_apply(action, budget, **context)
            self._approved_pace_outcome(action, context, entry, budget)  # in the audit log; the answer is the action's
            return entry

    def reject(self, approval_id: str, by: str = "operator", comment: str = "") -> AuditEntry:
        with self._lock:
            awaiting = self._decide(approval_id, False, by, comment)
            entry = AuditEntry(self.clock.now(), self.mode, Outcome.REJECTED, awaiting["kind"], awaiting["target"],
                               awaiting.get("reason", ""), comment, str(approval_id), by=by)
            self.audit.entries.append(entry)
            return entry

    def _decide(self, approval_id: str, approve: bool, by: str, comment: str) -> Record:
        approval_id = str(approval_id)
        if self.audit.path is not None:
            awaiting = approvals.check_decidable(self.audit.records(), approval_id)
            approvals.decide(self.audit.path, approval_id, approve, by, comment, self.clock)
            return awaiting
        awaiting = approvals.check_decidable(self.audit.records(), approval_id)
        self.audit.append_record(approvals.decision_record(approval_id, approve, by, comment, self.clock.now()))
        return awaiting

    def undo(self, entry_id: str, by: str = "operator") -> AuditEntry:
        """Apply the inverse of an applied action (uncordon, untaint, resume). ValueError if it cannot be."""
        with self._lock:
            return undo_applied(self, entry_id, by)
