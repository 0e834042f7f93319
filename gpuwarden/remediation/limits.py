"""The safety limits of the actuator and the budget verdict: what they still allow in one round.

The hourly limit counts applied actions in the audit log whose time is after an hour before the
injected clock's ``now`` (restarts do not reset it, a ``FakeClock`` moves it); the node share
counts cordoned nodes and nodes carrying a gpuwarden taint. A round's use of the budget is a value
(:class:`BudgetUse`): what the history leaves, plus what the round took since (not yet in its
snapshot, and in observe mode never in the log).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from gpuwarden.fleet import Action, ActionKind, Cluster, ClusterSnapshot

from .audit import Outcome, parse_at
from .verdict import ALLOWED, Verdict, refused

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


@dataclass(frozen=True)
class BudgetUse:
    """What a round has used of the limits: actions applied in the last hour (the history's and
    the round's) and the nodes the round itself took out of scheduling."""

    applied_last_hour: int
    taken_nodes: frozenset[str] = frozenset()

    def taking(self, action: Action) -> BudgetUse:
        """The use once ``action`` is applied (or, in observe mode, would be)."""
        applied = self.applied_last_hour + (0 if action.kind in _UNCOUNTED else 1)
        taken = self.taken_nodes | {action.target} if action.kind in _REMOVES_NODE else self.taken_nodes
        return replace(self, applied_last_hour=applied, taken_nodes=taken)


class RoundUse:
    """One round as the gates see it: the snapshot (read from the cluster the first time one needs
    it) and what the round has used of the safety limits so far."""

    def __init__(self, cluster: Cluster, snapshot: ClusterSnapshot | None, use: BudgetUse) -> None:
        self._cluster, self._snapshot, self.use = cluster, snapshot, use

    def snapshot(self) -> ClusterSnapshot:
        if self._snapshot is None:
            self._snapshot = self._cluster.snapshot()
        return self._snapshot


def budget_use(records: Iterable[Mapping[str, Any]], now: datetime) -> BudgetUse:
    """The use the audit history leaves at ``now``: its applied actions of the last hour."""
    return BudgetUse(applied_since(records, now - timedelta(hours=1)))


def out_of_scheduling(snapshot: ClusterSnapshot) -> set[str]:
    """Nodes cordoned or carrying a gpuwarden taint (others' taints are the operator's business)."""
    own = {n for n, taints in snapshot.taints.items() if any(t.startswith(OWN_TAINT_PREFIX) for t in taints)}
    return set(snapshot.cordoned) | own


def budget_verdict(action: Action, use: BudgetUse, limits: SafetyLimits,
                   snapshot: ClusterSnapshot | Callable[[], ClusterSnapshot]) -> Verdict:
    """The limits' verdict on ``action``: blocked (which trips the breaker) once the hourly limit is
    reached, or when it would take more than the node share out of scheduling. ``snapshot`` may be
    a callable, called only when the node share is asked (the applier reads the cluster lazily)."""
    if action.kind not in _UNCOUNTED and use.applied_last_hour >= limits.max_actions_per_hour:
        return refused(Outcome.BLOCKED, f"{use.applied_last_hour} actions in the last hour; "
                                        f"limit {limits.max_actions_per_hour}")
    if action.kind in _REMOVES_NODE:
        current = snapshot() if callable(snapshot) else snapshot
        removed = out_of_scheduling(current) | use.taken_nodes | {action.target}
        total = max(1, len(current.nodes))
        ratio = len(removed) / total
        if ratio > limits.max_cordoned_node_ratio:
            return refused(Outcome.BLOCKED, f"would leave {len(removed)} of {total} nodes cordoned or tainted "
                                            f"({ratio:.0%}); limit {limits.max_cordoned_node_ratio:.0%}")
    return ALLOWED


def applied_since(records: Iterable[Mapping[str, Any]], since: datetime) -> int:
    """Applied actions (notices aside) recorded after ``since``."""
    uncounted = {k.value for k in _UNCOUNTED}
    return sum(1 for record in records if record.get("outcome") == Outcome.APPLIED.value
               and record.get("kind") not in uncounted and (at := parse_at(record.get("at"))) is not None and at > since)
