"""The scheduling round: the one loop body that schedules a cluster, live or simulated.

Each round reads ``cluster.snapshot()``, fills each workload's attained service where it was given
a source of it (``attained``: the live service measures it from the metrics source; the simulator
counts it itself), holds out workloads that cannot start as they stand (:mod:`.round_screen`), plans
on the rest with the scheduling engine (``scheduling.planner``: every fact it uses is in the
snapshot; work outside the queue's namespaces only holds capacity), checks the whole plan against
the invariants (``scheduling.verify``: a plan that breaks one is refused whole, logged and counted,
and nothing of it is done), applies the actions through ``cluster.apply`` and builds the live queue
(:func:`gpuwarden.scheduling.live_queue.queue_document`). Where the cluster can publish
(``record_workload_event`` / ``annotate_workload``, :mod:`.queue_publication`) each waiting
workload gets its position, reason and estimated start. Between rounds it keeps only what a live
loop can know because it did it itself:

- which workloads it suspended: it resumes those, and those annotated
  ``gpuwarden.io/suspended-by: scheduler`` (what survives a restart); one idle reclaim suspended
  (``idle-reclaim``) only once its owner set ``gpuwarden.io/resume-requested``; a Job a user
  created suspended (no annotation) never;
- when it preempted each workload and until when the policy protects it from more preemption;
- the priority changes it asked a Kueue Workload for (asked once per value).

Its own suspends and preemptions carry ``params["by"] = "scheduler"`` (the cluster writes the
annotation). Times are Unix seconds (the engine's times are seconds since an origin; a fixed one
keeps the history comparable across rounds, and keeps every time after 0, which the engine reads
as "unset"). The simulator calls :meth:`SchedulingRound.run_round` through
``fleet.SchedulingHook``; a live process runs it on its runner every scheduling interval
(:mod:`.scheduler_service`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuwarden.fleet import (
    Action,
    ActionKind,
    ActionResult,
    Cluster,
    ClusterSnapshot,
    WorkloadPhase,
    WorkloadState,
)
from gpuwarden.scheduling import JobState, Scheduler, State
from gpuwarden.scheduling.live_queue import queue_document
from gpuwarden.scheduling.planner import KnownJobs, Schedule, actions_for, policy_for, state_from_snapshot
from gpuwarden.scheduling.scheduler import Decision, DecisionKind, QueueEntry, queue_positions
from gpuwarden.scheduling.ledgers import check_actions
from gpuwarden.scheduling.verify import Violation

from gpuwarden.fleet.object_names import (
    REQUESTED_BY_ANNOTATION,
    RESUME_REQUESTED_ANNOTATION,
    SUSPENDED_BY_ANNOTATION,
    SUSPENDED_BY_IDLE_RECLAIM as BY_IDLE_RECLAIM,
)
from .mig_manager import mig_change
from .queue_publication import Publisher
from .round_screen import screen

STOPS = (ActionKind.SUSPEND, ActionKind.PREEMPT)  # a PREEMPT of a checkpointable workload suspends it
STARTS = (ActionKind.BIND, ActionKind.RESUME)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BY_SCHEDULER = "scheduler"
# read once: an enum member read off its class costs more than the test it is used in (3.11), and
# these are tested once per workload per round
_SUSPENDED, _JOB_SUSPENDED = WorkloadPhase.SUSPENDED, JobState.SUSPENDED
log = logging.getLogger("gpuwarden.scheduler")
# How long a reader of the live queue waits for the round in progress when the round before's queue
# was not kept (nobody had read it): below the dashboard's 3 s and ``gpuwarden queue``'s 10 s request
# timeouts, so they get the server's 503 with Retry-After rather than a timeout of their own.
QUEUE_WAIT_SECONDS = 2.0

# {workload key: GPU-seconds of service over the policy's window}, measured outside the round
AttainedSource = Callable[[ClusterSnapshot], Mapping[str, float]]


@dataclass(frozen=True)
class RoundOutcome:
    """What one round did, for its observers (metrics, the CLI's one-line summary)."""

    snapshot: ClusterSnapshot
    results: tuple[ActionResult, ...]
    queue: Mapping[str, Any]
    preemption_reasons: Mapping[str, str]  # victim workload -> "reclaim" | "priority" | "defragment"
    seconds: float
    refused: tuple[Violation, ...] = ()  # the invariants the round's plan broke (then nothing was carried out)


class SchedulingRound:
    """Runs the scheduling policy ``policy`` on ``cluster``, one round per :meth:`run_round`."""

    def __init__(self, cluster: Cluster, policy: str = "gpuwarden", attained: AttainedSource | None = None,
                 on_round: Iterable[Callable[[RoundOutcome], None]] = (), mig_manager: bool = False) -> None:
        """``mig_manager``: also set a drained MIG node's named layout for the MIG work that waits
        (:mod:`.mig_manager`; opt-in: it changes nodes)."""
        self.cluster = cluster
        self.mig_manager = mig_manager
        self.policy = policy
        self.attained = attained
        self.on_round = list(on_round)
        self.suspended: set[str] = set()  # workloads this round stopped that may be suspended now
        # per workload it preempted: (when, in round seconds; protected from preemption until)
        self.preemptions: dict[str, tuple[list[float], float]] = {}
        self.refused = 0  # actions the cluster refused (the snapshot and the cluster disagreed)
        self.plans_refused = 0  # plans the verifier refused whole (an invariant broken: a bug, logged)
        self.known: KnownJobs = {}  # the engine's jobs of the last round, refreshed by the planner (not rebuilt)
        self.priorities_asked: dict[str, str] = {}  # Kueue priority changes asked, by workload
        self.publisher = Publisher(cluster)
        # the latest round's snapshot (every workload, held ones too), actions, queue (as the
        # positions or what gives them), held workloads, policy, number
        self._latest: tuple[ClusterSnapshot, tuple[Action, ...], _Positions, dict[str, str], str, int] | None = None
        self._queue: dict[str, Any] | None = None
        # A server thread reads the queue while the next round runs. The latest round's positions
        # are worked out from its jobs, which the next round refreshes for its own pass: it works
        # them out first where the queue is read, else drops them (``_replacing``: a first reader
        # meanwhile waits for the new round's, at most ``queue_wait_seconds``).
        self._queue_changed = threading.Condition()
        self.queue_wait_seconds = QUEUE_WAIT_SECONDS
        self._queue_read = False
        self._replacing = False
        self.rounds = 0

    def run_round(self) -> tuple[ActionResult, ...]:
        with self._queue_changed:
            if self._latest is not None and self._queue is None:
                if self._queue_read:
                    self._latest[2].entries()
                else:
                    self._replacing = True
        try:
            return self._round()
        finally:
            with self._queue_changed:
                if self._replacing:  # the round failed before it replaced the queue it dropped
                    self._latest, self._replacing = None, False
                self._queue_changed.notify_all()

    def _round(self) -> tuple[ActionResult, ...]:
        started = time.perf_counter()
        snapshot = self._with_attained(self.cluster.snapshot())
        policy = policy_for(snapshot, self.policy)
        held = screen(snapshot, policy.placement, self.mig_manager)  # what cannot start as it stands: key -> why
        planned = dataclasses.replace(snapshot, workloads=tuple(
            ws for ws in snapshot.workloads if ws.workload.key not in held)) if held else snapshot
        state, workloads = state_from_snapshot(planned, origin=EPOCH, known=self.known)
        self._recall(workloads, state)
        scheduler = Scheduler(policy)
        now = (snapshot.taken_at - EPOCH).total_seconds()
        decisions = scheduler.schedule(state, now)
        self.known = {key: (workloads[key], job) for key, job in state.jobs.items()}
        actions = _after_stops(actions_for(decisions, state, scheduler.policy.name), decisions, workloads)
        mig = mig_change(planned) if self.mig_manager else None
        stopped = {d.job for d in decisions if d.kind in (DecisionKind.SUSPEND, DecisionKind.PREEMPT)}
        plan = (_reserved_admissions(planned, stopped) + actions + self._priority_changes(planned)
                + ((mig,) if mig else ()))
        broken = tuple(check_actions(snapshot, plan, policy.quotas))  # the invariants, before anything is carried out
        if broken:
            self.plans_refused += 1
            log.error("scheduler: round %d's plan refused whole (%d action(s), nothing carried out): %s",
                      self.rounds + 1, len(plan), "; ".join(map(str, broken)))
            log.debug("scheduler: the refused plan: %s", "; ".join(f"{a.kind.value} {a.target} {a.params}" for a in plan))
            reasons: dict[str, str] = {}
            results: tuple[ActionResult, ...] = ()
        else:
            reasons = self._note_preemptions(state, decisions)
            results = tuple(self._apply(plan))
        self.rounds += 1
        latest = (snapshot, actions, _Positions(scheduler, state, now), {**held, **self._held_suspended(snapshot)},
                  scheduler.policy.name, self.rounds)
        with self._queue_changed:
            self._latest, self._queue, self._replacing = latest, None, False
        if self.publisher.can_publish:
            self.publisher.publish(snapshot, self.queue, held, results)
        if self.on_round:
            outcome = RoundOutcome(snapshot, results, self.queue, reasons, time.perf_counter() - started, broken)
            for observe in self.on_round:
                observe(outcome)
        return results

    @property
    def queue(self) -> dict[str, Any]:
        """The live queue after the latest round (the contract's JSON document; built when first
        asked for, so a simulation nobody watches does not pay for it); empty before the first round.

        Bounded: a round drops the positions of a round before that nobody read (its own pass
        refreshes the jobs they are worked out from), so the first reader during such a round waits
        for it, at most ``queue_wait_seconds`` (:data:`QUEUE_WAIT_SECONDS`); a round that has not
        finished by then (a slow API server) gives the empty document, as before the first round,
        which the queue server answers with 503 and Retry-After."""
        with self._queue_changed:
            self._queue_read = True
            if not self._queue_changed.wait_for(lambda: not self._replacing, timeout=self.queue_wait_seconds):
                log.warning("scheduler: the live queue was asked for while round %d runs, and it has not finished "
                            "within %.1f s; answered as before the first round", self.rounds + 1,
                            self.queue_wait_seconds)
                return {}
            if self._queue is None:
                if self._latest is None:
                    return {}
                taken, actions, positions, refused, policy, number = self._latest
                schedule = Schedule(actions, positions.entries())
                self._queue = queue_document(taken, schedule, policy=policy, round_number=number,
                                             refused=refused, requested_by_annotation=REQUESTED_BY_ANNOTATION)
            return self._queue

    def _with_attained(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot with each workload's attained service replaced by the measured one."""
        if self.attained is None:
            return snapshot
        measured = self.attained(snapshot)
        if not measured:
            return snapshot
        return dataclasses.replace(snapshot, workloads=tuple(
            dataclasses.replace(ws, attained_gpu_seconds=float(measured[ws.workload.key]))
            if ws.workload.key in measured else ws for ws in snapshot.workloads))

    def may_resume(self, state: WorkloadState) -> bool:
        """Whether this round may resume a suspended workload (the module docstring's rules)."""
        by = state.annotations.get(SUSPENDED_BY_ANNOTATION)
        if by == BY_IDLE_RECLAIM:
            return bool(state.annotations.get(RESUME_REQUESTED_ANNOTATION))
        return by == BY_SCHEDULER or state.workload.key in self.suspended

    def _held_suspended(self, snapshot: ClusterSnapshot) -> dict[str, str]:
        """Suspended workloads it may not resume, with why (shown in the queue, never planned)."""
        held = {}
        for ws in snapshot.workloads:
            if ws.phase != _SUSPENDED or self.may_resume(ws) or not snapshot.in_queue(ws.workload.namespace):
                continue
            by = ws.annotations.get(SUSPENDED_BY_ANNOTATION)
            held[ws.workload.key] = (
                f"suspended by idle reclaim; resumes once its owner sets {RESUME_REQUESTED_ANNOTATION}"
                if by == BY_IDLE_RECLAIM else f"suspended by {by}; theirs to resume" if by else
                "suspended by its owner (created suspended); theirs to resume")
        return held

    def _recall(self, workloads: Mapping[str, WorkloadState], state: State) -> None:
        """Hold others' suspends out of the plan; give back the preemption history it keeps."""
        self.suspended = {key for key in self.suspended
                          if key in workloads and workloads[key].phase == _SUSPENDED}
        self.preemptions = {key: kept for key, kept in self.preemptions.items() if key in workloads}
        for key, job in list(state.jobs.items()):
            if job.state == _JOB_SUSPENDED and not self.may_resume(workloads[key]):
                del state.jobs[key]  # suspended by someone else: theirs to resume
            elif key in self.preemptions:  # its history; protection the snapshot gives (stopping, scope) stays
                job.preempted_at = list(self.preemptions[key][0])
                job.protected_until = max(job.protected_until, self.preemptions[key][1])
            elif job.preempted_at:
                job.preempted_at = []  # preemptions it did not make do not count towards protection

    def _note_preemptions(self, state: State, decisions: Iterable[Decision]) -> dict[str, str]:
        """Keep each victim's preemption history; return why each was stopped: ``reclaim`` (for
        another team), ``priority`` (for its own team's work) or ``defragment`` (moved)."""
        reasons: dict[str, str] = {}
        victims: list[str] = []
        for decision in decisions:
            if decision.kind in (DecisionKind.SUSPEND, DecisionKind.PREEMPT):
                job = state.jobs[decision.job]
                self.preemptions[decision.job] = (list(job.preempted_at), job.protected_until)
                victims.append(decision.job)
            elif victims:  # the start the victims just before it made room for
                beneficiary = state.jobs[decision.job].team
                for victim in victims:
                    moved = state.jobs[victim].state == JobState.RUNNING or decision.reason.startswith("moved")
                    reasons[victim] = "defragment" if moved else (
                        "reclaim" if state.jobs[victim].team != beneficiary else "priority")
                victims = []
        return reasons

    def _priority_changes(self, snapshot: ClusterSnapshot) -> tuple[Action, ...]:
        """SET_PRIORITY where a team lead's override differs from the class Kueue runs the workload
        at (the snapshot's ``kueue_managed``); elsewhere the override only orders gpuwarden's queue
        (the planner reads it)."""
        managed = snapshot.kueue_managed
        if not managed:
            return ()
        actions = []
        for ws in snapshot.workloads:
            key, wanted = ws.workload.key, ws.priority_override
            if (key in managed and wanted and wanted != ws.workload.priority_class.value
                    and self.priorities_asked.get(key) != wanted and snapshot.in_queue(ws.workload.namespace)):
                self.priorities_asked[key] = wanted
                actions.append(Action(ActionKind.SET_PRIORITY, key, f"priority changed to {wanted} by its team's lead",
                                      {"priority_class": wanted}))
        return tuple(actions)

    def _apply(self, actions: Iterable[Action]) -> Iterable[ActionResult]:
        for action in actions:
            if action.kind in STOPS:
                action = dataclasses.replace(action, params={**action.params, "by": BY_SCHEDULER})
            result = self.cluster.apply(action)
            if not result.ok:
                self.refused += 1
                log.warning("scheduler: %s %s refused: %s", action.kind.value, action.target, result.message)
            elif result.action.kind in STOPS:
                self.suspended.add(result.action.target)
            elif result.action.kind in STARTS:
                self.suspended.discard(result.action.target)
            yield result


class _Positions:
    """A round's queue positions, worked out when first asked for (sorting the waiting work again
    was a tenth of a simulated round, and nobody reads most rounds' queues in a simulation)."""

    def __init__(self, scheduler: Scheduler, state: State, now: float) -> None:
        self._args: tuple[Scheduler, State, float] | None = (scheduler, state, now)
        self._entries: tuple[QueueEntry, ...] = ()

    def entries(self) -> tuple[QueueEntry, ...]:
        if self._args is not None:
            self._entries, self._args = tuple(queue_positions(*self._args)), None
        return self._entries


def _reserved_admissions(snapshot: ClusterSnapshot, stopped: set[str]) -> tuple[Action, ...]:
    """BINDs that carry out earlier starts: a workload's pods admitted onto the nodes held for them
    (``WorkloadState.reserved``: a live Job's new pods, gated, a round after its RESUME, or pods held
    while the work they preempted stopped; the simulator starts at once and has none).
    ``params['reserved']`` marks them: the decision was made before. One the round stops instead
    (``stopped``: to the engine it runs, as in the simulator) is not admitted: its suspend drops the
    reservation."""
    return tuple(Action(ActionKind.BIND, ws.workload.key, "admitted onto the GPUs held for it (since its resume, "
                        "or since the work it preempted was stopped)",
                        {"placements": tuple({"node": p.node, "gpu_uuid": p.gpu_uuid} for p in ws.reserved),
                         "reserved": True})
                 for ws in snapshot.workloads
                 if ws.reserved and ws.phase == WorkloadPhase.RUNNING and ws.workload.key not in stopped
                 and snapshot.in_queue(ws.workload.namespace) and ws.workload.team not in snapshot.refused_teams)


def _after_stops(actions: tuple[Action, ...], decisions: Iterable[Decision],
                 workloads: Mapping[str, WorkloadState]) -> tuple[Action, ...]:
    """Starts onto nodes this round's victims run on, marked ``params['after_stops']``: a cluster
    whose pods take a grace period to stop holds the GPUs for the start and admits it once they
    have (kube-scheduler would otherwise make room itself, evicting other pods); the simulator's
    stops are immediate and it binds at once."""
    stopped = {p.node for d in decisions if d.kind in (DecisionKind.SUSPEND, DecisionKind.PREEMPT)
               for p in (workloads[d.job].placements if d.job in workloads else ())}
    if not stopped:
        return actions
    return tuple(dataclasses.replace(a, params={**a.params, "after_stops": True})
                 if a.kind in STARTS and stopped & {p["node"] for p in a.params.get("placements", ())} else a
                 for a in actions)

