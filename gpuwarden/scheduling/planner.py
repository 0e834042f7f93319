"""Plan on a ``ClusterSnapshot``: what the actuator calls. Pure: the snapshot is never changed.

``plan(snapshot, policy="gpuwarden", quotas=None, now=None) -> Plan`` builds the engine's working
state from the snapshot (nodes minus cordoned ones and unhealthy GPUs, MIG layouts, running
workloads' placements), runs one scheduling pass and returns fleet ``Action``s (BIND, RESUME,
SUSPEND, PREEMPT) plus the queue with each waiting workload's position and reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, WorkloadPhase

from .engine import MILLI, Job, NodeState, QuotaSpec, Quotas, Scheduler, State, queue_positions
from .mig import check_profile


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    queue: tuple[dict, ...]  # position, job, team, priority, state, waiting_seconds, reason

    def reason(self, workload: str) -> str | None:
        for entry in self.queue:
            if entry["job"] == workload:
                return entry["reason"]
        return None


def _key(state) -> str:
    return f"{state.workload.namespace}/{state.workload.name}"


def state_from_snapshot(snapshot: ClusterSnapshot, quotas: Quotas | None = None) -> tuple[State, dict]:
    gpus_by_node: dict[str, list] = {}
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
            gpu_free=free, mig_layout=layout, gpu_ids=[g.uuid for g in gpus],
        ))
    if quotas is None:
        quotas = Quotas(QuotaSpec(t.name, t.guaranteed_gpus, t.burst_limit_gpus, weight=t.weight) for t in snapshot.teams)
    state = State(nodes, quotas)
    index = {(n.name, uuid): i for n in nodes for i, uuid in enumerate(n.gpu_ids)}
    origin = snapshot.taken_at
    rank = {member: member.rank for member in type(snapshot.workloads[0].workload.priority_class)} if snapshot.workloads else {}
    by_key = {}
    for ws in snapshot.workloads:
        w = ws.workload
        if w.gpus.mig_profile:
            check_profile(w.gpus.mig_profile)
        job = Job(
            name=_key(ws), team=w.team, priority=rank[w.priority_class], pods=w.gang_size,
            gpus_per_pod=w.gpus.count, milli=w.gpus.fraction_milli, mig_profile=w.gpus.mig_profile,
            gpu_model=w.gpus.gpu_model, kind=w.kind, checkpointable=w.checkpointable,
            submitted=(ws.submitted_at - origin).total_seconds(), progress=ws.progress_seconds,
        )
        job.preempted_at = [-1.0] * ws.preemptions
        by_key[job.name] = ws
        if ws.phase == WorkloadPhase.RUNNING:
            placements = []
            for p in ws.placements:
                g = index.get((p.node, p.gpu_uuid))
                if g is None:
                    continue
                if p.mig_instance_id is not None and job.mig_profile:
                    placements.append((p.node, g, job.mig_profile))
                else:
                    placements.append((p.node, g, job.milli))
            state.jobs[job.name] = job
            state._occupy(job, placements)
            job.placements, job.state = placements, "running"
            job.started = ((ws.started_at or origin) - origin).total_seconds()
        elif ws.phase in (WorkloadPhase.PENDING, WorkloadPhase.SUSPENDED):
            job.state = "suspended" if ws.phase == WorkloadPhase.SUSPENDED else "pending"
            if ws.phase == WorkloadPhase.SUSPENDED:
                job.started = 0.0
            state.jobs[job.name] = job
    return state, by_key


def plan(snapshot: ClusterSnapshot, policy: str = "gpuwarden", quotas: Quotas | None = None,
         now: datetime | None = None) -> Plan:
    state, _ = state_from_snapshot(snapshot, quotas)
    scheduler = Scheduler(policy)
    t = ((now or snapshot.taken_at) - snapshot.taken_at).total_seconds()
    decisions = scheduler.schedule(state, t)
    gpu_uuid = {n.name: n.gpu_ids for n in state.nodes.values()}
    kinds = {"bind": ActionKind.BIND, "resume": ActionKind.RESUME, "suspend": ActionKind.SUSPEND,
             "preempt": ActionKind.PREEMPT}
    actions = []
    for d in decisions:
        params = {}
        if d.placements:
            params["placements"] = tuple(
                {"node": node, "gpu_uuid": gpu_uuid[node][g], **({"mig_profile": a} if isinstance(a, str) else {"milli": a})}
                for node, g, a in d.placements)
        if d.kind == "suspend":
            params["grace_seconds"] = 120
        actions.append(Action(kinds[d.kind], d.job, d.reason or f"{d.kind} by policy {scheduler.policy.name}", params))
    return Plan(tuple(actions), tuple(queue_positions(scheduler, state, t)))
