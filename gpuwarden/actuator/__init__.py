"""The actuator: findings + snapshot -> plan -> actions through the ``Cluster`` protocol, in
observe / approve / auto modes, under safety limits, with an audit log. Observe is the default."""

from .apply import Actuator, Mode
from .audit import AuditEntry, AuditLog, Outcome
from .limits import SafetyLimits
from .loop import Reconciler, RoundReport
from .plan import Plan, PlannedAction, PlanningPolicy, plan_from_findings

__all__ = ["Actuator", "AuditEntry", "AuditLog", "Mode", "Outcome", "Plan", "PlannedAction", "PlanningPolicy",
           "Reconciler", "RoundReport", "SafetyLimits", "plan_from_findings"]
