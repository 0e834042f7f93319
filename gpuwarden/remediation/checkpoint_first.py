"""Checkpoint-first drains: a drain of checkpointable work asks for a checkpoint, and goes ahead once
it is done or at the deadline.

The protocol for trainers (the names are in :mod:`gpuwarden.fleet.object_names`; docs/remediation.md):

1. **request**: gpuwarden writes ``gpuwarden.io/checkpoint-request=<id>`` and
   ``gpuwarden.io/checkpoint-deadline=<ISO-8601 UTC>`` on each pod and the Job of every checkpointable
   workload the drain would evict at once, and an Event ``CheckpointRequested`` on its owner;
2. **done**: the trainer saves, then writes ``gpuwarden.io/checkpoint-done=<the same id>`` and
   ``gpuwarden.io/checkpoint-done-at=<its checkpoint's time>`` on its pod or Job (one PATCH);
3. **timeout**: at the deadline gpuwarden drains, answered or not.

The state lives where the actuator's always does. The request is recorded in the audit log (a
``drain`` entry, outcome ``retry-later``, with ``params.checkpoint``: id, deadline, workloads) before
anything is written on the cluster, and the answers are annotations on the workloads, so a process
that stops between the request and the drain resumes from the log and the cluster alone: the same
id, the same deadline, the annotations written again where they are missing (a PATCH only where a
value differs). While it waits nothing more is logged and the node is not cordoned (the drain
cordons it when it goes ahead). The drain's own entry carries what happened (``params.checkpoint``:
``done``, ``timed-out`` or ``not-asked``, each workload's answer) and the GPU-hours at risk restated
at the moment it went. A concluded request stands while the drain goes on (a PodDisruptionBudget's
retry) until as long again as its timeout after the deadline; a later drain of the node asks anew.
A cluster that takes no workload annotations (the simulator) is not asked: ``not-asked``, and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpuwarden.fleet import Action, ActionKind, Cluster, ClusterSnapshot, WorkloadPhase
from gpuwarden.fleet.capabilities import WorkloadNotices
from gpuwarden.fleet.clock import Clock
from gpuwarden.fleet.object_names import (CHECKPOINT_DEADLINE_ANNOTATION, CHECKPOINT_DONE_ANNOTATION,
                                          CHECKPOINT_DONE_AT_ANNOTATION, CHECKPOINT_REQUEST_ANNOTATION)

from .at_risk import STATED, Running, iso, number, parse_time, running, statement
from .audit import Outcome, Record, new_id

REQUESTED, DONE, TIMED_OUT, NOT_ASKED = "requested", "done", "timed-out", "not-asked"
ANSWERED, GONE, NO_ANSWER = "done", "gone", "no answer"
EVENT_REASON = "CheckpointRequested"

Recorder = Callable[[Outcome, Action, str], None]  # records an entry in the audit log


@dataclass(frozen=True)
class Request:
    """A checkpoint request for the drain of ``node``: what the audit log keeps of it."""

    request_id: str
    node: str
    requested_at: datetime
    deadline: datetime
    workloads: tuple[str, ...]
    gpu_hours_at_risk: float = 0.0  # when it was asked

    @property
    def stands_until(self) -> datetime:
        return self.deadline + (self.deadline - self.requested_at)

    def record(self, state: str, **more: Any) -> dict[str, Any]:
        return {"state": state, "request_id": self.request_id, "requested_at": iso(self.requested_at),
                "deadline": iso(self.deadline), "workloads": list(self.workloads),
                "gpu_hours_at_risk_at_request": round(self.gpu_hours_at_risk, 3), **more}

    @staticmethod
    def from_record(node: str, checkpoint: Mapping[str, Any]) -> Request | None:
        at, deadline = parse_time(checkpoint.get("requested_at")), parse_time(checkpoint.get("deadline"))
        workloads = checkpoint.get("workloads")
        if at is None or deadline is None or not isinstance(workloads, list):
            return None  # a hand-edited or torn record: not a request to resume (a new one is asked)
        return Request(str(checkpoint.get("request_id")), node, at, deadline, tuple(str(w) for w in workloads),
                       number(checkpoint.get("gpu_hours_at_risk_at_request")))


def standing_request(records: Sequence[Record], node: str, now: datetime) -> Request | None:
    """The latest checkpoint request the log holds for a drain of ``node``, if it still stands."""
    for record in reversed(records):
        params = record.get("params")
        if record.get("kind") != ActionKind.DRAIN.value or record.get("target") != node or not isinstance(params, dict):
            continue
        checkpoint = params.get("checkpoint")
        if isinstance(checkpoint, dict) and checkpoint.get("request_id"):
            request = Request.from_record(node, checkpoint)
            return request if request is not None and now <= request.stands_until else None
    return None


def answers(request: Request, snapshot: ClusterSnapshot) -> list[dict[str, Any]]:
    """Each asked workload's answer on ``snapshot``: done (with its checkpoint's time), gone (no
    longer running on the node: it has nothing left to lose there) or no answer yet."""
    states = {s.workload.key: s for s in snapshot.workloads}
    out = []
    for key in request.workloads:
        state = states.get(key)
        if state is None or state.phase != WorkloadPhase.RUNNING or all(p.node != request.node for p in state.placements):
            out.append({"workload": key, "answer": GONE, "checkpoint_at": None})
        elif state.annotations.get(CHECKPOINT_DONE_ANNOTATION) == request.request_id:
            out.append({"workload": key, "answer": ANSWERED,
                        "checkpoint_at": state.annotations.get(CHECKPOINT_DONE_AT_ANNOTATION)})
        else:
            out.append({"workload": key, "answer": NO_ANSWER, "checkpoint_at": None})
    return out


def conclusion(request: Request, found: list[dict[str, Any]], now: datetime) -> str:
    """done once every asked workload answered (or left), timed-out at the deadline, else requested."""
    if all(a["answer"] != NO_ANSWER for a in found):
        return DONE
    return TIMED_OUT if now >= request.deadline else REQUESTED


def with_params(action: Action, more: Mapping[str, Any]) -> Action:
    return Action(action.kind, action.target, action.reason, {**action.params, **more}) if more else action


class CheckpointFirst:
    """The applier's step before a disruptive action: its statement restated on the round's
    snapshot, and for a checkpoint-first drain the protocol above."""

    def __init__(self, cluster: Cluster, clock: Clock) -> None:
        self.cluster, self.clock = cluster, clock
        self._index: tuple[ClusterSnapshot, Running] | None = None  # the round's, built once

    def _running(self, snapshot: ClusterSnapshot) -> Running:
        if self._index is None or self._index[0] is not snapshot:
            self._index = (snapshot, running(snapshot))
        return self._index[1]

    def step(self, action: Action, snapshot: ClusterSnapshot, records: Sequence[Record], record: Recorder) -> Action | None:
        """The action to apply now, or None while a drain waits for its checkpoint (the request
        recorded through ``record`` once, when it is made)."""
        if action.kind not in STATED:
            return action
        now = self.clock.now()
        wanted = action.params.get("checkpoint_first")
        timeout = number(wanted.get("timeout_seconds")) if isinstance(wanted, Mapping) else 0.0
        said = statement(action, snapshot, now, timeout, self._running(snapshot))
        stated = with_params(action, said)
        if action.kind != ActionKind.DRAIN or timeout <= 0:
            return stated
        request = standing_request(records, action.target, now)
        if request is None:
            asked = tuple(said.get("checkpoint_first", {}).get("workloads", ()))
            if not asked:
                return stated  # no checkpointable work left there to ask
            if not isinstance(self.cluster, WorkloadNotices):
                return with_params(stated, {"checkpoint": {"state": NOT_ASKED, "workloads": list(asked),
                                                           "why": "this cluster takes no workload annotations"}})
            request = Request(new_id(), action.target, now, now + timedelta(seconds=timeout), asked,
                              number(said.get("gpu_hours_at_risk")))
            # the log first: a process that stops after this line resumes this request, never asks twice
            record(Outcome.RETRY, with_params(stated, {"checkpoint": request.record(REQUESTED)}),
                   f"checkpoint requested ({request.request_id}) from {len(asked)} workload(s): "
                   f"{', '.join(asked[:5])}; the drain waits for their answer or until {iso(request.deadline)}")
            self._ask(request, self.cluster, first=True)
            return None
        found = answers(request, snapshot)
        state = conclusion(request, found, now)
        if state == REQUESTED:
            if isinstance(self.cluster, WorkloadNotices):
                self._ask(request, self.cluster, first=False)  # writes only what is missing (a crash before it)
            return None
        return with_params(stated, {"checkpoint": request.record(
            state, answers=found, waited_seconds=round((now - request.requested_at).total_seconds(), 1))})

    @staticmethod
    def _ask(request: Request, notices: WorkloadNotices, first: bool) -> None:
        values: dict[str, str | None] = {CHECKPOINT_REQUEST_ANNOTATION: request.request_id,
                                         CHECKPOINT_DEADLINE_ANNOTATION: iso(request.deadline)}
        for workload in request.workloads:
            notices.annotate_workload(workload, values)
            if first:
                notices.record_workload_event(
                    workload, EVENT_REASON,
                    f"gpuwarden drains node {request.node} at {iso(request.deadline)}, or once this workload saves: "
                    f"write {CHECKPOINT_DONE_ANNOTATION}={request.request_id} and {CHECKPOINT_DONE_AT_ANNOTATION}="
                    "<checkpoint time> on its pod or Job")


def risk_rows(records: Sequence[Record]) -> list[dict[str, Any]]:
    """The log's entries that state work at risk, newest first, for the Actions page: the GPU-hours,
    the basis, the mode and the checkpoint (requested, done, timed out, with the answers)."""
    rows = []
    for record in reversed(records):
        params = record.get("params")
        if not isinstance(params, dict) or "gpu_hours_at_risk" not in params:
            continue
        checkpoint, first = _mapping(params.get("checkpoint")), _mapping(params.get("checkpoint_first"))
        found = [a for a in checkpoint.get("answers") or () if isinstance(a, dict)]
        asked = checkpoint.get("workloads") if isinstance(checkpoint.get("workloads"), list) else []
        rows.append({
            "at": record.get("at"), "outcome": record.get("outcome"), "kind": record.get("kind"),
            "target": record.get("target"), "gpu_hours_at_risk": number(params.get("gpu_hours_at_risk")),
            "basis": params.get("at_risk_basis"),
            "checkpoint": checkpoint.get("state") or (f"asks {len(first.get('workloads') or ())} first" if first else ""),
            "answered": f"{sum(a.get('answer') == ANSWERED for a in found)}/{len(asked)}" if asked else "",
            "mode": params.get("stop_mode"), "request_id": checkpoint.get("request_id"), "deadline": checkpoint.get("deadline"),
            "at_risk_when_asked": checkpoint.get("gpu_hours_at_risk_at_request"),
        })
    return rows


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
