"""Schedule on a ``ClusterSnapshot``: what the actuator calls. Pure: the snapshot is never changed.

``plan(snapshot, policy="gpuwarden", quotas=None, now=None) -> Schedule`` builds the engine's working
state from the snapshot, runs one scheduling pass and returns fleet ``Action``s (BIND, RESUME,
SUSPEND, PREEMPT) plus the queue with each waiting workload's position and reason.

Every fact the engine uses comes from the snapshot, so a live cluster and the simulator feed it the
same ones: cordons; NoSchedule / NoExecute taints a workload does not tolerate (as kube-scheduler
reads them); unhealthy GPUs; MIG layouts and which instance each pod holds; whether GPUs may be
shared by fractions (``Node.shares_gpus``); node pools; set-priority overrides; and each
workload's attained service (``WorkloadState.attained_gpu_seconds``), which LAS orders by.

A ``Schedule`` is the scheduler's proposal in the fleet's action vocabulary; the actuator's
``Plan`` (the one plan that is applied) takes these actions in as findings of kind ``scheduling``.
``actions_for`` is the one translation of decisions into actions; the actuator's scheduling round
(``gpuwarden.actuator.scheduling_round``) applies them through any ``Cluster``, ``SimCluster`` too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from collections.abc import Iterable

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, Gpu, PriorityClass, Workload, WorkloadPhase, WorkloadState
from gpuwarden.fleet.taints import taint_blocks

from .mig import check_profile
from .placement import FractionMode
from .policy import QueuePolicy, policy_named
from .quotas import Quotas, QuotaSpec
from .scheduler import Decision, DecisionKind, QueueEntry, Scheduler, queue_positions
from .state import MILLI, Job, JobState, NodeState, Slot, State

ACTION_OF = {DecisionKind.BIND: ActionKind.BIND, DecisionKind.RESUME: ActionKind.RESUME,
             DecisionKind.SUSPEND: ActionKind.SUSPEND, DecisionKind.PREEMPT: ActionKind.PREEMPT}
SUSPEND_GRACE_SECONDS = 120  # a checkpointable workload's time to save before it stops
PRIORITY_NAMES = frozenset(p.value for p in PriorityClass)


@dataclass(frozen=True)
class Schedule:
    actions: tuple[Action, ...]
    queue: tuple[QueueEntry, ...]

    def reason(self, workload: str) -> str | None:
        for entry in self.queue:
            if entry["job"] == workload:
                return entry["reason"]
        return None


def _node_states(snapshot: ClusterSnapshot) -> list[NodeState]:
    """Nodes as the engine sees them, before running work is booked: whole GPUs free unless
    unhealthy, MIG GPUs cut into their layouts, cordoned nodes unschedulable."""
    gpus_by_node: dict[str, list[Gpu]] = {}
    for gpu in snapshot.gpus:
        gpus_by_node.setdefault(gpu.node, []).append(gpu)
    nodes = []
    for node in snapshot.nodes:
        gpus = sorted(gpus_by_node.get(node.name, []), key=lambda g: g.index)
        layout = [tuple(i.profile for i in g.mig_instances) if g.mig_enabled else None for g in gpus]
        free = [0 if (g.uuid in snapshot.unhealthy_gpus or g.mig_enabled) else MILLI for g in gpus]
        nodes.append(NodeState(
            name=node.name, model=node.gpu_model, gpu_count=len(gpus), cpu_free=node.cpu_milli,
            mem_free=node.memory_bytes, tier=node.price_tier, nvlink_domain=node.topology.nvlink_domain,
            leaf_switch=node.topology.leaf_switch, schedulable=node.name not in snapshot.cordoned,
            gpu_free=free, mig_layout=layout, gpu_ids=[g.uuid for g in gpus], pool=node.pool,
        ))
    return nodes


def _hold_unhealthy(snapshot: ClusterSnapshot, state: State) -> None:
    """An unhealthy GPU offers nothing, also where running work was booked on it: no whole GPU
    free, every MIG instance taken."""
    for node in state.nodes.values():
        for g, uuid in enumerate(node.gpu_ids):
            if uuid in snapshot.unhealthy_gpus:
                layout = node.mig_layout[g]
                if layout is None:
                    node.gpu_free[g] = 0
                else:
                    node.mig_used[g] = list(layout)


def _blocked_nodes(snapshot: ClusterSnapshot, workload: Workload) -> frozenset[str]:
    """Nodes kube-scheduler keeps ``workload`` off: a NoSchedule / NoExecute taint it does not tolerate."""
    return frozenset(node for node, taints in snapshot.taints.items()
                     if any(taint_blocks(t, workload.tolerations) for t in taints))


def shares_gpus(snapshot: ClusterSnapshot) -> bool:
    """Whether fractions may share a GPU: on a fleet where no node shares GPUs, a fraction takes the
    smallest MIG instance that holds it, else a whole GPU (``FractionMode.MIG_OR_WHOLE``)."""
    return not snapshot.nodes or any(node.shares_gpus for node in snapshot.nodes)


def policy_for(snapshot: ClusterSnapshot, policy: str | QueuePolicy) -> QueuePolicy:
    """``policy`` with the fraction mode the snapshot's GPUs allow."""
    base = policy_named(policy) if isinstance(policy, str) else policy
    if shares_gpus(snapshot):
        return base
    return replace(base, placement=replace(base.placement, fractions=FractionMode.MIG_OR_WHOLE))


def state_from_snapshot(snapshot: ClusterSnapshot, quotas: Quotas | None = None,
                        origin: datetime | None = None) -> tuple[State, dict[str, WorkloadState]]:
    """The engine's working state. Times become seconds since ``origin`` (default: the snapshot's
    time); a loop that keeps facts across rounds passes the same origin every round."""
    origin = origin or snapshot.taken_at
    nodes = _node_states(snapshot)
    if quotas is None:
        quotas = Quotas(QuotaSpec(t.name, t.guaranteed_gpus, t.burst_limit_gpus, weight=t.weight) for t in snapshot.teams)
    state = State(nodes, quotas)
    index = {(n.name, uuid): i for n in nodes for i, uuid in enumerate(n.gpu_ids)}
    instance_profile = {(g.uuid, i.gpu_instance_id): i.profile for g in snapshot.gpus for i in g.mig_instances}
    whole_amount_of_fraction = None if shares_gpus(snapshot) else MILLI  # an unshared GPU is held whole
    # With no tolerations anywhere, a tainted node is closed to everyone: one flag, no per-job sets.
    tolerating = any(ws.workload.tolerations for ws in snapshot.workloads)
    for node in nodes:
        if not tolerating and any(taint_blocks(t, ()) for t in snapshot.taints.get(node.name, ())):
            node.schedulable = False
    by_key: dict[str, WorkloadState] = {}
    for ws in snapshot.workloads:
        w = ws.workload
        if w.gpus.mig_profile:
            check_profile(w.gpus.mig_profile)
        job = Job(
            name=w.key, team=w.team, priority=_priority_of(ws).rank, pods=w.gang_size,
            gpus_per_pod=w.gpus.count, milli=w.gpus.fraction_milli, mig_profile=w.gpus.mig_profile,
            gpu_model=w.gpus.gpu_model, kind=w.kind, checkpointable=w.checkpointable,
            submitted=(ws.submitted_at - origin).total_seconds(), progress=ws.progress_seconds,
            duration=ws.duration_seconds, pools=w.pools, attained=ws.attained_gpu_seconds,
        )
        if tolerating:
            job.avoid_nodes = _blocked_nodes(snapshot, w)
        job.preempted_at = [-1.0] * ws.preemptions
        if ws.started_at is not None:
            job.started = (ws.started_at - origin).total_seconds()  # the latest (re)start
        by_key[job.name] = ws
        if ws.phase == WorkloadPhase.RUNNING:
            placements: list[Slot] = []
            for p in ws.placements:
                g = index.get((p.node, p.gpu_uuid))
                if g is None:
                    continue
                if p.mig_instance_id is not None:
                    placements.append((p.node, g, instance_profile.get((p.gpu_uuid, p.mig_instance_id))
                                       or job.mig_profile or MILLI))
                else:
                    placements.append((p.node, g, job.milli if job.whole else whole_amount_of_fraction or job.milli))
            state.add_running(job, placements)
            if job.started is None:
                job.started = 0.0
        elif ws.phase in (WorkloadPhase.PENDING, WorkloadPhase.SUSPENDED):
            job.state = JobState.SUSPENDED if ws.phase == WorkloadPhase.SUSPENDED else JobState.PENDING
            if ws.phase == WorkloadPhase.SUSPENDED and job.started is None:
                job.started = 0.0  # it ran before: a start is a RESUME
            state.jobs[job.name] = job
    _hold_unhealthy(snapshot, state)
    return state, by_key


def _priority_of(ws: WorkloadState) -> PriorityClass:
    """The class it runs at now: a set-priority override that names a class, else its own."""
    override = ws.priority_override
    if override in PRIORITY_NAMES:
        return PriorityClass(override)
    return ws.workload.priority_class


def actions_for(decisions: Iterable[Decision], state: State, policy_name: str) -> tuple[Action, ...]:
    """Decisions as fleet actions: placements name nodes and GPU UUIDs, suspends carry a grace period."""
    gpu_uuid = {n.name: n.gpu_ids for n in state.nodes.values()}
    actions = []
    for d in decisions:
        params: dict[str, Any] = {}
        if d.placements:
            params["placements"] = tuple(
                {"node": node, "gpu_uuid": gpu_uuid[node][g],
                 **({"mig_profile": amount} if isinstance(amount, str) else {"milli": amount})}
                for node, g, amount in d.placements)
        if d.kind == DecisionKind.SUSPEND:
            params["grace_seconds"] = SUSPEND_GRACE_SECONDS
        actions.append(Action(ACTION_OF[d.kind], d.job, d.reason or f"{d.kind.value} by policy {policy_name}", params))
    return tuple(actions)


def plan(snapshot: ClusterSnapshot, policy: str = "gpuwarden", quotas: Quotas | None = None,
         now: datetime | None = None) -> Schedule:
    state, _ = state_from_snapshot(snapshot, quotas)
    scheduler = Scheduler(policy_for(snapshot, policy))
    t = ((now or snapshot.taken_at) - snapshot.taken_at).total_seconds()
    decisions = scheduler.schedule(state, t)
    return Schedule(actions_for(decisions, state, scheduler.policy.name), tuple(queue_positions(scheduler, state, t)))
