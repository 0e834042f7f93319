"""The Queue & quotas and Portal pages' tables, from a cluster snapshot and the scheduling room's
own planner (pure: no Streamlit).

Per team: guarantee, burst limit, GPUs allocated now (running workloads, MIG and fractions by
share), borrowed (allocated beyond the guarantee) and lent (unused guarantee other teams are
using, shared out in proportion to each lender's unused guarantee). Pending workloads come in the
planner's queue order with its wait reason; the estimated start is a rough, labelled guess.

Estimated start: running workloads free their GPUs when their known duration ends (simulation
and replay), or, on a live cluster where no duration is known, at the time a running workload's
``gpuwarden.io/expected-end`` annotation (ISO-8601, written by whoever submits it) names; with
neither, no estimate (None), never a guess.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd

from gpuwarden.fleet.protocols import ClusterSnapshot, WorkloadPhase, WorkloadState

from .planner import Schedule, plan

EXPECTED_END_ANNOTATION = "gpuwarden.io/expected-end"  # on a running workload: when it expects to finish (ISO-8601)


def quota_table(snapshot: ClusterSnapshot, used_gpus: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per team (and one for workloads of teams without a quota). ``used_gpus``: mean GPUs
    doing useful work per team over the window (from analytics), shown beside allocation."""
    allocated: dict[str, float] = {}
    for state in snapshot.workloads:
        if state.phase == WorkloadPhase.RUNNING and snapshot.in_queue(state.workload.namespace):
            owner = state.workload.team
            allocated[owner] = allocated.get(owner, 0.0) + state.workload.total_gpu_equivalents
    rows = []
    for team in snapshot.teams:
        held = allocated.get(team.name, 0.0)
        rows.append({"team": team.name, "guaranteed_gpus": float(team.guaranteed_gpus), "burst_limit_gpus": float(team.burst_limit_gpus),
                     "allocated_gpus": held, "used_gpus": (used_gpus or {}).get(team.name, float("nan")),
                     "borrowed_gpus": max(0.0, held - team.guaranteed_gpus), "weight": float(team.weight)})
    known = {t.name for t in snapshot.teams}
    for name, held in sorted(allocated.items()):
        if name not in known:
            rows.append({"team": name, "guaranteed_gpus": 0.0, "burst_limit_gpus": float("nan"), "allocated_gpus": held,
                         "used_gpus": (used_gpus or {}).get(name, float("nan")), "borrowed_gpus": held, "weight": float("nan")})
    table = pd.DataFrame(rows, columns=["team", "guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "used_gpus",
                                        "borrowed_gpus", "weight"])
    unused = (table["guaranteed_gpus"] - table["allocated_gpus"]).clip(lower=0.0)
    borrowed_total = float(table["borrowed_gpus"].sum())
    pool = float(unused.sum())
    table["lent_gpus"] = (unused * min(1.0, borrowed_total / pool)) if pool > 0 else 0.0
    return table.sort_values(["allocated_gpus", "team"], ascending=[False, True], ignore_index=True)


def pending_table(snapshot: ClusterSnapshot, result: Schedule) -> pd.DataFrame:
    """Waiting workloads in the planner's order: position, workload, team, GPUs, priority class,
    waiting time, reason and a rough estimated start."""
    by_key = {s.workload.key: s for s in snapshot.workloads}
    starts = estimated_starts(snapshot, result)
    rows = []
    for entry in result.queue:
        state = by_key.get(entry["job"])
        workload = state.workload if state else None
        rows.append({
            "position": entry["position"], "workload": entry["job"], "team": entry["team"],
            "gpus": workload.total_gpu_equivalents if workload else float("nan"),
            "priority_class": workload.priority_class.value if workload else str(entry["priority"]),
            "state": entry["state"], "waiting_hours": max(0.0, entry["waiting_seconds"]) / 3600.0,
            "reason": entry["reason"], "estimated_start": starts.get(entry["job"]),
        })
    return pd.DataFrame(rows, columns=["position", "workload", "team", "gpus", "priority_class", "state", "waiting_hours",
                                       "reason", "estimated_start"])


def expected_end(state: WorkloadState, taken_at: datetime) -> datetime | None:
    """When a running workload frees its GPUs: its known duration's end (simulation, replay), else
    its ``gpuwarden.io/expected-end`` annotation, else None (unknown)."""
    if state.duration_seconds is not None:
        return taken_at + timedelta(seconds=max(0.0, state.duration_seconds - state.progress_seconds))
    hint = state.annotations.get(EXPECTED_END_ANNOTATION)
    if not hint:
        return None
    try:
        end = datetime.fromisoformat(str(hint))
    except ValueError:
        return None  # a hint nobody can read is no estimate
    end = end if end.tzinfo else end.replace(tzinfo=UTC)
    return max(end, taken_at)


def estimated_starts(snapshot: ClusterSnapshot, result: Schedule) -> dict[str, datetime | None]:
    """A rough start time per waiting workload: running workloads free their GPUs when they are
    expected to end (:func:`expected_end`), and the queue takes freed GPUs in order. None where no
    end is known."""
    ends = []
    for state in snapshot.workloads:
        if state.phase != WorkloadPhase.RUNNING:
            continue
        end = expected_end(state, snapshot.taken_at)
        if end is not None:
            ends.append((end, state.workload.total_gpu_equivalents))
    ends.sort(key=lambda pair: pair[0])
    binding = {a.target for a in result.actions if a.kind.value in ("bind", "resume")}
    by_key = {s.workload.key: s for s in snapshot.workloads}
    out: dict[str, datetime | None] = {}
    needed, freed, i = 0.0, 0.0, 0
    for entry in result.queue:
        job = entry["job"]
        if job in binding:
            out[job] = snapshot.taken_at
            continue
        waiting = by_key.get(job)
        needed += waiting.workload.total_gpu_equivalents if waiting else 1.0
        while freed < needed and i < len(ends):
            freed += ends[i][1]
            i += 1
        out[job] = ends[i - 1][0] if freed >= needed and i else None
    return out


def plan_with(snapshot: ClusterSnapshot) -> Schedule:
    """The scheduling room's plan on this snapshot (the same planner the actuator calls)."""
    return plan(snapshot)
