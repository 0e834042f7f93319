"""From findings and a cluster snapshot to a plan of actions: pure, decided on an immutable snapshot.

One plan vocabulary for every source of actions, each action carrying the findings behind it:
- health findings become node actions, strongest first (drain > cordon > taint, the ladder of
  :mod:`gpuwarden.fleet.node_actions`), one per node. Which action a fault gets is not decided
  here: a finding carries its kind's action from the fault catalogue
  (:data:`gpuwarden.analytics.health.catalogue.FAULT_ACTIONS`), and the plan takes it as it stands,
  applying only policy (severity and confidence bars, protected nodes, the strongest per node, a
  drain's mode by severity);
- idle findings (``hoarded``, ``allocated-idle``) on a workload in a namespace that opted in
  (label ``gpuwarden.io/reclaim-idle=true``) become a notice (an Event and an annotation) once the
  GPU has idled past ``notify_grace_seconds``, then, ``reclaim_grace_seconds`` after the notice, a
  suspend (checkpointable or a suspendable controller) or an eviction;
- a finding that names a workload in its evidence and recommends a workload action (set-priority,
  suspend, resume, preempt, evict) is planned as it says.
Scheduling (admission, quota reclaim, queue order) is not planned here: it has its own loop, the
scheduling round (:mod:`gpuwarden.scheduler.scheduling_round`), which resumes only what it suspended.
An idle reclaim's suspend carries ``params["by"] = "idle-reclaim"`` so the cluster marks who holds it.
An action whose effect already stands (a cordoned node, a suspended job) is never planned again,
and a node or namespace labelled ``gpuwarden.io/protect=true`` is left alone. Each disruptive action
states what it puts at stake (:mod:`.at_risk`: the GPU-hours at risk since the last checkpoint, on
what basis, the mode, and for a drain of checkpointable work the checkpoint it asks for first,
:mod:`.checkpoint_first`), beside its action: ``PlannedAction.stated`` is what the log records.
Applying the plan is a separate step (:mod:`gpuwarden.remediation.apply`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from datetime import datetime

from gpuwarden.fleet import (
    Action,
    ActionKind,
    ClusterSnapshot,
    Finding,
    Severity,
    WorkloadPhase,
    WorkloadState,
)
from gpuwarden.fleet.node_actions import NODE_ACTIONS, stronger
from gpuwarden.fleet.object_names import SUSPENDED_BY_IDLE_RECLAIM

from .at_risk import SUSPENDABLE_CONTROLLERS, running, statement

WORKLOAD_ACTIONS = (ActionKind.SET_PRIORITY, ActionKind.RESUME, ActionKind.NOTIFY, ActionKind.SUSPEND,
                    ActionKind.EVICT, ActionKind.PREEMPT)
_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
PROTECT_LABEL = "gpuwarden.io/protect"
RECLAIM_LABEL = "gpuwarden.io/reclaim-idle"
NOTIFIED_ANNOTATION = "gpuwarden.io/idle-notified-at"


@dataclass(frozen=True)
class PlanningPolicy:
    """Which findings are acted on. Thresholds are documented parameters, not magic numbers."""

    min_severity: Severity = Severity.WARNING
    min_confidence: float = 0.8
    protected_nodes: frozenset[str] = frozenset()
    taint: str = "gpuwarden.io/unhealthy=true:NoSchedule"
    idle_kinds: frozenset[str] = frozenset({"hoarded", "allocated-idle", "idle"})
    notify_grace_seconds: float = 3600.0  # idle this long before the owner is told
    reclaim_grace_seconds: float = 3600.0  # after the notice, this long before the GPU is taken back
    suspend_grace_seconds: int = 120  # a checkpointable workload's time to save before it stops
    # A drain's mode unless a node or namespace label gpuwarden.io/drain-mode says otherwise: a
    # critical finding drains now, a warning cordons and lets pods finish up to the timeout.
    drain_mode_by_severity: Mapping[str, str] = field(default_factory=lambda: {
        Severity.CRITICAL.value: "immediate", Severity.WARNING.value: "allow-completion"})
    drain_completion_seconds: float = 3600.0
    # How long a drain that would evict checkpointable work at once waits for it to save first
    # (:mod:`.checkpoint_first`), by its most severe finding; 0: it drains without asking.
    checkpoint_timeout_seconds_by_severity: Mapping[str, float] = field(default_factory=lambda: {
        Severity.CRITICAL.value: 300.0, Severity.WARNING.value: 900.0})

    def __post_init__(self) -> None:
        for severity, seconds in self.checkpoint_timeout_seconds_by_severity.items():
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
                raise ValueError(f"checkpoint_timeout_seconds_by_severity: {severity}={seconds!r} is not a number "
                                 "of seconds >= 0")


@dataclass(frozen=True)
class PlannedAction:
    action: Action
    findings: tuple[Finding, ...]  # the evidence behind it
    # What it puts at stake (:func:`.at_risk.statement`): GPU-hours at risk, basis, mode, checkpoint-first
    statement: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.action.kind.value, self.action.target)

    @property
    def stated(self) -> Action:
        """The action with its statement in its params: what the audit log records (approve mode
        applies it from there) and what the applier restates when it goes ahead."""
        if not self.statement:
            return self.action
        action = self.action
        return Action(action.kind, action.target, action.reason, {**action.params, **self.statement})


@dataclass(frozen=True)
class Plan:
    actions: tuple[PlannedAction, ...]
    skipped: tuple[tuple[Finding, str], ...] = field(default=())  # finding and why it led to nothing
    snapshot_at: datetime | None = None
    # Open health findings per node (those that pass the policy's severity and confidence bars,
    # acted on or not): what the node condition says, and what pacing and repair wait to see clear.
    health: Mapping[str, tuple[Finding, ...]] = field(default_factory=dict)

    def stated(self) -> Plan:
        """This plan with each action's statement in its params (what the applier records)."""
        return replace(self, actions=tuple(replace(p, action=p.stated) for p in self.actions))


def _label_true(labels: Mapping[str, str] | None, key: str) -> bool:
    return str((labels or {}).get(key, "")).lower() == "true"


def node_protected(snapshot: ClusterSnapshot, node: str, policy: PlanningPolicy) -> bool:
    return node in policy.protected_nodes or _label_true(snapshot.node_labels.get(node), PROTECT_LABEL)


def namespace_protected(snapshot: ClusterSnapshot, namespace: str) -> bool:
    return _label_true(snapshot.namespace_labels.get(namespace), PROTECT_LABEL)


def _passes(finding: Finding, policy: PlanningPolicy) -> str | None:
    if _SEVERITY_RANK[finding.severity] < _SEVERITY_RANK[policy.min_severity]:
        return f"severity {finding.severity.value} below {policy.min_severity.value}"
    if finding.confidence < policy.min_confidence:
        return f"confidence {finding.confidence:.2f} below {policy.min_confidence:.2f}"
    return None


def already_standing(action: Action, snapshot: ClusterSnapshot, policy: PlanningPolicy,
                     index: _Index | None = None) -> str | None:
    """Why ``action`` would change nothing (its effect already stands), or None."""
    index = index or _Index(snapshot)
    target, kind = action.target, action.kind
    if kind == ActionKind.CORDON and target in snapshot.cordoned:
        return f"{target} is already cordoned"
    if kind == ActionKind.TAINT and action.params.get("taint", policy.taint) in snapshot.taints.get(target, ()):
        return f"{target} is already tainted"
    if kind == ActionKind.DRAIN and target in snapshot.cordoned and target not in index.busy_nodes:
        return f"{target} is already drained (cordoned, no GPU workload left)"
    if kind in WORKLOAD_ACTIONS:
        state = index.by_key.get(target)
        if state is None:
            return f"workload {target!r} is not in the cluster"
        if kind == ActionKind.NOTIFY and NOTIFIED_ANNOTATION in state.annotations:
            return f"{target} was already notified"
        if kind in (ActionKind.SUSPEND, ActionKind.PREEMPT, ActionKind.EVICT) and state.phase == WorkloadPhase.SUSPENDED:
            return f"{target} is already suspended"
        if kind == ActionKind.RESUME and state.phase != WorkloadPhase.SUSPENDED:
            return f"{target} is {state.phase.value}, not suspended"
        current = state.priority_override or state.workload.priority_class.value
        if kind == ActionKind.SET_PRIORITY and action.params.get("priority_class") == current:
            return f"{target} already has priority {current}"
    return None


def _node_plan(findings: list[Finding], snapshot: ClusterSnapshot, policy: PlanningPolicy,
               skipped: list[tuple[Finding, str]], index: _Index) -> list[PlannedAction]:
    nodes = {node.name for node in snapshot.nodes}
    strongest: dict[str, tuple[ActionKind, list[Finding]]] = {}
    for finding in findings:
        action = finding.recommended_action
        if action is None:  # the caller passes node actions only; kept for the type checker
            skipped.append((finding, "recommends no node action"))
            continue
        why = _passes(finding, policy)
        if why:
            skipped.append((finding, why))
            continue
        if finding.node not in nodes:
            skipped.append((finding, f"node {finding.node!r} is not in the cluster"))
            continue
        if node_protected(snapshot, finding.node, policy):
            skipped.append((finding, f"node {finding.node!r} is protected"))
            continue
        current = strongest.get(finding.node)
        if current is None or stronger(action, current[0]):
            strongest[finding.node] = (action, [finding] + (current[1] if current else []))
        else:
            current[1].append(finding)
    planned = []
    for node, (kind, evidence) in sorted(strongest.items()):
        params: dict[str, Any] = {"taint": policy.taint} if kind == ActionKind.TAINT else {}
        if kind == ActionKind.DRAIN:
            params = drain_defaults(evidence, policy)
        reason = "; ".join(sorted({f"{f.kind} on {f.gpu_uuid or node}" for f in evidence}))
        node_action = Action(kind, node, reason, params)
        standing = already_standing(node_action, snapshot, policy, index)
        if standing:
            skipped.extend((finding, standing) for finding in evidence)
            continue
        planned.append(PlannedAction(node_action, tuple(evidence)))
    return planned


def drain_defaults(findings: Iterable[Finding], policy: PlanningPolicy) -> dict[str, Any]:
    """A drain's mode by its most severe finding, and the time pods may take to finish."""
    worst = max((f.severity for f in findings), key=_SEVERITY_RANK.__getitem__, default=Severity.WARNING)
    return {"mode": policy.drain_mode_by_severity.get(worst.value, "immediate"),
            "timeout_seconds": policy.drain_completion_seconds, "severity": worst.value}


def open_health(findings: Iterable[Finding], policy: PlanningPolicy) -> dict[str, tuple[Finding, ...]]:
    """Node -> its open health findings that pass the policy's bars."""
    out: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.recommended_action in NODE_ACTIONS and finding.active and _passes(finding, policy) is None:
            out.setdefault(finding.node, []).append(finding)
    return {node: tuple(found) for node, found in out.items()}


class _Index:
    """Workloads by key, by (namespace, pod) and by GPU, and nodes with running GPU work: built once
    per plan, so matching findings costs a lookup each, not a scan of every workload."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.by_key: dict[str, WorkloadState] = {}
        self.by_pod: dict[tuple[str, str], WorkloadState] = {}
        self.by_gpu: dict[str, WorkloadState] = {}
        self.busy_nodes: set[str] = set()
        for state in snapshot.workloads:
            namespace = state.workload.namespace
            self.by_key[state.workload.key] = state
            self.by_pod.setdefault((namespace, state.workload.name), state)
            for pod in state.pods:
                self.by_pod[(namespace, pod)] = state
            for placement in state.placements:
                self.by_gpu.setdefault(placement.gpu_uuid, state)
                if state.phase == WorkloadPhase.RUNNING:
                    self.busy_nodes.add(placement.node)


def _workload_of(finding: Finding, index: _Index) -> WorkloadState | None:
    evidence = finding.evidence
    named = evidence.get("workload")
    namespace, pod = evidence.get("namespace"), evidence.get("pod")
    if named:
        return index.by_key.get(named)
    if pod:
        return index.by_pod.get((str(namespace or ""), str(pod)))
    if finding.gpu_uuid:
        return index.by_gpu.get(finding.gpu_uuid)
    return None


def _idle_action(finding: Finding, state: WorkloadState, snapshot: ClusterSnapshot,
                 policy: PlanningPolicy, now: datetime) -> tuple[ActionKind | None, str]:
    idle_seconds = (finding.last_seen - finding.first_seen).total_seconds()
    if idle_seconds < policy.notify_grace_seconds:
        return None, f"idle {idle_seconds:.0f} s, under the notice grace of {policy.notify_grace_seconds:.0f} s"
    notified = state.annotations.get(NOTIFIED_ANNOTATION)
    if not notified:
        return ActionKind.NOTIFY, ""
    try:
        since = (now - datetime.fromisoformat(notified)).total_seconds()
    except (TypeError, ValueError):
        return None, f"annotation {NOTIFIED_ANNOTATION}={notified!r} is not an ISO time"
    if since < policy.reclaim_grace_seconds:
        return None, f"notified {since:.0f} s ago; reclaim grace is {policy.reclaim_grace_seconds:.0f} s"
    if state.workload.checkpointable or state.controller in SUSPENDABLE_CONTROLLERS:
        return ActionKind.SUSPEND, ""
    return ActionKind.EVICT, ""


def _workload_plan(findings: list[Finding], snapshot: ClusterSnapshot, policy: PlanningPolicy, now: datetime,
                   skipped: list[tuple[Finding, str]], index: _Index) -> list[PlannedAction]:
    planned: dict[str, PlannedAction] = {}
    for finding in findings:
        idle = finding.kind in policy.idle_kinds
        why = None if idle else _passes(finding, policy)  # idle findings are facts, not guesses: no confidence bar
        if why:
            skipped.append((finding, why))
            continue
        state = _workload_of(finding, index)
        if state is None:
            skipped.append((finding, "no workload in the cluster holds this GPU or pod"))
            continue
        target, namespace = state.workload.key, state.workload.namespace
        if namespace_protected(snapshot, namespace):
            skipped.append((finding, f"namespace {namespace!r} is protected"))
            continue
        params: dict[str, Any] = {}
        if idle:
            if not _label_true(snapshot.namespace_labels.get(namespace), RECLAIM_LABEL):
                skipped.append((finding, f"namespace {namespace!r} has not opted in ({RECLAIM_LABEL}=true)"))
                continue
            kind, why = _idle_action(finding, state, snapshot, policy, now)
            if kind is None:
                skipped.append((finding, why))
                continue
            if kind == ActionKind.NOTIFY:
                params = {"annotation": NOTIFIED_ANNOTATION, "at": now.isoformat(),
                          "message": f"GPU {finding.gpu_uuid or '?'} on {finding.node} has been {finding.kind} since "
                                     f"{finding.first_seen.isoformat()}; it will be reclaimed after "
                                     f"{policy.reclaim_grace_seconds:.0f} s unless it is used"}
        else:
            recommended = finding.recommended_action
            if recommended is None:  # the caller passes workload actions only; kept for the type checker
                skipped.append((finding, "recommends no workload action"))
                continue
            kind = recommended
            params = {k: finding.evidence[k] for k in ("priority_class",) if k in finding.evidence}
        if kind in (ActionKind.SUSPEND, ActionKind.PREEMPT):
            params["grace_seconds"] = policy.suspend_grace_seconds
            if idle:
                params["by"] = SUSPENDED_BY_IDLE_RECLAIM  # the scheduler never resumes it until its owner asks
        action = Action(kind, target, f"{finding.kind} on {finding.gpu_uuid or finding.node or target}", params)
        standing = already_standing(action, snapshot, policy, index)
        if standing:
            skipped.append((finding, standing))
            continue
        current = planned.get(target)
        if current is None or WORKLOAD_ACTIONS.index(kind) > WORKLOAD_ACTIONS.index(current.action.kind):
            planned[target] = PlannedAction(action, (finding,) + (current.findings if current else ()))
        else:
            planned[target] = PlannedAction(current.action, current.findings + (finding,))
    return [planned[k] for k in sorted(planned)]


def plan_from_findings(findings: list[Finding], snapshot: ClusterSnapshot, policy: PlanningPolicy = PlanningPolicy(),
                       now: datetime | None = None) -> Plan:
    now = now or snapshot.taken_at
    skipped: list[tuple[Finding, str]] = []
    node_findings, workload_findings = [], []
    for finding in findings:
        if finding.kind in policy.idle_kinds or finding.recommended_action in WORKLOAD_ACTIONS:
            workload_findings.append(finding)
        elif finding.recommended_action in NODE_ACTIONS:
            node_findings.append(finding)
        else:
            skipped.append((finding, "recommends no node action"))
    index = _Index(snapshot)
    actions = _node_plan(node_findings, snapshot, policy, skipped, index) + _workload_plan(
        workload_findings, snapshot, policy, now, skipped, index)
    live = running(snapshot)
    stated = tuple(replace(p, statement=statement(p.action, snapshot, now, _checkpoint_timeout(p.action, policy), live))
                   for p in actions)
    return Plan(stated, tuple(skipped), snapshot.taken_at, open_health(node_findings, policy))


def _checkpoint_timeout(action: Action, policy: PlanningPolicy) -> float:
    """A drain's wait for checkpoints, by the severity its params carry (0 for other kinds)."""
    if action.kind != ActionKind.DRAIN:
        return 0.0
    return float(policy.checkpoint_timeout_seconds_by_severity.get(str(action.params.get("severity")), 0.0))


def merge(*plans: Plan) -> Plan:
    """One plan from several: one action per target (the first plan's wins), skipped reasons kept."""
    seen: dict[str, PlannedAction] = {}
    skipped: list[tuple[Finding, str]] = []
    for plan in plans:
        skipped.extend(plan.skipped)
        for planned in plan.actions:
            seen.setdefault(planned.action.target, planned)
    at = next((p.snapshot_at for p in plans if p.snapshot_at), None)
    health: dict[str, tuple[Finding, ...]] = {}
    for plan in plans:
        for node, found in plan.health.items():
            health[node] = health.get(node, ()) + found
    return Plan(tuple(seen.values()), tuple(skipped), at, health)
