"""The scheduling round: the one loop body that schedules a cluster, live or simulated.

Each round reads ``cluster.snapshot()``, plans on it with the scheduling engine
(``scheduling.planner``: every fact it uses is in the snapshot) and applies the actions through
``cluster.apply``. Between rounds it keeps only what a live loop can know because it did it itself:

- which workloads it suspended: it resumes only those, and a workload someone else suspended (an
  operator, the remediation loop reclaiming an idle GPU) stays held until they resume it;
- when it preempted each workload and until when the policy protects it from more preemption.

Times are Unix seconds (the engine's times are seconds since an origin; a fixed one keeps the
history comparable across rounds, and keeps every time after 0, which the engine reads as "unset").
The simulator calls :meth:`SchedulingRound.run_round` through ``fleet.SchedulingHook``; a live
process runs it on its runner every scheduling interval.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from gpuwarden.fleet import Action, ActionKind, ActionResult, Cluster, WorkloadPhase, WorkloadState
from gpuwarden.scheduling import JobState, Scheduler, State
from gpuwarden.scheduling.planner import KnownJobs, actions_for, policy_for, state_from_snapshot
from gpuwarden.scheduling.scheduler import Decision, DecisionKind

STOPS = (ActionKind.SUSPEND, ActionKind.PREEMPT)  # a PREEMPT of a checkpointable workload suspends it
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class SchedulingRound:
    """Runs the scheduling policy ``policy`` on ``cluster``, one round per :meth:`run_round`."""

    def __init__(self, cluster: Cluster, policy: str = "gpuwarden") -> None:
        self.cluster = cluster
        self.policy = policy
        self.suspended: set[str] = set()  # workloads this round stopped that may be suspended now
        # per workload it preempted: (when, in round seconds; protected from preemption until)
        self.preemptions: dict[str, tuple[list[float], float]] = {}
        self.refused = 0  # actions the cluster refused (the snapshot and the cluster disagreed)
        self.known: KnownJobs = {}  # the engine's jobs of the last round, refreshed by the planner (not rebuilt)
        self.rounds = 0

    def run_round(self) -> tuple[ActionResult, ...]:
        snapshot = self.cluster.snapshot()
        state, workloads = state_from_snapshot(snapshot, origin=EPOCH, known=self.known)
        self._recall(workloads, state)
        scheduler = Scheduler(policy_for(snapshot, self.policy))
        now = (snapshot.taken_at - EPOCH).total_seconds()
        decisions = scheduler.schedule(state, now)
        self._note_preemptions(state, decisions)
        self.known = {key: (workloads[key], job) for key, job in state.jobs.items()}
        results = tuple(self._apply(actions_for(decisions, state, scheduler.policy.name)))
        self.rounds += 1
        return results

    def _recall(self, workloads: Mapping[str, WorkloadState], state: State) -> None:
        """Hold others' suspends out of the plan; give back the preemption history it keeps."""
        self.suspended = {key for key in self.suspended
                          if key in workloads and workloads[key].phase == WorkloadPhase.SUSPENDED}
        self.preemptions = {key: kept for key, kept in self.preemptions.items() if key in workloads}
        for key, job in list(state.jobs.items()):
            if job.state == JobState.SUSPENDED and key not in self.suspended:
                del state.jobs[key]  # suspended by someone else: theirs to resume
            elif key in self.preemptions:
                job.preempted_at, job.protected_until = list(self.preemptions[key][0]), self.preemptions[key][1]
            else:
                job.preempted_at = []  # preemptions it did not make do not count towards protection

    def _note_preemptions(self, state: State, decisions: Iterable[Decision]) -> None:
        for decision in decisions:
            if decision.kind in (DecisionKind.SUSPEND, DecisionKind.PREEMPT):
                job = state.jobs[decision.job]
                self.preemptions[decision.job] = (list(job.preempted_at), job.protected_until)

    def _apply(self, actions: Iterable[Action]) -> Iterable[ActionResult]:
        for action in actions:
            result = self.cluster.apply(action)
            if not result.ok:
                self.refused += 1
            elif result.action.kind in STOPS:
                self.suspended.add(result.action.target)
            else:
                self.suspended.discard(result.action.target)
            yield result
