"""Mixed inference + training on a simulated H100/H200 fleet: naive whole-GPU first-fit vs gpuwarden.

The fleet (default 8 H100 nodes and 8 H200 nodes, 8 GPUs each = 128 GPUs; nodes in NVLink domains of
one node, 4 nodes per leaf switch; a quarter of the H100 nodes are spot) receives the *same* seeded
stream of jobs under both policies, in the same run:

- inference services: each asks for one MIG slice (1g, 2g or 3g of H100 / H200, mix below) for its
  lifetime; used utilisation of a service on its slice is drawn around 70% (inference keeps a small
  slice busy; on a whole GPU the same service leaves most of it idle);
- training jobs: 1, 2, 4, 8 or 16 GPUs (16 = a 2-pod gang), checkpointable, a duration in hours.

``naive``: every request takes whole GPUs (a MIG request gets a whole GPU), first fit, no topology,
no tier rules. ``gpuwarden``: MIG layouts advised from the inference demand on part of the fleet,
MIG requests on MIG slices, best-fit and NVLink / leaf-switch packing for training, inference kept
off spot, checkpointable training allowed on spot.

Reported: GPU allocation (GPU-equivalents in use / GPUs), *useful* utilisation (the busy compute,
counting a MIG slice's work over a whole GPU as slice/7 of that GPU), jobs and services served,
training throughput (GPU-hours of training done per hour), placement failures by reason.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np

from gpuwarden.fleet import PriceTier, WorkloadKind

from .engine import Job, JobState, NodeState, PlacementOptions, QueuePolicy, Scheduler, State
from .mig import MODEL_ALIASES, advise_layouts

INFERENCE_MIX = {"1g": 0.5, "2g": 0.3, "3g": 0.2}
PROFILES = {"H100": {"1g": "1g.10gb", "2g": "2g.20gb", "3g": "3g.40gb"},
            "H200": {"1g": "1g.18gb", "2g": "2g.35gb", "3g": "3g.71gb"}}


@dataclass(frozen=True)
class MixedSpec:
    h100_nodes: int = 8
    h200_nodes: int = 8
    gpus_per_node: int = 8
    hours: float = 72.0
    inference_per_hour: float = 6.0
    inference_hours: float = 24.0
    training_per_hour: float = 3.0
    seed: int = 42
    mig_fraction: float = 0.375  # share of each model's nodes gpuwarden turns MIG on for


def fleet(spec: MixedSpec) -> list[NodeState]:
    nodes = []
    for model, count in (("H100", spec.h100_nodes), ("H200", spec.h200_nodes)):
        for i in range(count):
            tier = PriceTier.SPOT if model == "H100" and i >= count - count // 4 else PriceTier.RESERVED
            nodes.append(NodeState(name=f"{model.lower()}-{i:02d}", model=MODEL_ALIASES[model],
                                   gpu_count=spec.gpus_per_node, cpu_free=10**9, mem_free=10**15, tier=tier,
                                   nvlink_domain=f"{model.lower()}-{i:02d}", leaf_switch=f"{model.lower()}-leaf{i // 4}"))
    return nodes


def workload(spec: MixedSpec) -> list[Job]:
    rng = np.random.default_rng(spec.seed)
    jobs: list[Job] = []
    t = 0.0
    while True:
        t += rng.exponential(3600.0 / spec.inference_per_hour)
        if t >= spec.hours * 3600:
            break
        model = "H100" if rng.random() < 0.5 else "H200"
        size = rng.choice(list(INFERENCE_MIX), p=list(INFERENCE_MIX.values()))
        jobs.append(Job(name=f"svc-{len(jobs):04d}", team="inference", kind=WorkloadKind.INFERENCE, priority=3,
                        mig_profile=PROFILES[model][size], gpu_model=MODEL_ALIASES[model], submitted=t,
                        duration=rng.exponential(spec.inference_hours * 3600)))
    t = 0.0
    while True:
        t += rng.exponential(3600.0 / spec.training_per_hour)
        if t >= spec.hours * 3600:
            break
        gpus = int(rng.choice([1, 2, 4, 8, 16], p=[0.3, 0.2, 0.2, 0.2, 0.1]))
        jobs.append(Job(name=f"train-{len(jobs):04d}", team="research", kind=WorkloadKind.TRAINING, priority=2,
                        pods=2 if gpus == 16 else 1, gpus_per_pod=8 if gpus == 16 else gpus, checkpointable=True,
                        submitted=t, duration=rng.lognormal(np.log(4 * 3600), 0.8)))
    return sorted(jobs, key=lambda j: j.submitted)


def _as_whole(job: Job) -> Job:
    """Naive Kubernetes: a MIG request becomes a request for a whole GPU of that model."""
    copy = Job(**{k: getattr(job, k) for k in ("name", "team", "priority", "pods", "gpus_per_pod", "gpu_model",
                                              "kind", "checkpointable", "submitted", "duration")})
    return copy


NAIVE = QueuePolicy("naive", placement=PlacementOptions(topology=False, best_fit=False, mig=False))
GPUWARDEN = QueuePolicy("gpuwarden-mixed", order="fifo", preempt="priority", checkpoint=True)


def run_mixed(spec: MixedSpec = MixedSpec()) -> list[dict]:
    jobs = workload(spec)
    return [_run(jobs, spec, "naive"), _run(jobs, spec, "gpuwarden")]


def _run(template: list[Job], spec: MixedSpec, policy: str) -> dict:
    started = time.perf_counter()
    nodes = fleet(spec)
    if policy == "gpuwarden":
        # MIG layouts from the expected inference demand (services alive at once ~ rate x lifetime)
        for short, model in MODEL_ALIASES.items():
            if short not in PROFILES:
                continue
            pool = [n for n in nodes if n.model == model and n.tier != PriceTier.SPOT]
            mig_nodes = pool[: max(1, int(round(len(pool) * spec.mig_fraction / (1 - 0.25 * (short == "H100")))))]
            alive = spec.inference_per_hour * spec.inference_hours / 2 * 1.3
            demand = {PROFILES[short][k]: int(np.ceil(alive * p)) for k, p in INFERENCE_MIX.items()}
            advice = advise_layouts(model, len(mig_nodes) * spec.gpus_per_node, demand)
            layouts = [layout for layout, count in advice.layouts for _ in range(count)]
            slots = [(n, g) for n in mig_nodes for g in range(n.gpu_count)]
            for (node, g), layout in zip(slots, layouts):
                node.mig_layout[g] = layout
                node.gpu_free[g] = 0
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
    horizon = spec.hours * 3600
    alloc_integral = useful_integral = training_done = 0.0
    served = {"inference": 0, "training": 0}
    failures: dict[str, int] = {}
    running: set[str] = set()
    slice_of = {name: int(p.split("g.")[0]) for name, p in ((j.name, j.mig_profile) for j in template) if p}

    def accrue(to: float) -> None:
        nonlocal now, alloc_integral, useful_integral, training_done
        dt = min(to, horizon) - now
        if dt > 0:
            for name in running:
                j = state.jobs[name]
                if j.kind == WorkloadKind.INFERENCE:
                    slices = slice_of[name]
                    # the service keeps its slice ~70% busy; as work over a whole GPU that is 0.7 * slices / 7
                    useful_integral += dt * 0.7 * slices / 7.0
                    alloc_integral += dt * (slices / 7.0 if j.mig_profile else 1.0)
                else:
                    useful_integral += dt * 0.9 * j.pods * j.gpus_per_pod
                    alloc_integral += dt * j.pods * j.gpus_per_pod
                    training_done += dt * j.pods * j.gpus_per_pod
        now = max(now, min(to, horizon))

    epoch: dict[str, int] = {}
    while events:
        t, ep, name = heapq.heappop(events)
        if t > horizon:
            break
        accrue(t)
        job = state.jobs[name]
        if ep == 0:
            job.state = "pending"
        elif ep == epoch.get(name) and name in running:
            state.release(job, job.placements)
            job.placements, job.state = [], "done"
            running.discard(name)
        else:
            continue
        for d in scheduler.schedule(state, now):
            j = state.jobs[d.job]
            if d.kind in ("bind", "resume"):
                if d.kind == "bind":
                    served["inference" if j.kind == WorkloadKind.INFERENCE else "training"] += 1
                epoch[j.name] = epoch.get(j.name, 0) + 1
                running.add(j.name)
                heapq.heappush(events, (now + max(j.duration - j.progress, 1.0), epoch[j.name], j.name))
            else:
                running.discard(j.name)
                epoch[j.name] = epoch.get(j.name, 0) + 1
    accrue(horizon)
    for j in state.jobs.values():
        if j.state in ("pending", "suspended") and j.wait_reason:
            reason = j.wait_reason.split(";")[0].split(":")[0]
            failures[reason] = failures.get(reason, 0) + 1
    gpus = sum(n.gpu_count for n in nodes)
    return {
        "policy": policy, "gpus": gpus, "hours": spec.hours,
        "allocation": alloc_integral / (horizon * gpus),
        "useful_utilisation": useful_integral / (horizon * gpus),
        "inference_served": served["inference"], "training_started": served["training"],
        "training_gpu_hours_per_hour": training_done / horizon,
        "waiting_at_end": sum(1 for j in state.jobs.values() if j.state in ("pending", "suspended")),
        "wait_reasons": failures, "seconds": time.perf_counter() - started,
    }


_FIELDS = ("name", "team", "priority", "pods", "gpus_per_pod", "milli", "mig_profile", "gpu_model", "cpu_milli",
           "mem_bytes", "kind", "checkpointable", "submitted", "duration", "flavour")
