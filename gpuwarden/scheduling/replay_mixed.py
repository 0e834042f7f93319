"""Mixed inference + training on a simulated two-model fleet (H100 and H200 by default): naive
whole-GPU first-fit vs gpuwarden.

The fleet is the caller's cluster snapshot, read into the scheduling engine the way the live
planner reads a cluster (``planner.state_from_snapshot``). ``gpuwarden simulate mixed`` and the
bench build it with the simulator's fleet generator from :meth:`MixedSpec.pools` (default 8 cloud
nodes of ``cloud_model``, a quarter of them spot, and 8 on-prem nodes of ``on_prem_model``, 8 GPUs
each = 128 GPUs; one node per NVLink domain, 4 nodes per leaf switch): scheduling never imports the
simulator. The two models are any MIG models of the GPU catalogue (:mod:`gpuwarden.fleet.gpu_catalogue`),
by any name it resolves; their MIG profiles come from it too. The fleet receives the
*same* seeded stream of jobs under both policies, in the same run, through the one replay driver
(:mod:`.replay`):

- inference services: each asks for one MIG slice (1g, 2g or 3g of either model, mix below) for its
  lifetime; a service keeps its slice ~70% busy (on a whole GPU the same service leaves most of it
  idle);
- training jobs: 1, 2, 4, 8 or 16 GPUs (16 = a 2-pod gang), checkpointable, log-normal hours.

The default stream asks for more than the fleet holds (``demand_ratio`` >= 1.1: GPU-equivalents
asked for, a MIG slice counted as its share of a GPU, over the measured window), so a good
scheduler is limited by the fleet, not by the work.

``naive``: every request takes whole GPUs (a MIG request gets a whole GPU), first fit, no topology.
``gpuwarden``: MIG layouts advised (``mig.advise_layouts``) from the expected inference demand, MIG
requests on MIG slices, best-fit and NVLink / leaf-switch packing for training, inference kept off
spot, checkpointable training allowed on spot, inference preempts training (checkpoint, resume), and
a training job blocked only by scattered free GPUs starts once checkpointable jobs move out of its
way (``QueuePolicy.defragment``). Every resume costs ``restore_seconds`` (300 s: pod start and
checkpoint load) of held GPUs that compute nothing.

Reported over the window after ``warmup_hours`` (the fleet starts empty): GPU allocation,
*useful* utilisation (busy compute: a service's 70% of its slice's share, a training GPU's 90%),
training GPU-hours per hour, waiting jobs and their reasons, and the demand ratio. Jobs served,
suspends and moves are counted over the whole run, warm-up included.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from gpuwarden.fleet import ClusterSnapshot, Location, PriceTier, WorkloadKind
from gpuwarden.fleet.gpu_catalogue import gpu_catalogue
from gpuwarden.fleet.semantics import mig_share

from .engine import (WAITING, DecisionKind, Job, NodeState, PlacementOptions, PreemptMode, QueueOrder, QueuePolicy,
                     Scheduler, State)
from .errors import SchedulingError
from .mig import advise_layouts
from .planner import state_from_snapshot
from .replay import JobModel, Replay, ReplayMetrics, fresh_copy

# A node pool for the fleet generator: (pool, GPU model, location, price tier, share of the nodes,
# MIG share of the pool's nodes), the simulator's ``fleetgen.PoolSpec`` (scheduling does not import it).
PoolSpec = tuple[str, str, Location, PriceTier, float, float]
INFERENCE_MIX = {"1g": 0.5, "2g": 0.3, "3g": 0.2}  # a service's slice by compute slices
TRAINING_GPUS = {1: 0.3, 2: 0.2, 4: 0.2, 8: 0.2, 16: 0.1}
TRAINING_BUSY_RATIO = 0.9  # a training GPU's busy compute
SERVICE_BUSY_RATIO = 0.7  # a service's busy share of its slice


def mig_profiles(model: str) -> dict[str, str]:
    """Size (``1g``, ...) -> the catalogue's smallest-memory MIG profile of ``model`` with that many
    compute slices (NVIDIA's order breaks ties): H100 1g.10gb, 2g.20gb, 3g.40gb."""
    spec = gpu_catalogue().model(model)
    out = {}
    for size in INFERENCE_MIX:
        profile = spec.smallest_profile(int(size.rstrip("g")))
        if profile is None:
            raise SchedulingError(f"the mixed replay needs a MIG model with {size} profiles; {spec.name} has "
                                  f"{', '.join(spec.mig_profiles) or 'no MIG'}")
        out[size] = profile.name
    return out


@dataclass(frozen=True)
class MixedSpec:
    cloud_model: str = "H100"  # reserved cloud nodes, a quarter of them spot
    cloud_nodes: int = 8
    on_prem_model: str = "H200"  # reserved on-prem nodes
    on_prem_nodes: int = 8
    gpus_per_node: int = 8
    hours: float = 72.0
    warmup_hours: float = 24.0  # not measured: the fleet starts empty (at most a third of a short run)
    inference_per_hour: float = 4.0
    inference_hours: float = 12.5
    training_per_hour: float = 7.0
    training_median_hours: float = 4.0
    seed: int = 42
    mig_headroom: float = 0.95  # MIG instances advised per expected live service
    # A suspended job's restart (pod start, checkpoint load) before it computes again: held GPUs,
    # no progress and no useful work.
    restore_seconds: float = 300.0

    def __post_init__(self) -> None:
        cloud, on_prem = (gpu_catalogue().model(m).name for m in self.models)
        if cloud == on_prem:
            raise SchedulingError(f"the mixed replay's two models are one ({cloud}): name two models")

    @property
    def measured_from_seconds(self) -> float:
        return min(self.warmup_hours, self.hours / 3) * 3600

    @property
    def nodes(self) -> int:
        return self.cloud_nodes + self.on_prem_nodes

    @property
    def models(self) -> tuple[str, str]:
        """The two models as written (``H100``): the services' MIG profiles and the pools' names."""
        return (self.cloud_model, self.on_prem_model)

    def pools(self) -> tuple[PoolSpec, ...]:
        """The fleet's node pools, for the caller's fleet generator (named by the models as written:
        ``mixed-h100``, ``mixed-h100-spot``, ``mixed-h200``)."""
        total = self.nodes
        spot = self.cloud_nodes // 4
        cloud, on_prem = (gpu_catalogue().model(m).name for m in self.models)
        cloud_pool, on_prem_pool = (f"mixed-{m.lower()}" for m in self.models)
        return (
            (cloud_pool, cloud, Location.CLOUD, PriceTier.RESERVED, (self.cloud_nodes - spot) / total, 0.0),
            (f"{cloud_pool}-spot", cloud, Location.CLOUD, PriceTier.SPOT, spot / total, 0.0),
            (on_prem_pool, on_prem, Location.ON_PREM, PriceTier.RESERVED, self.on_prem_nodes / total, 0.0),
        )


def workload(spec: MixedSpec) -> list[Job]:
    rng = np.random.default_rng(spec.seed)
    profiles = {model: mig_profiles(model) for model in spec.models}
    names = {model: gpu_catalogue().model(model).name for model in spec.models}
    jobs: list[Job] = []
    t = 0.0
    while True:
        t += rng.exponential(3600.0 / spec.inference_per_hour)
        if t >= spec.hours * 3600:
            break
        model = spec.models[0] if rng.random() < 0.5 else spec.models[1]
        size = str(rng.choice(list(INFERENCE_MIX), p=list(INFERENCE_MIX.values())))
        jobs.append(Job(name=f"svc-{len(jobs):04d}", team="inference", kind=WorkloadKind.INFERENCE, priority=3,
                        mig_profile=profiles[model][size], gpu_model=names[model], submitted=t,
                        duration=float(rng.exponential(spec.inference_hours * 3600))))
    t = 0.0
    while True:
        t += rng.exponential(3600.0 / spec.training_per_hour)
        if t >= spec.hours * 3600:
            break
        gpus = int(rng.choice(list(TRAINING_GPUS), p=list(TRAINING_GPUS.values())))
        jobs.append(Job(name=f"train-{len(jobs):04d}", team="research", kind=WorkloadKind.TRAINING, priority=2,
                        pods=2 if gpus == 16 else 1, gpus_per_pod=8 if gpus == 16 else gpus, checkpointable=True,
                        submitted=t, duration=float(rng.lognormal(np.log(spec.training_median_hours * 3600), 0.8))))
    return sorted(jobs, key=lambda j: j.submitted)


def demand_ratio(jobs: list[Job], spec: MixedSpec) -> float:
    """GPU-equivalents the jobs ask for while the window runs, over the fleet's GPUs in it."""
    start, end = spec.measured_from_seconds, spec.hours * 3600
    asked = sum(j.gpu_equivalents * max(0.0, min(end, j.submitted + (j.duration or 0.0)) - max(start, j.submitted))
                for j in jobs)
    return asked / (spec.nodes * spec.gpus_per_node * (end - start))


@dataclass(frozen=True)
class Ceiling:
    """The most any schedule that serves every service from its submission could reach over the
    measured window (shares of the fleet's GPU-seconds)."""

    useful_ratio: float  # useful utilisation
    training_gpus: float  # training GPU-hours per hour


def ceiling(jobs: list[Job], spec: MixedSpec) -> Ceiling:
    """An upper bound, not a schedule. At each instant the services alive since their submission hold
    their slices' shares ``I(t)`` (``SERVICE_BUSY_RATIO`` of it useful); training can hold at most the
    rest of the fleet, ``C - I(t)``, and at most the GPUs of every training job submitted by then (a job
    may run late, never before its submission); over the window, no job computes longer than its
    duration nor before its submission; each training GPU is ``TRAINING_BUSY_RATIO`` useful. Perfect
    packing, no MIG layout, no restore time: every real schedule that serves all services is at or
    below it. (A schedule that leaves services waiting could exceed it with training, which is busier.)"""
    start, end = spec.measured_from_seconds, spec.hours * 3600
    fleet = float(spec.nodes * spec.gpus_per_node)
    services = [j for j in jobs if j.kind == WorkloadKind.INFERENCE]
    training = [j for j in jobs if j.kind != WorkloadKind.INFERENCE]
    edges = {start, end}
    edges.update(t for j in services for t in (j.submitted, j.submitted + (j.duration or 0.0)) if start < t < end)
    edges.update(j.submitted for j in training if start < j.submitted < end)
    times = np.array(sorted(edges))
    mids, widths = (times[:-1] + times[1:]) / 2, np.diff(times)
    alive = np.zeros(len(mids))
    for j in services:
        alive += np.where((mids >= j.submitted) & (mids < j.submitted + (j.duration or 0.0)), j.gpu_equivalents, 0.0)
    alive = np.minimum(alive, fleet)
    submitted = np.zeros(len(mids))
    for j in training:
        submitted += np.where(mids >= j.submitted, j.gpu_equivalents, 0.0)
    room = float((np.minimum(fleet - alive, submitted) * widths).sum())
    work = sum(j.gpu_equivalents * min(j.duration or 0.0, max(0.0, end - max(start, j.submitted))) for j in training)
    train = min(room, work)
    window = end - start
    useful = SERVICE_BUSY_RATIO * float((alive * widths).sum()) + TRAINING_BUSY_RATIO * train
    return Ceiling(useful_ratio=useful / (fleet * window), training_gpus=train / window)


def run_mixed(spec: MixedSpec, fleet: ClusterSnapshot) -> list[dict[str, object]]:
    """naive and gpuwarden on ``fleet`` (nodes and GPUs of a snapshot; its workloads are ignored: the
    fleet starts empty), the same job stream for both; each row carries the stream's demand ratio and
    its :func:`ceiling`."""
    jobs = workload(spec)
    bound = ceiling(jobs, spec)
    shared = {"demand_ratio": demand_ratio(jobs, spec), "useful_ceiling": bound.useful_ratio,
              "training_gpu_hours_per_hour_ceiling": bound.training_gpus}
    return [{**_run(jobs, spec, "naive", fleet), **shared}, {**_run(jobs, spec, "gpuwarden", fleet), **shared}]


def _advise_mig(nodes: list[NodeState], spec: MixedSpec) -> None:
    """MIG on for as many non-spot GPUs of each model as the expected live services need."""
    for written in spec.models:
        model, profiles = gpu_catalogue().model(written).name, mig_profiles(written)
        pool = [n for n in nodes if n.model == model and n.tier != PriceTier.SPOT]
        alive = spec.inference_per_hour / len(spec.models) * spec.inference_hours * spec.mig_headroom
        demand = {profiles[k]: int(math.ceil(alive * p)) for k, p in INFERENCE_MIX.items()}
        advice = advise_layouts(model, len(pool) * spec.gpus_per_node, demand)
        layouts = [layout for layout, count in advice.layouts for _ in range(count)]
        slots = [(n, g) for n in pool for g in range(n.gpu_count)]
        for (node, g), layout in zip(slots, layouts):
            node.mig_layout[g] = layout
            node.gpu_free[g] = 0


class _MixedMetrics(ReplayMetrics):
    """Held and useful GPU-seconds and training GPU-seconds inside the measured window; starts,
    suspends and moves (a job suspended and resumed in one pass) over the whole run."""

    def __init__(self, spec: MixedSpec, asked_share: dict[str, float]) -> None:
        self.start, self.horizon = spec.measured_from_seconds, spec.hours * 3600
        self.asked_share = asked_share  # a service's slice as a share of its GPU, also when it holds a whole one
        self.held = self.useful = self.training = 0.0
        self.served = {"inference": 0, "training": 0}
        self.moves = self.suspends = 0
        self._suspended_at: dict[str, float] = {}

    def accrue(self, replay: Replay, start: float, end: float) -> None:
        lo, hi = max(start, self.start), min(end, self.horizon)
        if hi <= lo:
            return
        for name, j in replay.running.items():
            computing = replay.computing_seconds(name, lo, hi)  # restoring time is held, not used
            self.held += (hi - lo) * j.gpu_equivalents  # its slice, or the whole GPU it took
            if j.kind == WorkloadKind.INFERENCE:
                self.useful += computing * SERVICE_BUSY_RATIO * self.asked_share[name]
            else:
                self.useful += computing * TRAINING_BUSY_RATIO * j.gpu_equivalents
                self.training += computing * j.gpu_equivalents

    def started(self, replay: Replay, job: Job, kind: DecisionKind) -> None:
        if kind == DecisionKind.BIND:
            self.served["inference" if job.kind == WorkloadKind.INFERENCE else "training"] += 1
        self.moves += self._suspended_at.get(job.name) == replay.now

    def stopped(self, replay: Replay, job: Job, kind: DecisionKind) -> None:
        if kind == DecisionKind.SUSPEND:
            self.suspends += 1
            self._suspended_at[job.name] = replay.now


NAIVE = QueuePolicy("naive", placement=PlacementOptions(topology=False, scorer="firstfit", mig=False))
GPUWARDEN = QueuePolicy("gpuwarden-mixed", order=QueueOrder.FIFO, preempt=PreemptMode.PRIORITY, checkpoint=True,
                        defragment=True)


def _run(template: list[Job], spec: MixedSpec, policy: str, fleet: ClusterSnapshot) -> dict[str, object]:
    started = time.perf_counter()
    nodes = list(state_from_snapshot(fleet)[0].nodes.values())
    if policy == "gpuwarden":
        _advise_mig(nodes, spec)
        scheduler = Scheduler(GPUWARDEN)
        jobs = [fresh_copy(j) for j in template]
    else:  # naive Kubernetes: a MIG request becomes a request for a whole GPU of that model
        scheduler = Scheduler(NAIVE)
        jobs = [fresh_copy(j, mig_profile=None) for j in template]
    state = State(nodes)
    metrics = _MixedMetrics(spec, {j.name: mig_share(j.mig_profile, j.gpu_model) for j in template if j.mig_profile})
    Replay(state, scheduler, jobs, JobModel(resume_overhead_seconds=spec.restore_seconds), metrics,
           horizon_seconds=spec.hours * 3600).run()
    failures: dict[str, int] = {}
    for j in state.jobs.values():
        if j.state in WAITING and j.wait_reason:
            reason = j.wait_reason.split(";")[0].split(":")[0]
            failures[reason] = failures.get(reason, 0) + 1
    gpus = sum(n.gpu_count for n in nodes)
    window = metrics.horizon - metrics.start
    return {
        "policy": policy, "gpus": gpus, "hours": spec.hours, "measured_hours": window / 3600,
        "allocation": metrics.held / (window * gpus),
        "useful_utilisation": metrics.useful / (window * gpus),
        "inference_served": metrics.served["inference"], "training_started": metrics.served["training"],
        "suspends": metrics.suspends, "moves": metrics.moves,
        "training_gpu_hours_per_hour": metrics.training / window,
        "waiting_at_end": sum(1 for j in state.jobs.values() if j.state in WAITING),
        "wait_reasons": failures, "seconds": time.perf_counter() - started,
    }
