"""The victim search of a scheduling pass: which running jobs a blocked job may preempt, and the
fewest of them that make room. ``Scheduler`` inherits it; it reads the pass's policy and the per-pass
facts kept here (service levels, the running jobs), which are what make a pass over a busy fleet fast.

Speed without changing a decision (pinned by tests/scheduling/test_whatif_pinned.py): the running jobs are
listed once a pass, and a start adds its job, instead of scanning every job, waiting ones included,
for each blocked job; candidates are sorted by cost, then by their order in ``state.jobs`` (what a
stable sort of that order gave); a search that failed fails again for a job asking the same until a
start changes the state (a failed search evicts nothing: it rolls back); a service level is a
bisection of the sorted level edges; the highest running level is the level of the running job with
the most attained service (levels only grow with it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from operator import attrgetter

import numpy as np

from .placement import allowed_key, find_placement, node_allowed
from .admission_checks import ADMISSION_CHECKS
from .policy import QueuePolicy
from .queue_orders import QUEUE_ORDERS
from .quotas import Admission
from .state import MILLI, Job, JobState, NodeState, Slot, State, Statement
from .victim_choices import VICTIM_CHOICES

_ATTAINED, _PRIORITY = attrgetter("attained"), attrgetter("priority")
# why a borrowing job found no victim: the running work of other teams is within their guarantees
GUARANTEES_KEPT = ("borrowing: the other teams' running work is within their guarantees, which borrowing never "
                   "takes; it starts when GPUs are free")


class VictimSearch:
    """Service levels and the victim search, with the facts they keep for one pass."""

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        # the policy's parts, looked up once by the names it gives (``parts``)
        self.queue_order = QUEUE_ORDERS[policy.order](policy)
        self.victim_choice = VICTIM_CHOICES[policy.preempt](policy)
        self.admission_check = ADMISSION_CHECKS[policy.admission_check]
        self._mixed_fleet = True  # MIG GPUs or nodes some jobs may not use: victims need filtering
        # (highest service level, lowest priority) any job running in this pass has had: None until
        # asked for. Bounds, not exact: an eviction does not lower them.
        self._running_bounds: tuple[int, int] | None = None
        # RUNNING when listed in this pass, and every job started since (callers check the state)
        self._running_jobs: dict[str, Job] | None = None
        self._near: dict[tuple[str, ...], tuple[frozenset[str], dict[str, Job]]] = {}  # on any of these nodes
        self._rank: dict[str, int] | None = None  # a job's place in state.jobs, for this pass
        self._found: dict[tuple[object, ...], list[Job]] = {}  # candidates by what they depend on, until a start
        self._failed: dict[tuple[object, ...], str] = {}  # why a search failed, by what it depends on, until a start
        self._guarded: set[tuple[object, ...]] = set()  # candidate keys that left out victims to keep a guarantee
        # the nodes a request may ever use (their names, their rows in state.arrays), by what node_allowed
        # reads of it: a State's nodes stay as they are while one scheduler schedules them (the replays;
        # the live round builds a scheduler per round)
        self._allowed: dict[tuple[object, ...], tuple[list[NodeState], tuple[str, ...], np.ndarray]] = {}
        self._allowed_in: State | None = None
        # whole-GPU requests that found no room: (versions of the nodes they may use, why), across passes
        self._no_room: dict[tuple[object, ...], tuple[bytes, str]] = {}
        # jobs started in this pass: never its victims (admitted and evicted in one round, a bare pod is lost)
        self._started_in_pass: set[str] = set()

    def _begin_pass(self, state: State) -> None:
        self._started_in_pass = set()
        self._running_bounds = None
        self._running_jobs, self._near, self._rank = None, {}, None
        self._found, self._failed, self._guarded = {}, {}, set()
        if state is not self._allowed_in:
            self._allowed, self._allowed_in, self._no_room = {}, state, {}
        self._mixed_fleet = any(layout is not None for node in state.nodes.values() for layout in node.mig_layout) \
            or len({(node.pool, node.model, node.tier) for node in state.nodes.values()}) > 1

    def _running(self, state: State) -> Collection[Job]:
        """Jobs running now, in no set order (a superset once some are evicted: callers check the
        state). A start in the pass must call :meth:`_ran` so that its job is listed."""
        if self._running_jobs is None:
            running = JobState.RUNNING
            self._running_jobs = {j.name: j for j in state.jobs.values() if j.state == running}
        return self._running_jobs.values()

    def _running_on(self, state: State, names: tuple[str, ...]) -> Collection[Job]:
        """The running jobs with a pod on one of the nodes ``names``, in no set order; a job moved off
        them in this pass may still be listed (the caller checks where a victim runs, and its state)."""
        near = self._near.get(names)
        if near is None:
            wanted, jobs = frozenset(names), {}
            for job in self._running(state):
                for name, _, _ in job.placements:
                    if name in wanted:
                        jobs[job.name] = job
                        break
            near = self._near[names] = (wanted, jobs)
        return near[1].values()

    def _list_on_nodes(self, job: Job) -> None:
        """Add ``job`` to the running jobs of each node set asked for that it has a pod on."""
        nodes = {name for name, _, _ in job.placements}
        for names, jobs in self._near.values():
            if not names.isdisjoint(nodes):
                jobs[job.name] = job

    def _in_state_order(self, state: State) -> dict[str, int]:
        """Each job's place in ``state.jobs`` (jobs are not added to a state within a pass)."""
        if self._rank is None:
            self._rank = {name: i for i, name in enumerate(state.jobs)}
        return self._rank

    def _allowed_nodes(self, state: State, job: Job) -> list[NodeState]:
        """Nodes ``job`` may ever use (the victim filter and the room check of one search share them)."""
        return self._allowed_for(state, job)[0]

    def _allowed_for(self, state: State, job: Job) -> tuple[list[NodeState], tuple[str, ...], np.ndarray]:
        """(the nodes ``job`` may ever use, their names, their rows in ``state.arrays``)."""
        request = allowed_key(job)
        known = self._allowed.get(request)
        if known is None:
            nodes = [node for node in state.nodes.values() if node_allowed(job, node)]
            rows = np.array([state.arrays.index[node.name] for node in nodes], np.intp)
            known = self._allowed[request] = (nodes, tuple(node.name for node in nodes), rows)
        return known

    def _place(self, state: State, job: Job, request: tuple[object, ...]) -> tuple[list[Slot] | None, str]:
        """:func:`find_placement`. A whole-GPU ``request`` (what placement reads of a job) that found no
        room finds none again, for the same reason, while no node it may use has changed: placement
        reads only those nodes, and every booking on a node raises its ``state.arrays.version``."""
        if not job.whole:
            return find_placement(state, job, self.policy.placement)
        stamp = state.arrays.version[self._allowed_for(state, job)[2]].tobytes()
        known = self._no_room.get(request)
        if known is not None and known[0] == stamp:
            return None, known[1]
        placements, reason = find_placement(state, job, self.policy.placement)
        if placements is None:
            self._no_room[request] = (stamp, reason)
        return placements, reason

    def _ran(self, job: Job, now: float) -> None:
        """``job`` started in this pass: list it as running, forget the candidates found and the
        failed searches, raise the bounds."""
        self._found, self._failed = {}, {}
        self._started_in_pass.add(job.name)
        if self._running_jobs is not None:
            self._running_jobs[job.name] = job
            self._list_on_nodes(job)
        if self._running_bounds is not None:
            level, priority = self._running_bounds
            self._running_bounds = (max(level, self.level(job, now, aging=False)), min(priority, job.priority))

    def level(self, job: Job, now: float, aging: bool = True) -> int:
        """Service level in the queue order (LAS: 0 for jobs that received little service, higher for
        more). Aging lifts waiting jobs in the *order* only; preemption compares levels without aging."""
        return self.queue_order.level(job, now, aging)

    def _may_have_victims(self, state: State, job: Job, las_floor: int, reclaiming: bool, now: float) -> bool:
        """False when no running job can be a victim of ``job``: none of a lower priority, none at
        ``las_floor`` or above, no other team borrowing (two numbers, not a scan of the running jobs)."""
        if self._running_bounds is None:  # the running list may hold jobs evicted since: bounds all the same
            running = self._running(state)
            most = max(map(_ATTAINED, running), default=None)  # levels only grow with attained service
            self._running_bounds = (-1 if most is None else self.queue_order.service_level(most),
                                    min(map(_PRIORITY, running), default=job.priority))
        top_level, lowest_priority = self._running_bounds
        return (self.victim_choice.may_have_victims(job.priority, lowest_priority, top_level, las_floor)
                or (reclaiming and any(team != job.team and state.quotas.borrowed(team, flavour) > 1e-9
                                       for team, flavour in state.quotas.usage)))

    def _candidates(self, state: State, job: Job, verdict: Admission,
                    now: float) -> tuple[tuple[object, ...], list[Job]]:
        """(what the candidates depend on, the candidates)."""
        policy = self.policy
        # levels do not change within a pass: the job's once, not once per running job
        las_floor = self.victim_choice.floor(self.level(job, now, aging=False))
        allowed = self._allowed_for(state, job) if self._mixed_fleet else None
        # what the answer depends on: the same for the next blocked job alike until a start changes the state
        key = (job.team, job.flavour, job.priority, las_floor, verdict, job.mig_profile is not None, job.milli < MILLI,
               None if allowed is None else allowed[1])
        found = self._found.get(key)
        if found is None:
            reclaiming = policy.reclaim and verdict == Admission.NOMINAL
            found = self._found[key] = self._scan(state, job, verdict, now, las_floor, allowed, key) \
                if self._may_have_victims(state, job, las_floor, reclaiming, now) else []
        return key, found

    def _scan(self, state: State, job: Job, verdict: Admission, now: float, las_floor: int,
              allowed: tuple[list[NodeState], tuple[str, ...], np.ndarray] | None,
              key: tuple[object, ...] = ()) -> list[Job]:
        """The candidates, cheapest first: running jobs on nodes ``job`` may use (any when ``allowed``
        is None) that the policy lets it evict."""
        policy, choice = self.policy, self.victim_choice
        reclaiming = policy.reclaim and verdict == Admission.NOMINAL
        usable = None if allowed is None else _usable_victim(job, allowed[1])
        outranking = choice.outranks
        # whatever the choice (priority too): a borrowing job never takes a team below its guarantee
        borrowing = policy.quotas and verdict == Admission.BORROW
        reclaimable: dict[tuple[str, str], bool] = {}  # per (team, flavour): the state does not change in the scan
        keeps: dict[tuple[str, str, float], bool] = {}
        stays: dict[tuple[str, str, float], bool] = {}
        same_class = choice.same_class(job, now, las_floor, verdict, lambda victim: self._keeps(state, victim, keeps))
        started = self._started_in_pass
        out = []
        running, priority, team = JobState.RUNNING, job.priority, job.team
        for victim in self._running(state) if allowed is None else self._running_on(state, allowed[1]):
            if victim.state != running or victim is job or victim.protected_until > now or victim.name in started:
                continue
            if borrowing and victim.team != team and not self._stays(state, victim, stays):
                self._guarded.add(key)
                continue
            if not (outranking and victim.priority < priority):
                reclaim = False
                if reclaiming and victim.team != team and victim.priority <= priority:
                    team_flavour = (victim.team, victim.flavour)
                    if (found := reclaimable.get(team_flavour)) is None:
                        found = reclaimable[team_flavour] = state.quotas.borrowed(*team_flavour) > 1e-9
                    reclaim = found
                if not reclaim and (same_class is None or not same_class(victim)):
                    continue  # neither outranked, nor reclaimed, nor the choice's own victim
            if usable is None or usable(victim):
                out.append(victim)

        rank, service_level = self._in_state_order(state), self.queue_order.service_level

        def cost(v: Job) -> tuple[bool, int, bool, int, float, float, int]:
            started = v.started
            lost = (now - (started or now)) if not v.checkpointable else 0.0
            level = service_level(v.attained)  # self.level of a running job
            # a bare pod (nothing makes it again) only as the last resort
            return (not v.recreated, v.priority, not v.checkpointable, -level, lost, -(started or 0), rank[v.name])

        return sorted(out, key=cost)

    def _keeps(self, state: State, victim: Job, known: dict[tuple[str, str, float], bool]) -> bool:
        """:meth:`_keeps_guarantee`, remembered in ``known`` for one scan (it reads the team and the size only)."""
        key = (victim.team, victim.flavour, victim.gpu_equivalents)
        if (keeps := known.get(key)) is None:
            keeps = known[key] = self._keeps_guarantee(state, victim)
        return keeps

    def _stays(self, state: State, victim: Job, known: dict[tuple[str, str, float], bool]) -> bool:
        """:meth:`_stays_guaranteed`, remembered in ``known`` for one scan."""
        key = (victim.team, victim.flavour, victim.gpu_equivalents)
        if (stays := known.get(key)) is None:
            stays = known[key] = self._stays_guaranteed(state, victim)
        return stays

    @staticmethod
    def _stays_guaranteed(state: State, victim: Job) -> bool:
        """Whether evicting ``victim`` leaves its team at or above its guarantee (a team without a quota
        has none): the rule a borrowing job's victims of other teams must keep."""
        spec = state.quotas.spec(victim.team, victim.flavour)
        return spec is None or state.quotas.used(victim.team, victim.flavour) - victim.gpu_equivalents \
            >= spec.guaranteed - 1e-9

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
        if not self.victim_choice.preempts and not policy.reclaim:
            return [], None, ""
        key, candidates = self._candidates(state, job, verdict, now)
        if not candidates:
            return [], None, GUARANTEES_KEPT if key in self._guarded else ""
        # a job asking the same as one that found no room since the last start finds none either
        attempt = (key, job.pods, job.gpus_per_pod, job.milli, job.mig_profile, job.cpu_milli, job.mem_bytes,
                   *allowed_key(job))
        if (why := self._failed.get(attempt)) is not None:
            return [], None, why
        victims, placements, why = self._search(state, statement, job, verdict, candidates)
        if placements is None:
            self._failed[attempt] = why
        return victims, placements, why

    def _search(self, state: State, statement: Statement, job: Job, verdict: Admission,
                candidates: list[Job]) -> tuple[list[Job], list[Slot] | None, str]:
        """The fewest of ``candidates`` (cheapest first) whose eviction lets ``job`` start; the state
        is left as it was when none does."""
        policy = self.policy
        need = job.pods * job.gpus_per_pod
        allowed = self._allowed_nodes(state, job)

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
            if (policy.quotas and verdict == Admission.BORROW and victim.team != job.team
                    and not self._stays_guaranteed(state, victim)):
                continue  # likewise, for a borrowing job whatever the victim's priority
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


def _usable_victim(job: Job, allowed: tuple[str, ...]) -> Callable[[Job], bool]:
    """Whether evicting a job frees anything ``job`` can take: not on nodes it may never use (not in
    ``allowed``), nor whole-GPU work for a MIG instance, nor MIG work for a whole GPU."""
    names = set(allowed)
    wants_mig = job.mig_profile is not None
    any_gpu = job.milli < MILLI and not wants_mig

    def usable(victim: Job) -> bool:
        for node, _, amount in victim.placements:
            if node in names and (any_gpu or isinstance(amount, str) == wants_mig):
                return True
        return False
    return usable


def _whole_room_after_evicting(job: Job, candidates: list[Job], allowed: list[NodeState]) -> bool:
    """Whether evicting every candidate would leave whole GPUs for all pods of ``job`` (each pod on one
    node): a necessary condition, checked before the search that evicts and places victim by victim."""
    need = job.gpus_per_pod
    if need <= 0:
        return True
    names = {node.name for node in allowed}
    freed: dict[str, dict[int, int]] = {}  # node -> GPU -> milli freed
    for victim in candidates:
        for node_name, gpu, amount in victim.placements:
            if node_name in names and not isinstance(amount, str):
                on_node = freed.setdefault(node_name, {})
                on_node[gpu] = on_node.get(gpu, 0) + amount
    pods = 0
    for node in allowed:
        extra = freed.get(node.name)
        # its whole free GPUs, and those the candidates' going would make whole (free milli never exceeds MILLI)
        whole = node.whole_free()
        if extra is not None:
            free = node.gpu_free
            whole += sum(1 for gpu, amount in extra.items() if free[gpu] < MILLI and free[gpu] + amount >= MILLI)
        pods += whole // need
        if pods >= job.pods:
            return True
    return False
