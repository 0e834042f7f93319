"""The reconcile round: findings + a cluster snapshot -> a plan -> the actuator, as a runner job.

:meth:`Reconciler.register` adds the round to the process's :class:`~gpuwarden.fleet.runner.Runner`
on an APScheduler ``IntervalTrigger`` started on the runner's clock, so a slow round is never run
twice at once and rounds missed while one ran coalesce into one (APScheduler's ``max_instances=1,
coalesce=True``). Tests hand the runner a ``FakeClock`` and advance it. Where findings come from is
a callable, so the round knows nothing about analytics or Prometheus.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuwarden.fleet import ClusterSnapshot, Finding
from gpuwarden.fleet.runner import Job, Runner
from gpuwarden.fleet.triggers import every

from .apply import Actuator
from .audit import AuditEntry
from .plan import Plan, PlanningPolicy, plan_from_findings

log = logging.getLogger("gpuwarden.actuator")


@dataclass(frozen=True)
class RoundReport:
    findings: int
    plan: Plan
    entries: tuple[AuditEntry, ...]


class Reconciler:
    def __init__(self, actuator: Actuator, find: Callable[[ClusterSnapshot], list[Finding]],
                 policy: PlanningPolicy = PlanningPolicy(), interval_seconds: float = 60.0,
                 on_round: Callable[[RoundReport], None] | None = None) -> None:
        """Scheduling is not planned here: it has its own loop (``gpuwarden.scheduler.scheduler_service``)."""
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds: {interval_seconds} must be > 0")
        self.actuator = actuator
        self.find = find
        self.policy = policy
        self.interval_seconds = interval_seconds
        self.on_round = on_round  # e.g. the CLI's one-line summary of each scheduled round
        self.rounds: list[RoundReport] = []
        self._lock = threading.Lock()

    def reconcile_once(self) -> RoundReport:
        with self._lock:
            if not self.actuator.leader():
                log.info("reconcile: not the leader; this replica waits")
                return RoundReport(0, Plan(()), ())
            snapshot = self.actuator.cluster.snapshot()
            findings = list(self.find(snapshot))
            plan = plan_from_findings(findings, snapshot, self.policy)
            entries = tuple(self.actuator.execute(plan, snapshot))
            report = RoundReport(len(findings), plan, entries)
            self.rounds.append(report)
            self.actuator.metrics.last_round.set(self.actuator.clock.now().timestamp())
            log.info("reconcile: %d findings -> %d planned actions (%s mode)", len(findings), len(plan.actions),
                     self.actuator.mode.value)
            return report

    def run_round(self) -> bool:
        """One round as a runner job: a failed round is one line, retried at the next fire time.
        Whether it succeeded (a command that runs a set number of rounds exits non-zero when none did)."""
        try:
            report = self.reconcile_once()
        except Exception as error:  # noqa: BLE001 (a failed round never ends the job)
            log.error("reconcile round failed: %s: %s; retrying next interval", type(error).__name__, error)
            log.debug("reconcile round failed", exc_info=True)
            return False
        if self.on_round is not None:
            self.on_round(report)
        return True

    def register(self, runner: Runner, *, at_once: bool = True) -> Job:
        """Add the round to ``runner``: every interval on its clock, the first at once or one
        interval from now."""
        return runner.add("reconcile", self.run_round, every(self.interval_seconds, runner.clock), at_once=at_once)
