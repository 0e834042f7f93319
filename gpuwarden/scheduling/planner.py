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
(``gpuwarden.scheduler.scheduling_round``) applies them through any ``Cluster``, ``SimCluster`` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from collections.abc import Iterable, Mapping

from gpuwarden.fleet import (
    Action, ActionKind, ClusterSnapshot, Gpu, Node, Placement, PriorityClass, Workload, WorkloadPhase, WorkloadState,
)
from gpuwarden.fleet.node_selection import selects
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
RANK = {p: p.rank for p in PriorityClass}
PRIORITY_NAMES = {p.value: p for p in PriorityClass}
_RAN = (WorkloadPhase.RUNNING, WorkloadPhase.SUSPENDED)
# members read once: an enum member read off its class costs more than the dict insert it guards (3.11)
_RUNNING, _PENDING, _SUSPENDED = WorkloadPhase.RUNNING, WorkloadPhase.PENDING, WorkloadPhase.SUSPENDED
_JOB_PENDING, _JOB_SUSPENDED = JobState.PENDING, JobState.SUSPENDED
_NO_NODES: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Schedule:
    actions: tuple[Action, ...]
    queue: tuple[QueueEntry, ...]

    def reason(self, workload: str) -> str | None:
        for entry in self.queue:
            if entry["job"] == workload:
                return entry["reason"]
        return None


@dataclass(frozen=True)
class _Layout:
    """What a snapshot's nodes and GPUs say before anything runs: per node its ``NodeState`` fields
    (free milli per GPU, MIG layouts, GPU ids), and where each GPU and MIG instance is."""

    nodes: tuple[tuple[dict[str, Any], tuple[int, ...], tuple[tuple[str, ...] | None, ...], tuple[str, ...]], ...]
    index: dict[tuple[str, str], int]  # (node, GPU uuid) -> GPU index on the node
    instance_profile: dict[tuple[str, int], str]  # (GPU uuid, MIG instance id) -> profile


def _layout_of(nodes: tuple[Node, ...], gpus: tuple[Gpu, ...]) -> _Layout:
    by_node: dict[str, list[Gpu]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    rows = []
    index: dict[tuple[str, str], int] = {}
    for node in nodes:
        on_node = sorted(by_node.get(node.name, []), key=lambda g: g.index)
        index.update(((node.name, g.uuid), i) for i, g in enumerate(on_node))
        fields = dict(name=node.name, model=node.gpu_model, gpu_count=len(on_node), cpu_free=node.cpu_milli,
                      mem_free=node.memory_bytes, tier=node.price_tier, nvlink_domain=node.topology.nvlink_domain,
                      leaf_switch=node.topology.leaf_switch, pool=node.pool, cpu_capacity=node.cpu_milli,
                      mem_capacity=node.memory_bytes)
        rows.append((fields, tuple(0 if g.mig_enabled else MILLI for g in on_node),
                     tuple(tuple(i.profile for i in g.mig_instances) if g.mig_enabled else None for g in on_node),
                     tuple(g.uuid for g in on_node)))
    profiles = {(g.uuid, i.gpu_instance_id): i.profile for g in gpus for i in g.mig_instances}
    return _Layout(tuple(rows), index, profiles)


# The latest snapshot's layout, with the node and GPU tuples it was read from: a cluster that hands
# the same tuples every round (the simulator's never change) has them read once, not every round.
_latest_layout: tuple[tuple[Node, ...], tuple[Gpu, ...], _Layout] | None = None


def _layout(snapshot: ClusterSnapshot) -> _Layout:
    global _latest_layout
    kept = _latest_layout
    if kept is not None and kept[0] is snapshot.nodes and kept[1] is snapshot.gpus:
        return kept[2]
    layout = _layout_of(snapshot.nodes, snapshot.gpus)
    _latest_layout = (snapshot.nodes, snapshot.gpus, layout)
    return layout


def _node_states(snapshot: ClusterSnapshot, layout: _Layout) -> list[NodeState]:
    """Nodes as the engine sees them, before running work is booked: whole GPUs free unless
    unhealthy, MIG GPUs cut into their layouts, cordoned nodes unschedulable."""
    unhealthy, cordoned, overhead = snapshot.unhealthy_gpus, snapshot.cordoned, snapshot.node_overhead
    nodes = []
    for fields, free, mig_layout, uuids in layout.nodes:
        gpu_free = list(free)
        if unhealthy:
            for g, uuid in enumerate(uuids):
                if uuid in unhealthy:
                    gpu_free[g] = 0
        node = NodeState(**fields, schedulable=fields["name"] not in cordoned, gpu_free=gpu_free,
                         mig_layout=list(mig_layout), gpu_ids=list(uuids))
        if overhead and node.name in overhead:  # pods asking no GPU hold this CPU and memory
            cpu, memory = overhead[node.name]
            node.cpu_free, node.mem_free = node.cpu_free - cpu, node.mem_free - memory
        nodes.append(node)
    return nodes


def _hold_unhealthy(snapshot: ClusterSnapshot, state: State) -> None:
    """An unhealthy GPU offers nothing, also where running work was booked on it: no whole GPU
    free, every MIG instance taken."""
    if not snapshot.unhealthy_gpus:
        return
    for node in state.nodes.values():
        for g, uuid in enumerate(node.gpu_ids):
            if uuid in snapshot.unhealthy_gpus:
                layout = node.mig_layout[g]
                if layout is None:
                    node.gpu_free[g] = 0
                else:
                    node.mig_used[g] = list(layout)


def _blocked_nodes(snapshot: ClusterSnapshot, workload: Workload) -> frozenset[str]:
    """Nodes kube-scheduler keeps ``workload`` off: a NoSchedule / NoExecute taint it does not
    tolerate, or labels its node selection does not select."""
    tainted = {node for node, taints in snapshot.taints.items() if any(taint_blocks(t, workload.tolerations) for t in taints)}
    if workload.node_selection:
        tainted.update(n.name for n in snapshot.nodes
                       if not selects(workload.node_selection, snapshot.node_labels.get(n.name, {})))
    return frozenset(tainted)


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


# Jobs a loop kept from its last round, by workload, with the state each was built from.
KnownJobs = Mapping[str, tuple[WorkloadState, Job]]


def _job_of(ws: WorkloadState, key: str, origin: datetime, known: KnownJobs | None, foreign: bool = False,
            protected: bool = False) -> Job:
    """The engine's job for ``ws`` (whose workload's key is ``key``). Where a loop built one last
    round for the very same workload object, that job is refreshed from ``ws`` instead of built
    again (what a pass may have left on it is reset: every field below). ``foreign``: outside the
    scheduler's scope; ``protected``: never a victim (foreign, or of a team whose quota was refused)."""
    w = ws.workload
    kept = known.get(key) if known else None
    if kept is not None and kept[0].workload is w:
        job = kept[1]
    else:
        if w.gpus.mig_profile:
            check_profile(w.gpus.mig_profile)
        job = Job(
            name=key, team=w.team, pods=w.gang_size, gpus_per_pod=w.gpus.count, milli=w.gpus.fraction_milli,
            mig_profile=w.gpus.mig_profile, gpu_model=w.gpus.gpu_model, kind=w.kind, checkpointable=w.checkpointable,
            submitted=(ws.submitted_at - origin).total_seconds(), pools=w.pools,
        )
    job.priority = RANK[_priority_of(ws)]
    job.progress, job.attained, job.duration = ws.progress_seconds, ws.attained_gpu_seconds, ws.duration_seconds
    # an empty list is kept rather than made anew every round (a filled one is replaced: nothing
    # a pass left in it survives)
    if job.placements:
        job.placements = []
    job.avoid_nodes = _NO_NODES
    if ws.preemptions or job.preempted_at:
        job.preempted_at = [-1.0] * ws.preemptions
    job.foreign = foreign
    job.recreated = ws.controller != "Pod"  # a bare pod is lost when evicted
    # nothing resumes a bare pod: it cannot be suspended, whatever it saves
    job.checkpointable = w.checkpointable and job.recreated
    job.cpu_milli, job.mem_bytes = w.cpu_milli, w.memory_bytes
    # a stopping workload is no victim, nor is work outside the scheduler's scope
    job.protected_until = math.inf if ws.stopping or protected else -math.inf
    # the latest (re)start; one that ran before (suspended) starts again as a RESUME
    started = ws.started_at
    job.started = (started - origin).total_seconds() if started is not None else 0.0 if ws.phase in _RAN else None
    return job


def _slots(ws: WorkloadState, job: Job, layout: _Layout, whole_amount_of_fraction: int | None) -> list[Slot]:
    """Where a running workload's pods sit, as the engine books them (pods on GPUs the snapshot does
    not list are left out)."""
    index, instance_profile = layout.index, layout.instance_profile
    # a whole-GPU request books its milli; a fraction books the whole GPU where GPUs are not shared
    amount = job.milli if job.whole else whole_amount_of_fraction or job.milli
    slots: list[Slot] = []
    for p in ws.placements:
        g = index.get((p.node, p.gpu_uuid))
        if g is None:
            continue
        if p.mig_instance_id is not None:
            slots.append((p.node, g, instance_profile.get((p.gpu_uuid, p.mig_instance_id)) or job.mig_profile or MILLI))
        else:
            slots.append((p.node, g, amount))
    return slots


# The latest build's slots, by the placements tuple they were read from (kept with it, so its id
# names it): a cluster that hands a running workload the same tuple every round while its pods stay
# (the simulator does) has them read once. The slots depend on nothing else but the workload's
# request, the layout and whether GPUs are shared: all four are checked, so no entry is ever stale
# (a live cluster's fresh tuples simply miss) and builds on two threads at once only lose hits.
_SlotsKept = dict[int, tuple[tuple[Placement, ...], Workload, _Layout, "int | None", list[Slot]]]
_latest_slots: _SlotsKept = {}


def _set_latest_slots(slots: _SlotsKept) -> None:
    global _latest_slots
    _latest_slots = slots


def state_from_snapshot(snapshot: ClusterSnapshot, quotas: Quotas | None = None, origin: datetime | None = None,
                        known: KnownJobs | None = None) -> tuple[State, dict[str, WorkloadState]]:
    """The engine's working state. Times become seconds since ``origin`` (default: the snapshot's
    time); a loop that keeps facts across rounds passes the same origin every round, and may pass
    the jobs of its last round as ``known`` (building hundreds of jobs anew every round was most of
    a simulated round's cost)."""
    origin = origin or snapshot.taken_at
    layout = _layout(snapshot)
    nodes = _node_states(snapshot, layout)
    if quotas is None:
        quotas = Quotas(QuotaSpec(t.name, t.guaranteed_gpus, t.burst_limit_gpus, weight=t.weight) for t in snapshot.teams)
    state = State(nodes, quotas)
    whole_amount_of_fraction = None if shares_gpus(snapshot) else MILLI  # an unshared GPU is held whole
    # With no tolerations anywhere, a tainted node is closed to everyone: one flag, no per-job sets.
    tolerating = any(ws.workload.tolerations for ws in snapshot.workloads)
    for node in nodes:
        if not tolerating and any(taint_blocks(t, ()) for t in snapshot.taints.get(node.name, ())):
            node.schedulable = False
    by_key: dict[str, WorkloadState] = {}
    jobs, on_node = state.jobs, state.nodes
    kept_slots, used_slots = _latest_slots, {}
    # nodes kept off, by what decides them: workloads share a few selectors and tolerations, and each
    # new pair is checked against every node
    blocked: dict[tuple[object, object], frozenset[str]] = {}
    spared: dict[object, frozenset[str]] = {}
    scoped, refused = snapshot.queue_namespaces is not None, snapshot.refused_teams
    for ws in snapshot.workloads:
        w = ws.workload
        key = w.key
        foreign = scoped and not snapshot.in_queue(w.namespace)
        if foreign and ws.phase != _RUNNING:
            continue  # outside the queue: not the scheduler's to start or resume
        job = _job_of(ws, key, origin, known, foreign, foreign or (bool(refused) and w.team in refused))
        if tolerating or w.node_selection:
            which = (w.node_selection, w.tolerations)
            avoid = blocked.get(which)
            if avoid is None:
                avoid = blocked[which] = _blocked_nodes(snapshot, w)
            job.avoid_nodes = avoid
        if w.spare_nodes:  # the same few selections for many workloads: each matched against the nodes once
            spare = spared.get(w.spare_nodes)
            if spare is None:
                spare = spared[w.spare_nodes] = frozenset(
                    n.name for n in snapshot.nodes if selects(w.spare_nodes, snapshot.node_labels.get(n.name, {})))
            job.spare_nodes = spare
        by_key[key] = ws
        phase = ws.phase
        if phase == _RUNNING:
            given = ws.placements
            kept = kept_slots.get(id(given))
            if kept is not None and kept[0] is given and kept[1] is w and kept[2] is layout \
                    and kept[3] == whole_amount_of_fraction:
                placements = list(kept[4])
            else:
                placements = _slots(ws, job, layout, whole_amount_of_fraction)
                kept = (given, w, layout, whole_amount_of_fraction, list(placements))
            used_slots[id(given)] = kept
            for node_name, g, amount in placements:  # booked here: the nodes start from their free capacity
                if isinstance(amount, str):
                    on_node[node_name].mig_used[g].append(amount)
                else:
                    on_node[node_name].gpu_free[g] -= amount
            if (job.cpu_milli or job.mem_bytes) and placements:
                _book_host(on_node, job, placements)
            state.add_placed(job, placements)
        elif phase == _PENDING:
            job.state = _JOB_PENDING
            jobs[key] = job
        elif phase == _SUSPENDED:
            job.state = _JOB_SUSPENDED
            jobs[key] = job
    _set_latest_slots(used_slots)
    _hold_unhealthy(snapshot, state)
    return state, by_key


def _book_host(nodes: Mapping[str, NodeState], job: Job, placements: list[Slot]) -> None:
    """The CPU and memory of a running job's pods on their nodes: a node's share of its slots is its
    share of the pods (a pod's GPUs are on one node)."""
    per_node: dict[str, int] = {}
    for node_name, _, _ in placements:
        per_node[node_name] = per_node.get(node_name, 0) + 1
    for node_name, slots in per_node.items():
        pods = job.pods * slots / len(placements)
        node = nodes[node_name]
        node.cpu_free -= int(job.cpu_milli * pods)
        node.mem_free -= int(job.mem_bytes * pods)


def _priority_of(ws: WorkloadState) -> PriorityClass:
    """The class it runs at now: a set-priority override that names a class, else its own."""
    override = ws.priority_override
    return PRIORITY_NAMES.get(override, ws.workload.priority_class) if override else ws.workload.priority_class


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
        if d.beneficiary:
            params["for"] = d.beneficiary  # the start it makes room for (the plan verifier reads it)
        actions.append(Action(ACTION_OF[d.kind], d.job, d.reason or f"{d.kind.value} by policy {policy_name}", params))
    return tuple(actions)


def plan(snapshot: ClusterSnapshot, policy: str = "gpuwarden", quotas: Quotas | None = None,
         now: datetime | None = None) -> Schedule:
    state, _ = state_from_snapshot(snapshot, quotas)
    scheduler = Scheduler(policy_for(snapshot, policy))
    t = ((now or snapshot.taken_at) - snapshot.taken_at).total_seconds()
    decisions = scheduler.schedule(state, t)
    return Schedule(actions_for(decisions, state, scheduler.policy.name), tuple(queue_positions(scheduler, state, t)))
