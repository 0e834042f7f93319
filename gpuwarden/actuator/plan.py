"""From findings and a cluster snapshot to a plan of actions: pure, decided on an immutable snapshot.

A finding recommends an action; planning turns the ones worth acting on into node actions,
strongest first (drain > cordon > taint), one per node, skipping what is already done and what the
operator protected. Applying the plan is a separate step (:mod:`gpuwarden.actuator.apply`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, Finding, Severity

# Node actions a health finding may lead to, weakest to strongest.
NODE_ACTIONS = (ActionKind.TAINT, ActionKind.CORDON, ActionKind.DRAIN)
_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


@dataclass(frozen=True)
class PlanningPolicy:
    """Which findings are acted on. Thresholds are documented parameters, not magic numbers."""

    min_severity: Severity = Severity.WARNING
    min_confidence: float = 0.8
    protected_nodes: frozenset[str] = frozenset()
    taint: str = "gpuwarden.io/unhealthy=true:NoSchedule"


@dataclass(frozen=True)
class PlannedAction:
    action: Action
    findings: tuple[Finding, ...]  # the evidence behind it

    @property
    def key(self) -> tuple[str, str]:
        return (self.action.kind.value, self.action.target)


@dataclass(frozen=True)
class Plan:
    actions: tuple[PlannedAction, ...]
    skipped: tuple[tuple[Finding, str], ...] = field(default=())  # finding and why it led to nothing


def plan_from_findings(findings: list[Finding], snapshot: ClusterSnapshot, policy: PlanningPolicy = PlanningPolicy()) -> Plan:
    nodes = {node.name for node in snapshot.nodes}
    strongest: dict[str, tuple[ActionKind, list[Finding]]] = {}
    skipped: list[tuple[Finding, str]] = []
    for finding in findings:
        action = finding.recommended_action
        if action not in NODE_ACTIONS:
            skipped.append((finding, "recommends no node action"))
            continue
        if _SEVERITY_RANK[finding.severity] < _SEVERITY_RANK[policy.min_severity]:
            skipped.append((finding, f"severity {finding.severity.value} below {policy.min_severity.value}"))
            continue
        if finding.confidence < policy.min_confidence:
            skipped.append((finding, f"confidence {finding.confidence:.2f} below {policy.min_confidence:.2f}"))
            continue
        if finding.node not in nodes:
            skipped.append((finding, f"node {finding.node!r} is not in the cluster"))
            continue
        if finding.node in policy.protected_nodes:
            skipped.append((finding, f"node {finding.node!r} is protected"))
            continue
        current = strongest.get(finding.node)
        if current is None or NODE_ACTIONS.index(action) > NODE_ACTIONS.index(current[0]):
            strongest[finding.node] = (action, [finding] + (current[1] if current else []))
        else:
            current[1].append(finding)
    planned = []
    for node, (kind, evidence) in sorted(strongest.items()):
        # A drain still evicts on a cordoned node; a cordon or the same taint twice does nothing.
        already = (kind == ActionKind.CORDON and node in snapshot.cordoned) or (
            kind == ActionKind.TAINT and policy.taint in snapshot.taints.get(node, ())
        )
        if already:
            skipped.extend((finding, f"{node} is already {kind.value}ed") for finding in evidence)
            continue
        reason = "; ".join(sorted({f"{f.kind} on {f.gpu_uuid or node}" for f in evidence}))
        params = {"taint": policy.taint} if kind == ActionKind.TAINT else {}
        planned.append(PlannedAction(Action(kind, node, reason, params), tuple(evidence)))
    return Plan(tuple(planned), tuple(skipped))
