"""The scheduling engine: quotas with lending and reclaim, a preemptive priority queue, gang, placement.

Decisions are made on a working copy of the cluster (``State``); every tentative change goes
through a ``Statement`` that can be checkpointed and rolled back (a gang that does not fully fit,
a preemption that would not free enough room). The engine returns ``Decision`` objects; it never
touches a cluster. ``planner.plan`` turns a ``ClusterSnapshot`` into a ``State`` and decisions into
fleet ``Action``s; the replays drive the same engine over traces.

Policies are named plugins (``QueuePolicy``): how the queue is ordered, whether quotas apply,
and what may preempt what. ``gpuwarden`` is the production policy; ``fifo``, ``kueue`` and
``tiresias`` are the baselines the replay compares against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

from gpuwarden.fleet import PriceTier, WorkloadKind

from . import mig
from .errors import QuotaError, SchedulingError

MILLI = 1000
ANY_FLAVOUR = "*"


# ---------------------------------------------------------------------------------------------
# State


@dataclass
class NodeState:
    name: str
    model: str
    gpu_count: int
    cpu_free: int
    mem_free: int
    tier: PriceTier = PriceTier.ON_DEMAND
    nvlink_domain: str = ""
    leaf_switch: str = ""
    schedulable: bool = True
    gpu_free: list[int] = field(default_factory=list)  # milli free per GPU (0 for MIG GPUs)
    mig_layout: list[tuple[str, ...] | None] = field(default_factory=list)  # instances a MIG GPU is cut into
    mig_used: list[list[str]] = field(default_factory=list)  # instances in use per GPU
    gpu_ids: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.gpu_free:
            self.gpu_free = [MILLI] * self.gpu_count
        if not self.mig_layout:
            self.mig_layout = [None] * self.gpu_count
        if not self.mig_used:
            self.mig_used = [[] for _ in range(self.gpu_count)]
        if not self.gpu_ids:
            self.gpu_ids = [f"{self.name}/gpu{i}" for i in range(self.gpu_count)]
        for i, layout in enumerate(self.mig_layout):
            if layout is not None:
                self.gpu_free[i] = 0

    def whole_free(self) -> int:
        return sum(1 for g, free in enumerate(self.gpu_free) if free == MILLI and self.mig_layout[g] is None)


@dataclass
class Job:
    """A workload as the engine sees it. ``gpus_per_pod`` whole GPUs, or a fraction, or a MIG profile."""

    name: str
    team: str
    priority: int = 2  # PriorityClass rank: 0 best-effort .. 4 critical
    pods: int = 1
    gpus_per_pod: int = 1
    milli: int = MILLI  # < 1000: a fractional GPU (then gpus_per_pod == 1)
    mig_profile: str | None = None
    gpu_model: str | None = None
    cpu_milli: int = 0
    mem_bytes: int = 0
    kind: WorkloadKind = WorkloadKind.TRAINING
    checkpointable: bool = False
    submitted: float = 0.0
    duration: float | None = None  # replay only
    flavour: str = ANY_FLAVOUR
    # mutable
    state: str = "pending"  # pending | running | suspended | done
    started: float | None = None
    first_started: float | None = None
    progress: float = 0.0  # seconds of useful work kept (at the last checkpoint when suspended)
    attained: float = 0.0  # GPU-seconds of service received (LAS)
    placements: list = field(default_factory=list)  # (node, gpu index, milli or profile)
    preempted_at: list[float] = field(default_factory=list)
    protected_until: float = -math.inf
    wait_reason: str = ""
    finished: float | None = None

    @property
    def gpu_equivalents(self) -> float:
        if self.mig_profile:
            return int(self.mig_profile.split("g.")[0]) / 7.0 * self.pods
        return self.pods * self.gpus_per_pod * self.milli / MILLI

    @property
    def key(self) -> str:
        return self.name


@dataclass(frozen=True)
class QuotaSpec:
    team: str
    guaranteed: float
    burst: float
    flavour: str = ANY_FLAVOUR
    weight: float = 1.0

    def __post_init__(self):
        if self.guaranteed < 0 or self.burst < 0:
            raise QuotaError(f"team {self.team!r}: negative quota (guaranteed {self.guaranteed}, burst {self.burst})")
        if self.burst < self.guaranteed:
            raise QuotaError(f"team {self.team!r}: burst {self.burst} is below the guarantee {self.guaranteed}")
        if self.weight <= 0:
            raise QuotaError(f"team {self.team!r}: weight {self.weight} must be > 0")


class Quotas:
    """Guarantees and burst limits per (team, flavour). Unused guarantee is lent; borrowers are reclaimed."""

    def __init__(self, specs: Iterable[QuotaSpec] = ()):
        self.specs: dict[tuple[str, str], QuotaSpec] = {}
        for spec in specs:
            self.specs[(spec.team, spec.flavour)] = spec
        self.usage: dict[tuple[str, str], float] = {}

    def spec(self, team: str, flavour: str) -> QuotaSpec | None:
        return self.specs.get((team, flavour)) or self.specs.get((team, ANY_FLAVOUR))

    def flavour_of(self, team: str, flavour: str) -> str:
        return flavour if (team, flavour) in self.specs else ANY_FLAVOUR

    def used(self, team: str, flavour: str) -> float:
        return self.usage.get((team, self.flavour_of(team, flavour)), 0.0)

    def add(self, team: str, flavour: str, amount: float) -> None:
        key = (team, self.flavour_of(team, flavour))
        self.usage[key] = self.usage.get(key, 0.0) + amount

    def lendable(self, flavour: str, exclude_team: str) -> float:
        """Unused guarantee of the other teams in this flavour."""
        total = 0.0
        for (team, flv), spec in self.specs.items():
            if team != exclude_team and flv == self.flavour_of(team, flavour):
                total += max(0.0, spec.guaranteed - self.usage.get((team, flv), 0.0))
        return total

    def borrowed(self, team: str, flavour: str) -> float:
        spec = self.spec(team, flavour)
        return max(0.0, self.used(team, flavour) - (spec.guaranteed if spec else 0.0))

    def admit(self, job: Job, capacity_free: float) -> tuple[str, str]:
        """('nominal'|'borrow'|'no', reason). Borrowing needs room beyond what other teams may claim back."""
        spec = self.spec(job.team, job.flavour)
        if spec is None:
            return "borrow", ""  # a team without a quota only ever borrows
        after = self.used(job.team, job.flavour) + job.gpu_equivalents
        if after <= spec.guaranteed + 1e-9:
            return "nominal", ""
        if after > spec.burst + 1e-9:
            return "no", f"quota: team {job.team} would use {after:g} GPUs, over its burst limit {spec.burst:g}"
        return "borrow", ""


# ---------------------------------------------------------------------------------------------
# Statement: tentative changes with checkpoint / rollback


class Statement:
    def __init__(self, state: "State"):
        self.state = state
        self.log: list[tuple] = []

    def checkpoint(self) -> int:
        return len(self.log)

    def rollback(self, mark: int = 0) -> None:
        while len(self.log) > mark:
            op, job, placements, extra = self.log.pop()
            if op == "allocate":
                self.state._release(job, placements)
                job.placements = []
                job.state = extra
            else:  # evict
                self.state._occupy(job, placements)
                job.placements = placements
                job.state = "running"

    def allocate(self, job: Job, placements: list) -> None:
        self.state._occupy(job, placements)
        self.log.append(("allocate", job, placements, job.state))
        job.placements = placements
        job.state = "running"

    def evict(self, job: Job) -> None:
        placements = job.placements
        self.state._release(job, placements)
        self.log.append(("evict", job, placements, None))
        job.placements = []
        job.state = "evicting"


class State:
    """The working copy decisions are made on: nodes, jobs, quota usage."""

    def __init__(self, nodes: Iterable[NodeState], quotas: Quotas | None = None):
        self.nodes = {node.name: node for node in nodes}
        self.quotas = quotas or Quotas()
        self.jobs: dict[str, Job] = {}
        self.capacity = sum(n.gpu_count for n in self.nodes.values() if n.schedulable)

    def add_job(self, job: Job) -> None:
        if job.name in self.jobs:
            raise SchedulingError(f"job {job.name!r} submitted twice")
        if job.mig_profile:
            mig.check_profile(job.mig_profile)
        self.jobs[job.name] = job

    @property
    def used_gpus(self) -> float:
        return sum(j.gpu_equivalents for j in self.jobs.values() if j.state == "running")

    def _occupy(self, job: Job, placements: list) -> None:
        for node_name, gpu, amount in placements:
            node = self.nodes[node_name]
            if isinstance(amount, str):
                node.mig_used[gpu].append(amount)
            else:
                node.gpu_free[gpu] -= amount
        for node_name in {p[0] for p in placements}:
            pods_here = len({(p[0], i) for i, p in enumerate(placements) if p[0] == node_name})
            share = pods_here / max(1, len(placements))
            self.nodes[node_name].cpu_free -= int(job.cpu_milli * job.pods * share)
            self.nodes[node_name].mem_free -= int(job.mem_bytes * job.pods * share)
        self.quotas.add(job.team, job.flavour, job.gpu_equivalents)

    def _release(self, job: Job, placements: list) -> None:
        for node_name, gpu, amount in placements:
            node = self.nodes[node_name]
            if isinstance(amount, str):
                node.mig_used[gpu].remove(amount)
            else:
                node.gpu_free[gpu] += amount
        for node_name in {p[0] for p in placements}:
            pods_here = len({(p[0], i) for i, p in enumerate(placements) if p[0] == node_name})
            share = pods_here / max(1, len(placements))
            self.nodes[node_name].cpu_free += int(job.cpu_milli * job.pods * share)
            self.nodes[node_name].mem_free += int(job.mem_bytes * job.pods * share)
        self.quotas.add(job.team, job.flavour, -job.gpu_equivalents)


# ---------------------------------------------------------------------------------------------
# Placement


def _tier_ok(job: Job, node: NodeState) -> bool:
    if node.tier == PriceTier.SPOT:
        return job.kind != WorkloadKind.INFERENCE and job.checkpointable
    return True


def _node_ok(job: Job, node: NodeState) -> bool:
    return (
        node.schedulable
        and (job.gpu_model is None or node.model == job.gpu_model or mig.MODEL_ALIASES.get(job.gpu_model) == node.model)
        and _tier_ok(job, node)
        and node.cpu_free >= job.cpu_milli
        and node.mem_free >= job.mem_bytes
    )


@dataclass(frozen=True)
class PlacementOptions:
    topology: bool = True  # NVLink-domain and leaf-switch packing for gangs
    best_fit: bool = True  # pack tightly (else first fit)
    mig: bool = True  # use MIG instances for MIG requests (else a whole GPU per request)


def find_placement(state: State, job: Job, options: PlacementOptions = PlacementOptions()) -> tuple[list | None, str]:
    """All pods of ``job`` or nothing: returns (placements, '') or (None, reason)."""
    nodes = [n for n in state.nodes.values() if _node_ok(job, n)]
    if not nodes:
        return None, _no_node_reason(state, job)
    if job.mig_profile:
        return _place_mig(nodes, job, options)
    if job.milli < MILLI:
        return _place_fraction(nodes, job, options)
    return _place_whole(nodes, job, options)


def _no_node_reason(state: State, job: Job) -> str:
    allowed = [n for n in state.nodes.values() if job.gpu_model is None or n.model == job.gpu_model
               or mig.MODEL_ALIASES.get(job.gpu_model) == n.model]
    if not allowed:
        return f"no node has GPU model {job.gpu_model}"
    if all(not _tier_ok(job, n) for n in allowed):
        return "only spot capacity, and the job is not checkpointable training"
    if job.gpus_per_pod > max(n.gpu_count for n in allowed):
        return f"asks for {job.gpus_per_pod} GPUs per pod; the largest node has {max(n.gpu_count for n in allowed)}"
    return "no node has the CPU and memory free"


def _place_whole(nodes: list[NodeState], job: Job, options: PlacementOptions) -> tuple[list | None, str]:
    need = job.gpus_per_pod
    biggest = max(n.gpu_count for n in nodes)
    if need > biggest:
        return None, f"asks for {need} GPUs per pod; the largest node has {biggest}"
    cap = {n.name: min(n.whole_free() // need if need else job.pods,
                       (n.cpu_free // job.cpu_milli) if job.cpu_milli else job.pods,
                       (n.mem_free // job.mem_bytes) if job.mem_bytes else job.pods) for n in nodes}
    if sum(cap.values()) < job.pods:
        free = sum(n.whole_free() for n in nodes)
        if job.pods > 1 and free >= need * job.pods:
            return None, f"gang: {job.pods} pods x {need} GPUs do not fit together (free GPUs are scattered)"
        return None, f"capacity: needs {need * job.pods} whole GPUs, {free} free on allowed nodes"
    by_node = {n.name: n for n in nodes}

    def tightness(n: NodeState) -> tuple:
        left = n.whole_free() - need
        return (left if options.best_fit else 0, n.name if not options.best_fit else "")

    if job.pods == 1 or not options.topology:
        chosen: list[str] = []
        order = sorted((n for n in nodes if cap[n.name] > 0), key=tightness) if options.best_fit else \
            [n for n in nodes if cap[n.name] > 0]
        for n in order:
            take = min(cap[n.name], job.pods - len(chosen))
            chosen += [n.name] * take
            if len(chosen) == job.pods:
                break
    else:
        chosen = _gang_by_topology(nodes, cap, job.pods, lambda n: n.whole_free())
        if chosen is None:
            return None, f"topology: no leaf switch holds all {job.pods} pods x {need} GPUs"
    placements = []
    used: dict[str, set[int]] = {}
    for name in chosen:
        node = by_node[name]
        taken = used.setdefault(name, set())
        gpus = [g for g, free in enumerate(node.gpu_free)
                if free == MILLI and node.mig_layout[g] is None and g not in taken][:need]
        taken.update(gpus)
        placements += [(name, g, MILLI) for g in gpus]
    return placements, ""


def _gang_by_topology(nodes, cap, pods, free_of) -> list[str] | None:
    """Pods of a gang under one leaf switch, packed into as few NVLink domains (and nodes) as possible."""
    leaves: dict[str, list[NodeState]] = {}
    for n in nodes:
        if cap[n.name] > 0:
            leaves.setdefault(n.leaf_switch, []).append(n)
    best = None
    for leaf, members in leaves.items():
        room = sum(cap[n.name] for n in members)
        if room >= pods and (best is None or room < best[0]):
            best = (room, leaf, members)
    if best is None:
        return None
    members = best[2]
    domains: dict[str, list[NodeState]] = {}
    for n in members:
        domains.setdefault(n.nvlink_domain, []).append(n)
    # domains that hold the whole gang, tightest first; else the fullest domains first
    ordered = sorted(domains.values(), key=lambda ms: (sum(cap[n.name] for n in ms) < pods,
                                                       sum(cap[n.name] for n in ms)))
    chosen: list[str] = []
    for members in ordered:
        for n in sorted(members, key=lambda n: -cap[n.name]):
            take = min(cap[n.name], pods - len(chosen))
            chosen += [n.name] * take
            if len(chosen) == pods:
                return chosen
    return None


def _place_fraction(nodes, job, options) -> tuple[list | None, str]:
    best = None
    for n in nodes:
        for g, free in enumerate(n.gpu_free):
            if n.mig_layout[g] is not None or free < job.milli:
                continue
            # tightest GPU first; a GPU already shared before an untouched one
            key = (free - job.milli if options.best_fit else 0, free == MILLI, n.name, g)
            if best is None or key < best[0]:
                best = (key, n.name, g)
            if not options.best_fit:
                break
        if best is not None and not options.best_fit:
            break
    if best is None:
        return None, f"capacity: no GPU has {job.milli} milli-GPU free"
    if job.pods > 1:
        return None, "fractional gangs are not supported; submit pods separately"
    return [(best[1], best[2], job.milli)], ""


def _place_mig(nodes, job, options) -> tuple[list | None, str]:
    profile = job.mig_profile
    placements = []
    taken: dict[tuple[str, int], list[str]] = {}
    for _ in range(job.pods):
        best = None
        for n in nodes:
            table = mig.mig_table(n.model)
            if profile not in table:
                continue
            for g, layout in enumerate(n.mig_layout):
                if layout is None:
                    continue
                in_use = n.mig_used[g] + taken.get((n.name, g), [])
                free_slots = list(layout)
                for used in in_use:
                    if used in free_slots:
                        free_slots.remove(used)
                if profile not in free_slots:
                    continue
                key = (len(free_slots), n.name, g)  # fill the fullest GPU first
                if best is None or key < best[0]:
                    best = (key, n.name, g)
        if best is None:
            if not any(profile in mig.mig_table(n.model) for n in nodes):
                return None, f"no allowed node offers MIG profile {profile}"
            return None, f"capacity: no free {profile} MIG instance (MIG layouts may need changing)"
        taken.setdefault((best[1], best[2]), []).append(profile)
        placements.append((best[1], best[2], profile))
    return placements, ""


# ---------------------------------------------------------------------------------------------
# Queue policy plugins and the scheduling pass


@dataclass(frozen=True)
class QueuePolicy:
    """A named combination of plugins.

    order: 'fifo' (priority, then submit time) | 'las' (priority, then attained-service level)
    quotas: enforce guarantees / burst limits and reclaim lent capacity
    preempt: 'none' | 'priority' (higher class preempts lower) | 'las' (lower service level preempts)
    checkpoint: victims that are checkpointable are suspended (progress kept) instead of killed
    """

    name: str
    order: str = "fifo"
    quotas: bool = False
    reclaim: bool = False
    preempt: str = "none"
    checkpoint: bool = False
    aging_seconds: float = 0.0  # every this long in the queue raises a job one level (0: off)
    las_thresholds: tuple[float, ...] = (3600.0 * 1, 3600.0 * 10)  # GPU-seconds per level
    protect_after: int = 2  # preempted this many times within protect_window ...
    protect_window: float = 6 * 3600.0
    protect_for: float = 6 * 3600.0  # ... is protected from preemption this long
    min_run_seconds: float = 0.0  # a job (re)started less than this ago is not LAS-preempted (reclaim still may)
    backfill: bool = True  # later jobs may start when the head does not fit
    guarantee_first: bool = False  # within a level, jobs of teams still under their guarantee go first
    borrower_las: bool = False  # a borrowing job may LAS-preempt another team's borrowed capacity
    las_gap: int = 1  # LAS preemption needs the victim this many levels above the job (hysteresis)
    las_keep_guarantee: bool = False  # LAS takes from another team only GPUs it borrows beyond its guarantee
    placement: PlacementOptions = PlacementOptions()


POLICIES: dict[str, QueuePolicy] = {
    "fifo": QueuePolicy("fifo", placement=PlacementOptions(topology=False, best_fit=False)),
    "kueue": QueuePolicy("kueue", quotas=True, reclaim=True, checkpoint=False,
                         placement=PlacementOptions(topology=False, best_fit=False)),
    "tiresias": QueuePolicy("tiresias", order="las", preempt="las", checkpoint=True,
                            placement=PlacementOptions(topology=False, best_fit=False)),
    "gpuwarden": QueuePolicy("gpuwarden", order="las", quotas=True, reclaim=True, preempt="las", checkpoint=True,
                             aging_seconds=24 * 3600.0, min_run_seconds=0.0, guarantee_first=True,
                             borrower_las=True, las_keep_guarantee=True,
                             # level edges where the Gittins index of Philly's GPU-service distribution
                             # drops (4 weeks *before* the replay slice): ~300 GPU-s, ~1 GPU-h; 10 GPU-h
                             las_thresholds=(300.0, 3600.0, 36000.0)),
}


@dataclass(frozen=True)
class Decision:
    kind: str  # bind | resume | suspend | preempt
    job: str
    placements: tuple = ()
    reason: str = ""


class Scheduler:
    """One scheduling pass over a ``State``: returns decisions and leaves the state updated."""

    max_preemption_attempts = 8  # blocked jobs per pass that may look for victims

    def __init__(self, policy: QueuePolicy | str = "gpuwarden"):
        if isinstance(policy, str):
            if policy not in POLICIES:
                raise SchedulingError(f"unknown queue policy {policy!r}; choose from {', '.join(POLICIES)}")
            policy = POLICIES[policy]
        self.policy = policy

    # -- ordering ---------------------------------------------------------------------------
    def level(self, job: Job, now: float, aging: bool = True) -> int:
        """Service level (LAS): 0 for jobs that received little service, higher for more.
        Aging lifts waiting jobs in the *order* only; preemption compares levels without aging."""
        if self.policy.order != "las":
            return 0
        level = sum(1 for t in self.policy.las_thresholds if job.attained >= t)
        if aging and self.policy.aging_seconds and job.state != "running":
            level -= int((now - job.submitted) // self.policy.aging_seconds)
        return level

    def sort_key(self, job: Job, now: float) -> tuple:
        guarantee_first = 0
        if self.policy.quotas and self._state is not None:
            spec = self._state.quotas.spec(job.team, job.flavour)
            if spec is not None and self._state.quotas.used(job.team, job.flavour) + job.gpu_equivalents <= spec.guaranteed + 1e-9:
                guarantee_first = -1
        if self.policy.guarantee_first:
            return (-job.priority, self.level(job, now), guarantee_first, job.submitted, job.name)
        return (-job.priority, self.level(job, now), job.submitted, job.name)

    _state: State | None = None

    def queue(self, state: State, now: float) -> list[Job]:
        self._state = state
        waiting = [j for j in state.jobs.values() if j.state in ("pending", "suspended")]
        return sorted(waiting, key=lambda j: self.sort_key(j, now))

    # -- one pass -----------------------------------------------------------------------------
    def schedule(self, state: State, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        statement = Statement(state)
        free_total = state.capacity - state.used_gpus
        blocked_head = False
        free_whole = sum(n.whole_free() for n in state.nodes.values() if n.schedulable)
        attempts = 0
        biggest = max((n.gpu_count for n in state.nodes.values() if n.schedulable), default=0)
        for job in self.queue(state, now):
            whole = job.mig_profile is None and job.milli == MILLI
            if whole and job.gpus_per_pod > biggest:
                job.wait_reason = f"unplaceable: asks for {job.gpus_per_pod} GPUs per pod; the largest node has {biggest}"
                continue
            if whole and job.pods * job.gpus_per_pod > free_whole and (
                    attempts >= self.max_preemption_attempts or (self.policy.preempt == "none" and not self.policy.reclaim)):
                job.wait_reason = job.wait_reason or f"capacity: needs {job.pods * job.gpus_per_pod} GPUs, {free_whole} free"
                blocked_head = True
                continue
            if blocked_head and not self.policy.backfill:
                job.wait_reason = "fifo: waiting behind the head of the queue"
                continue
            if self.policy.quotas:
                verdict, reason = state.quotas.admit(job, free_total)
                if verdict == "no":
                    job.wait_reason = reason
                    continue
            else:
                verdict = "nominal"
            mark = statement.checkpoint()
            placements, reason = find_placement(state, job, self.policy.placement) if (
                not whole or job.pods * job.gpus_per_pod <= free_whole) else (None, f"capacity: needs {job.pods * job.gpus_per_pod} GPUs, {free_whole} free")
            victims: list[Job] = []
            if placements is None:
                attempts += 1
                victims, placements, why = self._preempt_for(state, statement, job, verdict, now)
                if placements is None:
                    statement.rollback(mark)
                    job.wait_reason = reason if not why else f"{reason}; {why}"
                    blocked_head = True
                    continue
            for victim in victims:
                decisions.append(self._evict(victim, now, f"preempted for {job.name}"))
            statement.allocate(job, placements)
            free_whole = sum(n.whole_free() for n in state.nodes.values() if n.schedulable)
            kind = "resume" if job.started is not None or job.progress > 0 else "bind"
            job.started = now
            if job.first_started is None:
                job.first_started = now
            job.wait_reason = ""
            decisions.append(Decision(kind, job.name, tuple(placements)))
        return decisions

    def _evict(self, victim: Job, now: float, reason: str) -> Decision:
        victim.preempted_at.append(now)
        recent = [t for t in victim.preempted_at if now - t <= self.policy.protect_window]
        if len(recent) >= self.policy.protect_after:
            victim.protected_until = now + self.policy.protect_for
        if self.policy.checkpoint and victim.checkpointable:
            victim.state = "suspended"
            return Decision("suspend", victim.name, (), reason + " (checkpoint, then pause; resumes when capacity returns)")
        victim.state = "pending"  # the caller rolls progress back to the last periodic checkpoint
        return Decision("preempt", victim.name, (), reason + " (not checkpointable: restarts from scratch)")

    def _candidates(self, state: State, job: Job, verdict: str, now: float) -> list[Job]:
        running = [j for j in state.jobs.values() if j.state == "running" and j is not job]
        out = []
        for victim in running:
            if victim.protected_until > now:
                continue
            # hysteresis: a job that (re)started less than min_run_seconds ago is not LAS-demoted
            # (reclaim of a guarantee and higher priority classes still may preempt it)
            young = now - (victim.started if victim.started is not None else now) < self.policy.min_run_seconds
            lower_priority = victim.priority < job.priority
            reclaim = (self.policy.reclaim and verdict == "nominal" and victim.team != job.team
                       and state.quotas.borrowed(victim.team, victim.flavour) > 1e-9
                       and victim.priority <= job.priority)
            las = (self.policy.preempt == "las" and victim.priority == job.priority and not young
                   and self.level(victim, now, aging=False) >= self.level(job, now, aging=False) + self.policy.las_gap)
            if self.policy.preempt == "las" and self.policy.quotas and las:
                # never push a team below its guarantee to serve another team's borrowing
                if victim.team != job.team and not self._keeps_guarantee(state, victim):
                    las = False
                if verdict == "borrow" and victim.team != job.team and not self.policy.borrower_las:
                    las = False
            if (self.policy.preempt != "none" and lower_priority) or reclaim or las:
                out.append(victim)

        def cost(v: Job):
            lost = (now - (v.started or now)) if not v.checkpointable else 0.0
            return (v.priority, not v.checkpointable, -self.level(v, now), lost, -(v.started or 0))

        return sorted(out, key=cost)

    def _keeps_guarantee(self, state: State, victim: Job) -> bool:
        """Whether evicting ``victim`` leaves its team at or above its guarantee (it only gives back borrowed GPUs)."""
        spec = state.quotas.spec(victim.team, victim.flavour)
        if spec is None:
            return True
        if self.policy.las_keep_guarantee:
            return state.quotas.used(victim.team, victim.flavour) - victim.gpu_equivalents >= spec.guaranteed - 1e-9
        return state.quotas.used(victim.team, victim.flavour) > spec.guaranteed + 1e-9

    def _preempt_for(self, state, statement, job, verdict, now):
        if self.policy.preempt == "none" and not self.policy.reclaim:
            return [], None, ""
        candidates = self._candidates(state, job, verdict, now)
        if not candidates:
            return [], None, ""
        if job.mig_profile is None and job.milli == MILLI:
            freeable = sum(n.whole_free() for n in state.nodes.values() if n.schedulable) + sum(
                len(v.placements) for v in candidates)
            if freeable < job.pods * job.gpus_per_pod:
                return [], None, "not enough preemptible GPUs"
        mark = statement.checkpoint()
        victims = []
        for victim in candidates:
            if (self.policy.quotas and self.policy.las_keep_guarantee and victim.team != job.team
                    and victim.priority >= job.priority and not (verdict == "nominal" and self.policy.reclaim)
                    and not self._keeps_guarantee(state, victim)):
                continue  # earlier victims already took this team down to its guarantee
            statement.evict(victim)
            victims.append(victim)
            placements, _ = find_placement(state, job, self.policy.placement)
            if placements is not None:
                # keep only victims that were needed: try giving back each (latest first)
                for v in reversed(victims[:-1]):
                    m2 = statement.checkpoint()
                    statement.allocate(v, _last_placements(statement, v))
                    if find_placement(state, job, self.policy.placement)[0] is None:
                        statement.rollback(m2)
                    else:
                        victims.remove(v)
                placements, _ = find_placement(state, job, self.policy.placement)
                return victims, placements, ""
        statement.rollback(mark)
        return [], None, "preemption would not free enough room"


def _last_placements(statement: Statement, job: Job) -> list:
    for op, logged, placements, _ in reversed(statement.log):
        if op == "evict" and logged is job:
            return placements
    return []


def queue_positions(scheduler: Scheduler, state: State, now: float) -> list[dict]:
    """Where each waiting job stands and why it waits."""
    return [
        {"position": i + 1, "job": j.name, "team": j.team, "priority": j.priority, "state": j.state,
         "waiting_seconds": now - j.submitted, "reason": j.wait_reason or "not yet considered"}
        for i, j in enumerate(scheduler.queue(state, now))
    ]

