"""The scheduling round as a live loop runs it (issue 21): resume rules, bad input, queue
publication, attained service, priority changes, the live queue document, the metrics and the
service on the runner. The cluster is a small in-test one that carries actions out on its own
workload list and records every Event and annotation, as ``KubeCluster`` would make them."""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta

import pandas as pd
import pytest
from builders import NOW, node, snapshot, workload
from polling import tick, wait_for

from gpuwarden.kube.gates import (
    ESTIMATED_START_ANNOTATION,
    QUEUE_POSITION_ANNOTATION,
    QUEUE_REASON_ANNOTATION,
    REQUESTED_BY_ANNOTATION,
    RESUME_REQUESTED_ANNOTATION,
    SUSPENDED_BY_ANNOTATION,
)
from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics
from gpuwarden.scheduler.scheduler_service import SchedulerService, attained_from_frame, attained_from_samples
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.fleet import (
    Action,
    ActionKind,
    ActionResult,
    ClusterSnapshot,
    GpuRequest,
    Placement,
    Team,
    UnreadableWorkload,
    WorkloadPhase,
    WorkloadState,
)
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.fleet.runner import Runner
from gpuwarden.scheduling.live_queue import TEAM_FIELDS, WORKLOAD_FIELDS
from gpuwarden.scheduling.queue_report import EXPECTED_END_ANNOTATION


TEAMS = (Team("alpha", 4, 8), Team("beta", 4, 8))
OWNER_AND_BORROWER = (Team("alpha", 8, 8), Team("beta", 0, 8))  # alpha holds its own; beta may only borrow


class RecordingCluster:
    """A cluster of whole-GPU nodes that carries BIND / RESUME / SUSPEND / PREEMPT / SET_PRIORITY
    out on its workloads (writing suspended-by as the contract says), keeps annotations written
    to it, and records Events. ``publishes=False``: a cluster that cannot publish (as SimCluster)."""

    def __init__(self, nodes=(), workloads=(), teams=TEAMS, publishes: bool = True) -> None:
        self.base = snapshot(nodes, (), teams)
        self.workloads = {ws.workload.key: ws for ws in workloads}
        self.applied: list[Action] = []
        self.events: list[tuple[str, str, str, str]] = []
        self.annotations: list[tuple[str, dict]] = []
        self.unreadable: dict[str, UnreadableWorkload] = {}  # what a cluster could not read into a workload
        self.unschedulable: dict[str, str] = {}  # admitted, left Pending by kube-scheduler
        self.now = NOW
        if publishes:
            self.record_workload_event = self._event
            self.annotate_workload = self._annotate

    def snapshot(self) -> ClusterSnapshot:
        return dataclasses.replace(self.base, taken_at=self.now, workloads=tuple(self.workloads.values()),
                                   unreadable=dict(self.unreadable), unschedulable=dict(self.unschedulable))

    def apply(self, action: Action) -> ActionResult:
        self.applied.append(action)
        ws = self.workloads[action.target]
        notes = dict(ws.annotations)
        if action.kind in (ActionKind.BIND, ActionKind.RESUME):
            placements = tuple(Placement(p["node"], p["gpu_uuid"]) for p in action.params["placements"])
            notes.pop(SUSPENDED_BY_ANNOTATION, None)
            ws = dataclasses.replace(ws, phase=WorkloadPhase.RUNNING, placements=placements, started_at=self.now)
        elif action.kind in (ActionKind.SUSPEND, ActionKind.PREEMPT):
            if "by" in action.params:
                notes[SUSPENDED_BY_ANNOTATION] = action.params["by"]
            ws = dataclasses.replace(ws, phase=WorkloadPhase.SUSPENDED, placements=())
        elif action.kind == ActionKind.SET_PRIORITY:
            ws = dataclasses.replace(ws, workload=dataclasses.replace(ws.workload, priority_class=action.params[
                "priority_class"]))
        self.workloads[action.target] = dataclasses.replace(ws, annotations=notes)
        return ActionResult(action, True, "done")

    def _event(self, target: str, reason: str, message: str, type: str = "Normal") -> None:  # noqa: A002
        self.events.append((target, reason, message, type))

    def _annotate(self, target: str, values: dict) -> None:
        self.annotations.append((target, values))
        if target in self.workloads:
            ws = self.workloads[target]
            notes = {k: v for k, v in {**ws.annotations, **values}.items() if v is not None}
            self.workloads[target] = dataclasses.replace(ws, annotations=notes)


def pending(name, team="alpha", gpus=1, **state) -> WorkloadState:
    return workload(name, team, gpus, WorkloadPhase.PENDING, **state)


def suspended(name, team="alpha", gpus=1, **annotations) -> WorkloadState:
    return dataclasses.replace(workload(name, team, gpus, WorkloadPhase.SUSPENDED, annotations=annotations),
                               started_at=NOW - timedelta(hours=2))


def kinds(actions) -> list[tuple[str, str]]:
    return [(a.kind.value, a.target) for a in actions]


# -- resume rules ----------------------------------------------------------------------------------


def test_it_resumes_only_what_it_may():
    cluster = RecordingCluster([node("n0", gpus=8)], [
        suspended("mine", **{SUSPENDED_BY_ANNOTATION: "scheduler"}),
        suspended("idle", **{SUSPENDED_BY_ANNOTATION: "idle-reclaim"}),
        suspended("asked", **{SUSPENDED_BY_ANNOTATION: "idle-reclaim", RESUME_REQUESTED_ANNOTATION: "2026-11-23T11:00Z"}),
        suspended("users"),  # created suspended by its owner: no annotation
        suspended("operator", **{SUSPENDED_BY_ANNOTATION: "bob"}),
    ])
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    assert sorted(kinds(cluster.applied)) == [("resume", "alpha/asked"), ("resume", "alpha/mine")]
    held = {w["workload"]: w["reason"] for w in scheduling.queue["workloads"]}
    assert set(held) == {"alpha/idle", "alpha/users", "alpha/operator"}  # shown, never planned
    assert "resumes once its owner sets gpuwarden.io/resume-requested" in held["alpha/idle"]
    assert "created suspended" in held["alpha/users"] and "suspended by bob" in held["alpha/operator"]


def test_its_own_suspends_say_so_and_are_resumed_from_memory_on_a_cluster_that_keeps_no_annotation():
    """A high-priority arrival preempts a checkpointable borrower (params by=scheduler); once room
    returns the round resumes it, remembering it suspended it."""
    borrower = dataclasses.replace(workload("borrower", "beta", 8, on="n0"),
                                   workload=dataclasses.replace(workload("borrower", "beta", 8).workload,
                                                                checkpointable=True, checkpoint_interval_seconds=600.0))
    cluster = RecordingCluster([node("n0", gpus=8)], [borrower, pending("urgent", "alpha", 8, priority="high")],
                               teams=OWNER_AND_BORROWER)
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    stops = [a for a in cluster.applied if a.kind in (ActionKind.SUSPEND, ActionKind.PREEMPT)]
    assert kinds(stops) == [(stops[0].kind.value, "beta/borrower")] and stops[0].params["by"] == "scheduler"
    assert kinds(cluster.applied)[-1] == ("bind", "alpha/urgent")
    # the cluster forgets the annotation (as one that cannot write it); the urgent job finishes
    cluster.workloads["beta/borrower"] = dataclasses.replace(cluster.workloads["beta/borrower"], annotations={})
    del cluster.workloads["alpha/urgent"]
    cluster.now += timedelta(minutes=10)
    scheduling.run_round()
    assert kinds(cluster.applied)[-1] == ("resume", "beta/borrower")
    assert SchedulingRound(cluster).may_resume(suspended("x")) is False  # a fresh round (restart) would not


# -- bad input ---------------------------------------------------------------------------------------


def test_bad_input_gets_one_event_stays_waiting_and_never_blocks_the_queue():
    mig = pending("mig")
    mig = dataclasses.replace(mig, workload=dataclasses.replace(mig.workload, gpus=GpuRequest(mig_profile="9g.999gb")))
    gang = pending("gang", gpus=4)
    gang = dataclasses.replace(gang, workload=dataclasses.replace(gang.workload, gang_size=8))  # 32 GPUs > 16
    cluster = RecordingCluster([node("n0", gpus=8), node("n1", gpus=8)],
                               [mig, pending("huge", gpus=16, submitted_at=NOW - timedelta(hours=3)), gang,
                                pending("broken"), pending("fine", submitted_at=NOW)])
    del cluster.workloads["alpha/broken"]  # a request the cluster could not read is no workload
    cluster.unreadable["alpha/broken"] = UnreadableWorkload(
        "alpha", "broken", "alpha", "pod broken-0 asks for nvidia.com/gpu and a MIG profile at once", NOW)
    cluster.unreadable["alpha/unread"] = UnreadableWorkload(
        "alpha", "unread", "alpha", "pod unread-0: gang label without gpuwarden.io/gang-size", NOW)
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    assert kinds(cluster.applied) == [("bind", "alpha/fine")]  # the only good one, though it came last
    warned = {target: message for target, reason, message, kind in cluster.events if reason == "NotAdmitted"}
    assert set(warned) == {"alpha/mig", "alpha/huge", "alpha/gang", "alpha/broken", "alpha/unread"}
    assert "unknown MIG profile '9g.999gb'" in warned["alpha/mig"]
    assert "16 whole GPUs per pod; the largest node it may use offers 8 whole GPUs" in warned["alpha/huge"]
    assert "gang of 8 pods x 4 GPUs = 32 whole GPUs; the nodes it may use offer 16" in warned["alpha/gang"]
    assert "a MIG profile at once" in warned["alpha/broken"]
    events = len(cluster.events)
    cluster.now += timedelta(minutes=1)
    scheduling.run_round()
    assert len(cluster.events) == events  # told once, not every round
    assert [w["workload"] for w in scheduling.queue["workloads"]][-5:] == sorted(warned)


# -- publication -------------------------------------------------------------------------------------


def test_waiting_work_is_annotated_when_it_changes_and_told_when_its_reason_changes():
    running = workload("runner", "alpha", 8, on="n0", duration_seconds=7200.0, progress_seconds=1800.0)
    cluster = RecordingCluster([node("n0", gpus=8)], [running, pending("next", "beta", 4,
                               annotations={REQUESTED_BY_ANNOTATION: "alice@example.com"})], OWNER_AND_BORROWER)
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    (target, values), = cluster.annotations
    assert target == "beta/next" and values[QUEUE_POSITION_ANNOTATION] == "1"
    assert values[QUEUE_REASON_ANNOTATION].startswith("capacity: needs 4 whole GPUs; 0 free on the 1 node(s)")
    assert values[ESTIMATED_START_ANNOTATION] == (NOW + timedelta(seconds=5400)).isoformat()
    (event,) = cluster.events
    assert event[:2] == ("beta/next", "Queued") and "position 1" in event[2]
    row = scheduling.queue["workloads"][0]
    assert row["requested_by"] == "alice@example.com"
    scheduling.run_round()  # nothing changed: nothing written, nothing told
    assert len(cluster.annotations) == 1 and len(cluster.events) == 1
    cluster.workloads["alpha/runner"] = dataclasses.replace(running, progress_seconds=3600.0)  # figures move
    scheduling.run_round()
    assert len(cluster.annotations) == 2 and len(cluster.events) == 1  # the new estimate written, not told again
    del cluster.workloads["alpha/runner"]  # room: admitted, and its queue annotations are removed
    scheduling.run_round()
    assert kinds(cluster.applied) == [("bind", "beta/next")]
    assert cluster.annotations[-1] == ("beta/next", dict.fromkeys(
        (QUEUE_POSITION_ANNOTATION, QUEUE_REASON_ANNOTATION, ESTIMATED_START_ANNOTATION)))


def test_publication_is_bounded_per_round_head_of_the_queue_first():
    """One admission shifts every position behind it: a round writes at most its budget of Events
    and annotations, the queue's head first; the rest follow in later rounds."""
    cluster = RecordingCluster([node("n0", gpus=1)], [workload("busy", on="n0")] + [
        pending(f"w{k}", submitted_at=NOW - timedelta(minutes=60 - k)) for k in range(6)])
    scheduling = SchedulingRound(cluster)
    scheduling.publisher.writes_per_round = 4
    scheduling.run_round()
    writes = [("annotate", t) for t, _ in cluster.annotations] + [("event", e[0]) for e in cluster.events]
    assert len(writes) == 4 and {t for _, t in writes} == {"alpha/w0", "alpha/w1"}  # annotation + Event each
    for _ in range(2):
        scheduling.run_round()
    assert {t for t, _ in cluster.annotations} == {f"alpha/w{k}" for k in range(6)}
    assert len(cluster.annotations) == 6 and len(cluster.events) == 6  # each written once, told once


def test_a_pod_kube_scheduler_left_pending_is_reported_once_with_its_reason():
    cluster = RecordingCluster([node("n0")], [])
    cluster.unschedulable["alpha/stuck"] = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu"
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    scheduling.run_round()
    assert cluster.events == [("alpha/stuck", "AdmittedButUnschedulable",
                               "admitted, but kube-scheduler left it Pending: 0/1 nodes are available: 1 Insufficient "
                               "nvidia.com/gpu; its GPUs were released to the queue", "Warning")]


def test_a_cluster_that_cannot_publish_still_gets_its_queue():
    cluster = RecordingCluster([node("n0", gpus=1)], [workload("a", on="n0"), pending("b")], publishes=False)
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    assert [w["workload"] for w in scheduling.queue["workloads"]] == ["alpha/b"]


# -- attained service and priority -------------------------------------------------------------------


def test_measured_attained_service_replaces_the_snapshots_and_orders_the_queue():
    first, second = pending("first", submitted_at=NOW - timedelta(hours=2)), pending("second")
    cluster = RecordingCluster([node("n0", gpus=1)], [first, second])
    SchedulingRound(cluster, attained=lambda snapshot: {"alpha/first": 20 * 3600.0}).run_round()
    assert kinds(cluster.applied) == [("bind", "alpha/second")]  # less served goes first
    cluster = RecordingCluster([node("n0", gpus=1)], [first, second])
    SchedulingRound(cluster).run_round()
    assert kinds(cluster.applied) == [("bind", "alpha/first")]  # without it: first come


def test_attained_service_is_summed_per_workload_from_fleet_samples():
    state = dataclasses.replace(workload("train", "alpha", 2, on="n0"), pods=("train-0", "train-1"))
    stamps = pd.date_range(NOW - timedelta(minutes=10), periods=10, freq="60s", tz="UTC")
    rows = [{"timestamp": t, "gpu_uuid": f"GPU-n0-{g}", "namespace": "alpha", "pod": f"train-{g}", "model": "H100",
             "mig_instance": None} for t in stamps for g in range(2)]
    rows += [{"timestamp": t, "gpu_uuid": "GPU-n0-3", "namespace": "alpha", "pod": "someone-else", "model": "H100",
              "mig_instance": None} for t in stamps]
    frame = pd.DataFrame(rows)
    snap = snapshot([node("n0")], [state])
    assert attained_from_frame(frame, snap) == {"alpha/train": 2 * 10 * 60.0}
    reads = []
    source = attained_from_samples(lambda start, end: reads.append((start, end)) or frame, window_seconds=3600)
    assert source(snap) == {"alpha/train": 1200.0} and source(snap) == {"alpha/train": 1200.0}
    assert len(reads) == 1 and (reads[0][1] - reads[0][0]).total_seconds() == 3600  # read once per refresh


def test_a_leads_priority_change_is_planned_once_where_kueue_manages_the_workload():
    raised = pending("raised", priority_override="high")
    other = pending("other", priority_override="high")  # not Kueue's: the override only orders the queue
    cluster = RecordingCluster([node("n0", gpus=1)], [workload("busy", on="n0"), raised, other])
    cluster.base = dataclasses.replace(cluster.base, kueue_managed=frozenset({"alpha/raised"}))
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    changes = [a for a in cluster.applied if a.kind == ActionKind.SET_PRIORITY]
    assert [(a.target, a.params["priority_class"]) for a in changes] == [("alpha/raised", "high")]
    cluster.workloads["alpha/raised"] = dataclasses.replace(raised)  # Kueue not caught up yet: not asked again
    scheduling.run_round()
    assert len([a for a in cluster.applied if a.kind == ActionKind.SET_PRIORITY]) == 1


def test_no_priority_change_is_asked_outside_the_queue():
    """Kueue manages work in namespaces gpuwarden does not queue too: a lead's annotation there is
    never carried into Kueue by gpuwarden (issue 31: nothing written outside the queue)."""
    theirs = pending("theirs", "beta", priority_override="high")
    cluster = RecordingCluster([node("n0", gpus=1)], [workload("busy", on="n0"), theirs])
    cluster.base = dataclasses.replace(cluster.base, queue_namespaces=frozenset({"alpha"}),
                                       kueue_managed=frozenset({"beta/theirs"}))
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    assert cluster.applied == [] and scheduling.plans_refused == 0


# -- the queue document and the metrics --------------------------------------------------------------


def test_the_queue_document_has_the_contracts_fields_positions_and_team_table():
    running = workload("runner", "alpha", 8, on="n0", annotations={EXPECTED_END_ANNOTATION: "2026-11-23T15:00:00Z"})
    cluster = RecordingCluster([node("n0", gpus=8)], [running, pending("small", "beta", 2),
                                                     pending("big", "beta", 8, submitted_at=NOW - timedelta(hours=5))],
                               OWNER_AND_BORROWER)
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    document = scheduling.queue
    assert set(document) == {"taken_at", "policy", "round", "teams", "workloads", "ignored_pods"}
    assert (document["policy"], document["round"], document["taken_at"]) == ("gpuwarden", 1, NOW.isoformat())
    assert all(tuple(row) == WORKLOAD_FIELDS for row in document["workloads"])
    assert all(tuple(row) == TEAM_FIELDS for row in document["teams"])
    rows = document["workloads"]
    assert [(r["position"], r["workload"], r["shape"], r["gpus"], r["state"]) for r in rows] == [
        (1, "beta/big", "8 GPU", 8.0, "pending"), (2, "beta/small", "2 GPU", 2.0, "pending")]
    assert rows[0]["waiting_seconds"] == 5 * 3600.0
    assert rows[0]["estimated_start"] == "2026-11-23T15:00:00+00:00"  # the running job's expected end
    teams = {t["team"]: t for t in document["teams"]}
    assert (teams["beta"]["pending_workloads"], teams["beta"]["pending_gpus"]) == (2, 10.0)
    assert [teams["alpha"][k] for k in ("guaranteed_gpus", "allocated_gpus", "borrowed_gpus", "lent_gpus")] == [
        8.0, 8.0, 0.0, 0.0]
    assert (teams["beta"]["burst_limit_gpus"], teams["beta"]["allocated_gpus"]) == (8.0, 0.0)


def test_the_metrics_follow_the_rounds():
    borrower = workload("borrower", "beta", 8, on="n0")
    cluster = RecordingCluster([node("n0", gpus=8)], [borrower, pending("owner", "alpha", 8),
                                                     pending("later", "alpha", 1, submitted_at=NOW)],
                               teams=OWNER_AND_BORROWER)
    metrics = SchedulerMetrics()
    scheduling = SchedulingRound(cluster, on_round=[metrics])
    scheduling.run_round()
    value = metrics.registry.get_sample_value
    assert value("gpuwarden_scheduler_preemptions_total", {"team": "beta", "reason": "reclaim"}) == 1.0
    assert value("gpuwarden_scheduler_admissions_total", {"team": "alpha"}) == 1.0
    assert value("gpuwarden_queue_wait_seconds_count") == 1.0 and value("gpuwarden_queue_wait_seconds_sum") == 3600.0
    assert value("gpuwarden_queue_pending_workloads", {"team": "alpha"}) == 1.0
    assert value("gpuwarden_queue_pending_gpus", {"team": "alpha"}) == 1.0
    assert value("gpuwarden_scheduler_round_seconds_count") == 1.0
    assert value("gpuwarden_scheduler_last_round_timestamp_seconds") > 0
    del cluster.workloads["alpha/later"]
    scheduling.run_round()
    assert value("gpuwarden_queue_pending_workloads", {"team": "alpha"}) == 0.0  # emptied, not stale


# -- the service on the runner -----------------------------------------------------------------------


def test_the_service_runs_only_as_leader_and_survives_a_failed_round(caplog):
    cluster = RecordingCluster([node("n0", gpus=1)], [pending("a")])
    leading = [False]
    service = SchedulerService(SchedulingRound(cluster), interval_seconds=10, leader=lambda: leading[0])
    assert service.run_once() is None and cluster.applied == []  # a standby waits: no round, no failure
    leading[0] = True
    assert service.run_once() is True and kinds(cluster.applied) == [("bind", "alpha/a")]

    def broken() -> ClusterSnapshot:
        raise ConnectionError("API server went away")

    cluster.snapshot = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, "gpuwarden.scheduler"):
        assert service.run_once() is False
    assert service.failures == 1 and "API server went away; retrying next interval" in caplog.text


def test_the_service_runs_a_round_every_interval_on_the_runners_clock():
    cluster = RecordingCluster([node("n0", gpus=1)], [workload("busy", on="n0"), pending("a")])
    scheduling = SchedulingRound(cluster)
    clock = FakeClock(NOW)
    runner = Runner(clock)
    job = SchedulerService(scheduling, interval_seconds=10).register(runner)
    runner.start()
    try:
        wait_for(lambda: job.runs == 1, what="the first round, at once")
        tick(clock, 10)
        wait_for(lambda: job.runs == 2, what="the round one interval later")
    finally:
        runner.stop()
    assert scheduling.rounds == 2 and job.failures == 0


def test_an_interval_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="interval_seconds: 0 must be > 0"):
        SchedulerService(SchedulingRound(RecordingCluster()), interval_seconds=0)
