"""One scheduling pass: the queue in policy order, quota admission, placement, and preemption.

Decisions are made on a working copy of the cluster (``State``) through a ``Statement`` (checkpoint
/ rollback). The scheduler returns ``Decision`` objects and never touches a cluster: ``planner.plan``
turns them into fleet actions for the actuator, the simulator carries them out through
``SimCluster``, and the replays drive the same pass over traces. Who a blocked job may preempt, and
the service levels it compares, are :mod:`.victims` (``VictimSearch``, which ``Scheduler`` inherits).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypedDict

from .placement import allowed_key, find_placement, node_allowed
from .policy import QueuePolicy, policy_named
from .queue_orders import SortKey
from .quotas import Admission
from .state import MILLI, WAITING, Job, JobState, NodeState, Slot, State, Statement
from .victims import VictimSearch


class DecisionKind(StrEnum):
    BIND = "bind"  # first start
    RESUME = "resume"  # start again after a suspend or a preemption
    SUSPEND = "suspend"  # checkpoint, then pause; keeps progress
    PREEMPT = "preempt"  # not checkpointable: stopped and requeued, restarts from scratch


STARTS = (DecisionKind.BIND, DecisionKind.RESUME)
# A job waiting for room; the figures (per resource kind, on the nodes it may use) are worked out when
# the queue is read (``queue_positions``), not for every blocked job of every pass.
CAPACITY = "capacity"


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    job: str
    placements: tuple[Slot, ...] = ()  # a start's: where it goes
    reason: str = ""
    beneficiary: str = ""  # a stop's: the job it makes room for (what the plan verifier reads)


class QueueEntry(TypedDict):
    position: int
    job: str
    team: str
    priority: int
    state: str
    waiting_seconds: float
    reason: str


class Scheduler(VictimSearch):
    """One scheduling pass over a ``State``: returns decisions and leaves the state updated."""

    max_preemption_attempts = 8  # blocked jobs per pass that may look for victims

    def __init__(self, policy: QueuePolicy | str = "gpuwarden") -> None:
        super().__init__(policy_named(policy) if isinstance(policy, str) else policy)
        self._state: State | None = None

    # -- ordering: the policy's queue order (``queue_orders``) --------------------------------------
    def sort_key(self, job: Job, now: float) -> SortKey:
        return self.queue_order.sort_key(job, now, None if self._state is None else self._state.quotas)

    def queue(self, state: State, now: float) -> list[Job]:
        self._state = state
        waiting = [j for j in state.jobs.values() if j.state in WAITING]
        return sorted(waiting, key=lambda j: self.sort_key(j, now))

    # -- one pass -----------------------------------------------------------------------------
    def schedule(self, state: State, now: float) -> list[Decision]:
        policy = self.policy
        self._begin_pass(state)
        decisions: list[Decision] = []
        statement = Statement(state)
        blocked_head = False
        free_whole = state.free_whole()
        attempts = 0
        # whole GPUs of the largest node (a MIG-partitioned GPU is no whole GPU)
        biggest = max((n.mig_layout.count(None) for n in state.nodes.values() if n.schedulable), default=0)
        may_preempt = self.victim_choice.preempts or policy.reclaim
        admit = self.admission_check
        # A whole-GPU shape that found no room cannot fit later in the pass either until an eviction
        # frees some: free capacity only shrinks otherwise (its reason keeps the free count it saw).
        failed_shapes: dict[tuple[object, ...], str] = {}
        for job in self.queue(state, now):
            whole = job.whole
            need = job.pods * job.gpus_per_pod
            if whole and job.gpus_per_pod > biggest:
                job.wait_reason = (f"unplaceable: asks for {job.gpus_per_pod} whole GPUs per pod; the largest "
                                   f"schedulable node offers {biggest}")
                continue
            if whole and need > free_whole and (attempts >= self.max_preemption_attempts or not may_preempt):
                job.wait_reason = job.wait_reason or CAPACITY  # the figures, for the nodes it may use: when read
                blocked_head = True
                continue
            if blocked_head and not policy.backfill:
                job.wait_reason = "fifo: waiting behind the head of the queue"
                continue
            verdict, reason = admit(state.quotas, job)
            if verdict == Admission.NO:
                job.wait_reason = reason
                continue
            shape = (job.pods, job.gpus_per_pod, job.cpu_milli, job.mem_bytes, *allowed_key(job))  # what placing it reads
            if whole and not may_preempt and shape in failed_shapes:
                job.wait_reason = failed_shapes[shape]
                blocked_head = True
                continue
            mark = statement.checkpoint()
            placements: list[Slot] | None
            if whole and shape in failed_shapes:  # no eviction since this shape found no room
                placements, reason = None, failed_shapes[shape]
            elif not whole or need <= free_whole:
                placements, reason = self._place(state, job, shape)
            else:
                placements, reason = None, CAPACITY
            victims: list[Job] = []
            if placements is None:
                if whole:
                    failed_shapes[shape] = reason
                attempts += 1
                victims, placements, why = self._preempt_for(state, statement, job, verdict, now)
                if placements is None:
                    statement.rollback(mark)
                    job.wait_reason = reason if not why else f"{reason}; {why}"
                    blocked_head = True
                    continue
            if victims:
                failed_shapes.clear()  # evictions free room a failed shape may now fit in
            for victim in victims:
                decisions.append(self._evict(victim, now, f"preempted for {job.name}", job.name))
            before = state.free_whole(touched := {name for name, _, _ in placements})  # not O(nodes) per job
            statement.allocate(job, placements)
            free_whole = state.free_whole() if victims else free_whole - before + state.free_whole(touched)
            decisions.append(self._started(job, placements, now))
        if policy.defragment:
            decisions.extend(self._defragment(state, statement, now))
        return decisions

    def _started(self, job: Job, placements: list[Slot], now: float, reason: str = "") -> Decision:
        """The decision that starts ``job`` (already allocated): BIND the first time, else RESUME."""
        self._ran(job, now)
        kind = DecisionKind.RESUME if job.started is not None or job.progress > 0 else DecisionKind.BIND
        job.started = now
        if job.first_started is None:
            job.first_started = now
        job.wait_reason = ""
        return Decision(kind, job.name, tuple(placements), reason)

    # -- defragmentation ----------------------------------------------------------------------
    def _defragment(self, state: State, statement: Statement, now: float) -> list[Decision]:
        """Start single-pod whole-GPU jobs that wait only because the free GPUs are scattered: on the
        node needing the fewest GPUs moved, checkpointable single-node jobs of no higher priority
        (smallest first) are suspended and resumed elsewhere in this pass, the waiting job takes the
        gathered GPUs. All of a move or none of it: when a moved job finds no place, it rolls back.
        Decisions: SUSPEND of each moved job, the waiting job's start, then each moved job's RESUME."""
        decisions: list[Decision] = []
        for job in self.queue(state, now):
            if not job.whole or job.pods != 1 or self.admission_check(state.quotas, job)[0] == Admission.NO:
                continue
            need = job.gpus_per_pod
            allowed = [node for node in state.nodes.values() if node_allowed(job, node) and node.gpu_count >= need]
            if sum(node.whole_free() for node in allowed) < need:
                continue  # not scattered: there are not enough free GPUs at all
            crowded = [node for node in allowed if node.whole_free() < need]
            for node in sorted(crowded, key=lambda n: (need - n.whole_free(), n.name)):
                moves = self._move_for(state, statement, job, node, now)
                if moves is None:
                    continue
                placements, moved = moves
                decisions.extend(Decision(DecisionKind.SUSPEND, m.name, (), f"moved to make room for {job.name} "
                                          "(checkpoint, then resume on other GPUs)", job.name) for m, _ in moved)
                decisions.append(self._started(job, placements, now))
                decisions.extend(self._started(mover, slots, now, f"moved for {job.name}") for mover, slots in moved)
                break
        return decisions

    def _move_for(self, state: State, statement: Statement, job: Job, node: NodeState,
                  now: float) -> tuple[list[Slot], list[tuple[Job, list[Slot]]]] | None:
        """Clear room for ``job`` on ``node`` by moving jobs elsewhere; None (nothing changed) if it cannot."""
        need = job.gpus_per_pod
        movable = sorted((j for j in state.jobs.values()
                          if j.state == JobState.RUNNING and j.whole and j.checkpointable and j.priority <= job.priority
                          and j.protected_until <= now and j.placements and j.started != now  # not moved twice a pass
                          and now - (j.started if j.started is not None else now) >= self.policy.min_run_seconds
                          and all(slot[0] == node.name for slot in j.placements) and len(j.placements) < need),
                         key=lambda j: (len(j.placements), j.name))
        mark = statement.checkpoint()
        evicted: list[Job] = []
        for mover in movable:
            if node.whole_free() >= need:
                break
            statement.evict(mover)
            evicted.append(mover)
        if node.whole_free() < need or not evicted:
            statement.rollback(mark)
            return None
        placements, _ = find_placement(state, job, self.policy.placement)
        if placements is None:
            statement.rollback(mark)
            return None
        statement.allocate(job, placements)
        moved: list[tuple[Job, list[Slot]]] = []
        for mover in evicted:
            slots, _ = find_placement(state, mover, self.policy.placement)
            if slots is None:
                statement.rollback(mark)
                return None
            statement.allocate(mover, slots)
            moved.append((mover, slots))
        return placements, moved

    def _evict(self, victim: Job, now: float, reason: str, beneficiary: str = "") -> Decision:
        victim.preempted_at.append(now)
        recent = [t for t in victim.preempted_at if now - t <= self.policy.protect_window]
        if len(recent) >= self.policy.protect_after:
            victim.protected_until = now + self.policy.protect_for
        if self.policy.checkpoint and victim.checkpointable:
            victim.state = JobState.SUSPENDED
            return Decision(DecisionKind.SUSPEND, victim.name, (),
                            reason + " (checkpoint, then pause; resumes when capacity returns)", beneficiary)
        victim.state = JobState.PENDING  # the caller rolls progress back to the last periodic checkpoint
        if not victim.recreated:
            return Decision(DecisionKind.PREEMPT, victim.name, (), reason + " (a bare pod: nothing makes it again, "
                            "so it was taken only as the last resort, when no other work could make room)",
                            beneficiary)
        return Decision(DecisionKind.PREEMPT, victim.name, (), reason + " (not checkpointable: restarts from scratch)",
                        beneficiary)


def queue_positions(scheduler: Scheduler, state: State, now: float) -> list[QueueEntry]:
    """Where each waiting job stands and why it waits."""
    free: dict[tuple[object, ...], tuple[int, int]] = {}  # what is free of a kind on a set of nodes, worked out once
    return [
        QueueEntry(position=i + 1, job=j.name, team=j.team, priority=j.priority, state=j.state.value,
                   waiting_seconds=now - j.submitted, reason=_said(scheduler, state, j, free))
        for i, j in enumerate(scheduler.queue(state, now))
    ]


def _said(scheduler: Scheduler, state: State, job: Job, free: dict[tuple[object, ...], tuple[int, int]]) -> str:
    reason = job.wait_reason or "not yet considered"
    if not reason.startswith(CAPACITY):
        return reason
    key = (*allowed_key(job), job.mig_profile, job.milli)
    if key not in free:
        nodes = scheduler._allowed_nodes(state, job)
        free[key] = (free_of_kind(job, nodes), len(nodes))
    return capacity_figures(job, *free[key]) + reason[len(CAPACITY):]


def free_of_kind(job: Job, nodes: list[NodeState]) -> int:
    """What is free of ``job``'s resource kind on ``nodes``, from their allocatable: whole GPUs
    (MIG-partitioned and time-sliced GPUs are not), instances of its MIG profile, or shares of its size."""
    if job.mig_profile:
        return sum(max(0, layout.count(job.mig_profile) - node.mig_used[g].count(job.mig_profile))
                   for node in nodes for g, layout in enumerate(node.mig_layout) if layout)
    if job.milli < MILLI:
        return sum(f // job.milli for node in nodes for g, f in enumerate(node.gpu_free) if node.mig_layout[g] is None)
    return sum(node.whole_free() for node in nodes)


def capacity_figures(job: Job, free: int, nodes: int) -> str:
    """What ``job`` needs beside what is free of that kind (:func:`free_of_kind`) on the ``nodes`` it may use."""
    if job.mig_profile:
        needs = f"{job.pods} x {job.mig_profile}"
    elif job.milli < MILLI:
        needs = f"{job.pods} share(s) of {job.milli} milli-GPU"
    else:
        needs = f"{job.pods * job.gpus_per_pod} whole GPUs"
    return f"capacity: needs {needs}; {free} free on the {nodes} node(s) it may use"
