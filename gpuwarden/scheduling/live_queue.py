"""The live queue: what the scheduler's ``GET /queue`` serves after each round (pure: no HTTP).

One JSON document per round (the issue-21 contract, read by ``gpuwarden queue``, the dashboard's
Queue page and the portal):

    {"taken_at": ISO, "policy": str, "round": int,
     "teams": [{"team", "guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "borrowed_gpus",
                "lent_gpus", "pending_workloads", "pending_gpus"}],
     "workloads": [{"position", "workload", "namespace", "name", "team", "priority_class", "gpus",
                    "shape", "state", "waiting_seconds", "reason", "estimated_start",
                    "requested_by"}],
     "ignored_pods": [{"pod", "reason"}]}

A team whose quota cannot be read carries ``error`` (the namespace and annotation) and holds its
waiting work; ``burst_limit_gpus`` is null for a team without a cap. ``ignored_pods``: pods in
namespaces outside the queue that carry the admission gate (gpuwarden leaves them alone).

Workloads come in the planner's queue order; workloads the round refused (bad input: an unknown
MIG profile, a pod larger than any node, a gang larger than the cluster) follow, with the reason
they can never start as it stands. The per-team table is :func:`queue_report.quota_table`'s, with
the waiting work counted beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gpuwarden.fleet import NO_CAP_GPUS, ClusterSnapshot, UnreadableWorkload, Workload, WorkloadPhase, WorkloadState

from .planner import Schedule, _priority_of
from .queue_report import estimated_starts, quota_table

TEAM_FIELDS = ("team", "guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "borrowed_gpus", "lent_gpus",
               "pending_workloads", "pending_gpus")
WORKLOAD_FIELDS = ("position", "workload", "namespace", "name", "team", "priority_class", "gpus", "shape", "state",
                   "waiting_seconds", "reason", "estimated_start", "requested_by")


def shape_of(workload: Workload) -> str:
    """What one workload asks for, as a person writes it: ``8 GPU``, ``4 x 8 GPU``, ``1g.10gb``, ``0.3 GPU``."""
    request = workload.gpus
    if request.mig_profile:
        per_pod = request.mig_profile
    elif request.fraction_milli < 1000:
        per_pod = f"{request.fraction_milli / 1000:g} GPU"
    else:
        per_pod = f"{request.count} GPU"
    return per_pod if workload.gang_size == 1 else f"{workload.gang_size} x {per_pod}"


def _number(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), 3)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def queue_document(snapshot: ClusterSnapshot, schedule: Schedule, *, policy: str, round_number: int,
                   refused: Mapping[str, str] | None = None, requested_by_annotation: str = "") -> dict[str, Any]:
    """The live queue after a round planned ``schedule`` on ``snapshot``. ``refused``: workloads
    the round held out of planning, with why; ``requested_by_annotation``: the annotation naming
    who submitted a workload (the portal's)."""
    by_key = {state.workload.key: state for state in snapshot.workloads}
    starts = estimated_starts(snapshot, schedule)
    rows: list[dict[str, Any]] = []
    for entry in schedule.queue:
        state = by_key.get(entry["job"])
        if state is None:
            continue
        rows.append(_row(state, len(rows) + 1, entry["state"], max(0.0, entry["waiting_seconds"]), entry["reason"],
                         starts.get(entry["job"]), requested_by_annotation))
    for key, why in sorted((refused or {}).items()):
        state = by_key.get(key)
        if state is None:
            unreadable = snapshot.unreadable.get(key)
            if unreadable is not None:  # its request cannot be read: no workload, but its owner waits
                rows.append(_unreadable_row(snapshot, key, unreadable, len(rows) + 1))
            continue
        waiting = max(0.0, (snapshot.taken_at - state.submitted_at).total_seconds())
        rows.append(_row(state, len(rows) + 1, _state_name(state), waiting, why, None, requested_by_annotation))
    return {"taken_at": snapshot.taken_at.isoformat(), "policy": policy, "round": round_number,
            "teams": _teams(snapshot, rows), "workloads": rows,
            "ignored_pods": [{"pod": pod, "reason": why} for pod, why in sorted(snapshot.ignored_pods.items())]}


def _unreadable_row(snapshot: ClusterSnapshot, key: str, item: UnreadableWorkload, position: int) -> dict[str, Any]:
    waiting = (snapshot.taken_at - item.submitted_at).total_seconds() if item.submitted_at else 0.0
    return {"position": position, "workload": key, "namespace": item.namespace, "name": item.name, "team": item.team,
            "priority_class": None, "gpus": None, "shape": "unreadable", "state": "pending",
            "waiting_seconds": round(max(0.0, waiting), 1), "reason": item.reason, "estimated_start": None,
            "requested_by": ""}


def _state_name(state: WorkloadState) -> str:
    return "suspended" if state.phase == WorkloadPhase.SUSPENDED else "pending"


def _row(state: WorkloadState, position: int, phase: str, waiting_seconds: float, reason: str,
         start: datetime | None, requested_by_annotation: str) -> dict[str, Any]:
    workload = state.workload
    return {"position": position, "workload": workload.key, "namespace": workload.namespace, "name": workload.name,
            "team": workload.team, "priority_class": _priority_of(state).value,
            "gpus": _number(workload.total_gpu_equivalents), "shape": shape_of(workload),
            "state": "suspended" if phase == "suspended" else "pending", "waiting_seconds": round(waiting_seconds, 1),
            "reason": reason, "estimated_start": _iso(start),
            "requested_by": str(state.annotations.get(requested_by_annotation, "")) if requested_by_annotation else ""}


def _teams(snapshot: ClusterSnapshot, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    waiting: dict[str, tuple[int, float]] = {}
    for row in rows:
        count, gpus = waiting.get(row["team"], (0, 0.0))
        waiting[row["team"]] = (count + 1, gpus + (row["gpus"] or 0.0))
    table = quota_table(snapshot)
    out = []
    for record in table.to_dict("records"):
        count, gpus = waiting.pop(record["team"], (0, 0.0))
        out.append({**{k: _number(record[k]) if k != "team" else record[k] for k in TEAM_FIELDS[:6]},
                    "pending_workloads": count, "pending_gpus": _number(gpus)})
    for team, (count, gpus) in sorted(waiting.items()):  # waiting work of a team with no quota and nothing running
        out.append({"team": team, "guaranteed_gpus": 0.0, "burst_limit_gpus": None, "allocated_gpus": 0.0,
                    "borrowed_gpus": 0.0, "lent_gpus": 0.0, "pending_workloads": count, "pending_gpus": _number(gpus)})
    for row in out:
        if row["burst_limit_gpus"] is not None and row["burst_limit_gpus"] >= NO_CAP_GPUS:
            row["burst_limit_gpus"] = None  # no cap
        team = str(row["team"])
        if team in snapshot.refused_teams:  # its quota annotation cannot be read: said where it is set
            row["error"] = snapshot.refused_teams[team]
    named = {row["team"] for row in out}
    out += [{"team": team, "guaranteed_gpus": None, "burst_limit_gpus": None, "allocated_gpus": 0.0,
             "borrowed_gpus": 0.0, "lent_gpus": 0.0, "pending_workloads": 0, "pending_gpus": 0.0, "error": why}
            for team, why in sorted(snapshot.refused_teams.items()) if team not in named]
    return out


def pending_by_team(document: Mapping[str, Any]) -> dict[str, tuple[int, float]]:
    """(waiting workloads, waiting GPUs) per team of a queue document."""
    return {team["team"]: (int(team["pending_workloads"]), float(team["pending_gpus"] or 0.0))
            for team in document.get("teams", ())}
