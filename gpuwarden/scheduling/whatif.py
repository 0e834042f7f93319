"""What-if on your own history: replay a window's workloads under each queue policy, on the same fleet.

:func:`whatif_report` reads fleet samples, rebuilds the workloads and the fleet
(:mod:`.whatif_history`, which documents the rules), replays them through the production
scheduler under each named policy (:data:`WHATIF_POLICIES`) and measures every schedule, the
"as it really ran" one included, with the same code:

- **wait**: every second between submission and finish that a workload is not running (queued,
  suspended, or redoing lost work is running time, not wait). Submission is the first sample, so
  the as-it-ran row's wait is only its pauses;
- **idle GPU-hours**: GPU-hours of the window no workload held (a MIG instance holds its share by fleet.semantics.mig_share
  of its GPU; a MIG GPU's unpartitioned slices are idle);
- **cost**: what the fleet costs until the window's work is done (the window, or longer when a
  policy finishes the work later), and what its idle GPU-hours cost; each GPU model at the mean
  hourly price of its GPUs (price book, tier from the inventory);
- **guarantee met**: of the GPUs a team asked for up to its guarantee (running plus waiting work
  that fits in the guarantee), the share it held, time-weighted; per team and the worst team.
  Guarantees are each team's share of the fleet in proportion to its GPU-hours in the window,
  unless given.

JSON (``schema_version`` 1): ``report`` ('whatif'), ``window`` (start, end, hours, step_seconds),
``currency``, ``summary`` (workloads, gpus, nodes, teams, guarantees), ``tables.policies`` (one
row per schedule, as-it-ran first: workloads, finished_in_window, never_started, unfinished,
wait_mean/p50/p99_seconds, idle_gpu_hours, idle_cost, fleet_cost, work_after_window_gpu_hours,
all_done_seconds, guarantee_met_ratio, worst_team_guarantee_met_ratio, suspends, preemptions),
``tables.teams`` (team, policy, guarantee_gpus, workloads, wait_mean_seconds,
guarantee_met_ratio), ``notes`` and ``params``.

Replay assumptions (the samples do not say): one priority; every workload checkpointable
training that checkpoints every ``CHECKPOINT_INTERVAL_SECONDS`` of computing (a resumed one holds
its GPUs ``RESUME_OVERHEAD_SECONDS`` before it computes; a killed one redoes the work since its last
checkpoint), the replay driver's job model (:class:`.replay.JobModel`) as in :mod:`.replay_queue`;
no tier rules (what ran on spot may run on spot); pods of a gang are replayed on their own.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.semantics import iso_utc

from .engine import POLICIES, DecisionKind, Job, NodeState, Quotas, QuotaSpec, Scheduler, State
from .replay import JobModel, Replay, ReplayMetrics
from .state import MILLI
from .whatif_history import DEFAULT_MAX_GAP_SECONDS, NEEDED_COLUMNS, History, Workload, rebuild

if TYPE_CHECKING:
    from gpuwarden.analytics.inventory import Inventory
    from gpuwarden.analytics.pricebook import PriceBook

SCHEMA_VERSION = 1
AS_IT_RAN = "as-it-ran"
WHATIF_POLICIES = ("fifo", "kueue", "tiresias", "gpuwarden")
CHECKPOINT_INTERVAL_SECONDS = 1800.0
RESUME_OVERHEAD_SECONDS = 60.0
TICK_SECONDS = 300.0  # LAS policies re-rank the queue this often
JOB_MODEL = JobModel(RESUME_OVERHEAD_SECONDS, CHECKPOINT_INTERVAL_SECONDS)


class WhatIfError(UserError, ValueError):
    """Input the what-if cannot use (an unknown policy, a guarantee for a team not in the window)."""


# ---------------------------------------------------------------------------------------------
# A schedule: when each workload ran, as it ran or in a replay


@dataclass
class Schedule:
    policy: str
    runs: dict[str, list[tuple[float, float]]]  # workload -> [start, end) running stretches
    finished: dict[str, float | None]  # None: never finished (still waiting when the replay stopped)
    preemptions: int = 0  # killed, work since the last checkpoint lost
    suspends: int = 0  # checkpointed and paused
    seconds: float = 0.0  # wall time of the replay


def as_it_ran(history: History) -> Schedule:
    """The schedule the samples show (no replay)."""
    return Schedule(AS_IT_RAN, {w.name: list(w.runs) for w in history.workloads},
                    {w.name: w.runs[-1][1] for w in history.workloads})


# ---------------------------------------------------------------------------------------------
# A replay: the history's workloads through the production scheduler, on the one replay driver


def _job(workload: Workload) -> Job:
    """A workload as the engine's job: k MIG instances of one profile are k one-instance pods; a
    time-sliced share of one GPU is a fraction of it."""
    if workload.mig_profile:
        pods, per_pod, milli = workload.gpus, 1, MILLI
    elif workload.gpu_fraction >= 1.0:
        pods, per_pod, milli = 1, workload.gpus, MILLI
    else:
        pods, per_pod, milli = 1, 1, max(1, round(workload.gpu_fraction * MILLI))
    return Job(name=workload.name, team=workload.team, pods=pods, gpus_per_pod=per_pod, milli=milli,
               mig_profile=workload.mig_profile, gpu_model=workload.model, submitted=workload.submitted_seconds,
               duration=max(workload.duration_seconds, 1.0), checkpointable=True)


class _Counts(ReplayMetrics):
    def __init__(self) -> None:
        self.suspends = self.preemptions = 0

    def stopped(self, replay: Replay, job: Job, kind: DecisionKind) -> None:
        if kind == DecisionKind.SUSPEND:
            self.suspends += 1
        else:
            self.preemptions += 1


def replay(history: History, policy: str, guarantees: dict[str, float]) -> Schedule:
    """The history's workloads, submitted at their first sample, scheduled by ``policy`` on its fleet."""
    if policy not in WHATIF_POLICIES:
        raise WhatIfError(f"unknown policy {policy!r}; choose from {', '.join(WHATIF_POLICIES)}")
    started_wall = time.perf_counter()
    nodes = [NodeState(name=n.name, model=n.model, gpu_count=len(n.gpu_uuids), cpu_free=10**9, mem_free=10**15,
                       nvlink_domain=n.name, leaf_switch="fleet", mig_layout=list(n.mig_layouts),
                       gpu_ids=list(n.gpu_uuids)) for n in history.nodes]
    capacity = float(max(history.gpus, 1))
    state = State(nodes, Quotas(QuotaSpec(team, min(g, capacity), capacity) for team, g in guarantees.items()))
    jobs = [_job(w) for w in history.workloads]
    counts = _Counts()
    done = Replay(state, Scheduler(POLICIES[policy]), jobs, JOB_MODEL, counts, tick_seconds=TICK_SECONDS).run()
    return Schedule(policy, done.runs, {j.name: j.finished for j in jobs}, counts.preemptions, counts.suspends,
                    time.perf_counter() - started_wall)


# ---------------------------------------------------------------------------------------------
# Measuring a schedule


@dataclass(frozen=True)
class Prices:
    """Mean hourly price of one GPU of each model in the fleet."""

    per_model: dict[str, float]
    currency: str = "USD"

    @classmethod
    def of(cls, history: History, price_book: PriceBook | None = None, inventory: Inventory | None = None) -> Prices:
        from gpuwarden.analytics.inventory import Inventory
        from gpuwarden.analytics.pricebook import PriceBook
        from gpuwarden.fleet.vocabulary import PriceTier

        book = price_book or PriceBook.default()
        places = inventory or Inventory.default()
        totals: dict[str, list[float]] = {}
        for node in history.nodes:
            _, tier = places.lookup(node.name.split("/")[0])
            hourly = book.owned_hourly(node.model) if PriceTier(tier) is PriceTier.OWNED else book.hourly(node.model, tier)
            totals.setdefault(node.model, []).extend([hourly] * len(node.gpu_uuids))
        return cls({model: float(np.mean(values)) for model, values in totals.items()}, book.currency)


def default_guarantees(history: History) -> dict[str, float]:
    """Each team's share of the fleet's GPUs in proportion to its GPU-hours in the window (floored)."""
    used: dict[str, float] = {}
    for w in history.workloads:
        used[w.team] = used.get(w.team, 0.0) + w.duration_seconds * w.gpu_equivalents
    total = sum(used.values())
    if total <= 0:
        return {team: 0.0 for team in used}
    return {team: float(math.floor(history.gpus * amount / total)) for team, amount in sorted(used.items())}


def measure(history: History, schedule: Schedule, guarantees: dict[str, float],
            prices: Prices) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the policy's row, one row per team) for ``schedule``."""
    window = history.window_seconds
    by_name = {w.name: w for w in history.workloads}
    ends = [f for f in schedule.finished.values() if f is not None]
    span = max([window, *ends, *(e for runs in schedule.runs.values() for _, e in runs)])
    waits: list[float] = []
    team_waits: dict[str, list[float]] = {}
    held_in_window: dict[str, float] = {}
    after_window = 0.0
    for name, workload in by_name.items():
        runs = schedule.runs[name]
        ran = sum(e - s for s, e in runs)
        finish = schedule.finished[name]
        wait = (span if finish is None else finish) - workload.submitted_seconds - ran
        waits.append(max(wait, 0.0))
        team_waits.setdefault(workload.team, []).append(max(wait, 0.0))
        inside = sum(max(0.0, min(e, window) - max(s, 0.0)) for s, e in runs)
        held_in_window[workload.model] = held_in_window.get(workload.model, 0.0) + inside * workload.gpu_equivalents
        after_window += sum(max(0.0, e - max(s, window)) for s, e in runs) * workload.gpu_equivalents
    gpus = history.gpus_by_model()
    idle_by_model = {m: max(count * window - held_in_window.get(m, 0.0), 0.0) / 3600.0 for m, count in gpus.items()}
    met, asked = _guarantee_met(history, schedule, guarantees, span)
    wait_array = np.array(waits) if waits else np.zeros(1)
    unfinished = sum(1 for f in schedule.finished.values() if f is None)
    row = {
        "policy": schedule.policy,
        "workloads": len(by_name),
        "finished_in_window": sum(1 for f in schedule.finished.values() if f is not None and f <= window + 1e-6),
        "never_started": sum(1 for n in by_name if not schedule.runs[n]),
        "unfinished": unfinished,
        "wait_mean_seconds": float(wait_array.mean()),
        "wait_p50_seconds": float(np.percentile(wait_array, 50)),
        "wait_p99_seconds": float(np.percentile(wait_array, 99)),
        "idle_gpu_hours": float(sum(idle_by_model.values())),
        "idle_cost": float(sum(hours * prices.per_model.get(m, 0.0) for m, hours in idle_by_model.items())),
        "fleet_cost": float(sum(count * span / 3600.0 * prices.per_model.get(m, 0.0) for m, count in gpus.items())),
        "work_after_window_gpu_hours": after_window / 3600.0,
        "all_done_seconds": span,
        "guarantee_met_ratio": float(sum(met.values()) / sum(asked.values())) if sum(asked.values()) > 0 else 1.0,
        "worst_team_guarantee_met_ratio": min((met[t] / asked[t] for t in asked if asked[t] > 0), default=1.0),
        "suspends": schedule.suspends,
        "preemptions": schedule.preemptions,
    }
    teams = [{"team": team, "policy": schedule.policy, "guarantee_gpus": guarantees.get(team, 0.0),
              "workloads": len(team_waits.get(team, [])),
              "wait_mean_seconds": float(np.mean(team_waits[team])) if team_waits.get(team) else 0.0,
              "guarantee_met_ratio": met[team] / asked[team] if asked.get(team, 0.0) > 0 else 1.0}
             for team in sorted(set(guarantees) | set(team_waits))]
    return row, teams


def _guarantee_met(history: History, schedule: Schedule, guarantees: dict[str, float],
                   span: float) -> tuple[dict[str, float], dict[str, float]]:
    """Per team: GPU-seconds granted and asked for, up to its guarantee (replay_queue's rule)."""
    events: list[tuple[float, int, str, float]] = []  # (time, +1 running / -1, team, gpus) for alloc; 2/-2 waiting
    for w in history.workloads:
        runs = sorted(schedule.runs[w.name])
        finish = schedule.finished[w.name]
        g = w.gpu_equivalents
        events.append((w.submitted_seconds, 2, w.team, g))
        for i, (s, e) in enumerate(runs):
            events += [(s, -2, w.team, g), (s, 1, w.team, g), (e, -1, w.team, g)]
            if not (finish is not None and i == len(runs) - 1):
                events.append((e, 2, w.team, g))
        if not runs and finish is None:
            events.append((span, -2, w.team, g))
    events.sort(key=lambda ev: ev[0])
    alloc: dict[str, float] = {}
    wanting: dict[str, Counter[float]] = {}
    granted = {t: 0.0 for t in guarantees}
    asked = {t: 0.0 for t in guarantees}
    # (held, ask) per team with a guarantee, recomputed only for the teams an event touched
    rates = {team: (0.0, 0.0) for team, g in guarantees.items() if g > 0}
    touched = set(rates)
    previous = 0.0
    i = 0
    while i < len(events):
        now = min(events[i][0], span)
        dt = now - previous
        if dt > 0:
            for team in touched & rates.keys():
                g = guarantees[team]
                held = alloc.get(team, 0.0)
                room = g - held
                want = sum(size * n for size, n in wanting.get(team, Counter()).items() if n > 0 and size <= room + 1e-9)
                rates[team] = (held, min(g, held + min(max(room, 0.0), want)))
            touched = set()
            for team, (held, ask) in rates.items():
                if ask > 1e-9:
                    asked[team] += dt * ask
                    granted[team] += dt * min(held, ask)
        previous = now
        while i < len(events) and events[i][0] <= now:
            _, kind, team, g = events[i]
            if abs(kind) == 1:
                alloc[team] = alloc.get(team, 0.0) + kind * g
            else:
                counter = wanting.setdefault(team, Counter())
                counter[round(g, 6)] += 1 if kind > 0 else -1
            touched.add(team)
            i += 1
    return granted, asked


# ---------------------------------------------------------------------------------------------
# The report


@dataclass
class WhatIfReport:
    history: History
    guarantees: dict[str, float]
    currency: str
    policies: list[dict[str, Any]]  # one row per schedule, as-it-ran first
    teams: list[dict[str, Any]]  # one row per (team, schedule)
    notes: list[str] = field(default_factory=list)

    TABLES = ("policies", "teams")

    def table(self, name: str) -> list[dict[str, Any]]:
        return self.policies if name == "policies" else self.teams

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, stable keys (``schema_version`` 1)."""
        history = self.history
        return {
            "report": "whatif",
            "schema_version": SCHEMA_VERSION,
            "window": {"start": iso_utc(history.start), "end": iso_utc(history.end),
                       "hours": history.window_seconds / 3600.0, "step_seconds": history.step_seconds},
            "currency": self.currency,
            "summary": {"workloads": len(history.workloads), "gpus": history.gpus, "nodes": len(history.nodes),
                        "teams": len(self.guarantees), "guarantees": dict(self.guarantees)},
            "tables": {"policies": self.policies, "teams": self.teams},
            "notes": list(self.notes),
            "params": {"checkpoint_interval_seconds": CHECKPOINT_INTERVAL_SECONDS,
                       "resume_overhead_seconds": RESUME_OVERHEAD_SECONDS, "submission": "first sample"},
        }


SUBMISSION_NOTE = ("submission times are not in the samples: each workload is taken as submitted at its first sample, "
                   "so the as-it-ran row has no queueing before a first start (its wait is only pauses)")


def build_report(history: History, policies: tuple[str, ...] = WHATIF_POLICIES,
                 guarantees: dict[str, float] | None = None, price_book: PriceBook | None = None,
                 inventory: Inventory | None = None) -> WhatIfReport:
    """Measure the as-it-ran schedule and a replay under each of ``policies``."""
    unknown = [p for p in policies if p not in WHATIF_POLICIES]
    if unknown:
        raise WhatIfError(f"unknown policy {unknown[0]!r}; choose from {', '.join(WHATIF_POLICIES)}")
    teams = sorted({w.team for w in history.workloads})
    given = dict(guarantees or {})
    strangers = sorted(set(given) - set(teams))
    if strangers:
        raise WhatIfError(f"guarantee for team {strangers[0]!r}, which has no workload in the window; "
                          f"teams: {', '.join(teams) or 'none'}")
    chosen = default_guarantees(history) if guarantees is None else {t: float(given.get(t, 0.0)) for t in teams}
    prices = Prices.of(history, price_book, inventory)
    notes = [SUBMISSION_NOTE, *history.notes]
    if guarantees is None:
        notes.append("guarantees: each team's share of the fleet in proportion to its GPU-hours in the window "
                     "(give your own with --guarantees)")
    rows, team_rows = [], []
    for schedule in [as_it_ran(history), *(replay(history, p, chosen) for p in policies)]:
        row, per_team = measure(history, schedule, chosen, prices)
        rows.append(row)
        team_rows += per_team
        if row["unfinished"]:
            notes.append(f"{schedule.policy}: {row['unfinished']} workload(s) never finished (no fleet capacity "
                         "could ever hold them); their wait runs to the end of the replay")
    return WhatIfReport(history, chosen, prices.currency, rows, team_rows, notes)


def whatif_report(source: Any, start: pd.Timestamp, end: pd.Timestamp, policies: tuple[str, ...] = WHATIF_POLICIES,
                  guarantees: dict[str, float] | None = None, max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS,
                  price_book: PriceBook | None = None, inventory: Inventory | None = None) -> WhatIfReport:
    """Read ``[start, end)`` from a samples source (or take a frame), rebuild and replay it."""
    frame = source if isinstance(source, pd.DataFrame) else source.read(start, end, list(NEEDED_COLUMNS))
    history = rebuild(frame, start, end, max_gap_seconds)
    del frame  # the samples read (most of the memory) are not needed by the replays
    return build_report(history, policies, guarantees, price_book, inventory)
