"""Queue visibility on the cluster itself: what each waiting workload's owner sees with kubectl.

Where the cluster offers fleet's :class:`~gpuwarden.fleet.capabilities.WorkloadNotices` (and
:class:`~gpuwarden.fleet.capabilities.TeamNotices` for a refused team's Event): ``KubeCluster``
does, the simulated cluster does not. After each round:

- each waiting workload carries annotations with its queue position, reason and estimated start,
  written only when one of them changed (what the snapshot read back is compared, so a restart
  writes nothing new) and removed once it is admitted;
- an Event ``Queued`` when the kind of its reason changes (``capacity``, ``quota``, ``fifo``...;
  not when only its figures move, not every round);
- a workload the round held as bad input gets one Warning Event ``NotAdmitted`` naming why;
- a pod admitted but left Pending by kube-scheduler (the snapshot's ``unschedulable``: {workload
  key: kube-scheduler's message}) gets one Warning Event ``AdmittedButUnschedulable`` with
  kube-scheduler's reason; its capacity is already released by the snapshot.
Writes are bounded per round (``writes_per_round``, default 50 Events or annotation writes):
warnings first, then the queue from its head; what is left is written in later rounds. A failed
publication is logged and never fails the round.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpuwarden.fleet import ActionKind, ActionResult, ClusterSnapshot
from gpuwarden.fleet.capabilities import TeamNotices, WorkloadNotices

from gpuwarden.fleet.object_names import ESTIMATED_START_ANNOTATION, QUEUE_POSITION_ANNOTATION, QUEUE_REASON_ANNOTATION

log = logging.getLogger("gpuwarden.scheduler")
QUEUE_ANNOTATIONS = (QUEUE_POSITION_ANNOTATION, QUEUE_REASON_ANNOTATION, ESTIMATED_START_ANNOTATION)
# Events and annotation writes per round, at most: one admission shifts every position behind it, and
# a round's API calls must stay bounded (list pages plus one PATCH per admitted pod, plus this).
DEFAULT_WRITES_PER_ROUND = 50


class Publisher:
    def __init__(self, cluster: object, writes_per_round: int = DEFAULT_WRITES_PER_ROUND) -> None:
        notices = cluster if isinstance(cluster, WorkloadNotices) else None
        self.event = notices.record_workload_event if notices else None
        self.annotate = notices.annotate_workload if notices else None
        self.team_event = cluster.record_team_event if isinstance(cluster, TeamNotices) else None
        self.cluster = cluster
        self.writes_per_round = writes_per_round
        self.told: dict[str, str] = {}  # the reason each workload was last told of
        self.teams_told: dict[str, str] = {}  # the refusal each team was last told of
        self.ignored_logged: set[str] = set()  # pods outside the queue with the gate, logged once each
        self._left = 0

    @property
    def can_publish(self) -> bool:
        return self.event is not None or self.annotate is not None

    def publish(self, snapshot: ClusterSnapshot, queue: Mapping[str, Any], held: Mapping[str, str],
                results: tuple[ActionResult, ...]) -> None:
        """Warnings first (bad input, pods kube-scheduler left Pending), then admitted workloads'
        annotations removed, then the queue from its head, until this round's writes are spent."""
        self._left = self.writes_per_round
        self._say_ignored(snapshot.ignored_pods)
        current = {ws.workload.key: ws.annotations for ws in snapshot.workloads}
        rows = list(queue.get("workloads", ()))
        waiting = {row["workload"] for row in rows}
        stuck = {k: v for k, v in snapshot.unschedulable.items() if snapshot.in_queue(k.partition("/")[0])}
        for team, why in sorted(snapshot.refused_teams.items()):
            if self.team_event is not None and self.teams_told.get(team) != why and self._left > 0:
                self._left -= 1
                self.teams_told[team] = why
                try:
                    self.team_event(team, "QuotaRefused", f"team {team} is not scheduled until its quota is fixed "
                                    f"(its running work is left alone): {why}", type="Warning")
                except Exception as error:  # noqa: BLE001 (publication never fails the round)
                    log.warning("scheduler: Event QuotaRefused for team %s failed: %s", team, error)
        self.teams_told = {t: w for t, w in self.teams_told.items() if t in snapshot.refused_teams}
        for key, message in stuck.items():
            self._tell(key, "AdmittedButUnschedulable", message, f"admitted, but kube-scheduler left it Pending: "
                       f"{message}; its GPUs were released to the queue", "Warning")
        for key in sorted(held):
            self._tell(key, "NotAdmitted", held[key], f"not admitted: {held[key]}", "Warning")
        for result in results:  # admitted: the queue annotations no longer apply
            key = result.action.target
            if result.ok and result.action.kind in (ActionKind.BIND, ActionKind.RESUME) and key not in waiting \
                    and any(k in current.get(key, {}) for k in QUEUE_ANNOTATIONS):
                self._annotate(key, dict.fromkeys(QUEUE_ANNOTATIONS))
                self.told.pop(key, None)
        for row in rows:
            key = row["workload"]
            wanted = {QUEUE_POSITION_ANNOTATION: str(row["position"]), QUEUE_REASON_ANNOTATION: row["reason"],
                      ESTIMATED_START_ANNOTATION: row["estimated_start"]}
            have = current.get(key, {})
            if any(have.get(k) != v for k, v in wanted.items()):
                self._annotate(key, wanted)
            if key not in held:
                # told again when the kind of reason changes (capacity, quota, fifo...), not its figures
                self._tell(key, "Queued", row["reason"].split(":", 1)[0],
                           f"position {row['position']} in the queue: {row['reason']}")
        self.told = {k: v for k, v in self.told.items() if k in current or k in held or k in stuck}

    def _say_ignored(self, ignored: Mapping[str, str]) -> None:
        """One log line per pod left alone outside the queue (the queue lists them; a metric counts them)."""
        for pod in sorted(set(ignored) - self.ignored_logged):
            log.warning("scheduler: pod %s left alone: %s", pod, ignored[pod])
        self.ignored_logged = set(ignored)

    def _tell(self, key: str, reason: str, why: str, message: str, kind: str = "Normal") -> None:
        """An Event, once per workload and ``why`` (a new reason is told again, the same one never)."""
        if self.event is None or self.told.get(key) == why or self._left <= 0:
            return
        self._left -= 1
        self.told[key] = why
        try:
            self.event(key, reason, message, type=kind)
        except Exception as error:  # noqa: BLE001 (publication never fails the round)
            log.warning("scheduler: Event %s on %s failed: %s", reason, key, error)

    def _annotate(self, key: str, values: Mapping[str, str | None]) -> None:
        if self.annotate is None or self._left <= 0:
            return  # what is not written now is written in a later round (compared with what the cluster holds)
        self._left -= 1
        try:
            self.annotate(key, dict(values))
        except Exception as error:  # noqa: BLE001 (publication never fails the round)
            log.warning("scheduler: annotating %s failed: %s", key, error)
