"""Queue replay on the Philly trace: FIFO, Kueue-like quotas, Tiresias-like LAS and gpuwarden, same jobs.

Documented slice (the defaults): the first 4,000 jobs submitted from 2017-10-09 UTC (a busy week
of Philly; they span about two and a half days), on 16 nodes x 8 GPUs = 128 GPUs, so the queue is contended
(FIFO's median queueing delay is about a day). Teams are Philly's virtual clusters; each team's
guarantee is the cluster's GPUs split in proportion to ``philly_vc.csv``; burst limit is the whole
cluster. Every job is treated as checkpointable training with a periodic checkpoint every
``checkpoint_interval`` seconds: a *suspended* job (checkpoint signal, grace period) keeps all its
progress and pays ``resume_overhead`` seconds; a *killed* job (Kueue-like reclaim) loses the work
since its last periodic checkpoint. The replay runs until every job of the slice has finished.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet.traces import load_philly_jobs, load_philly_vcs

from .engine import POLICIES, DecisionKind, Job, NodeState, QueuePolicy, Quotas, QuotaSpec, Scheduler, State
from .errors import SchedulingError, TraceOrderError
from .replay import JobModel, Replay, ReplayMetrics, fresh_copy

QUEUE_POLICIES = ("fifo", "kueue", "tiresias", "gpuwarden")
TICK_SECONDS = 300.0  # LAS policies re-rank the queue this often


@dataclass(frozen=True)
class QueueSlice:
    start: str = "2017-10-09"
    end: str = "2017-10-16"
    nodes: int = 16
    gpus_per_node: int = 8
    checkpoint_interval: float = 1800.0
    resume_overhead: float = 60.0
    max_jobs: int | None = 4000


def check_order(frame: pd.DataFrame, column: str = "submitted_at") -> None:
    """A trace must be in submit order: name the first row that goes back in time."""
    values = frame[column].to_numpy()
    if len(values) > 1:
        back = np.flatnonzero(values[1:] < values[:-1])
        if len(back):
            row = int(back[0]) + 1
            raise TraceOrderError(
                f"trace is not in time order: row {row + 2} ({values[row]}) is earlier than row {row + 1} "
                f"({values[row - 1]}); sort it by {column} first"
            )


def slice_jobs(data_dir: Path, spec: QueueSlice) -> tuple[pd.DataFrame, dict[str, float]]:
    jobs = load_philly_jobs(data_dir)
    check_order(jobs)
    start, end = pd.Timestamp(spec.start, tz="UTC"), pd.Timestamp(spec.end, tz="UTC")
    if start >= end:
        raise SchedulingError(f"queue slice --start {spec.start} is not before --end {spec.end}")
    everything = jobs
    jobs = jobs[(jobs["submitted_at"] >= start) & (jobs["submitted_at"] < end) & (jobs["gpus"] > 0)]
    if jobs.empty:
        first, last = everything["submitted_at"].min(), everything["submitted_at"].max()
        raise SchedulingError(f"queue slice {spec.start}..{spec.end}: no GPU job was submitted in it; the trace "
                              f"holds {first:%Y-%m-%d} to {last:%Y-%m-%d}")
    if spec.max_jobs:
        jobs = jobs.iloc[: spec.max_jobs]
    return jobs.reset_index(drop=True), guarantees_of(philly_shares(data_dir), spec.nodes * spec.gpus_per_node)


def philly_shares(data_dir: Path) -> dict[str, float]:
    """Each Philly virtual cluster's share of the fleet: its nodes over all nodes in ``philly_vc.csv``."""
    vcs = load_philly_vcs(data_dir)
    share = vcs.set_index("virtual_cluster")["nodes"] / vcs["nodes"].sum()
    return {str(team): float(s) for team, s in share.items()}


def guarantees_of(shares: dict[str, float], capacity_gpus: int) -> dict[str, float]:
    """Each team's guaranteed GPUs: its share of ``capacity_gpus``, rounded down."""
    return {team: float(math.floor(capacity_gpus * s)) for team, s in shares.items()}


def philly_fleet(nodes: int, gpus_per_node: int) -> list[NodeState]:
    """The queue replays' fleet: identical GPU nodes, each its own NVLink domain, 16 to a leaf switch;
    CPU and memory never bind (the Philly trace records neither)."""
    return [NodeState(name=f"node-{i:03d}", model="philly-gpu", gpu_count=gpus_per_node, cpu_free=10**9,
                      mem_free=10**15, nvlink_domain=f"node-{i:03d}", leaf_switch=f"leaf-{i // 16}")
            for i in range(nodes)]


def job_waits(jobs: Sequence[Job], replay: Replay) -> np.ndarray:
    """Per finished job of ``jobs``: every second between its submission and finish not holding GPUs
    (queued or suspended)."""
    return np.array([(j.finished or j.submitted) - j.submitted - sum(e - s for s, e in replay.runs[j.name])
                     for j in jobs])


def build_jobs(frame: pd.DataFrame, gpus_per_node: int, origin: pd.Timestamp) -> list[Job]:
    out = []
    for i, row in enumerate(frame.itertuples(index=False)):
        gpus = int(row.gpus)
        pods = max(1, math.ceil(gpus / gpus_per_node))
        out.append(Job(
            name=f"job-{i:05d}", team=str(row.virtual_cluster), pods=pods,
            gpus_per_pod=min(gpus, gpus_per_node) if pods == 1 else gpus_per_node,
            submitted=(row.submitted_at - origin).total_seconds(), duration=max(1.0, float(row.duration_seconds)),
            checkpointable=True,
        ))
    return out


@dataclass
class QueueResult:
    policy: str
    jobs: int
    finished: int
    queue_delay_p50: float  # submission to first start
    queue_delay_p99: float
    wait_mean: float  # every second between submission and finish not running: queued or suspended
    wait_p50: float
    wait_p99: float
    jct_mean: float
    jct_p99: float
    utilisation: float
    preemptions: int
    suspends: int
    guarantee_met: float  # share of asked-for guarantee that was granted, all teams, time-weighted
    worst_team_guarantee_met: float
    jain_index: float
    seconds: float

    def as_dict(self) -> dict[str, float | int | str]:
        return dict(self.__dict__)


class QueueMetrics(ReplayMetrics):
    """Busy GPU-seconds, each team's asked-for and granted guarantee, suspends and kills."""

    def __init__(self, guarantees: dict[str, float]) -> None:
        self.guarantees = guarantees
        self.teams = sorted(guarantees)
        self.busy = 0.0
        self.asked = {t: 0.0 for t in self.teams}
        self.granted = {t: 0.0 for t in self.teams}
        self.share_integral = {t: 0.0 for t in self.teams}
        self.share_time = {t: 0.0 for t in self.teams}
        self.preemptions = self.suspends = 0

    def accrue(self, replay: Replay, start: float, end: float) -> None:
        dt = end - start
        alloc = {t: 0.0 for t in self.teams}
        demand: dict[str, list[float]] = {t: [] for t in self.teams}
        for j in replay.running.values():
            alloc[j.team] = alloc.get(j.team, 0.0) + j.gpu_equivalents
        for j in replay.waiting.values():
            demand.setdefault(j.team, []).append(j.gpu_equivalents)
        self.busy += dt * sum(alloc.values())
        for t in self.teams:
            g = self.guarantees[t]
            room = g - alloc[t]
            fits = [d for d in demand[t] if d <= room + 1e-9]
            want = min(room, sum(fits)) if fits else 0.0
            ask = min(g, alloc[t] + want)
            if ask > 0:
                self.asked[t] += dt * ask
                self.granted[t] += dt * min(alloc[t], ask)
                self.share_integral[t] += dt * min(1.0, alloc[t] / ask)
                self.share_time[t] += dt

    def stopped(self, replay: Replay, job: Job, kind: DecisionKind) -> None:
        if kind == DecisionKind.SUSPEND:
            self.suspends += 1
        else:
            self.preemptions += 1


def replay_queue(jobs: list[Job], guarantees: dict[str, float], policy: str | QueuePolicy,
                 spec: QueueSlice) -> QueueResult:
    started_wall = time.perf_counter()
    nodes = philly_fleet(spec.nodes, spec.gpus_per_node)
    quotas = Quotas(QuotaSpec(team, g, spec.nodes * spec.gpus_per_node) for team, g in guarantees.items())
    scheduler = Scheduler(POLICIES[policy] if isinstance(policy, str) else policy)
    jobs = [fresh_copy(job) for job in jobs]
    metrics = QueueMetrics(guarantees)
    model = JobModel(spec.resume_overhead, spec.checkpoint_interval)
    replay = Replay(State(nodes, quotas), scheduler, jobs, model, metrics, tick_seconds=TICK_SECONDS).run()
    done = [j for j in jobs if j.finished is not None]
    delay = np.array([(j.first_started or j.submitted) - j.submitted for j in done])
    jct = np.array([(j.finished or j.submitted) - j.submitted for j in done])
    wait = job_waits(done, replay)
    span = max(replay.now, 1.0)
    asked, granted = metrics.asked, metrics.granted
    met = {t: granted[t] / asked[t] for t in metrics.teams if asked[t] > 0}
    shares = np.array([metrics.share_integral[t] / metrics.share_time[t] for t in metrics.teams
                       if metrics.share_time[t] > 0])
    jain = float(shares.sum() ** 2 / (len(shares) * (shares**2).sum())) if len(shares) else 1.0
    return QueueResult(
        policy=scheduler.policy.name, jobs=len(jobs), finished=len(done),
        queue_delay_p50=float(np.percentile(delay, 50)), queue_delay_p99=float(np.percentile(delay, 99)),
        wait_mean=float(wait.mean()), wait_p50=float(np.percentile(wait, 50)), wait_p99=float(np.percentile(wait, 99)),
        jct_mean=float(jct.mean()), jct_p99=float(np.percentile(jct, 99)),
        utilisation=metrics.busy / (span * spec.nodes * spec.gpus_per_node),
        preemptions=metrics.preemptions, suspends=metrics.suspends,
        guarantee_met=sum(granted.values()) / max(sum(asked.values()), 1e-9),
        worst_team_guarantee_met=min(met.values()) if met else 1.0, jain_index=jain,
        seconds=time.perf_counter() - started_wall,
    )


def run_queue_replay(data_dir: Path, spec: QueueSlice = QueueSlice(),
                     policies: Sequence[str] = QUEUE_POLICIES) -> list[QueueResult]:
    for policy in policies:
        if policy not in POLICIES:
            raise SchedulingError(f"unknown queue policy {policy!r}; choose from {', '.join(QUEUE_POLICIES)}")
    frame, guarantees = slice_jobs(data_dir, spec)
    origin = pd.Timestamp(spec.start, tz="UTC")
    jobs = build_jobs(frame, spec.gpus_per_node, origin)
    return [replay_queue(jobs, guarantees, policy, spec) for policy in policies]


def run_queue_replay_file(path: Path, data_dir: Path, spec: QueueSlice = QueueSlice(),
                          policies: Sequence[str] = QUEUE_POLICIES) -> list[QueueResult]:
    """Replay a user's Philly-format CSV (timestamp,duration,num_gpus,cluster). It must be time-ordered;
    a row whose GPUs are not a whole number 0..1,000,000 or whose duration is not a finite number of
    seconds >= 0 is refused naming its line (fleet.traces.checked_column), never rounded or run as 1 s."""
    from gpuwarden.fleet.traces import TraceError, read_trace_csv

    frame = read_trace_csv(Path(path), {"timestamp": "text", "duration": "seconds", "num_gpus": "gpus",
                                        "cluster": "text"}, "--trace")
    stamps = pd.to_datetime(frame["timestamp"], errors="coerce", utc=True)
    if stamps.isna().any():
        row = int(np.flatnonzero(stamps.isna().to_numpy())[0])
        raise TraceError(f"{path}:{row + 2}: timestamp {frame['timestamp'].iloc[row]!r} is not a time")
    if frame.empty:
        raise TraceError(f"{path}: no jobs (a header and no rows)")
    jobs = pd.DataFrame({"submitted_at": stamps, "duration_seconds": frame["duration"].astype(float),
                         "gpus": frame["num_gpus"].astype(int), "virtual_cluster": frame["cluster"].astype(str)})
    try:
        check_order(jobs)
    except TraceOrderError as error:
        raise TraceOrderError(f"{path}: {error}") from None
    teams = sorted(jobs["virtual_cluster"].unique())
    capacity = spec.nodes * spec.gpus_per_node
    guarantees = {t: float(capacity // len(teams)) for t in teams}
    built = build_jobs(jobs, spec.gpus_per_node, jobs["submitted_at"].iloc[0])
    return [replay_queue(built, guarantees, p, spec) for p in policies]
