"""GPU-hours at risk: what a disruptive action would cost the work it stops, stated with the plan.

A workload that is stopped (its pods drained off a node, evicted, preempted, suspended) loses what
it did since its last checkpoint. That moment is the first of these that is known, and the
statement says which (``basis``):

- ``last-checkpoint``: the trainer's own word, the latest of its annotations
  ``gpuwarden.io/last-checkpoint-at`` and ``gpuwarden.io/checkpoint-done-at``, when it is not
  before the run's start (a checkpoint from before a restart saves nothing of this run);
- ``start-time``: the current run's start: everything since is at risk;
- ``attained-service``: no start known: the GPU-seconds of service it received (an upper bound);
- ``unknown``: none of them (0 stated, and said so).

The GPUs are the whole workload's (whole-GPU equivalents x gang size): a gang loses every rank's
work when one of its pods goes. Only running work is at risk. A cordon, or a taint that evicts
nothing, stops nothing and states 0 with its mode. A drain states, per workload, the mode its pods
get (the namespace's ``gpuwarden.io/drain-mode`` label, else the node's, else the plan's), and which
checkpointable workloads it asks to save first (:mod:`.checkpoint_first`): those its mode would
evict at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, WorkloadPhase, WorkloadState
from gpuwarden.fleet.object_names import (CHECKPOINT_DONE_AT_ANNOTATION, DRAIN_MODE_LABEL,
                                          LAST_CHECKPOINT_ANNOTATION)
from gpuwarden.fleet.taints import taint_blocks

LAST_CHECKPOINT, START_TIME, ATTAINED, UNKNOWN, NOTHING = (
    "last-checkpoint", "start-time", "attained-service", "unknown", "none")
# The kinds whose plan entry states what is at stake: every disruptive one (pacing's and the stops)
STATED = (ActionKind.CORDON, ActionKind.TAINT, ActionKind.DRAIN, ActionKind.EVICT, ActionKind.PREEMPT,
          ActionKind.SUSPEND)
SUSPENDABLE_CONTROLLERS = ("Job", "JobSet", "Workload")  # batch/v1 spec.suspend, JobSet spec.suspend, Kueue spec.active
IMMEDIATE = "immediate"
LISTED = 10  # workloads listed per action (the largest first); the total counts them all


@dataclass(frozen=True)
class Running:
    """The running workloads by node (those with a pod on it) and by key: built once per plan."""

    by_node: Mapping[str, list[WorkloadState]]
    by_key: Mapping[str, WorkloadState]


def aware(at: datetime) -> datetime:
    """``at`` with a time zone (a naive time is UTC): annotations and clocks compare safely."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def parse_time(value: object) -> datetime | None:
    """An annotation's ISO-8601 time (``Z`` or an offset; naive read as UTC), None when unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return aware(datetime.fromisoformat(value))
    except ValueError:
        return None


def iso(at: datetime) -> str:
    """Kubernetes' form of a time (UTC, ``Z``), what trainers parse most easily."""
    return aware(at).astimezone(UTC).isoformat().replace("+00:00", "Z")


def last_checkpoint(annotations: Mapping[str, str]) -> datetime | None:
    times = [parse_time(annotations.get(k)) for k in (LAST_CHECKPOINT_ANNOTATION, CHECKPOINT_DONE_AT_ANNOTATION)]
    return max((t for t in times if t is not None), default=None)


@dataclass(frozen=True)
class Risk:
    """One workload's work at risk: GPUs x hours since ``since`` (what ``basis`` says it is)."""

    workload: str
    gpus: float
    gpu_hours: float
    basis: str
    since: datetime | None
    checkpointable: bool
    mode: str

    def record(self) -> dict[str, Any]:
        return {"workload": self.workload, "gpus": round(self.gpus, 3), "gpu_hours": round(self.gpu_hours, 3),
                "basis": self.basis, "since": iso(self.since) if self.since else None,
                "checkpointable": self.checkpointable, "mode": self.mode}


def work_at_risk(state: WorkloadState, now: datetime, mode: str = "") -> Risk:
    """What stopping ``state`` at ``now`` loses, and on what basis (module docstring)."""
    now, gpus = aware(now), state.workload.total_gpu_equivalents
    key, checkpointable = state.workload.key, state.workload.checkpointable
    started = aware(state.started_at) if state.started_at else None
    saved = last_checkpoint(state.annotations)
    if saved is not None and (started is None or saved >= started):
        since, basis = min(saved, now), LAST_CHECKPOINT
    elif started is not None:
        since, basis = min(started, now), START_TIME
    else:
        attained = state.attained_gpu_seconds
        if math.isfinite(attained) and attained > 0:
            return Risk(key, gpus, attained / 3600.0, ATTAINED, None, checkpointable, mode)
        return Risk(key, gpus, 0.0, UNKNOWN, None, checkpointable, mode)
    return Risk(key, gpus, gpus * (now - since).total_seconds() / 3600.0, basis, since, checkpointable, mode)


def running(snapshot: ClusterSnapshot) -> Running:
    by_node: dict[str, list[WorkloadState]] = {}
    by_key: dict[str, WorkloadState] = {}
    for state in snapshot.workloads:
        if state.phase == WorkloadPhase.RUNNING:
            by_key[state.workload.key] = state
            for node in dict.fromkeys(p.node for p in state.placements):  # each node once, in placement order
                by_node.setdefault(node, []).append(state)
    return Running(by_node, by_key)


def _drain_mode(action: Action, snapshot: ClusterSnapshot) -> str:
    """The node's drain mode: its label, else the plan's."""
    return str((snapshot.node_labels.get(action.target) or {}).get(DRAIN_MODE_LABEL)
               or action.params.get("mode") or IMMEDIATE)


def stopped_by(action: Action, snapshot: ClusterSnapshot, index: Running) -> list[tuple[WorkloadState, str]]:
    """The running workloads ``action`` stops, each with the mode it is stopped in."""
    kind, target = action.kind, action.target
    if kind == ActionKind.DRAIN:
        node_mode = _drain_mode(action, snapshot)
        return [(s, str((snapshot.namespace_labels.get(s.workload.namespace) or {}).get(DRAIN_MODE_LABEL) or node_mode))
                for s in index.by_node.get(target, ())]
    if kind == ActionKind.TAINT:
        taint = str(action.params.get("taint", ""))
        return [(s, "evicted by the NoExecute taint") for s in index.by_node.get(target, ())
                if taint.endswith(":NoExecute") and taint_blocks(taint, s.workload.tolerations)]
    if kind not in (ActionKind.EVICT, ActionKind.PREEMPT, ActionKind.SUSPEND):
        return []
    state = index.by_key.get(target)
    if state is None:
        return []
    suspends = kind == ActionKind.SUSPEND or (kind == ActionKind.PREEMPT and (
        state.workload.checkpointable or state.controller in SUSPENDABLE_CONTROLLERS))
    grace = action.params.get("grace_seconds")
    return [(state, f"suspend ({grace} s to save)" if suspends and grace is not None else
             "suspend" if suspends else "evict")]


def _mode_line(action: Action, snapshot: ClusterSnapshot, risks: list[Risk], asked: list[str],
               timeout_seconds: float) -> str:
    kind = action.kind
    if kind == ActionKind.CORDON:
        return "cordon: running work continues"
    if kind == ActionKind.TAINT:
        return f"taint {action.params.get('taint', '')}: " + (
            "evicts what does not tolerate it" if risks else "running work continues")
    if kind != ActionKind.DRAIN:
        return ", ".join(sorted({r.mode for r in risks})) or kind.value
    base = _drain_mode(action, snapshot)
    if base == "allow-completion":
        base += f" (up to {float(action.params.get('timeout_seconds') or 0):.0f} s)"
    others = sorted({r.mode for r in risks} - {_drain_mode(action, snapshot)})
    base += f"; namespace label: {', '.join(others)}" if others else ""
    return f"checkpoint-first (up to {timeout_seconds:.0f} s), then {base}" if asked else base


def statement(action: Action, snapshot: ClusterSnapshot, now: datetime, checkpoint_timeout_seconds: float = 0.0,
              index: Running | None = None) -> dict[str, Any]:
    """What ``action`` puts at stake at ``now``: the GPU-hours at risk (total and per workload, the
    largest first), their basis, the mode, and for a drain the checkpointable workloads it asks to
    save first (none when ``checkpoint_timeout_seconds`` is 0). {} for a kind that stops nothing."""
    if action.kind not in STATED:
        return {}
    index = running(snapshot) if index is None else index
    risks = sorted((work_at_risk(state, now, mode) for state, mode in stopped_by(action, snapshot, index)),
                   key=lambda r: (-r.gpu_hours, r.workload))
    timeout = checkpoint_timeout_seconds if math.isfinite(checkpoint_timeout_seconds) else 0.0
    asked = sorted(r.workload for r in risks if r.checkpointable and r.mode == IMMEDIATE) \
        if action.kind == ActionKind.DRAIN and timeout > 0 else []
    out: dict[str, Any] = {
        "gpu_hours_at_risk": round(sum(r.gpu_hours for r in risks), 3),
        "at_risk_basis": "+".join(sorted({r.basis for r in risks})) or NOTHING,
        "workloads_at_risk": len(risks),
        "at_risk": [r.record() for r in risks[:LISTED]],
        "stop_mode": _mode_line(action, snapshot, risks, asked, timeout),
    }
    if asked:
        out["checkpoint_first"] = {"timeout_seconds": timeout, "workloads": asked}
    return out


def risk_line(params: Mapping[str, Any]) -> str:
    """One line for a log entry's message: GPU-hours at risk, its basis and the mode ("" if unstated)."""
    if "gpu_hours_at_risk" not in params:
        return ""
    return (f"{number(params.get('gpu_hours_at_risk')):.2f} GPU-h at risk ({params.get('at_risk_basis')}, "
            f"{number(params.get('workloads_at_risk')):.0f} workload(s)); mode: {params.get('stop_mode')}")


def number(value: object) -> float:
    """A logged figure as a float (0.0 for a value a hand-edited line made unreadable)."""
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) else 0.0
