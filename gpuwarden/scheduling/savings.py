"""GPU-hours saved: for each queue policy, the smallest fleet that serves one window of work.

A fleet of whole 8-GPU nodes *serves* a window (:class:`.savings_jobs.Workload`) under a policy
when, replayed through that policy (the Philly queue replay's engine, job model and guarantee
accounting: :mod:`.replay_queue`), every job has finished by the window's end plus its tail (the
longest job's duration), and every team's p95 wait (seconds between submission and finish not
holding GPUs: queued or suspended) is at most the SLO.

The search, per policy: replay at the start size (``--gpus``, in whole nodes, kept inside the
bounds below); from a fleet that serves, step down 1, 2, 4, ... nodes until one does not; from one
that does not, step up 1, 2, 4, ... until one does; then bisect between the largest size that does
not serve and the smallest that does. It takes serving to be monotone in the fleet size (more nodes
never hurt), which heuristic policies need not be exactly. Bounds, known without a replay: fewer
nodes than the widest gang, or than the GPU-seconds the jobs hold spread over the window and tail,
cannot serve; at the peak of pods running at once if every job started on submission (one node
each), nothing ever waits, so the search goes no higher. Every replay is cached by (policy, nodes)
and counted. A replay stops early, as not serving, once some team's p95 wait must exceed the SLO
(enough of its jobs have already waited longer), or at the deadline.

Per policy the report gives the fleet found and, from its replay: GPU-hours provisioned (nodes x 8
x the time from the window's start until the last job finished), useful GPU-hours (GPUs x duration
the jobs asked for), their ratio, mean JCT, p95 wait over all jobs, and the worst team's share of
its asked-for guarantee; and gpuwarden's GPU-hours saved against kube-default (when that policy
exists) and Kueue. Each served replay also records its load (GPUs held over time, and how many by
jobs that cannot checkpoint): :meth:`SavingsReport.add_tiers` plans reserved, spot and on-demand
capacity over it (:mod:`.tiers`); and each job's wait, the seconds the SLO judges (the plots of
``scripts/savings_plots.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .engine import POLICIES, Quotas, QuotaSpec, Scheduler, State
from .errors import SchedulingError
from .replay import JobModel, Replay, fresh_copy
from .replay_queue import QUEUE_POLICIES, TICK_SECONDS, QueueMetrics, QueueSlice, job_waits, philly_fleet
from .savings_jobs import GPUS_PER_NODE, Workload
from .state import Job
from .tiers import LoadCurve, SpotModel, TierPlan, TierPrices, plan_tiers, tiers_header

TIER_KEYS = ("reserved_gpus", "reserved_gpu_hours", "spot_gpu_hours", "on_demand_gpu_hours", "gpu_hours_lost_to_reclaims",
             "cost", "cost_all_on_demand", "cost_saved_pct")  # --tiers: the table's and CSV's columns
POLICY_KEYS = ("nodes", "gpu_hours_provisioned", "useful_gpu_hours", "utilisation", "jct_mean", "wait_p95",
               "worst_team_guarantee_met")
JOB_MODEL = QueueSlice()  # the Philly queue replay's: checkpoint every 30 min, resume in 60 s
CHECK_EVERY_SECONDS = 600.0  # how often (simulated) a replay looks for a team that already broke the SLO


def savings_policies() -> tuple[str, ...]:
    """The queue policies a savings run compares by default: kube-default (when the engine has it) and
    the Philly queue replay's four."""
    return (("kube-default",) if "kube-default" in POLICIES else ()) + tuple(p for p in QUEUE_POLICIES if p in POLICIES)


@dataclass(frozen=True)
class Outcome:
    """One replay of the window under ``policy`` on ``nodes`` nodes."""

    policy: str
    nodes: int
    served: bool
    why: str = ""  # why it does not serve
    makespan: float = math.nan  # seconds from the window's start to the last finish
    jct_mean: float = math.nan
    wait_p95: float = math.nan
    team_wait_p95: dict[str, float] = field(default_factory=dict)
    worst_team_guarantee_met: float = math.nan
    load: LoadCurve | None = field(default=None, compare=False, repr=False)  # GPUs held over time (served only)
    waits: np.ndarray | None = field(default=None, compare=False, repr=False)  # per job, seconds (all finished only)


class _SloBroken(Exception):
    """Raised inside a replay once a team's p95 wait must exceed the SLO: ends it early (control flow)."""


class _SloWatch(QueueMetrics):
    """The queue replay's accounting, and a watch on each team's waits."""

    def __init__(self, guarantees: dict[str, float], jobs: Sequence[Job], slo_seconds: float) -> None:
        super().__init__(guarantees)
        self.slo = slo_seconds
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job.team] = counts.get(job.team, 0) + 1
        # np.percentile's p95 (linear) of n waits exceeds the SLO once this many of them do
        self.breaking = {t: n - math.floor(0.95 * (n - 1)) for t, n in counts.items()}
        self.late: dict[str, set[str]] = {t: set() for t in counts}
        self.next_check = CHECK_EVERY_SECONDS
        self.load: list[list[float]] = []  # [start, end, GPUs held, of them by jobs that cannot checkpoint]

    def accrue(self, replay: Replay, start: float, end: float) -> None:
        super().accrue(replay, start, end)
        if end > start:
            held = sum(j.gpu_equivalents for j in replay.running.values())
            rigid = sum(j.gpu_equivalents for j in replay.running.values() if not j.checkpointable)
            last = self.load[-1] if self.load else None
            if last is not None and last[1] == start and last[2] == held and last[3] == rigid:
                last[1] = end
            else:
                self.load.append([start, end, held, rigid])
        if end < self.next_check:
            return
        self.next_check = end + CHECK_EVERY_SECONDS
        for job in self._not_computing(replay):  # a computing job's wait does not grow
            late = self.late[job.team]
            if job.name in late or end - job.submitted <= self.slo:
                continue
            if end - job.submitted - sum(e - s for s, e in replay.runs[job.name]) > self.slo:
                late.add(job.name)
                if len(late) >= self.breaking[job.team]:
                    raise _SloBroken(job.team)


    @staticmethod
    def _not_computing(replay: Replay) -> list[Job]:
        """The jobs (never a policy's pods: wait is a job's) not computing now: those waiting, and,
        where a policy places a job's pods one by one, those whose pods run only in part."""
        found = {id(j): j for j in (replay.job_of.get(name, job) for name, job in replay.waiting.items())}
        for name in replay.running:
            whole = replay.job_of.get(name)
            if whole is not None and id(whole) not in found and not all(
                    pod.name in replay.running for pod in replay.pods_of[whole.name]):
                found[id(whole)] = whole
        return list(found.values())


def replay_window(workload: Workload, policy: str, nodes: int, slo_seconds: float,
                  spec: QueueSlice = JOB_MODEL) -> Outcome:
    """One replay of ``workload`` under ``policy`` on ``nodes`` 8-GPU nodes, judged against the SLO."""
    capacity = nodes * GPUS_PER_NODE
    guarantees = workload.guarantees(nodes)
    fleet = philly_fleet(nodes, GPUS_PER_NODE)
    quotas = Quotas(QuotaSpec(team, g, capacity) for team, g in guarantees.items())
    jobs = [fresh_copy(job) for job in workload.jobs]
    metrics = _SloWatch(guarantees, jobs, slo_seconds)
    model = JobModel(spec.resume_overhead, spec.checkpoint_interval)
    replay = Replay(State(fleet, quotas), Scheduler(POLICIES[policy]), jobs, model, metrics,
                    tick_seconds=TICK_SECONDS, horizon_seconds=workload.deadline_seconds)
    try:
        replay.run()
    except _SloBroken as broken:
        return Outcome(policy, nodes, False, f"team {broken.args[0]}'s p95 wait is over the SLO")
    done = [j for j in jobs if j.finished is not None]
    if len(done) < len(jobs):
        return Outcome(policy, nodes, False, f"{len(jobs) - len(done)} job(s) unfinished at the deadline")
    finish = np.array([j.finished or 0.0 for j in done])
    jct = finish - np.array([j.submitted for j in done])
    wait = job_waits(done, replay)
    teams = np.array([j.team for j in done])
    team_p95 = {t: float(np.percentile(wait[teams == t], 95)) for t in sorted(set(teams.tolist()))}
    asked, granted = metrics.asked, metrics.granted
    met = [granted[t] / asked[t] for t in metrics.teams if asked[t] > 0]
    worst = max(team_p95.values())
    return Outcome(policy, nodes, worst <= slo_seconds,
                   "" if worst <= slo_seconds else f"the worst team's p95 wait is {worst:.0f} s",
                   makespan=float(finish.max()), jct_mean=float(jct.mean()), wait_p95=float(np.percentile(wait, 95)),
                   team_wait_p95=team_p95, worst_team_guarantee_met=min(met) if met else 1.0,
                   load=_load_curve(metrics.load, float(finish.max())), waits=wait)


class FleetSearch:
    """The smallest serving fleet per policy, every replay cached by (policy, nodes) and counted."""

    def __init__(self, workload: Workload, slo_seconds: float, spec: QueueSlice = JOB_MODEL) -> None:
        if not slo_seconds > 0:
            raise SchedulingError(f"--slo-wait {slo_seconds:g} s: the SLO must be longer than 0 s")
        self.workload, self.slo, self.spec = workload, slo_seconds, spec
        self.low, self.high = workload.min_nodes(), workload.max_nodes()
        self.cache: dict[tuple[str, int], Outcome] = {}
        self.replays: dict[str, int] = {}

    def outcome(self, policy: str, nodes: int) -> Outcome:
        key = (policy, nodes)
        if key not in self.cache:
            if nodes < self.low:  # known without a replay
                self.cache[key] = Outcome(policy, nodes, False, f"fewer than {self.low} nodes cannot serve the window")
            else:
                self.replays[policy] = self.replays.get(policy, 0) + 1
                self.cache[key] = replay_window(self.workload, policy, nodes, self.slo, self.spec)
        return self.cache[key]

    def serves(self, policy: str, nodes: int) -> bool:
        return self.outcome(policy, nodes).served

    def smallest(self, policy: str, start_nodes: int) -> Outcome:
        """The smallest fleet that serves under ``policy`` (the largest tried, not serving, if none does)."""
        if policy not in POLICIES:
            raise SchedulingError(f"--policies: unknown queue policy {policy!r}; choose from {', '.join(POLICIES)}")
        n = min(max(start_nodes, self.low), self.high)
        step = 1
        if self.serves(policy, n):
            low, high = self.low - 1, n  # low never serves, high does
            while high - step > low:
                if not self.serves(policy, high - step):
                    low = high - step
                    break
                high, step = high - step, step * 2
        else:
            low = n
            while True:
                m = min(low + step, self.high)
                if self.serves(policy, m):
                    high = m
                    break
                if m >= self.high:
                    return self.outcome(policy, m)
                low, step = m, step * 2
        while high - low > 1:
            middle = (low + high) // 2
            if self.serves(policy, middle):
                high = middle
            else:
                low = middle
        return self.outcome(policy, high)


@dataclass
class SavingsReport:
    """The smallest fleet per policy and gpuwarden's GPU-hours saved against the baselines."""

    workload: Workload
    slo_seconds: float
    start_nodes: int
    outcomes: dict[str, Outcome]
    replays: dict[str, int]
    tiers: dict[str, Any] | None = None  # --tiers: the price book, prices and spot model every plan shares
    plans: dict[str, TierPlan] = field(default_factory=dict)  # --tiers: per served policy, its fleet's load

    def add_tiers(self, prices: TierPrices, spot: SpotModel) -> None:
        """A procurement plan (reserved, spot, on-demand) for each served policy's load (:mod:`.tiers`)."""
        self.tiers = tiers_header(prices, spot)
        self.plans = {p: plan_tiers(o.load, prices, spot, fleet_gpus=o.nodes * GPUS_PER_NODE)
                      for p, o in self.outcomes.items() if o.served and o.load is not None}

    def tier_rows(self) -> list[dict[str, Any]]:
        return [{"policy": p, **{k: v for k, v in plan.to_dict().items() if k in TIER_KEYS}}
                for p, plan in self.plans.items()]

    def policy_figures(self, policy: str) -> dict[str, Any]:
        o, w = self.outcomes[policy], self.workload
        provisioned = o.nodes * GPUS_PER_NODE * o.makespan / 3600.0 if o.served else math.nan
        useful = w.useful_gpu_seconds / 3600.0
        return {"nodes": o.nodes if o.served else None, "gpu_hours_provisioned": _num(provisioned),
                "useful_gpu_hours": useful, "utilisation": _num(useful / provisioned),
                "jct_mean": _num(o.jct_mean), "wait_p95": _num(o.wait_p95),
                "worst_team_guarantee_met": _num(o.worst_team_guarantee_met)}

    def saved_pct(self, baseline: str) -> float | None:
        """gpuwarden's GPU-hours provisioned below ``baseline``'s, in percent of the baseline's."""
        if "gpuwarden" not in self.outcomes or baseline not in self.outcomes:
            return None
        ours = self.policy_figures("gpuwarden")["gpu_hours_provisioned"]
        theirs = self.policy_figures(baseline)["gpu_hours_provisioned"]
        if ours is None or theirs is None or theirs <= 0:
            return None
        return 100.0 * float(theirs - ours) / float(theirs)

    def saved(self) -> dict[str, float | None]:
        return {"vs_kube_default": self.saved_pct("kube-default"), "vs_kueue": self.saved_pct("kueue")}

    def unserved(self) -> list[str]:
        return [f"{p}: no fleet up to {o.nodes} nodes served the window ({o.why})"
                for p, o in self.outcomes.items() if not o.served]

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        return {
            "trace": w.trace, "window_start": w.start.isoformat(), "window_days": w.window_seconds / 86400.0,
            "jobs": len(w.jobs), "tail_seconds": w.tail_seconds, "deadline_seconds": w.deadline_seconds,
            "slo_wait_seconds": self.slo_seconds, "start_nodes": self.start_nodes,
            "node_bounds": [w.min_nodes(), w.max_nodes()],
            "replays": sum(self.replays.values()), "replays_by_policy": dict(self.replays),
            "policies": {p: self.policy_figures(p) for p in self.outcomes},
            "gpu_hours_saved_pct": self.saved(),
            **({} if self.tiers is None else {"tiers": {
                **self.tiers, "cost_saved_pct": self.plans["gpuwarden"].saved_pct(self.plans["gpuwarden"].cost)
                if "gpuwarden" in self.plans else None,
                "plans": {p: plan.to_dict() for p, plan in self.plans.items()}}}),
        }

    def rows(self, with_tiers: bool = False) -> list[dict[str, Any]]:
        """One row per policy; ``with_tiers`` (and tiers added): its plan's columns too (empty for a
        policy that did not serve)."""
        plans = {row.pop("policy"): row for row in self.tier_rows()}
        return [{"policy": p, **self.policy_figures(p), "replays": self.replays.get(p, 0),
                 **({k: plans.get(p, {}).get(k) for k in TIER_KEYS} if with_tiers and self.tiers is not None else {})}
                for p in self.outcomes]


def _load_curve(segments: list[list[float]], makespan: float) -> LoadCurve:
    """GPUs held from the window's start until the last finish (the horizon GPU-hours provisioned count)."""
    first = segments[0][0] if segments else makespan
    return LoadCurve.from_segments([(0.0, first, 0.0, 0.0)] + [(a, min(b, makespan), h, r)
                                                              for a, b, h, r in segments if a < makespan])


def _num(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def find_savings(workload: Workload, policies: Sequence[str], start_gpus: int, slo_seconds: float,
                 search: FleetSearch | None = None) -> SavingsReport:
    """Search each policy's smallest serving fleet, each from ``start_gpus`` (whole nodes, rounded up)."""
    search = search or FleetSearch(workload, slo_seconds)
    start_nodes = max(1, math.ceil(start_gpus / GPUS_PER_NODE))
    outcomes = {policy: search.smallest(policy, start_nodes) for policy in policies}
    return SavingsReport(workload, slo_seconds, start_nodes, outcomes, {p: search.replays.get(p, 0) for p in policies})
