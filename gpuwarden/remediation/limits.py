"""The safety limits of the actuator and what they still allow in one round.

The hourly limit counts applied actions in the audit log whose time is after an hour before the
injected clock's ``now`` (restarts do not reset it, a ``FakeClock`` moves it); the node share
counts cordoned nodes and nodes carrying a gpuwarden taint.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot

from .audit import Outcome, Record

if TYPE_CHECKING:
    from .apply import Actuator

OWN_TAINT_PREFIX = "gpuwarden.io/"  # taints the actuator puts on; others (nvidia.com/gpu:NoSchedule) are the operator's


@dataclass(frozen=True)
class SafetyLimits:
    """Limits that hold in approve and auto modes, and are reported as "would block" in observe."""

    max_actions_per_hour: int = 10
    max_cordoned_node_ratio: float = 0.1  # never take more than this share of nodes out of scheduling

    def __post_init__(self) -> None:
        if self.max_actions_per_hour < 0:
            raise ValueError(f"max_actions_per_hour: {self.max_actions_per_hour} must be >= 0")
        if not 0.0 <= self.max_cordoned_node_ratio <= 1.0:
            raise ValueError(f"max_cordoned_node_ratio: {self.max_cordoned_node_ratio} not in 0..1")


_REMOVES_NODE = (ActionKind.CORDON, ActionKind.DRAIN, ActionKind.TAINT)
_UNCOUNTED = (ActionKind.NOTIFY,)  # a notice changes nothing a workload runs on


def parse_at(at: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(at) if at else None
    except ValueError:
        return None


class Budget:
    """What the limits still allow this round: actions in the last hour and nodes out of scheduling."""

    def __init__(self, actuator: Actuator, snapshot: ClusterSnapshot | None) -> None:
        self.actuator = actuator
        self.snapshot = snapshot
        self.applied = actuator.applied_in_last_hour()
        self.removed: set[str] | None = None

    def current(self) -> ClusterSnapshot:
        """The round's snapshot, read from the cluster the first time a limit needs it."""
        if self.snapshot is None:
            self.snapshot = self.actuator.cluster.snapshot()
        return self.snapshot

    def _removed(self) -> set[str]:
        if self.removed is None:
            snapshot = self.current()
            own = {n for n, taints in snapshot.taints.items() if any(t.startswith(OWN_TAINT_PREFIX) for t in taints)}
            self.removed = set(snapshot.cordoned) | own
        return self.removed

    def why_not(self, action: Action) -> str | None:
        limits = self.actuator.limits
        if action.kind not in _UNCOUNTED and self.applied >= limits.max_actions_per_hour:
            return f"{self.applied} actions in the last hour; limit {limits.max_actions_per_hour}"
        if action.kind in _REMOVES_NODE:
            removed = self._removed() | {action.target}
            total = max(1, len(self.current().nodes))
            ratio = len(removed) / total
            if ratio > limits.max_cordoned_node_ratio:
                return (f"would leave {len(removed)} of {total} nodes cordoned or tainted ({ratio:.0%}); "
                        f"limit {limits.max_cordoned_node_ratio:.0%}")
        return None

    def take(self, action: Action) -> None:
        if action.kind not in _UNCOUNTED:
            self.applied += 1
        if action.kind in _REMOVES_NODE:
            self._removed().add(action.target)


def applied_since(records: list[Record], since: datetime) -> int:
    """Applied actions (notices aside) recorded after ``since``."""
    uncounted = {k.value for k in _UNCOUNTED}
    return sum(1 for record in records if record.get("outcome") == Outcome.APPLIED.value
               and record.get("kind") not in uncounted and (at := parse_at(record.get("at"))) is not None and at > since)
