"""Remediation: findings + snapshot -> plan -> verdicts (breaker, maintenance window, pace, budget:
pure functions, :mod:`.verdict`) -> actions through the ``Cluster`` protocol, in observe / approve /
auto modes, with an audit log, approvals, repair and undo. Observe is the default. It imports only
``fleet``: the CLI hands it a cluster (Kubernetes or the simulator)."""

from .apply import Actuator
from .audit import AuditEntry, AuditLog, Mode, Outcome
from .limits import SafetyLimits
from .loop import Reconciler, RoundReport
from .plan import Plan, PlannedAction, PlanningPolicy, plan_from_findings

__all__ = ["Actuator", "AuditEntry", "AuditLog", "Mode", "Outcome", "Plan", "PlannedAction", "PlanningPolicy",
           "Reconciler", "RoundReport", "SafetyLimits", "plan_from_findings"]
