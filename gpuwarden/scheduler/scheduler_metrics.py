"""The scheduler's Prometheus metrics, updated from each round's outcome (one registry per process,
fresh in each test):

- ``gpuwarden_queue_pending_workloads{team}`` / ``gpuwarden_queue_pending_gpus{team}``: waiting now
  (a team whose queue emptied reads 0, not its last value);
- ``gpuwarden_queue_wait_seconds``: histogram of submission-to-admission time, observed when a
  workload is admitted (BIND), so it measures the waits that ended;
- ``gpuwarden_scheduler_admissions_total{team}``: admissions (BIND) and resumes (RESUME) applied;
- ``gpuwarden_scheduler_preemptions_total{team,reason}``: suspends and preemptions applied, by why
  (``reclaim``: for another team's guarantee or queue; ``priority``: for its own team's work;
  ``defragment``: moved to gather free GPUs);
- ``gpuwarden_scheduler_round_seconds``: histogram of a round's wall time (snapshot to publication);
- ``gpuwarden_scheduler_last_round_timestamp_seconds``: when the latest round ended (Unix seconds);
- ``gpuwarden_scheduler_plans_refused_total{invariant}``: plans the verifier refused whole (a bug
  in the engine, never carried out: ``scheduling.verify``);
- ``gpuwarden_scheduler_ignored_pods``: pods outside the queue carrying the admission gate, left alone;
- ``gpuwarden_scheduler_refused_teams``: teams whose quota annotations cannot be read;
- ``gpuwarden_scheduler_dra_skipped_objects{kind}``: DRA objects (ResourceSlice, DeviceClass,
  ResourceClaim, ResourceClaimTemplate) the cluster's reader skipped as bad input in the latest round
  (the rest is scheduled), where the cluster says (``dra_skipped``: the CLI hands it
  ``gpuwarden.kube.dra_notices.skipped_by_kind`` of the Kubernetes inventory; the scheduler never
  imports the adapter).

:func:`pending_gpus_history` reads the waiting GPUs back from Prometheus: the queue depth of the
efficiency report's fleet summary (null where no scheduler exported it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuwarden.fleet import ActionKind
from gpuwarden.scheduling.live_queue import pending_by_team
from gpuwarden.scheduling.verify import INVARIANTS

from .scheduling_round import STARTS, STOPS, RoundOutcome

if TYPE_CHECKING:
    import pandas as pd

WAIT_BUCKETS_SECONDS = (10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)
ROUND_BUCKETS_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class SchedulerMetrics:
    """Call it with each :class:`RoundOutcome` (``SchedulingRound(on_round=[metrics])``)."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 dra_skipped: Callable[[], Mapping[str, int]] | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.dra_skipped = dra_skipped  # {kind: DRA objects skipped} of the latest snapshot; None: not exported
        r = self.registry
        self.pending_workloads = Gauge("gpuwarden_queue_pending_workloads", "Workloads waiting in gpuwarden's queue",
                                       ["team"], registry=r)
        self.pending_gpus = Gauge("gpuwarden_queue_pending_gpus", "GPUs (whole-GPU equivalents) waiting in the queue",
                                  ["team"], registry=r)
        self.wait = Histogram("gpuwarden_queue_wait_seconds", "Seconds from submission to admission, at admission",
                              buckets=WAIT_BUCKETS_SECONDS, registry=r)
        self.admissions = Counter("gpuwarden_scheduler_admissions", "Workloads admitted (bound) or resumed",
                                  ["team"], registry=r)
        self.preemptions = Counter("gpuwarden_scheduler_preemptions", "Workloads suspended or preempted, by reason",
                                   ["team", "reason"], registry=r)
        self.round_seconds = Histogram("gpuwarden_scheduler_round_seconds", "Wall seconds of one scheduling round",
                                       buckets=ROUND_BUCKETS_SECONDS, registry=r)
        self.last_round = Gauge("gpuwarden_scheduler_last_round_timestamp_seconds",
                                "Unix time the latest scheduling round ended", registry=r)
        self.plans_refused = Counter("gpuwarden_scheduler_plans_refused",
                                     "Round plans refused whole by the plan verifier, by the invariant broken",
                                     ["invariant"], registry=r)
        for invariant in INVARIANTS:  # present at 0, so an alert on its increase needs no first refusal
            self.plans_refused.labels(invariant=invariant)
        self.ignored_pods = Gauge("gpuwarden_scheduler_ignored_pods",
                                  "Pods outside the queue's namespaces that carry the admission gate (left alone)",
                                  registry=r)
        self.refused_teams = Gauge("gpuwarden_scheduler_refused_teams",
                                   "Teams whose quota annotations cannot be read (their waiting work is held)",
                                   registry=r)
        self.dra_skipped_objects = Gauge("gpuwarden_scheduler_dra_skipped_objects",
                                         "DRA objects skipped as bad input in the latest round, by kind (the rest is "
                                         "scheduled)", ["kind"], registry=r)
        self._teams: set[str] = set()

    def __call__(self, outcome: RoundOutcome) -> None:
        pending = pending_by_team(outcome.queue)
        for team in self._teams | set(pending):
            count, gpus = pending.get(team, (0, 0.0))
            self.pending_workloads.labels(team=team).set(count)
            self.pending_gpus.labels(team=team).set(gpus)
        self._teams |= set(pending)
        by_key = {ws.workload.key: ws for ws in outcome.snapshot.workloads}
        for result in outcome.results:
            state = by_key.get(result.action.target)
            if not result.ok or state is None:
                continue
            team = state.workload.team
            if result.action.kind in STARTS:
                self.admissions.labels(team=team).inc()
            if result.action.kind == ActionKind.BIND:
                self.wait.observe(max(0.0, (outcome.snapshot.taken_at - state.submitted_at).total_seconds()))
            elif result.action.kind in STOPS:
                reason = outcome.preemption_reasons.get(result.action.target, "priority")
                self.preemptions.labels(team=team, reason=reason).inc()
        for invariant in sorted({v.invariant for v in outcome.refused}):
            self.plans_refused.labels(invariant=invariant).inc()
        self.ignored_pods.set(len(outcome.snapshot.ignored_pods))
        self.refused_teams.set(len(outcome.snapshot.refused_teams))
        for kind, count in (self.dra_skipped() if self.dra_skipped is not None else {}).items():
            self.dra_skipped_objects.labels(kind=kind).set(count)
        self.round_seconds.observe(outcome.seconds)
        self.last_round.set(time.time())


PENDING_GPUS_QUERY = "sum(gpuwarden_queue_pending_gpus)"
MAX_HISTORY_POINTS = 10000


def pending_gpus_history(source: object, start: pd.Timestamp, end: pd.Timestamp,
                         step_seconds: float = 60.0) -> pd.DataFrame | None:
    """The queue's waiting GPUs over [start, end) as the scheduler exported them
    (``timestamp``, ``gpus``: what ``efficiency_report(pending=...)`` reads), from a Prometheus
    source; None where the source is not Prometheus or no scheduler exported the series (queue
    depth unknown, never 0)."""
    import pandas as pd

    matrix = getattr(source, "matrix", None)
    if matrix is None:
        return None
    first, last = start.timestamp(), end.timestamp()
    step = max(step_seconds, (last - first) / MAX_HISTORY_POINTS)
    values = [pair for series in matrix(PENDING_GPUS_QUERY, first, last, step) for pair in series.get("values", [])]
    if not values:
        return None
    return pd.DataFrame({"timestamp": pd.to_datetime([float(t) for t, _ in values], unit="s", utc=True),
                         "gpus": [float(v) for _, v in values]})
