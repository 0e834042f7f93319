"""The applier: a plan through the ``Cluster`` protocol, under a mode, the gates' verdicts and an audit log.

Modes: ``observe`` applies nothing and asks the gates as if the plan were carried out, recording each
planned action once as ``planned``, ``held`` or ``blocked-by-limit`` ("would be ..."); ``approve`` queues
actions (:mod:`gpuwarden.remediation.approvals`) and applies an approved one at the next round (or at once
through :meth:`Actuator.approve`), the gates asked then; ``auto`` applies at once, as the gates allow.

The gates (:mod:`.verdict`) are pure functions returning a verdict, asked in this order: the circuit
breaker (:mod:`.breaker`), the maintenance window (:mod:`.maintenance`), the pace (:mod:`.pacing`), the
failure domains (:mod:`.domain_gate`, optional) and the budget of safety limits (:mod:`.limits`: the
hourly limit counts applied actions in the audit log, so restarts do not reset it; the node share counts
cordoned and gpuwarden-tainted nodes); last, a drain of checkpointable work asks for a checkpoint first
(:mod:`.checkpoint_first`). Every outcome is in the audit log before the next action is tried, so a plan
interrupted half-way leaves a record of exactly what was done. The window's, the pace's and the domains'
holds are recorded once while they stand and never trip the breaker; the budget's refusal trips it:
nothing more is applied, a metric and an Event say so, and a person resets it (``gpuwarden actuator
reset``). Options: pacing by outcome, repair (:mod:`.repair`), node conditions in every mode
(:mod:`.node_health`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypedDict, Unpack

from gpuwarden.fleet import Action, Cluster, ClusterSnapshot
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from . import approvals
from .audit import (AuditEntry, AuditLog, Mode, Outcome, Record, action_entry, action_from_record, finding_record,
                    new_id, parse_at)
from .at_risk import risk_line
from .breaker import OPEN, WAITING, breaker_verdict, record_breaker_reset, record_breaker_trip
from .checkpoint_first import CheckpointFirst
from .domain_gate import DomainGate
from .domains import DomainPolicy
from .limits import RoundUse, SafetyLimits, budget_use, budget_verdict
from .maintenance import MaintenanceWindow, window_verdict
from .metrics import RemediationMetrics
from .node_health import publish_health
from .pacing import FindingLike, PaceEvent, Pacer, PacingPolicy
from .plan import Plan, PlannedAction
from .repair import Repair
from .undo import inverse, undo_applied
from .verdict import ALLOWED, Verdict

__all__ = ["Actuator", "Mode"]

Key = tuple[str, str]  # (kind, target): a planned action's key


class _EntryContext(TypedDict, total=False):
    """What an approved action's audit entries carry over from its awaiting entry and decision."""

    approval_id: str | None
    findings: tuple[Record, ...]
    snapshot_at: datetime | None
    by: str | None


class Actuator:
    """Applies plans to one cluster. One per cluster; its state lives in the audit log."""

    def __init__(self, cluster: Cluster, mode: Mode | str = Mode.OBSERVE, limits: SafetyLimits | None = None,
                 audit: AuditLog | None = None, clock: Clock = SYSTEM_CLOCK,
                 leader: Callable[[], bool] | None = None, name: str = "actuator",
                 window: MaintenanceWindow | None = None, pacing: PacingPolicy | None = None,
                 repair_after_healthy_seconds: float | None = None, node_conditions: bool = False,
                 metrics: RemediationMetrics | None = None, domains: DomainPolicy | None = None) -> None:
        """``pacing`` (auto and approve modes; None: only the limits), ``domains`` (the failure-domain
        breaker), ``repair_after_healthy_seconds`` (None: never) and ``node_conditions`` (``GPUHealthy`` each
        round, every mode) are off by default; ``metrics``: the gauges it sets (a fresh registry when not
        given; the CLI serves the one it hands in)."""
        self.metrics = metrics if metrics is not None else RemediationMetrics()
        self.cluster, self.mode, self.limits = cluster, Mode(mode), limits or SafetyLimits()
        self.audit, self.clock, self.name, self.window = audit or AuditLog(), clock, name, window
        self.leader = leader or (lambda: True)
        # Holds recorded once while they stand (the audit log says it once, not every round):
        self._held: set[Key] = set()  # by the window, while it is shut
        self._paced: set[Key] = set()  # by the pace
        self._breaker_noted: set[Key] = set()  # by the open breaker
        self._observed: set[tuple[str, str, str]] = set()  # observe mode records a standing plan once
        self._lock = threading.RLock()
        self.pacer = Pacer(pacing, self.audit.records(), self.metrics) if pacing is not None else None
        self.repair = Repair(repair_after_healthy_seconds) if repair_after_healthy_seconds is not None else None
        self.node_conditions = node_conditions
        self.checkpoints = CheckpointFirst(cluster, clock)
        self.domains = DomainGate(domains, self.audit, cluster, name) if domains is not None else None
        self.metrics.breaker_open.set(1 if self.breaker_open else 0)

    # -- state rebuilt from the audit log ----------------------------------------------------------
    def applied_in_last_hour(self) -> int:
        return budget_use(self.audit.records(), self.clock.now()).applied_last_hour

    @property
    def breaker_open(self) -> bool:
        return not breaker_verdict(self.audit.records()).allowed

    @property
    def awaiting(self) -> dict[str, approvals.PendingApproval]:
        return {p.approval_id: p for p in approvals.pending_from(self.audit.records())}

    # -- the gates, on this actuator's policies ----------------------------------------------------
    def _round(self, snapshot: ClusterSnapshot | None) -> RoundUse:
        return RoundUse(self.cluster, snapshot, budget_use(self.audit.records(), self.clock.now()))

    def _pace(self, action: Action, findings: Sequence[FindingLike], round_: RoundUse,
              starts: dict[Key, int] | None = None) -> Verdict:
        verdict = ALLOWED if self.pacer is None else self.pacer.verdict(action, findings, round_.snapshot(),
                                                                        self.clock.now(), starts)
        if verdict.allowed and self.domains is not None:  # observe mode (its ``starts``) records no transition
            return self.domains.verdict(action, findings, round_.snapshot(), self.clock.now(), self.mode, starts is None)
        return verdict

    def _budget(self, action: Action, round_: RoundUse) -> Verdict:
        return budget_verdict(action, round_.use, self.limits, round_.snapshot)

    # -- recording ---------------------------------------------------------------------------------
    def _entry(self, outcome: Outcome, action: Action, message: str = "", approval_id: str | None = None,
               findings: tuple[Record, ...] = (), snapshot_at: datetime | None = None, by: str | None = None,
               undo: Action | None = None) -> AuditEntry:
        entry = action_entry(self.clock.now(), self.mode, outcome, action, message, by=by or self.name,
                             approval_id=approval_id, findings=findings, snapshot_at=snapshot_at, undo=undo)
        self.audit.record(entry)
        return entry

    @staticmethod
    def _findings(planned: PlannedAction) -> tuple[Record, ...]:
        return tuple(finding_record(f) for f in planned.findings)

    def _refusal(self, planned: PlannedAction, verdict: Verdict, snapshot_at: datetime | None) -> AuditEntry:
        assert verdict.outcome is not None  # a refusal always names one (Verdict checks)
        return self._entry(verdict.outcome, planned.action, verdict.reason, findings=self._findings(planned),
                           snapshot_at=snapshot_at)

    def _hold_once(self, seen: set[Key], planned: PlannedAction, verdict: Verdict,
                   snapshot_at: datetime | None) -> list[AuditEntry]:
        """A hold (the breaker, the window, the pace) recorded once while it stands."""
        if planned.key in seen:
            return []
        seen.add(planned.key)
        return [self._refusal(planned, verdict, snapshot_at)]

    def _not_applied(self, rest: Sequence[PlannedAction], why: str, snapshot_at: datetime | None) -> list[AuditEntry]:
        return [self._entry(Outcome.NOT_APPLIED, p.action, why, findings=self._findings(p), snapshot_at=snapshot_at)
                for p in rest]

    def _pace_entry(self, event: PaceEvent) -> AuditEntry:
        self.audit.record(entry := event.entry(self.clock.now(), self.mode, self.name))
        return entry

    # -- a round -----------------------------------------------------------------------------------
    def execute(self, plan: Plan, snapshot: ClusterSnapshot | None = None) -> list[AuditEntry]:
        """Carry out ``plan`` under the current mode. Returns the audit entries it wrote."""
        with self._lock:
            round_, plan = self._round(snapshot), plan.stated()  # each action with what it puts at stake
            if self.node_conditions:
                publish_health(self.cluster, plan.health)
            if self.domains is not None:  # domains with room again close first
                self.domains.begin(round_.snapshot(), self.clock.now(), self.mode, self.mode != Mode.OBSERVE)
            out = self._by_mode(plan, round_)
            return out if self.domains is None else [*self.domains.written, *out]

    def _by_mode(self, plan: Plan, round_: RoundUse) -> list[AuditEntry]:
        if self.mode == Mode.OBSERVE:
            return self._observe(plan, round_)
        if self.mode == Mode.APPROVE:
            out = self._observe_pace(plan, round_) + self._apply_approved(round_)
            done = {(e.kind, e.target) for e in out}  # the plan was made before these were applied
            return out + self._queue(Plan(tuple(p for p in plan.actions if p.key not in done), plan.skipped,
                                          plan.snapshot_at))
        return self._auto(plan, round_)

    def _auto(self, plan: Plan, round_: RoundUse) -> list[AuditEntry]:
        breaker = breaker_verdict(self.audit.records())
        if breaker.allowed:
            self._breaker_noted.clear()
        if self.window is None or self.window.is_open(self.clock.now()):
            self._held.clear()
        out = self._judge(plan, round_, breaker.allowed)
        for position, planned in enumerate(plan.actions):
            action = planned.action
            if not self.leader():
                out += self._not_applied(plan.actions[position:], "not the leader (lease lost): stopped acting",
                                         plan.snapshot_at)
                break
            if not breaker.allowed:
                out += self._hold_once(self._breaker_noted, planned, breaker, plan.snapshot_at)
                continue
            held = window_verdict(action, self.clock.now(), self.window)
            if not held.allowed:
                out += self._hold_once(self._held, planned, held, plan.snapshot_at)
                continue
            paced = self._pace(action, planned.findings, round_)
            if not paced.allowed:
                out += self._hold_once(self._paced, planned, paced, plan.snapshot_at)
                continue
            self._paced.discard(planned.key)
            budget = self._budget(action, round_)
            if not budget.allowed:  # a limit reached: the breaker opens and holds the rest
                out += [self._refusal(planned, budget, plan.snapshot_at), self._trip(budget.reason)]
                self._breaker_noted.add(planned.key)
                breaker = OPEN
                continue
            ready = self._ready(action, round_, findings=self._findings(planned), snapshot_at=plan.snapshot_at)
            if isinstance(ready, list):  # a drain waiting for its checkpoint
                out += ready
                continue
            entry = self._apply(ready, round_, findings=self._findings(planned), snapshot_at=plan.snapshot_at)
            out += [entry, *self._pace_outcome(ready, planned.findings, entry, round_)]
            if entry.outcome == Outcome.ERROR:
                out += self._not_applied(plan.actions[position + 1:], "an earlier action failed", plan.snapshot_at)
                break
        return out

    def _observe(self, plan: Plan, round_: RoundUse) -> list[AuditEntry]:
        out, seen = [], set()
        breaker = not breaker_verdict(self.audit.records()).allowed
        starts: dict[Key, int] = {}  # what auto mode would start this round, per pool and detector
        for planned in plan.actions:
            held = window_verdict(planned.action, self.clock.now(), self.window)
            if not held.allowed:
                outcome, message = Outcome.BLOCKED, f"would be blocked: {held.reason}"  # a schedule, not a fault
            elif breaker:
                outcome, message = Outcome.BLOCKED, "would be blocked: circuit breaker open"
            elif not (paced := self._pace(planned.action, planned.findings, round_, starts)).allowed:
                outcome, message = Outcome.HELD, f"would be held: {paced.reason}"
            elif not (budget := self._budget(planned.action, round_)).allowed:
                breaker = True  # auto mode would stop here: everything after it is blocked too
                outcome, message = Outcome.BLOCKED, f"would be blocked: {budget.reason}"
            else:
                round_.use = round_.use.taking(planned.action)
                outcome, message = Outcome.PLANNED, risk_line(planned.action.params)
            key = (*planned.key, outcome.value)
            seen.add(key)
            if key not in self._observed:
                out.append(self._entry(outcome, planned.action, message, findings=self._findings(planned),
                                       snapshot_at=plan.snapshot_at))
        self._observed = seen
        return out

    # -- pacing and repair -------------------------------------------------------------------------
    def _pace_outcome(self, action: Action, findings: Sequence[FindingLike], entry: AuditEntry,
                      round_: RoundUse) -> list[AuditEntry]:
        """The pace event of an applied (or failed) disruptive action; a blocked one never started."""
        if self.pacer is None or entry.outcome == Outcome.BLOCKED:
            return []
        event = self.pacer.outcome(action, findings, round_.snapshot(), self.clock.now(),
                                   entry.outcome in (Outcome.APPLIED, Outcome.RETRY), entry.outcome.value)
        return [self._pace_entry(event)] if event is not None else []

    def _observe_pace(self, plan: Plan, round_: RoundUse) -> list[AuditEntry]:
        """Pace events on what is in flight (proven, failed) on this round's snapshot."""
        if self.pacer is None:
            return []
        return [self._pace_entry(e) for e in self.pacer.observe(round_.snapshot(), plan.health, self.clock.now())]

    def _judge(self, plan: Plan, round_: RoundUse, breaker_closed: bool) -> list[AuditEntry]:
        """Pace events on what is in flight, then repair's uncordons (unpaced: they give capacity back)."""
        now, current = self.clock.now(), round_.snapshot()
        out = self._observe_pace(plan, round_)
        if self.repair is not None and breaker_closed:
            out += [self._apply(a, round_, by="repair") for a in self.repair.actions(self.audit.records(), current,
                                                                                     plan.health, now)]
        return out

    # -- approve mode --------------------------------------------------------------------------------
    def _queue(self, plan: Plan) -> list[AuditEntry]:
        asked = approvals.already_asked(self.audit.records(), self.clock.now())
        return [self._entry(Outcome.AWAITING_APPROVAL, p.action, risk_line(p.action.params), approval_id=new_id(),
                            findings=self._findings(p), snapshot_at=plan.snapshot_at)
                for p in plan.actions if p.key not in asked]

    @staticmethod
    def _approved(awaiting: Record, by: str) -> _EntryContext:
        return {"approval_id": str(awaiting["approval_id"]), "findings": tuple(awaiting.get("findings") or ()),
                "snapshot_at": parse_at(awaiting.get("snapshot_at")), "by": by}

    def _apply_approved(self, round_: RoundUse) -> list[AuditEntry]:
        out = []
        for awaiting, decision in approvals.approved_not_applied(self.audit.records()):
            action, context = action_from_record(awaiting), self._approved(awaiting, decision.get("by") or "operator")
            findings, key = context.get("findings", ()), (action.kind.value, action.target)
            if not self.leader():
                out.append(self._entry(Outcome.NOT_APPLIED, action, "not the leader (lease lost)", **context))
                continue
            if not window_verdict(action, self.clock.now(), self.window).allowed:
                continue  # it stays approved and is applied at the first round inside the window
            paced = self._pace(action, findings, round_)  # approve mode is paced like auto
            if not paced.allowed:  # recorded once, without its approval id: it stays approved and waits for the pace
                if key not in self._paced:
                    self._paced.add(key)
                    out.append(self._entry(Outcome.HELD, action, f"approved; {paced.reason}", by=context.get("by"),
                                           findings=findings, snapshot_at=context.get("snapshot_at")))
                continue
            self._paced.discard(key)
            entry = self._guarded_apply(action, round_, **context)
            if isinstance(entry, list):  # a drain waiting for its checkpoint: it stays approved
                out += entry
                continue
            out += [entry, *self._pace_outcome(action, findings, entry, round_)]
        return out

    def _guarded_apply(self, action: Action, round_: RoundUse, **context: Unpack[_EntryContext]) -> AuditEntry | list[AuditEntry]:
        """An approved action through the breaker, the budget (the breaker read afresh: an earlier
        approved action may have tripped it) and its checkpoint (a list while it waits for one)."""
        if not breaker_verdict(self.audit.records()).allowed:
            return self._entry(Outcome.BLOCKED, action, WAITING, **context)
        budget = self._budget(action, round_)
        if not budget.allowed:
            assert budget.outcome is not None  # a refusal always names one (Verdict checks)
            entry = self._entry(budget.outcome, action, budget.reason, **context)
            self._trip(budget.reason)
            return entry
        ready = self._ready(action, round_, **context)
        return ready if isinstance(ready, list) else self._apply(ready, round_, **context)

    def _ready(self, action: Action, round_: RoundUse, **context: Unpack[_EntryContext]) -> Action | list[AuditEntry]:
        """The action to apply now, restated (:mod:`.checkpoint_first`); while a drain waits for its
        checkpoint, the entries that says (its request, once, without the approval id: that stays open)."""
        made: list[AuditEntry] = []
        context.pop("approval_id", None)
        ready = self.checkpoints.step(action, round_.snapshot(), self.audit.records(),
                                      lambda *entry: made.append(self._entry(*entry, **context)))
        return made if ready is None else ready

    def _apply(self, action: Action, round_: RoundUse, **context: Unpack[_EntryContext]) -> AuditEntry:
        try:
            result = self.cluster.apply(action)
        except Exception as error:  # noqa: BLE001 the protocol says never raise; a client bug or outage still must be recorded
            return self._entry(Outcome.ERROR, action, f"{type(error).__name__}: {error}", **context)
        if result.ok:
            round_.use = round_.use.taking(action)
            return self._entry(Outcome.APPLIED, action, result.message, undo=result.undo or inverse(action), **context)
        outcome = Outcome.RETRY if result.temporary else Outcome.REFUSED
        return self._entry(outcome, action, result.message, **context)

    # -- the circuit breaker ---------------------------------------------------------------------
    def _trip(self, why: str) -> AuditEntry:
        return record_breaker_trip(self.audit, why, clock=self.clock, mode=self.mode, name=self.name,
                                   events=self.cluster, metrics=self.metrics)

    def reset_breaker(self, by: str, comment: str = "") -> AuditEntry:
        with self._lock:
            self._breaker_noted.clear()
            return record_breaker_reset(self.audit, by, comment, at=self.clock.now(), mode=self.mode, name=self.name,
                                        metrics=self.metrics)

    # -- people ------------------------------------------------------------------------------------
    def approve(self, approval_id: str, by: str = "operator", comment: str = "") -> AuditEntry:
        """Record the approval and apply the action now (gates asked). ValueError if not waiting."""
        with self._lock:
            awaiting = self._decide(approval_id, True, by, comment)
            action = action_from_record(awaiting)
            held = window_verdict(action, self.clock.now(), self.window)
            if not held.allowed:  # recorded without its approval id, so the approval stays waiting to be applied
                return self._entry(Outcome.BLOCKED, action, f"approved; {held.reason} (applied at the first round "
                                   "inside it)", by=by)
            context = self._approved(awaiting, by)
            round_ = self._round(None)
            paced = self._pace(action, context.get("findings", ()), round_)
            if not paced.allowed:  # as with the window: it stays approved and goes at a round the pace allows
                self._paced.add((action.kind.value, action.target))
                return self._entry(Outcome.HELD, action, f"approved; {paced.reason} (applied at a later round once "
                                   "the pace allows)", by=by, findings=context.get("findings", ()))
            entry = self._guarded_apply(action, round_, **context)
            if isinstance(entry, list):  # it waits for a checkpoint (asked now, or earlier) and goes at a later round
                return entry[0] if entry else action_entry(self.clock.now(), self.mode, Outcome.RETRY, action,
                                                           "approved; waiting for its checkpoint", by=by)
            self._pace_outcome(action, context.get("findings", ()), entry, round_)  # in the log; the answer is the action's
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
            return undo_applied(self.audit, self.cluster, entry_id, by or self.name, clock=self.clock, mode=self.mode)
