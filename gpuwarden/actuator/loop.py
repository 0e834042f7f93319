"""The reconcile loop: every interval, findings + a cluster snapshot -> a plan -> the actuator.

One background thread runs ``reconcile_once`` every ``interval_seconds`` on an injected
:class:`~gpuwarden.fleet.clock.Clock`, so a slow round is never run twice at once and rounds missed
while one ran collapse into the next (what APScheduler's ``max_instances=1, coalesce=True`` gave;
APScheduler 3 reads ``datetime.now()`` inside its scheduler, triggers and executors, so no clock can
be handed to it, and a test of the loop had to sleep). Tests hand in a ``FakeClock`` and advance it.
Where findings come from is a callable, so the loop knows nothing about analytics or Prometheus.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuwarden.fleet import ClusterSnapshot, Finding
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock, Repeater
from gpuwarden.scheduling.planner import plan as schedule_plan

from .apply import Actuator
from .audit import AuditEntry
from .plan import Plan, PlanningPolicy, plan_from_findings, scheduling_findings

log = logging.getLogger("gpuwarden.actuator")


@dataclass(frozen=True)
class RoundReport:
    findings: int
    plan: Plan
    entries: tuple[AuditEntry, ...]


class Reconciler:
    def __init__(self, actuator: Actuator, find: Callable[[ClusterSnapshot], list[Finding]],
                 policy: PlanningPolicy = PlanningPolicy(), interval_seconds: float = 60.0,
                 scheduling: str | None = None, on_round: Callable[[RoundReport], None] | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """``scheduling``: a scheduling policy name (``gpuwarden``...) whose decisions on each
        snapshot (quota reclaim, queue order) join the plan; None plans from findings only."""
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds: {interval_seconds} must be > 0")
        self.actuator = actuator
        self.find = find
        self.policy = policy
        self.interval_seconds = interval_seconds
        self.scheduling = scheduling
        self.on_round = on_round  # e.g. the CLI's one-line summary of each scheduled round
        self.rounds: list[RoundReport] = []
        self.clock = clock
        self._repeater = Repeater("gpuwarden-reconciler", self._safe_round, interval_seconds, clock, first_at_once=False)
        self._lock = threading.Lock()

    def reconcile_once(self) -> RoundReport:
        with self._lock:
            if not self.actuator.leader():
                log.info("reconcile: not the leader; this replica waits")
                return RoundReport(0, Plan(()), ())
            snapshot = self.actuator.cluster.snapshot()
            findings = list(self.find(snapshot))
            if self.scheduling:
                findings += scheduling_findings(schedule_plan(snapshot, self.scheduling).actions, snapshot)
            plan = plan_from_findings(findings, snapshot, self.policy)
            entries = tuple(self.actuator.execute(plan, snapshot))
            report = RoundReport(len(findings), plan, entries)
            self.rounds.append(report)
            log.info("reconcile: %d findings -> %d planned actions (%s mode)", len(findings), len(plan.actions),
                     self.actuator.mode.value)
            return report

    def _safe_round(self) -> None:
        try:
            report = self.reconcile_once()
        except Exception as error:  # a failed round is one line, retried next interval; never kills the loop
            log.error("reconcile round failed: %s: %s; retrying next interval", type(error).__name__, error)
            log.debug("reconcile round failed", exc_info=True)
            return
        if self.on_round is not None:
            self.on_round(report)

    def start(self) -> Reconciler:
        """A round every interval, the first one interval after start (``Repeater``: a round that
        overruns delays the next one, rounds never overlap)."""
        self._repeater.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the running round (if any); safe to call twice."""
        self._repeater.stop(timeout)
