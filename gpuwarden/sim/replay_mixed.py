"""Mixed inference + training on a simulated H100/H200 fleet: naive whole-GPU first-fit vs gpuwarden.

The fleet comes from the simulator's fleet generator (``fleetgen.build_fleet``, pools below:
default 8 H100 nodes, a quarter of them spot, and 8 H200 nodes, 8 GPUs each = 128 GPUs; one node
per NVLink domain, 4 nodes per leaf switch) and is read into the scheduling engine the way the
live planner reads a cluster (``planner.state_from_snapshot``). It receives the *same* seeded
stream of jobs under both policies, in the same run:

- inference services: each asks for one MIG slice (1g, 2g or 3g of H100 / H200, mix below) for its
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

import heapq
import math
import time
from dataclasses import dataclass
from datetime import datetime, UTC

import numpy as np

from gpuwarden.fleet import ClusterSnapshot, Location, PriceTier, WorkloadKind
from gpuwarden.fleet.semantics import mig_share
from gpuwarden.scheduling import (
    WAITING,
    DecisionKind,
    Job,
    JobState,
    NodeState,
    PlacementOptions,
    QueuePolicy,
    Scheduler,
    State,
    state_from_snapshot,
)
from gpuwarden.scheduling.mig import MODEL_ALIASES, advise_layouts

from .fleetgen import PoolSpec, build_fleet

INFERENCE_MIX = {"1g": 0.5, "2g": 0.3, "3g": 0.2}
PROFILES = {"H100": {"1g": "1g.10gb", "2g": "2g.20gb", "3g": "3g.40gb"},
            "H200": {"1g": "1g.18gb", "2g": "2g.35gb", "3g": "3g.71gb"}}
TRAINING_GPUS = {1: 0.3, 2: 0.2, 4: 0.2, 8: 0.2, 16: 0.1}
TRAINING_BUSY_RATIO = 0.9  # a training GPU's busy compute
SERVICE_BUSY_RATIO = 0.7  # a service's busy share of its slice


@dataclass(frozen=True)
class MixedSpec:
    h100_nodes: int = 8
    h200_nodes: int = 8
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

    @property
    def measured_from_seconds(self) -> float:
        return min(self.warmup_hours, self.hours / 3) * 3600

    def pools(self) -> tuple[PoolSpec, ...]:
        total = self.h100_nodes + self.h200_nodes
        spot = self.h100_nodes // 4
        return (
            ("mixed-h100", MODEL_ALIASES["H100"], Location.CLOUD, PriceTier.RESERVED, (self.h100_nodes - spot) / total, 0.0),
            ("mixed-h100-spot", MODEL_ALIASES["H100"], Location.CLOUD, PriceTier.SPOT, spot / total, 0.0),
            ("mixed-h200", MODEL_ALIASES["H200"], Location.ON_PREM, PriceTier.RESERVED, self.h200_nodes / total, 0.0),
        )


def fleet(spec: MixedSpec) -> list[NodeState]:
    """The simulator's fleet generator, read into the engine as the planner reads a cluster."""
    built = build_fleet("mixed", spec.h100_nodes + spec.h200_nodes, spec.gpus_per_node, None,
                        pools=spec.pools(), leaf_nodes=4)
    snapshot = ClusterSnapshot(taken_at=datetime(2026, 1, 1, tzinfo=UTC), nodes=built.nodes,
                               gpus=built.gpus, workloads=(), teams=())
    state, _ = state_from_snapshot(snapshot)
    return list(state.nodes.values())


def workload(spec: MixedSpec) -> list[Job]:
    rng = np.random.default_rng(spec.seed)
    jobs: list[Job] = []
    t = 0.0
    while True:
        t += rng.exponential(3600.0 / spec.inference_per_hour)
        if t >= spec.hours * 3600:
            break
        model = "H100" if rng.random() < 0.5 else "H200"
        size = str(rng.choice(list(INFERENCE_MIX), p=list(INFERENCE_MIX.values())))
        jobs.append(Job(name=f"svc-{len(jobs):04d}", team="inference", kind=WorkloadKind.INFERENCE, priority=3,
                        mig_profile=PROFILES[model][size], gpu_model=MODEL_ALIASES[model], submitted=t,
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
    gpus = (spec.h100_nodes + spec.h200_nodes) * spec.gpus_per_node
    return asked / (gpus * (end - start))


def _as_whole(job: Job) -> Job:
    """Naive Kubernetes: a MIG request becomes a request for a whole GPU of that model."""
    return Job(**{k: getattr(job, k) for k in ("name", "team", "priority", "pods", "gpus_per_pod", "gpu_model",
                                              "kind", "checkpointable", "submitted", "duration")})


NAIVE = QueuePolicy("naive", placement=PlacementOptions(topology=False, scorer="firstfit", mig=False))
GPUWARDEN = QueuePolicy("gpuwarden-mixed", order="fifo", preempt="priority", checkpoint=True, defragment=True)


def run_mixed(spec: MixedSpec = MixedSpec()) -> list[dict[str, object]]:
    jobs = workload(spec)
    ratio = demand_ratio(jobs, spec)
    return [{**_run(jobs, spec, "naive"), "demand_ratio": ratio}, {**_run(jobs, spec, "gpuwarden"), "demand_ratio": ratio}]


def _advise_mig(nodes: list[NodeState], spec: MixedSpec) -> None:
    """MIG on for as many non-spot GPUs of each model as the expected live services need."""
    for short, profiles in PROFILES.items():
        model = MODEL_ALIASES[short]
        pool = [n for n in nodes if n.model == model and n.tier != PriceTier.SPOT]
        alive = spec.inference_per_hour / len(PROFILES) * spec.inference_hours * spec.mig_headroom
        demand = {profiles[k]: int(math.ceil(alive * p)) for k, p in INFERENCE_MIX.items()}
        advice = advise_layouts(model, len(pool) * spec.gpus_per_node, demand)
        layouts = [layout for layout, count in advice.layouts for _ in range(count)]
        slots = [(n, g) for n in pool for g in range(n.gpu_count)]
        for (node, g), layout in zip(slots, layouts):
            node.mig_layout[g] = layout
            node.gpu_free[g] = 0


def _run(template: list[Job], spec: MixedSpec, policy: str) -> dict[str, object]:
    started = time.perf_counter()
    nodes = fleet(spec)
    if policy == "gpuwarden":
        _advise_mig(nodes, spec)
        scheduler = Scheduler(GPUWARDEN)
        jobs = [Job(**{k: getattr(j, k) for k in _FIELDS}) for j in template]
    else:
        scheduler = Scheduler(NAIVE)
        jobs = [_as_whole(j) for j in template]
    state = State(nodes)
    events: list[tuple[float, int, str]] = []
    for j in jobs:
        heapq.heappush(events, (j.submitted, 0, j.name))
        state.jobs[j.name] = j
        j.state = JobState.FUTURE
    now = 0.0
    start, horizon = spec.measured_from_seconds, spec.hours * 3600
    alloc_integral = useful_integral = training_done = 0.0
    served = {"inference": 0, "training": 0}
    moves = suspends = 0
    running: set[str] = set()
    asked_share = {j.name: mig_share(j.mig_profile, j.gpu_model) for j in template if j.mig_profile}
    epoch: dict[str, int] = {}
    ran_from: dict[str, float] = {}  # when a running job computes from (after its restore, if resumed)

    def accrue(to: float) -> None:
        nonlocal now, alloc_integral, useful_integral, training_done
        lo, hi = max(now, start), min(to, horizon)
        if hi > lo:
            dt = hi - lo
            for name in running:
                j = state.jobs[name]
                computing = max(0.0, hi - max(lo, ran_from.get(name, lo)))  # restoring time is held, not used
                if j.kind == WorkloadKind.INFERENCE:
                    share = asked_share[name]  # the slice it asked for, also when it holds a whole GPU
                    useful_integral += computing * SERVICE_BUSY_RATIO * share
                    alloc_integral += dt * j.gpu_equivalents  # its slice, or the whole GPU it took
                else:
                    gpus = j.gpu_equivalents
                    useful_integral += computing * TRAINING_BUSY_RATIO * gpus
                    alloc_integral += dt * gpus
                    training_done += computing * gpus
        now = max(now, min(to, horizon))

    while events:
        t, ep, name = heapq.heappop(events)
        if t > horizon:
            break
        accrue(t)
        job = state.jobs[name]
        if ep == 0:
            job.state = JobState.PENDING
        elif ep == epoch.get(name) and name in running:
            state.release(job, job.placements)
            job.placements, job.state = [], JobState.DONE
            running.discard(name)
        else:
            continue
        suspended_now: set[str] = set()  # a job suspended and resumed in one pass was moved
        for d in scheduler.schedule(state, now):
            j = state.jobs[d.job]
            if d.kind in (DecisionKind.BIND, DecisionKind.RESUME):
                if d.kind == DecisionKind.BIND:
                    served["inference" if j.kind == WorkloadKind.INFERENCE else "training"] += 1
                epoch[j.name] = epoch.get(j.name, 0) + 1
                running.add(j.name)
                ran_from[j.name] = now + (spec.restore_seconds if d.kind == DecisionKind.RESUME else 0.0)
                heapq.heappush(events, (ran_from[j.name] + max((j.duration or 0.0) - j.progress, 1.0), epoch[j.name],
                                        j.name))
                moves += j.name in suspended_now
            else:  # suspended (checkpointed: keeps its progress) or preempted
                running.discard(j.name)
                epoch[j.name] = epoch.get(j.name, 0) + 1
                if d.kind == DecisionKind.SUSPEND:
                    suspends += 1
                    suspended_now.add(j.name)
                computed = max(0.0, now - ran_from.pop(j.name, now))
                j.progress += computed if d.kind == DecisionKind.SUSPEND else -j.progress
    accrue(horizon)
    failures: dict[str, int] = {}
    for j in state.jobs.values():
        if j.state in WAITING and j.wait_reason:
            reason = j.wait_reason.split(";")[0].split(":")[0]
            failures[reason] = failures.get(reason, 0) + 1
    gpus = sum(n.gpu_count for n in nodes)
    window = horizon - start
    return {
        "policy": policy, "gpus": gpus, "hours": spec.hours, "measured_hours": window / 3600,
        "allocation": alloc_integral / (window * gpus),
        "useful_utilisation": useful_integral / (window * gpus),
        "inference_served": served["inference"], "training_started": served["training"],
        "suspends": suspends, "moves": moves,
        "training_gpu_hours_per_hour": training_done / window,
        "waiting_at_end": sum(1 for j in state.jobs.values() if j.state in WAITING),
        "wait_reasons": failures, "seconds": time.perf_counter() - started,
    }


_FIELDS = ("name", "team", "priority", "pods", "gpus_per_pod", "milli", "mig_profile", "gpu_model", "cpu_milli",
           "mem_bytes", "kind", "checkpointable", "submitted", "duration", "flavour")
