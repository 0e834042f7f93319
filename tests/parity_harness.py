"""One trace slice played into the simulator and into the fake cluster over HTTP (issue 21 item 7).

The slice is the simulator's own Philly training arrivals, recorded (:func:`record_slice`): team,
GPUs per pod, pods, priority, checkpointable, submit time and run time of each job. It is played
into two clusters that have the same nodes and teams:

- :func:`play_sim`: a ``Simulation`` with its own arrivals off, the slice submitted through
  ``Simulation.submit`` at its times, scheduled by ``SchedulingRound(SimCluster)``;
- :func:`play_live`: ``SchedulingRound(KubeCluster)`` over the official client against
  ``tests/fake_kube_api.py`` with the Job-controller and kube-scheduler stand-ins
  (``gated_scenario.FakeCluster``); the sim's nodes as Node objects (names, GPU counts, the pool,
  topology, tier and location labels the inventory reads), its teams as namespaces labelled
  ``gpuwarden.io/queue`` with quota and weight annotations, the slice as gated Jobs.

Both run a round every ``ROUND_SECONDS`` of virtual time and record each round's BIND and RESUME
actions (workload, nodes of its pods) in order; :func:`first_divergence` compares them.

Timing is made the same where a cluster allows it, never by changing what a side decides:
a Job is created at its submit time and its pods at once (the Job controller's sync), as the
simulator queues a submitted job at once; kube-scheduler binds an admitted pod right after the
round that ungated it (``FakeCluster.step(0)``: a real one binds within milliseconds), as the
simulator starts a bound job at the round's time; a pod's grace period is 0, as the simulator
frees a suspended job's GPUs at once. Attained service on the live side comes from what a metrics
source would count (:class:`PodServiceMeter`: GPU-seconds of each workload's pods while they ran).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from fake_kube_api import CORE, FakeKubeAPI
from gated_scenario import START_SECONDS, FakeCluster, job_manifest, submit
from kube_fleet import namespace, priority_class

from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.kube.gates import CHECKPOINT_ANNOTATION, QUEUE_LABEL
from gpuwarden.kube.team_quotas import BURST_ANNOTATION, GUARANTEE_ANNOTATION, WEIGHT_ANNOTATION
from gpuwarden.scheduler.scheduling_round import RoundOutcome, SchedulingRound
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.fleet import ActionKind, ClusterSnapshot, PriorityClass, Workload, WorkloadKind, WorkloadPhase
from gpuwarden.fleet.clock import ModelClock
from gpuwarden.sim import SimConfig, Simulation

ROUND_SECONDS = 60
START = datetime.fromtimestamp(START_SECONDS, UTC)
PRIORITY_VALUES = {PriorityClass.LOW: 100, PriorityClass.NORMAL: 1000, PriorityClass.HIGH: 10000,
                   PriorityClass.CRITICAL: 100000}
KIND_LABEL = "gpuwarden.io/workload-kind"


@dataclass(frozen=True)
class SliceJob:
    """One job of the slice, as a user submits it."""

    workload: Workload
    submit_s: int  # after the start, a whole number of rounds
    run_s: int  # whole seconds


@dataclass
class Played:
    """What one side did: each round's admissions ``(round seconds, kind, workload, nodes)``, and its time."""

    admissions: list[tuple[int, str, str, tuple[str, ...]]] = field(default_factory=list)
    stops: list[tuple[int, str, str]] = field(default_factory=list)  # (round seconds, kind, workload): suspends, preemptions
    # BINDs carrying out a RESUME (a live Job's new pods onto the nodes held for them): not decisions
    carried_out: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)
    seconds: float = 0.0
    rounds: int = 0


def config(nodes: int, max_job_hours: float, training_load: float = 0.95, seed: int = 7) -> SimConfig:
    """A small simulated fleet: no faults, no spot reclaims, no services or notebooks, no warm-up;
    a round may run every ``ROUND_SECONDS``."""
    return SimConfig(seed=seed, nodes=nodes, start=START, warmup_days=0.0, fault_rate_scale=0.0, training_load=training_load,
                     spot_reclaims_per_node_day=0.0, inference_load=0.0, notebooks_per_100_gpus=0.0,
                     max_job_days=max_job_hours / 24, max_training_gpus=min(32, 8 * nodes),
                     scheduling_interval_seconds=ROUND_SECONDS)


def record_slice(cfg: SimConfig, hours: float, jobs: int | None = None, speedup: float = 1.0,
                 checkpointable: bool | None = None) -> list[SliceJob]:
    """The simulator's Philly training arrivals of the first ``hours`` (at most ``jobs`` of them),
    submitted ``speedup`` times as fast (a small fleet sees a queue, preemptions and resumes),
    as the live cluster can state them: project = namespace = team (the live reader's project),
    pools any (a pool constraint is not read from a live Job), a checkpoint interval of 600 s
    (what the live reader assumes of a checkpointable Job); times whole rounds / seconds.
    ``checkpointable`` True / False overrides the trace's flag (False: no job is ever suspended,
    so none is resumed; a preempted one is evicted and waits again)."""
    sim = Simulation(cfg, scheduling=lambda cluster: _NoRound())
    out = []
    for spec in sim.arrivals.arrivals(hours * 3600):
        w = spec.workload
        if w.kind not in (WorkloadKind.TRAINING, WorkloadKind.FINE_TUNING):
            continue
        saves = w.checkpointable if checkpointable is None else checkpointable
        workload = replace(w, project=w.namespace, pools=(), checkpointable=saves,
                           checkpoint_interval_seconds=600.0 if saves else None)
        out.append(SliceJob(workload, int(spec.submit_s / speedup // ROUND_SECONDS) * ROUND_SECONDS, max(1, math.ceil(spec.duration_s))))
    return out[:jobs] if jobs else out


class _NoRound:
    def run_round(self) -> tuple[()]:
        return ()


def _recorder(played: Played, origin: datetime) -> Callable[[RoundOutcome], None]:
    def observe(outcome: RoundOutcome) -> None:
        played.rounds += 1
        at = int((outcome.snapshot.taken_at - origin).total_seconds())
        for result in outcome.results:
            action = result.action
            if result.ok and action.kind == ActionKind.BIND and action.params.get("reserved"):
                nodes = tuple(sorted(str(p["node"]) for p in action.params.get("placements") or ()))
                played.carried_out.append((at, action.target, nodes))
            elif result.ok and action.kind in (ActionKind.BIND, ActionKind.RESUME):
                nodes = tuple(sorted(str(p["node"]) for p in action.params.get("placements") or ()))
                played.admissions.append((at, action.kind.value, action.target, nodes))
            elif result.ok and action.kind in (ActionKind.SUSPEND, ActionKind.PREEMPT, ActionKind.EVICT):
                played.stops.append((at, action.kind.value, action.target))
    return observe


def play_sim(cfg: SimConfig, jobs: list[SliceJob], horizon_s: int) -> tuple[Played, Simulation]:
    """The slice through the in-process simulator, its arrivals off."""
    played = Played()
    cfg = replace(cfg, arrivals=False)
    sim = simulated_fleet(cfg)
    sim.scheduling.on_round.append(_recorder(played, cfg.start))  # type: ignore[attr-defined]
    due = _by_round(jobs)
    started = time.perf_counter()
    for now in range(0, horizon_s, ROUND_SECONDS):
        for job in due.get(now, ()):
            sim.submit(job.workload, job.run_s)
        sim.step()
    played.seconds = time.perf_counter() - started
    return played, sim


def _by_round(jobs: list[SliceJob]) -> dict[int, list[SliceJob]]:
    due: dict[int, list[SliceJob]] = {}
    for job in jobs:
        due.setdefault(job.submit_s, []).append(job)
    return due


def install(api: FakeKubeAPI, sim: Simulation) -> None:
    """The simulated fleet's nodes, teams and priority classes as a cluster administrator sets them up
    (a MIG node as the device plugin's mixed strategy publishes it: its instances, no whole GPU)."""
    for team in sim.teams:
        namespace(api, team.name, {QUEUE_LABEL: team.name},
                  {GUARANTEE_ANNOTATION: str(team.guaranteed_gpus), BURST_ANNOTATION: str(team.burst_limit_gpus),
                   WEIGHT_ANNOTATION: str(team.weight)})
    for priority, value in PRIORITY_VALUES.items():
        priority_class(api, priority.value, value)
    mig: dict[str, Counter[str]] = {}  # node -> MIG instances it offers, by profile
    for gpu in sim.gpus:
        mig.setdefault(gpu.node, Counter()).update(i.profile for i in gpu.mig_instances)
    for node in sim.nodes:
        offers = ({f"nvidia.com/mig-{p}": str(n) for p, n in mig[node.name].items()} | {"nvidia.com/gpu": "0"}
                  if mig.get(node.name) else {"nvidia.com/gpu": str(node.gpu_count)})  # the device plugin's mixed strategy
        resources = {"cpu": str(node.cpu_milli // 1000), "memory": str(node.memory_bytes), "pods": "110", **offers}
        api.add(CORE, "nodes", {
            "metadata": {"name": node.name, "labels": {
                "kubernetes.io/hostname": node.name, "nvidia.com/gpu.product": node.gpu_model,
                "nvidia.com/gpu.count": str(node.gpu_count), "gpuwarden.io/pool": node.pool,
                "gpuwarden.io/leaf-switch": node.topology.leaf_switch, "nvidia.com/gpu.clique": node.topology.nvlink_domain,
                "gpuwarden.io/rack": node.topology.rack, "gpuwarden.io/location": node.location.value,
                "gpuwarden.io/price-tier": node.price_tier.value}},
            "spec": {}, "status": {"capacity": resources, "allocatable": resources}})


def manifest(job: SliceJob) -> dict:
    """The slice job as a gated Job: GPUs only (the simulator's jobs ask for nothing else), grace 0."""
    w = job.workload
    out = job_manifest(w.name, w.namespace, count=w.gpus.count, parallelism=w.gang_size, priority=w.priority_class.value,
                       checkpointable=w.checkpointable, run_seconds=job.run_s, grace_seconds=0)
    template = out["spec"]["template"]
    template["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpu": str(w.gpus.count)}
    template["metadata"]["labels"][KIND_LABEL] = w.kind.value
    if w.checkpointable:
        template["metadata"]["annotations"][CHECKPOINT_ANNOTATION] = "true"
    return out


class PodServiceMeter:
    """Attained service as a metrics source measures it: GPU-seconds of each workload's GPUs while
    they ran (a run counted up to the last round it was seen running; a stop happens in a round)."""

    def __init__(self) -> None:
        self.banked: dict[str, float] = {}
        self.runs: dict[str, tuple[datetime, float]] = {}  # key -> (started, GPU-seconds so far)

    def __call__(self, snapshot: ClusterSnapshot) -> dict[str, float]:
        out = {}
        for ws in snapshot.workloads:
            key = ws.workload.key
            run = self.runs.get(key)
            running = ws.phase == WorkloadPhase.RUNNING and ws.started_at is not None
            if run is not None and (not running or run[0] != ws.started_at):
                self.banked[key] = self.banked.get(key, 0.0) + run[1]
                del self.runs[key]
            if running and ws.started_at is not None:
                gpus = ws.workload.gpus.count * ws.workload.gang_size
                self.runs[key] = (ws.started_at, (snapshot.taken_at - ws.started_at).total_seconds() * gpus)
            out[key] = self.banked.get(key, 0.0) + (self.runs[key][1] if key in self.runs else 0.0)
        return out


def play_live(sim: Simulation, jobs: list[SliceJob], horizon_s: int, workdir: Path) -> Played:
    """The slice through the HTTP loop on the fake cluster with ``sim``'s nodes and teams."""
    played = Played()
    api = FakeKubeAPI().start()
    try:
        install(api, sim)
        fake = FakeCluster(api)
        clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
        client = load_client(api.kubeconfig(workdir / "kc.json"))
        cluster = KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05, clock=clock), clock=clock)
        loop = SchedulingRound(cluster, attained=PodServiceMeter(), on_round=[_recorder(played, START)])
        due = _by_round(jobs)
        started = time.perf_counter()
        for now in range(0, horizon_s, ROUND_SECONDS):
            for job in due.get(now, ()):
                status, answer = submit(api, manifest(job))
                if status != 201:
                    raise RuntimeError(f"submitting {job.workload.key}: {status} {answer.get('message')}")
            fake.step(0)  # the Job controller makes the new Jobs' pods at their submit time
            fake.step(ROUND_SECONDS)
            loop.run_round()
            fake.step(0)  # kube-scheduler binds what the round ungated
        played.seconds = time.perf_counter() - started
        return played
    finally:
        api.stop()


def first_divergence(sim: Played, live: Played) -> tuple[int, object, object] | None:
    """The first admission (index, sim's, live's) where the two sides differ, or None."""
    for i in range(max(len(sim.admissions), len(live.admissions))):
        a = sim.admissions[i] if i < len(sim.admissions) else None
        b = live.admissions[i] if i < len(live.admissions) else None
        if a != b:
            return i, a, b
    return None

