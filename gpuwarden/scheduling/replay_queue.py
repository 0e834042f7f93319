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

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet.traces import load_philly_jobs, load_philly_vcs

from .engine import (POLICIES, WAITING, Decision, DecisionKind, Job, JobState, NodeState, QueueOrder, QueuePolicy, Quotas, QuotaSpec,
                     Scheduler, State)
from .errors import TraceOrderError

QUEUE_POLICIES = ("fifo", "kueue", "tiresias", "gpuwarden")


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
    jobs = jobs[(jobs["submitted_at"] >= start) & (jobs["submitted_at"] < end) & (jobs["gpus"] > 0)]
    if spec.max_jobs:
        jobs = jobs.iloc[: spec.max_jobs]
    vcs = load_philly_vcs(data_dir)
    capacity = spec.nodes * spec.gpus_per_node
    share = vcs.set_index("virtual_cluster")["nodes"] / vcs["nodes"].sum()
    guarantees = {team: float(math.floor(capacity * s)) for team, s in share.items()}
    return jobs.reset_index(drop=True), guarantees


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


def replay_queue(jobs: list[Job], guarantees: dict[str, float], policy: str | QueuePolicy,
                 spec: QueueSlice) -> QueueResult:
    started_wall = time.perf_counter()
    nodes = [NodeState(name=f"node-{i:03d}", model="philly-gpu", gpu_count=spec.gpus_per_node, cpu_free=10**9,
                       mem_free=10**15, nvlink_domain=f"node-{i:03d}", leaf_switch=f"leaf-{i // 16}")
             for i in range(spec.nodes)]
    quotas = Quotas(QuotaSpec(team, g, spec.nodes * spec.gpus_per_node) for team, g in guarantees.items())
    state = State(nodes, quotas)
    scheduler = Scheduler(POLICIES[policy] if isinstance(policy, str) else policy)
    jobs = [Job(**{k: v for k, v in job.__dict__.items() if k in _INIT_FIELDS}) for job in jobs]
    for job in jobs:
        job.placements = []
        job.preempted_at = []
    pending_arrivals = sorted(jobs, key=lambda j: j.submitted)
    arrivals_index = 0
    completions: list[tuple[float, int, str]] = []  # (time, epoch, job)
    epoch: dict[str, int] = {}
    last_ckpt: dict[str, float] = {}
    now = 0.0
    busy_integral = 0.0
    teams = sorted(guarantees)
    asked = {t: 0.0 for t in teams}
    granted = {t: 0.0 for t in teams}
    share_integral = {t: 0.0 for t in teams}
    share_time = {t: 0.0 for t in teams}
    preemptions = suspends = 0
    tick = 300.0
    next_tick = tick
    horizon_end = None
    running: set[str] = set()
    waiting: set[str] = set()

    def advance(to: float) -> None:
        nonlocal now, busy_integral
        dt = to - now
        if dt <= 0:
            return
        alloc = {t: 0.0 for t in teams}
        demand: dict[str, list[float]] = {t: [] for t in teams}
        for name in running:
            j = state.jobs[name]
            j.waited -= dt  # waited = time since submission minus time running, settled at the finish
            j.progress += dt
            j.attained += dt * j.gpu_equivalents
            alloc[j.team] = alloc.get(j.team, 0.0) + j.gpu_equivalents
        for name in list(waiting):
            j = state.jobs[name]
            if j.state in WAITING:
                demand.setdefault(j.team, []).append(j.gpu_equivalents)
            else:
                waiting.discard(name)
        busy_integral += dt * sum(alloc.values())
        for t in teams:
            g = guarantees[t]
            room = g - alloc[t]
            fits = [d for d in demand[t] if d <= room + 1e-9]
            want = min(room, sum(fits)) if fits else 0.0
            ask = min(g, alloc[t] + want)
            if ask > 0:
                asked[t] += dt * ask
                granted[t] += dt * min(alloc[t], ask)
                share_integral[t] += dt * min(1.0, alloc[t] / ask)
                share_time[t] += dt
        now = to

    def apply(decisions: list[Decision]) -> None:
        nonlocal preemptions, suspends
        for d in decisions:
            job = state.jobs[d.job]
            if d.kind in (DecisionKind.BIND, DecisionKind.RESUME):
                epoch[job.name] = epoch.get(job.name, 0) + 1
                remaining = (job.duration or 0.0) - job.progress + (spec.resume_overhead if d.kind == DecisionKind.RESUME else 0.0)
                job.progress -= spec.resume_overhead if d.kind == DecisionKind.RESUME else 0.0
                last_ckpt[job.name] = job.progress
                heapq.heappush(completions, (now + max(remaining, 0.0), epoch[job.name], job.name))
                running.add(job.name)
            else:
                running.discard(job.name)
                waiting.add(job.name)
                epoch[job.name] = epoch.get(job.name, 0) + 1
                if d.kind == DecisionKind.SUSPEND:
                    suspends += 1
                    job.progress = max(job.progress, 0.0)
                else:
                    preemptions += 1
                    # killed: back to the last periodic checkpoint
                    ran = job.progress - max(last_ckpt.get(job.name, 0.0), 0.0)
                    job.progress = max(last_ckpt.get(job.name, 0.0), 0.0) + (ran // spec.checkpoint_interval) * spec.checkpoint_interval
                    job.state = JobState.PENDING

    while arrivals_index < len(pending_arrivals) or running or waiting:
        candidates = []
        if arrivals_index < len(pending_arrivals):
            candidates.append(pending_arrivals[arrivals_index].submitted)
        while completions and (completions[0][1] != epoch.get(completions[0][2]) or completions[0][2] not in running):
            heapq.heappop(completions)
        if completions:
            candidates.append(completions[0][0])
        candidates.append(next_tick)
        to = min(candidates)
        advance(to)
        changed = False
        while arrivals_index < len(pending_arrivals) and pending_arrivals[arrivals_index].submitted <= now:
            state.add_job(pending_arrivals[arrivals_index])
            waiting.add(pending_arrivals[arrivals_index].name)
            arrivals_index += 1
            changed = True
        while completions and completions[0][0] <= now:
            _, ep, name = heapq.heappop(completions)
            if ep != epoch.get(name) or name not in running:
                continue
            job = state.jobs[name]
            state.release(job, job.placements)
            job.placements = []
            job.state = JobState.DONE
            job.finished = now
            job.waited += now - job.submitted
            running.discard(name)
            changed = True
        if now >= next_tick:
            next_tick += tick
            changed = changed or scheduler.policy.order == QueueOrder.LAS
        if changed:
            apply(scheduler.schedule(state, now))
        if horizon_end is None and arrivals_index >= len(pending_arrivals):
            horizon_end = now
        if now > 400 * 86400:
            break
    done = [j for j in state.jobs.values() if j.finished is not None]
    delay = np.array([(j.first_started or j.submitted) - j.submitted for j in done])
    jct = np.array([(j.finished or j.submitted) - j.submitted for j in done])
    wait = np.array([j.waited for j in done])
    span = max(now, 1.0)
    met = {t: granted[t] / asked[t] for t in teams if asked[t] > 0}
    shares = np.array([share_integral[t] / share_time[t] for t in teams if share_time[t] > 0])
    jain = float(shares.sum() ** 2 / (len(shares) * (shares**2).sum())) if len(shares) else 1.0
    return QueueResult(
        policy=scheduler.policy.name, jobs=len(jobs), finished=len(done),
        queue_delay_p50=float(np.percentile(delay, 50)), queue_delay_p99=float(np.percentile(delay, 99)),
        wait_mean=float(wait.mean()), wait_p50=float(np.percentile(wait, 50)), wait_p99=float(np.percentile(wait, 99)),
        jct_mean=float(jct.mean()), jct_p99=float(np.percentile(jct, 99)),
        utilisation=busy_integral / (span * spec.nodes * spec.gpus_per_node),
        preemptions=preemptions, suspends=suspends,
        guarantee_met=sum(granted.values()) / max(sum(asked.values()), 1e-9),
        worst_team_guarantee_met=min(met.values()) if met else 1.0, jain_index=jain,
        seconds=time.perf_counter() - started_wall,
    )


_INIT_FIELDS = ("name", "team", "priority", "pods", "gpus_per_pod", "milli", "mig_profile", "gpu_model", "cpu_milli",
                "mem_bytes", "kind", "checkpointable", "submitted", "duration", "flavour")


def run_queue_replay(data_dir: Path, spec: QueueSlice = QueueSlice(),
                     policies: Sequence[str] = QUEUE_POLICIES) -> list[QueueResult]:
    for policy in policies:
        if policy not in POLICIES:
            from .errors import SchedulingError
            raise SchedulingError(f"unknown queue policy {policy!r}; choose from {', '.join(QUEUE_POLICIES)}")
    frame, guarantees = slice_jobs(data_dir, spec)
    origin = pd.Timestamp(spec.start, tz="UTC")
    jobs = build_jobs(frame, spec.gpus_per_node, origin)
    return [replay_queue(jobs, guarantees, policy, spec) for policy in policies]


def run_queue_replay_file(path: Path, data_dir: Path, spec: QueueSlice = QueueSlice(),
                          policies: Sequence[str] = QUEUE_POLICIES) -> list[QueueResult]:
    """Replay a user's Philly-format CSV (timestamp,duration,num_gpus,cluster). It must be time-ordered."""
    from gpuwarden.fleet.traces import TraceError

    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError) as error:
        raise TraceError(f"{path}: not a readable CSV ({error})") from None
    missing = [c for c in ("timestamp", "duration", "num_gpus", "cluster") if c not in frame.columns]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
    stamps = pd.to_datetime(frame["timestamp"], errors="coerce", utc=True)
    if stamps.isna().any():
        row = int(np.flatnonzero(stamps.isna().to_numpy())[0])
        raise TraceError(f"{path}:{row + 2}: timestamp {frame['timestamp'].iloc[row]!r} is not a time")
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
