"""Mixed inference + training on a simulated H100/H200 fleet: naive whole-GPU first-fit vs gpuwarden.

The fleet is the caller's cluster snapshot, read into the scheduling engine the way the live
planner reads a cluster (``planner.state_from_snapshot``). ``gpuwarden simulate mixed`` and the
bench build it with the simulator's fleet generator from :meth:`MixedSpec.pools` (default 8 H100
nodes, a quarter of them spot, and 8 H200 nodes, 8 GPUs each = 128 GPUs; one node per NVLink
domain, 4 nodes per leaf switch): scheduling never imports the simulator. The fleet receives the
*same* seeded stream of jobs under both policies, in the same run, through the one replay driver
(:mod:`.replay`):

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

import math
import time
from dataclasses import dataclass

import numpy as np

from gpuwarden.fleet import ClusterSnapshot, Location, PriceTier, WorkloadKind
from gpuwarden.fleet.semantics import mig_share

from .engine import (WAITING, DecisionKind, Job, NodeState, PlacementOptions, PreemptMode, QueueOrder, QueuePolicy,
                     Scheduler, State)
from .mig import MODEL_ALIASES, advise_layouts
from .planner import state_from_snapshot
from .replay import JobModel, Replay, ReplayMetrics, fresh_copy

# A node pool for the fleet generator: (pool, GPU model, location, price tier, share of the nodes,
# MIG share of the pool's nodes), the simulator's ``fleetgen.PoolSpec`` (scheduling does not import it).
PoolSpec = tuple[str, str, Location, PriceTier, float, float]
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

    @property
    def nodes(self) -> int:
        return self.h100_nodes + self.h200_nodes

    def pools(self) -> tuple[PoolSpec, ...]:
        """The fleet's node pools, for the caller's fleet generator."""
        total = self.nodes
        spot = self.h100_nodes // 4
        return (
            ("mixed-h100", MODEL_ALIASES["H100"], Location.CLOUD, PriceTier.RESERVED, (self.h100_nodes - spot) / total, 0.0),
            ("mixed-h100-spot", MODEL_ALIASES["H100"], Location.CLOUD, PriceTier.SPOT, spot / total, 0.0),
            ("mixed-h200", MODEL_ALIASES["H200"], Location.ON_PREM, PriceTier.RESERVED, self.h200_nodes / total, 0.0),
        )


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
    return asked / (spec.nodes * spec.gpus_per_node * (end - start))


def run_mixed(spec: MixedSpec, fleet: ClusterSnapshot) -> list[dict[str, object]]:
    """naive and gpuwarden on ``fleet`` (nodes and GPUs of a snapshot; its workloads are ignored: the
    fleet starts empty), the same job stream for both."""
    jobs = workload(spec)
    ratio = demand_ratio(jobs, spec)
    return [{**_run(jobs, spec, "naive", fleet), "demand_ratio": ratio},
            {**_run(jobs, spec, "gpuwarden", fleet), "demand_ratio": ratio}]


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
