"""One scheduling pass: the queue in policy order, quota admission, placement, and preemption.

Decisions are made on a working copy of the cluster (``State``) through a ``Statement`` (checkpoint
/ rollback). The scheduler returns ``Decision`` objects and never touches a cluster: ``planner.plan``
turns them into fleet actions for the actuator, the simulator carries them out through
``SimCluster``, and the replays drive the same pass over traces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypedDict

from .placement import find_placement, node_allowed
from .policy import PreemptMode, QueueOrder, QueuePolicy, policy_named
from .quotas import Admission
from .state import MILLI, WAITING, Job, JobState, NodeState, Slot, State, Statement


class DecisionKind(StrEnum):
    BIND = "bind"  # first start
    RESUME = "resume"  # start again after a suspend or a preemption
    SUSPEND = "suspend"  # checkpoint, then pause; keeps progress
    PREEMPT = "preempt"  # not checkpointable: stopped and requeued, restarts from scratch


STARTS = (DecisionKind.BIND, DecisionKind.RESUME)


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    job: str
    placements: tuple[Slot, ...] = ()
    reason: str = ""


class QueueEntry(TypedDict):
    position: int
    job: str
    team: str
    priority: int
    state: str
    waiting_seconds: float
    reason: str


SortKey = tuple[int, int, int, float, str] | tuple[int, int, float, str]


class Scheduler:
    """One scheduling pass over a ``State``: returns decisions and leaves the state updated."""

    max_preemption_attempts = 8  # blocked jobs per pass that may look for victims

    def __init__(self, policy: QueuePolicy | str = "gpuwarden") -> None:
        self.policy = policy_named(policy) if isinstance(policy, str) else policy
        self._state: State | None = None
        self._service_levels: dict[str, int] = {}
        self._mixed_fleet = True  # MIG GPUs or nodes some jobs may not use: victims need filtering
        # (highest service level, lowest priority) any job running in this pass has had: None until
        # asked for. Bounds, not exact: an eviction does not lower them.
        self._running_bounds: tuple[int, int] | None = None

    # -- ordering ---------------------------------------------------------------------------
    def level(self, job: Job, now: float, aging: bool = True) -> int:
        """Service level (LAS): 0 for jobs that received little service, higher for more.
        Aging lifts waiting jobs in the *order* only; preemption compares levels without aging."""
        if self.policy.order != QueueOrder.LAS:
            return 0
        level = self._service_levels.get(job.name)
        if level is None:  # attained service does not change within a pass
            level = self._service_levels[job.name] = sum(1 for t in self.policy.las_thresholds if job.attained >= t)
        if aging and self.policy.aging_seconds and job.state != JobState.RUNNING:
            level -= int((now - job.submitted) // self.policy.aging_seconds)
        return level

    def sort_key(self, job: Job, now: float) -> SortKey:
        if self.policy.guarantee_first:
            within = self.policy.quotas and self._state is not None and self._state.quotas.within_guarantee(job)
            return (-job.priority, self.level(job, now), -1 if within else 0, job.submitted, job.name)
        return (-job.priority, self.level(job, now), job.submitted, job.name)

    def queue(self, state: State, now: float) -> list[Job]:
        self._state = state
        waiting = [j for j in state.jobs.values() if j.state in WAITING]
        return sorted(waiting, key=lambda j: self.sort_key(j, now))

    # -- one pass -----------------------------------------------------------------------------
    def schedule(self, state: State, now: float) -> list[Decision]:
        policy = self.policy
        self._service_levels = {}
        self._running_bounds = None
        self._mixed_fleet = any(layout is not None for node in state.nodes.values() for layout in node.mig_layout) \
            or len({(node.pool, node.model, node.tier) for node in state.nodes.values()}) > 1
        decisions: list[Decision] = []
        statement = Statement(state)
        blocked_head = False
        free_whole = state.free_whole()
        attempts = 0
        biggest = max((n.gpu_count for n in state.nodes.values() if n.schedulable), default=0)
        may_preempt = policy.preempt != PreemptMode.NONE or policy.reclaim
        # A whole-GPU shape that found no room cannot fit later in the pass either until an eviction
        # frees some: free capacity only shrinks otherwise (its reason keeps the free count it saw).
        failed_shapes: dict[tuple[object, ...], str] = {}
        for job in self.queue(state, now):
            whole = job.whole
            need = job.pods * job.gpus_per_pod
            if whole and job.gpus_per_pod > biggest:
                job.wait_reason = f"unplaceable: asks for {job.gpus_per_pod} GPUs per pod; the largest node has {biggest}"
                continue
            if whole and need > free_whole and (attempts >= self.max_preemption_attempts or not may_preempt):
                job.wait_reason = job.wait_reason or f"capacity: needs {need} GPUs, {free_whole} free"
                blocked_head = True
                continue
            if blocked_head and not policy.backfill:
                job.wait_reason = "fifo: waiting behind the head of the queue"
                continue
            verdict = Admission.NOMINAL
            if policy.quotas:
                verdict, reason = state.quotas.admit(job)
                if verdict == Admission.NO:
                    job.wait_reason = reason
                    continue
            shape = (job.pods, job.gpus_per_pod, job.gpu_model, job.gpu_models, job.pools, job.avoid_nodes, job.kind,
                     job.checkpointable, job.cpu_milli, job.mem_bytes)
            if whole and not may_preempt and shape in failed_shapes:
                job.wait_reason = failed_shapes[shape]
                blocked_head = True
                continue
            mark = statement.checkpoint()
            placements: list[Slot] | None
            if whole and shape in failed_shapes:  # no eviction since this shape found no room
                placements, reason = None, failed_shapes[shape]
            elif not whole or need <= free_whole:
                placements, reason = find_placement(state, job, policy.placement)
            else:
                placements, reason = None, f"capacity: needs {need} GPUs, {free_whole} free"
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
                decisions.append(self._evict(victim, now, f"preempted for {job.name}"))
            before = state.free_whole(touched := {name for name, _, _ in placements})  # not O(nodes) per job
            statement.allocate(job, placements)
            free_whole = state.free_whole() if victims else free_whole - before + state.free_whole(touched)
            decisions.append(self._started(job, placements, now))
        if policy.defragment:
            decisions.extend(self._defragment(state, statement, now))
        return decisions

    def _started(self, job: Job, placements: list[Slot], now: float, reason: str = "") -> Decision:
        """The decision that starts ``job`` (already allocated): BIND the first time, else RESUME."""
        if self._running_bounds is not None:
            level, priority = self._running_bounds
            self._running_bounds = (max(level, self.level(job, now, aging=False)), min(priority, job.priority))
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
            if not job.whole or job.pods != 1 or (self.policy.quotas and state.quotas.admit(job)[0] == Admission.NO):
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
                                          "(checkpoint, then resume on other GPUs)") for m, _ in moved)
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

    def _evict(self, victim: Job, now: float, reason: str) -> Decision:
        victim.preempted_at.append(now)
        recent = [t for t in victim.preempted_at if now - t <= self.policy.protect_window]
        if len(recent) >= self.policy.protect_after:
            victim.protected_until = now + self.policy.protect_for
        if self.policy.checkpoint and victim.checkpointable:
            victim.state = JobState.SUSPENDED
            return Decision(DecisionKind.SUSPEND, victim.name, (),
                            reason + " (checkpoint, then pause; resumes when capacity returns)")
        victim.state = JobState.PENDING  # the caller rolls progress back to the last periodic checkpoint
        return Decision(DecisionKind.PREEMPT, victim.name, (), reason + " (not checkpointable: restarts from scratch)")

    def _may_have_victims(self, state: State, job: Job, las_floor: int, reclaiming: bool, now: float) -> bool:
        """False when no running job can be a victim of ``job``: none of a lower priority, none at
        ``las_floor`` or above, no other team borrowing (two numbers, not a scan of the running jobs)."""
        if self._running_bounds is None:
            running = [j for j in state.jobs.values() if j.state == JobState.RUNNING]
            self._running_bounds = (max((self.level(j, now, aging=False) for j in running), default=-1),
                                    min((j.priority for j in running), default=job.priority))
        top_level, lowest_priority = self._running_bounds
        return ((self.policy.preempt != PreemptMode.NONE and lowest_priority < job.priority)
                or (self.policy.preempt == PreemptMode.LAS and top_level >= las_floor)
                or (reclaiming and any(team != job.team and state.quotas.borrowed(team, flavour) > 1e-9
                                       for team, flavour in state.quotas.usage)))

    def _candidates(self, state: State, job: Job, verdict: Admission, now: float) -> list[Job]:
        policy = self.policy
        las_mode = policy.preempt == PreemptMode.LAS
        # levels do not change within a pass: the job's once, not once per running job
        las_floor = self.level(job, now, aging=False) + policy.las_gap if las_mode else 0
        reclaiming = policy.reclaim and verdict == Admission.NOMINAL
        if not self._may_have_victims(state, job, las_floor, reclaiming, now):
            return []
        borrowed: dict[tuple[str, str], bool] = {}
        usable = self._usable_victim(state, job) if self._mixed_fleet else None
        out = []
        for victim in state.jobs.values():
            if victim.state != JobState.RUNNING or victim is job or victim.protected_until > now:
                continue
            # hysteresis: a job that (re)started less than min_run_seconds ago is not LAS-demoted
            # (reclaim of a guarantee and higher priority classes still may preempt it)
            young = now - (victim.started if victim.started is not None else now) < policy.min_run_seconds
            lower_priority = victim.priority < job.priority
            reclaim = False
            if reclaiming and victim.team != job.team and victim.priority <= job.priority:
                key = (victim.team, victim.flavour)
                reclaim = borrowed.setdefault(key, state.quotas.borrowed(*key) > 1e-9)
            las = (las_mode and victim.priority == job.priority and not young
                   and self.level(victim, now, aging=False) >= las_floor)
            if las_mode and policy.quotas and las:
                # never push a team below its guarantee to serve another team's borrowing
                if victim.team != job.team and not self._keeps_guarantee(state, victim):
                    las = False
                if verdict == Admission.BORROW and victim.team != job.team and not policy.borrower_las:
                    las = False
            if ((policy.preempt != PreemptMode.NONE and lower_priority) or reclaim or las) \
                    and (usable is None or usable(victim)):
                out.append(victim)

        def cost(v: Job) -> tuple[int, bool, int, float, float]:
            lost = (now - (v.started or now)) if not v.checkpointable else 0.0
            return (v.priority, not v.checkpointable, -self.level(v, now), lost, -(v.started or 0))

        return sorted(out, key=cost)

    @staticmethod
    def _usable_victim(state: State, job: Job) -> Callable[[Job], bool]:
        """Whether evicting a job frees anything ``job`` can take: not on nodes it may never use,
        nor whole-GPU work for a MIG instance, nor MIG work for a whole GPU."""
        allowed = {name for name, node in state.nodes.items() if node_allowed(job, node)}
        wants_mig = job.mig_profile is not None
        any_gpu = job.milli < MILLI and not wants_mig

        def usable(victim: Job) -> bool:
            return any(node in allowed and (any_gpu or isinstance(amount, str) == wants_mig)
                       for node, _, amount in victim.placements)
        return usable

    def _keeps_guarantee(self, state: State, victim: Job) -> bool:
        """Whether evicting ``victim`` leaves its team at or above its guarantee (it only gives back borrowed GPUs)."""
        spec = state.quotas.spec(victim.team, victim.flavour)
        if spec is None:
            return True
        if self.policy.las_keep_guarantee:
            return state.quotas.used(victim.team, victim.flavour) - victim.gpu_equivalents >= spec.guaranteed - 1e-9
        return state.quotas.used(victim.team, victim.flavour) > spec.guaranteed + 1e-9

    def _preempt_for(self, state: State, statement: Statement, job: Job, verdict: Admission,
                     now: float) -> tuple[list[Job], list[Slot] | None, str]:
        policy = self.policy
        if policy.preempt == PreemptMode.NONE and not policy.reclaim:
            return [], None, ""
        candidates = self._candidates(state, job, verdict, now)
        if not candidates:
            return [], None, ""
        need = job.pods * job.gpus_per_pod
        allowed = [node for node in state.nodes.values() if node_allowed(job, node)]

        def free_here() -> int:
            return sum(node.whole_free() for node in allowed)

        if job.whole:
            freeable = free_here() + sum(len(v.placements) for v in candidates)
            if freeable < need:
                return [], None, "not enough preemptible GPUs"
            if not _whole_room_after_evicting(job, candidates, allowed):
                return [], None, "preemption would not free enough room"  # what trying victim by victim finds
        mark = statement.checkpoint()
        victims: list[Job] = []
        for victim in candidates:
            if (policy.quotas and policy.las_keep_guarantee and victim.team != job.team
                    and victim.priority >= job.priority and not (verdict == Admission.NOMINAL and policy.reclaim)
                    and not self._keeps_guarantee(state, victim)):
                continue  # earlier victims already took this team down to its guarantee
            statement.evict(victim)
            victims.append(victim)
            if job.whole and free_here() < need:
                continue  # not enough whole GPUs free yet: no placement can exist
            placements, _ = find_placement(state, job, policy.placement)
            if placements is not None:
                # keep only victims that were needed: try giving back each (latest first)
                for v in reversed(victims[:-1]):
                    m2 = statement.checkpoint()
                    statement.allocate(v, statement.evicted_placements(v))
                    if find_placement(state, job, policy.placement)[0] is None:
                        statement.rollback(m2)
                    else:
                        victims.remove(v)
                placements, _ = find_placement(state, job, policy.placement)
                return victims, placements, ""
        statement.rollback(mark)
        return [], None, "preemption would not free enough room"


def _whole_room_after_evicting(job: Job, candidates: list[Job], allowed: list[NodeState]) -> bool:
    """Whether evicting every candidate would leave whole GPUs for all pods of ``job`` (each pod on one
    node): a necessary condition, checked before the search that evicts and places victim by victim."""
    need = job.gpus_per_pod
    if need <= 0:
        return True
    names = {node.name for node in allowed}
    freed: dict[tuple[str, int], int] = {}
    for victim in candidates:
        for node_name, gpu, amount in victim.placements:
            if node_name in names and not isinstance(amount, str):
                freed[(node_name, gpu)] = freed.get((node_name, gpu), 0) + amount
    pods = 0
    for node in allowed:
        whole = sum(1 for gpu, free in enumerate(node.gpu_free) if free + freed.get((node.name, gpu), 0) >= MILLI)
        pods += whole // need
        if pods >= job.pods:
            return True
    return False


def queue_positions(scheduler: Scheduler, state: State, now: float) -> list[QueueEntry]:
    """Where each waiting job stands and why it waits."""
    return [
        QueueEntry(position=i + 1, job=j.name, team=j.team, priority=j.priority, state=j.state.value,
                   waiting_seconds=now - j.submitted, reason=j.wait_reason or "not yet considered")
        for i, j in enumerate(scheduler.queue(state, now))
    ]
