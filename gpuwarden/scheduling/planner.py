"""Schedule on a ``ClusterSnapshot``: what the actuator calls. Pure: the snapshot is never changed.

``plan(snapshot, policy="gpuwarden", quotas=None, now=None) -> Schedule`` builds the engine's working
state from the snapshot (nodes minus cordoned ones and unhealthy GPUs, MIG layouts, running
workloads' placements), runs one scheduling pass and returns fleet ``Action``s (BIND, RESUME,
SUSPEND, PREEMPT) plus the queue with each waiting workload's position and reason.

A ``Schedule`` is the scheduler's proposal in the fleet's action vocabulary; the actuator's
``Plan`` (the one plan that is applied) takes these actions in as findings of kind ``scheduling``.
``actions_for`` is the one translation of decisions into actions: the simulator applies the same
actions through ``SimCluster``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from collections.abc import Iterable

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, Gpu, WorkloadPhase, WorkloadState

from .mig import check_profile
from .quotas import Quotas, QuotaSpec
from .scheduler import Decision, DecisionKind, QueueEntry, Scheduler, queue_positions
from .state import MILLI, Job, JobState, NodeState, Slot, State

ACTION_OF = {DecisionKind.BIND: ActionKind.BIND, DecisionKind.RESUME: ActionKind.RESUME,
             DecisionKind.SUSPEND: ActionKind.SUSPEND, DecisionKind.PREEMPT: ActionKind.PREEMPT}
SUSPEND_GRACE_SECONDS = 120  # a checkpointable workload's time to save before it stops


@dataclass(frozen=True)
class Schedule:
    actions: tuple[Action, ...]
    queue: tuple[QueueEntry, ...]

    def reason(self, workload: str) -> str | None:
        for entry in self.queue:
            if entry["job"] == workload:
                return entry["reason"]
        return None


def state_from_snapshot(snapshot: ClusterSnapshot,
                        quotas: Quotas | None = None) -> tuple[State, dict[str, WorkloadState]]:
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
    if quotas is None:
        quotas = Quotas(QuotaSpec(t.name, t.guaranteed_gpus, t.burst_limit_gpus, weight=t.weight) for t in snapshot.teams)
    state = State(nodes, quotas)
    index = {(n.name, uuid): i for n in nodes for i, uuid in enumerate(n.gpu_ids)}
    origin = snapshot.taken_at
    rank = {member: member.rank for member in type(snapshot.workloads[0].workload.priority_class)} if snapshot.workloads else {}
    by_key: dict[str, WorkloadState] = {}
    for ws in snapshot.workloads:
        w = ws.workload
        if w.gpus.mig_profile:
            check_profile(w.gpus.mig_profile)
        job = Job(
            name=w.key, team=w.team, priority=rank[w.priority_class], pods=w.gang_size,
            gpus_per_pod=w.gpus.count, milli=w.gpus.fraction_milli, mig_profile=w.gpus.mig_profile,
            gpu_model=w.gpus.gpu_model, kind=w.kind, checkpointable=w.checkpointable,
            submitted=(ws.submitted_at - origin).total_seconds(), progress=ws.progress_seconds,
        )
        job.preempted_at = [-1.0] * ws.preemptions
        by_key[job.name] = ws
        if ws.phase == WorkloadPhase.RUNNING:
            placements: list[Slot] = []
            for p in ws.placements:
                g = index.get((p.node, p.gpu_uuid))
                if g is None:
                    continue
                if p.mig_instance_id is not None and job.mig_profile:
                    placements.append((p.node, g, job.mig_profile))
                else:
                    placements.append((p.node, g, job.milli))
            state.add_running(job, placements)
            job.started = ((ws.started_at or origin) - origin).total_seconds()
        elif ws.phase in (WorkloadPhase.PENDING, WorkloadPhase.SUSPENDED):
            job.state = JobState.SUSPENDED if ws.phase == WorkloadPhase.SUSPENDED else JobState.PENDING
            if ws.phase == WorkloadPhase.SUSPENDED:
                job.started = 0.0
            state.jobs[job.name] = job
    return state, by_key


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
    scheduler = Scheduler(policy)
    t = ((now or snapshot.taken_at) - snapshot.taken_at).total_seconds()
    decisions = scheduler.schedule(state, t)
    return Schedule(actions_for(decisions, state, scheduler.policy.name), tuple(queue_positions(scheduler, state, t)))
