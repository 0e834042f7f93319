"""The working copy decisions are made on: nodes, jobs, quota usage, and tentative changes.

Every tentative change goes through a ``Statement`` that can be checkpointed and rolled back (a
gang that does not fully fit, a preemption that would not free enough room). The placement scorers
read the nodes as arrays (``NodeArrays``), built on first use and booked beside the nodes here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from enum import StrEnum
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from gpuwarden.fleet import PriceTier, WorkloadKind
from gpuwarden.fleet.semantics import request_gpu_equivalents

from . import mig
from .errors import SchedulingError
from .nodearrays import NO_PRIORITY, NodeArrays
from .quotas import ANY_FLAVOUR, Quotas

MILLI = 1000

# Where one pod of a job sits: (node, GPU index on the node, milli-GPU taken or MIG profile held).
Slot = tuple[str, int, int | str]


class JobState(StrEnum):
    """Where a job stands. ``FUTURE``: known to a replay but not yet submitted; ``EVICTING``: taken
    off its GPUs inside a pass, before the scheduler decides whether it is suspended or requeued."""

    FUTURE = "future"
    PENDING = "pending"
    RUNNING = "running"
    EVICTING = "evicting"
    SUSPENDED = "suspended"
    DONE = "done"


WAITING = (JobState.PENDING, JobState.SUSPENDED)


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
    pool: str = ""
    # what the node has in all (0: the free amount given at construction), for the CPU and memory
    # shares the scorers weigh
    cpu_capacity: int = 0
    mem_capacity: int = 0

    def __post_init__(self) -> None:
        self.cpu_capacity = self.cpu_capacity or self.cpu_free
        self.mem_capacity = self.mem_capacity or self.mem_free
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
        # a MIG GPU's gpu_free is always 0 (its capacity is in mig_used), so counting is enough
        return self.gpu_free.count(MILLI)


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
    gpu_models: tuple[str, ...] = ()  # any one of these models (openb's gpu_spec); empty: gpu_model decides
    cpu_milli: int = 0
    mem_bytes: int = 0
    kind: WorkloadKind = WorkloadKind.TRAINING
    checkpointable: bool = False
    submitted: float = 0.0
    duration: float | None = None  # replay only
    flavour: str = ANY_FLAVOUR
    pools: tuple[str, ...] = ()  # node pools the job may run in (empty: any)
    avoid_nodes: frozenset[str] = frozenset()  # nodes whose taints it does not tolerate
    spare_nodes: frozenset[str] = frozenset()  # nodes it takes only where no other fits (Workload.spare_nodes)
    recreated: bool = True  # an owner makes its pods again after an eviction (False: a bare pod, lost)
    foreign: bool = False  # outside the scheduler's scope (a namespace not in the queue): holds capacity only
    # mutable
    state: JobState = JobState.PENDING
    started: float | None = None
    first_started: float | None = None
    progress: float = 0.0  # seconds of useful work kept (at the last checkpoint when suspended)
    attained: float = 0.0  # GPU-seconds of service received (LAS)
    placements: list[Slot] = field(default_factory=list)
    preempted_at: list[float] = field(default_factory=list)
    protected_until: float = -math.inf
    wait_reason: str = ""
    finished: float | None = None
    waited: float = 0.0  # seconds between submission and finish not running (queued or suspended)

    @cached_property
    def gpu_equivalents(self) -> float:
        """Whole GPUs the job holds: a MIG slice by its compute share (``fleet.semantics``). Cached:
        the request does not change once the job exists."""
        if self.mig_profile:
            return request_gpu_equivalents(self.mig_profile, self.pods, model=self.gpu_model)
        return request_gpu_equivalents(None, self.pods * self.gpus_per_pod, self.milli)

    @property
    def whole(self) -> bool:
        """Asks for whole GPUs (not a fraction, not a MIG slice)."""
        return self.mig_profile is None and self.milli == MILLI

    @property
    def key(self) -> str:
        return self.name

    @cached_property  # the request does not change once the job exists: counted every round
    def shape(self) -> Shape:
        return Shape(self.gpus_per_pod, self.milli, self.cpu_milli, self.mem_bytes,
                     self.gpu_models or ((self.gpu_model,) if self.gpu_model else ()))


@dataclass(frozen=True)
class Shape:
    """What one pod asks for: GPUs (milli each when a fraction), CPU, memory and allowed models (empty: any)."""

    gpus: int
    milli: int
    cpu_milli: int
    mem_bytes: int
    models: tuple[str, ...] = ()
    # scorers key their caches by shape on every pod: its hash is computed once, not from the fields each time
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.gpus, self.milli, self.cpu_milli, self.mem_bytes, self.models)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Shape], tuple[int, int, int, int, tuple[str, ...]]]:
        # rebuilt by the constructor: a string's hash differs from one process to the next
        return Shape, (self.gpus, self.milli, self.cpu_milli, self.mem_bytes, self.models)


@dataclass(frozen=True)
class _LogEntry:
    allocate: bool  # else an eviction
    job: Job
    placements: list[Slot]
    previous: JobState


class Statement:
    """Tentative changes to a ``State`` with checkpoint / rollback."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.log: list[_LogEntry] = []

    def checkpoint(self) -> int:
        return len(self.log)

    def rollback(self, mark: int = 0) -> None:
        while len(self.log) > mark:
            entry = self.log.pop()
            if entry.allocate:
                self.state.release(entry.job, entry.placements)
                entry.job.placements = []
            else:
                self.state.occupy(entry.job, entry.placements)
                entry.job.placements = entry.placements
            entry.job.state = entry.previous

    def allocate(self, job: Job, placements: list[Slot]) -> None:
        self.state.occupy(job, placements)
        self.log.append(_LogEntry(True, job, placements, job.state))
        job.placements = placements
        job.state = JobState.RUNNING

    def evict(self, job: Job) -> None:
        placements = job.placements
        self.state.release(job, placements)
        self.log.append(_LogEntry(False, job, placements, job.state))
        job.placements = []
        job.state = JobState.EVICTING

    def evicted_placements(self, job: Job) -> list[Slot]:
        """Where ``job`` ran before its latest eviction in this statement."""
        for entry in reversed(self.log):
            if not entry.allocate and entry.job is job:
                return entry.placements
        return []


class State:
    """The working copy decisions are made on: nodes, jobs, quota usage."""

    def __init__(self, nodes: Iterable[NodeState], quotas: Quotas | None = None) -> None:
        self.nodes = {node.name: node for node in nodes}
        self.quotas = quotas or Quotas()
        self.jobs: dict[str, Job] = {}
        self.capacity = sum(n.gpu_count for n in self.nodes.values() if n.schedulable)
        self._arrays: NodeArrays[NodeState] | None = None
        # the pod shapes the fragmentation scorer expects: counted from the jobs known (pods per
        # shape), or given by ``expect`` (a trace's distribution); the version tells scorers to rebuild
        self._demand: dict[Shape, float] = {}
        self._demand_given = False
        self.demand_version = 0
        self.scorers: dict[Any, Any] = {}  # placement scorers with their caches, by configuration
        self.shapes: dict[tuple[int, int, int, int], Shape] = {}  # one-pod shapes placed, by their numbers
        self.seed = 0  # for the random scorers
        # per node: priority -> jobs of that priority running there (placement's keep_clear reads the
        # highest, mirrored in arrays.top_priority)
        self._priorities: dict[str, dict[int, int]] = {}
        self._running_priorities: dict[int, int] = {}  # priority -> (job, node) bookings in all

    @property
    def arrays(self) -> NodeArrays[NodeState]:
        if self._arrays is None:
            self._arrays = NodeArrays(list(self.nodes.values()))
            for name, counts in self._priorities.items():
                self._arrays.top_priority[self._arrays.index[name]] = max(counts, default=NO_PRIORITY)
        return self._arrays

    def expect(self, demand: Mapping[Shape, float]) -> None:
        """Fix the pod shapes expected to arrive (and their weights) instead of counting known jobs."""
        self._demand, self._demand_given = dict(demand), True
        self.demand_version += 1

    def demand(self) -> dict[Shape, float]:
        return self._demand

    def _count(self, job: Job) -> None:
        if not self._demand_given and job.mig_profile is None:
            shape = job.shape
            self._demand[shape] = self._demand.get(shape, 0.0) + job.pods
            self.demand_version += 1

    def rng(self) -> np.random.Generator:
        if "rng" not in self.scorers:
            self.scorers["rng"] = np.random.default_rng(self.seed)
        generator: np.random.Generator = self.scorers["rng"]
        return generator

    def add_job(self, job: Job) -> None:
        if job.name in self.jobs:
            raise SchedulingError(f"job {job.name!r} submitted twice")
        if job.mig_profile:
            mig.check_profile(job.mig_profile)
        self.jobs[job.name] = job
        self._count(job)

    def add_running(self, job: Job, placements: list[Slot]) -> None:
        """A job already running where ``placements`` say (read from a cluster)."""
        self.jobs[job.name] = job
        self._count(job)
        self.occupy(job, placements)
        job.placements, job.state = placements, JobState.RUNNING

    def add_placed(self, job: Job, placements: list[Slot]) -> None:
        """A running job whose GPUs the nodes already show as taken (built from a cluster's free
        capacity): registered and counted against its quota, not booked on the nodes again."""
        self.jobs[job.name] = job
        self._count(job)
        job.placements, job.state = placements, JobState.RUNNING
        self.quotas.add(job.team, job.flavour, job.gpu_equivalents)
        for node_name in self._shares(job, placements):
            self._book_priority(node_name, job.priority, +1)

    @property
    def used_gpus(self) -> float:
        return sum(j.gpu_equivalents for j in self.jobs.values() if j.state == JobState.RUNNING)

    def free_whole(self, names: Iterable[str] | None = None) -> int:
        nodes = self.nodes.values() if names is None else (self.nodes[name] for name in names)  # names: only these
        return sum(n.whole_free() for n in nodes if n.schedulable)

    def _shares(self, job: Job, placements: list[Slot]) -> dict[str, float]:
        """Share of the job's pods on each node (CPU and memory are booked per pod)."""
        counts: dict[str, int] = {}
        for node_name, _, _ in placements:
            counts[node_name] = counts.get(node_name, 0) + 1
        total = max(1, len(placements))
        return {name: count / total for name, count in counts.items()}

    def occupy(self, job: Job, placements: list[Slot]) -> None:
        self._book(job, placements, +1)

    def release(self, job: Job, placements: list[Slot]) -> None:
        self._book(job, placements, -1)

    def _book(self, job: Job, placements: list[Slot], sign: int) -> None:
        for node_name, gpu, amount in placements:
            node = self.nodes[node_name]
            if isinstance(amount, str):
                if sign > 0:
                    node.mig_used[gpu].append(amount)
                else:
                    node.mig_used[gpu].remove(amount)
            else:
                node.gpu_free[gpu] -= sign * amount
        # one node (a one-pod job, a gang on one node): all the job's CPU and memory there
        first = placements[0][0] if placements else None
        if first is not None and (len(placements) == 1 or all(slot[0] == first for slot in placements)):
            self._book_node(first, job, 1.0, sign, [slot[1] for slot in placements])
        else:
            for node_name, share in self._shares(job, placements).items():
                self._book_node(node_name, job, share, sign)
        self.quotas.add(job.team, job.flavour, sign * job.gpu_equivalents)

    def _book_node(self, node_name: str, job: Job, share: float, sign: int, gpus: list[int] | None = None) -> None:
        """The ``share`` of ``job``'s CPU and memory on node ``node_name`` (its GPUs, ``gpus`` when known,
        are booked already)."""
        node = self.nodes[node_name]
        node.cpu_free -= sign * int(job.cpu_milli * job.pods * share)
        node.mem_free -= sign * int(job.mem_bytes * job.pods * share)
        if self._arrays is not None:
            self._arrays.book(node_name, gpus)
        self._book_priority(node_name, job.priority, sign)

    def runs_below(self, priority: int) -> bool:
        """Whether any node runs work of a priority lower than ``priority``."""
        running = self._running_priorities
        return bool(running) and min(running) < priority

    def _book_priority(self, node_name: str, priority: int, sign: int) -> None:
        running = self._running_priorities
        total = running.get(priority, 0) + sign
        if total:
            running[priority] = total
        else:
            del running[priority]
        on_node = self._priorities.get(node_name)
        if on_node is None:
            on_node = self._priorities[node_name] = {}
        left = on_node.get(priority, 0) + sign
        if left:
            on_node[priority] = left
            if left > 1 or sign < 0:
                return  # the node ran this priority already: its highest stays
        else:
            del on_node[priority]
        if self._arrays is not None:
            self._arrays.top_priority[self._arrays.index[node_name]] = max(on_node, default=NO_PRIORITY)
