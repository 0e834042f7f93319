"""A gate's answer about one planned action now: the shape every gate returns.

The gates are pure functions of the action, the audit history, the snapshot, the clock's ``now``
and their own policy, and never touch the cluster or the log:

- :func:`.breaker.breaker_verdict`: the circuit breaker the audit log leaves;
- :func:`.maintenance.window_verdict`: the maintenance window;
- :func:`.pacing.pace_verdict`: the slow start per node pool and detector;
- :func:`.limits.budget_verdict`: the hourly limit and the node share.

The applier (:class:`.apply.Actuator`) asks them in that order, applies what they all allow and
records the first refusal's outcome and reason in the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass

from .audit import Outcome


@dataclass(frozen=True)
class Verdict:
    """Allowed, or not: then the outcome to record (blocked by a limit, held by the pace) and why."""

    allowed: bool
    outcome: Outcome | None = None  # None when allowed
    reason: str = ""

    def __post_init__(self) -> None:
        if self.allowed != (self.outcome is None):
            raise ValueError(f"a verdict has an outcome to record exactly when it refuses: {self}")


ALLOWED = Verdict(True)


def refused(outcome: Outcome, reason: str) -> Verdict:
    return Verdict(False, outcome, reason)
