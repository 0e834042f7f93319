"""Checkpoint-aware drains: each disruptive action in the plan states the GPU-hours at risk (from the
trainer's checkpoint annotations, else the start time, else attained service, saying which) and its
mode; a drain of checkpointable work asks for a checkpoint first (request, done, timeout) and the
audit log says what was asked and what happened, across a restart in between. The actuator here is
the real one on a small in-memory cluster that takes workload annotations (fleet's
``WorkloadNotices``); tests/kube/test_checkpoint_drain_kube.py runs the same protocol over HTTP."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from builders import NOW, node, snapshot, workload
from hypothesis import given, settings
from hypothesis import strategies as st
from streamlit.testing.v1 import AppTest

from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.fleet import Action, ActionKind, ActionResult, Finding, FindingKind, Severity, WorkloadPhase
from gpuwarden.fleet.capabilities import WorkloadNotices
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.fleet.object_names import (CHECKPOINT_DEADLINE_ANNOTATION, CHECKPOINT_DONE_ANNOTATION,
                                          CHECKPOINT_DONE_AT_ANNOTATION, CHECKPOINT_REQUEST_ANNOTATION,
                                          DRAIN_MODE_LABEL, LAST_CHECKPOINT_ANNOTATION)
from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, PlanningPolicy, SafetyLimits, plan_from_findings
from gpuwarden.remediation.approvals import pending
from gpuwarden.remediation.at_risk import iso, statement, work_at_risk
from gpuwarden.remediation.checkpoint_first import risk_rows

ROOMY = SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0)
NODES = (node("node-0"), node("node-1"))


def checkpointable(state, **annotations):
    spec = replace(state.workload, checkpointable=True, checkpoint_interval_seconds=600.0)
    return replace(state, workload=spec, annotations=dict(annotations))


def fleet():
    """node-0 runs a checkpointable 2-GPU trainer (last checkpoint 10 minutes ago) and a 1-GPU
    notebook (started 30 minutes ago); node-1 runs a 1-GPU job. Every start is 30 minutes before NOW."""
    train = checkpointable(workload("train", gpus=2, on="node-0"),
                           **{LAST_CHECKPOINT_ANNOTATION: iso(NOW - timedelta(minutes=10))})
    notebook = workload("notebook", kind="notebook", on="node-0")
    other = workload("other", team="beta", on="node-1")
    return [train, notebook, other]


def drain_finding(target="node-0", severity=Severity.CRITICAL, kind=FindingKind.ROW_REMAP_FAILURE):
    return Finding(kind, severity, target, f"GPU-{target}-0", {"count": 1}, ActionKind.DRAIN, 0.99,
                   NOW - timedelta(minutes=5), NOW)


class TrainerCluster:
    """The workloads above on a cluster that takes annotations (its trainers answer through
    :meth:`answer`); a drain stops what runs on the node and cordons it."""

    def __init__(self, states, clock, node_labels=None, namespace_labels=None, lose_writes=0):
        self.states = {s.workload.key: s for s in states}
        self.notes = {key: dict(s.annotations) for key, s in self.states.items()}
        self.clock, self.node_labels, self.namespace_labels = clock, node_labels or {}, namespace_labels or {}
        self.lose_writes = lose_writes  # annotation writes that fail (the process died before they were made)
        self.applied, self.events, self.cordoned, self.writes = [], [], set(), 0

    def snapshot(self):
        states = [replace(s, annotations=dict(self.notes[key])) for key, s in self.states.items()]
        return snapshot(NODES, states, taken_at=self.clock.now(), cordoned=frozenset(self.cordoned),
                        node_labels=self.node_labels, namespace_labels=self.namespace_labels)

    def apply(self, action):
        self.applied.append(action)
        if action.kind == ActionKind.DRAIN:
            self.cordoned.add(action.target)
            for key, state in self.states.items():
                if any(p.node == action.target for p in state.placements):
                    self.states[key] = replace(state, phase=WorkloadPhase.PENDING, placements=(), started_at=None)
        return ActionResult(action, True, f"{action.kind.value} {action.target}")

    def annotate_workload(self, target, values):
        changed = {k: v for k, v in values.items() if self.notes[target].get(k) != v}
        if not changed:
            return 0
        if self.lose_writes:
            self.lose_writes -= 1
            return 0
        self.notes[target].update(changed)
        self.writes += 1
        return 1

    def record_workload_event(self, target, reason, message, type="Normal"):  # noqa: A002 - the protocol's name
        self.events.append((target, reason, message))
        return 1

    def answer(self, key, checkpoint_at):
        """The trainer saved at ``checkpoint_at`` and answers the request its pod carries."""
        notes = self.notes[key]
        notes.update({CHECKPOINT_DONE_ANNOTATION: notes[CHECKPOINT_REQUEST_ANNOTATION],
                      CHECKPOINT_DONE_AT_ANNOTATION: iso(checkpoint_at), LAST_CHECKPOINT_ANNOTATION: iso(checkpoint_at)})


def round_(actuator, cluster, findings=None, policy=None):
    current, policy = cluster.snapshot(), policy or PlanningPolicy()
    plan = plan_from_findings(findings if findings is not None else [drain_finding()], current, policy,
                              now=actuator.clock.now())
    return actuator.execute(plan, current)


def setup(tmp_path, mode=Mode.AUTO, **kwargs):
    clock = FakeClock(NOW)
    cluster = TrainerCluster(fleet(), clock, **kwargs)
    return clock, cluster, Actuator(cluster, mode, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=clock)


# -- GPU-hours at risk ---------------------------------------------------------------------------------

def test_work_at_risk_counts_from_the_last_checkpoint_else_the_start_else_attained_service():
    started = workload("w", gpus=4, on="node-0")  # 30 minutes ago
    risk = work_at_risk(started, NOW)
    assert (risk.basis, risk.gpu_hours, risk.since) == ("start-time", 2.0, NOW - timedelta(minutes=30))
    saved = replace(started, annotations={CHECKPOINT_DONE_AT_ANNOTATION: iso(NOW - timedelta(minutes=6))})
    assert (work_at_risk(saved, NOW).basis, work_at_risk(saved, NOW).gpu_hours) == ("last-checkpoint", 0.4)
    before_restart = replace(started, annotations={LAST_CHECKPOINT_ANNOTATION: iso(NOW - timedelta(hours=2))})
    assert work_at_risk(before_restart, NOW).basis == "start-time"  # a checkpoint from before this run saves none of it
    unstarted = replace(started, started_at=None, attained_gpu_seconds=7200.0)
    assert (work_at_risk(unstarted, NOW).basis, work_at_risk(unstarted, NOW).gpu_hours) == ("attained-service", 2.0)
    nothing = replace(unstarted, attained_gpu_seconds=float("nan"))
    assert (work_at_risk(nothing, NOW).basis, work_at_risk(nothing, NOW).gpu_hours) == ("unknown", 0.0)
    garbled = replace(started, annotations={LAST_CHECKPOINT_ANNOTATION: "yesterday"})
    assert work_at_risk(garbled, NOW).basis == "start-time"  # an unreadable annotation is not a checkpoint


@settings(max_examples=200, deadline=None)
@given(gpus=st.integers(1, 64), run_minutes=st.floats(0, 10_000), saved_minutes=st.none() | st.floats(-100, 20_000),
       later_minutes=st.floats(0, 1_000))
def test_work_at_risk_is_bounded_by_the_run_and_only_grows_with_time(gpus, run_minutes, saved_minutes, later_minutes):
    state = replace(workload("w", gpus=gpus, on="node-0"), started_at=NOW - timedelta(minutes=run_minutes))
    if saved_minutes is not None:
        state = replace(state, annotations={LAST_CHECKPOINT_ANNOTATION: iso(NOW - timedelta(minutes=saved_minutes))})
    now, later = work_at_risk(state, NOW), work_at_risk(state, NOW + timedelta(minutes=later_minutes))
    tolerance = 1e-6  # times carry microseconds
    assert 0.0 <= now.gpu_hours <= gpus * run_minutes / 60 + tolerance
    assert now.gpu_hours <= later.gpu_hours + tolerance
    assert work_at_risk(replace(state, annotations={}), NOW).gpu_hours >= now.gpu_hours - tolerance  # a checkpoint never adds


def test_the_plan_states_the_gpu_hours_at_risk_and_the_mode_of_each_disruptive_action():
    current = snapshot(NODES, fleet())
    findings = [drain_finding(), replace(drain_finding("node-1"), recommended_action=ActionKind.CORDON)]
    plan = plan_from_findings(findings, current)
    drain, cordon = plan.actions
    assert drain.action.params == {"mode": "immediate", "timeout_seconds": 3600.0, "severity": "critical"}  # unchanged
    said = drain.statement
    # train: 2 GPUs x 10 min since its checkpoint; notebook: 1 GPU x 30 min since its start
    assert said["gpu_hours_at_risk"] == pytest.approx(2 * 10 / 60 + 30 / 60, abs=1e-3)
    assert said["at_risk_basis"] == "last-checkpoint+start-time" and said["workloads_at_risk"] == 2
    assert [(r["workload"], r["basis"], r["mode"]) for r in said["at_risk"]] == [
        ("alpha/notebook", "start-time", "immediate"), ("alpha/train", "last-checkpoint", "immediate")]
    assert said["stop_mode"] == "checkpoint-first (up to 300 s), then immediate"
    assert said["checkpoint_first"] == {"timeout_seconds": 300.0, "workloads": ["alpha/train"]}
    assert drain.stated.params == {**drain.action.params, **said}  # what the audit log records
    assert (cordon.statement["gpu_hours_at_risk"], cordon.statement["stop_mode"]) == (0.0, "cordon: running work continues")
    assert cordon.statement["at_risk_basis"] == "none"


def test_only_a_drain_that_would_evict_checkpointable_work_at_once_asks_first():
    current = snapshot(NODES, fleet())
    warning = plan_from_findings([drain_finding(severity=Severity.WARNING)], current).actions[0].statement
    assert "checkpoint_first" not in warning and warning["stop_mode"] == "allow-completion (up to 3600 s)"
    suspending = snapshot(NODES, fleet(), node_labels={"node-0": {DRAIN_MODE_LABEL: "suspend-first"}})
    assert "checkpoint_first" not in plan_from_findings([drain_finding()], suspending).actions[0].statement
    # a namespace that wants immediate drains: a warning's drain asks its trainer first, for the warning's timeout
    eager = snapshot(NODES, fleet(), namespace_labels={"alpha": {DRAIN_MODE_LABEL: "immediate"}})
    said = plan_from_findings([drain_finding(severity=Severity.WARNING)], eager).actions[0].statement
    assert said["checkpoint_first"] == {"timeout_seconds": 900.0, "workloads": ["alpha/train"]}
    assert said["stop_mode"] == ("checkpoint-first (up to 900 s), then allow-completion (up to 3600 s); "
                                 "namespace label: immediate")
    never = PlanningPolicy(checkpoint_timeout_seconds_by_severity={"critical": 0.0})
    assert "checkpoint_first" not in plan_from_findings([drain_finding()], current, never).actions[0].statement
    with pytest.raises(ValueError, match="critical=nan"):
        PlanningPolicy(checkpoint_timeout_seconds_by_severity={"critical": float("nan")})


def test_an_eviction_states_its_workloads_work_and_a_preemption_that_suspends_says_so():
    current = snapshot(NODES, fleet())
    evict = statement(Action(ActionKind.EVICT, "alpha/notebook", "x"), current, NOW)
    assert (evict["gpu_hours_at_risk"], evict["stop_mode"]) == (0.5, "evict")
    preempt = statement(Action(ActionKind.PREEMPT, "alpha/train", "x", {"grace_seconds": 120}), current, NOW)
    assert (preempt["gpu_hours_at_risk"], preempt["stop_mode"]) == (pytest.approx(0.333, abs=1e-3), "suspend (120 s to save)")
    assert statement(Action(ActionKind.EVICT, "alpha/gone", "x"), current, NOW)["gpu_hours_at_risk"] == 0.0
    tolerated = statement(Action(ActionKind.TAINT, "node-0", "x", {"taint": "gpuwarden.io/bad=true:NoExecute"}), current, NOW)
    assert tolerated["workloads_at_risk"] == 2 and tolerated["stop_mode"].endswith("evicts what does not tolerate it")


# -- the protocol: request, done, timeout --------------------------------------------------------------

def test_a_checkpoint_first_drain_asks_waits_and_drains_once_the_trainer_answers(tmp_path):
    clock, cluster, actuator = setup(tmp_path)
    (asked,) = round_(actuator, cluster)
    checkpoint = asked.params["checkpoint"]
    assert (asked.outcome, asked.kind, asked.target, checkpoint["state"]) == (Outcome.RETRY, "drain", "node-0", "requested")
    assert checkpoint["workloads"] == ["alpha/train"] and checkpoint["deadline"] == iso(NOW + timedelta(seconds=300))
    assert asked.params["gpu_hours_at_risk"] == pytest.approx(5 / 6, abs=1e-3)
    assert cluster.applied == [] and not cluster.cordoned  # nothing stopped yet
    notes = cluster.notes["alpha/train"]
    assert (notes[CHECKPOINT_REQUEST_ANNOTATION], notes[CHECKPOINT_DEADLINE_ANNOTATION]) == (
        checkpoint["request_id"], checkpoint["deadline"])
    assert CHECKPOINT_REQUEST_ANNOTATION not in cluster.notes["alpha/notebook"]  # not checkpointable: not asked
    assert [e[:2] for e in cluster.events] == [("alpha/train", "CheckpointRequested")]

    clock.advance(20)  # no answer yet: nothing logged, nothing written again, nothing applied
    assert round_(actuator, cluster) == [] and cluster.applied == [] and cluster.writes == 1 and len(cluster.events) == 1

    clock.advance(10)
    cluster.answer("alpha/train", clock.now() - timedelta(seconds=5))
    (drained,) = round_(actuator, cluster)
    assert (drained.outcome, [a.kind for a in cluster.applied]) == (Outcome.APPLIED, [ActionKind.DRAIN])
    done = drained.params["checkpoint"]
    assert (done["state"], done["request_id"], done["waited_seconds"]) == ("done", checkpoint["request_id"], 30.0)
    assert done["answers"] == [{"workload": "alpha/train", "answer": "done",
                                "checkpoint_at": iso(NOW + timedelta(seconds=25))}]
    # restated when it went: the trainer's 2 GPUs lose 5 s, the notebook its 30.5 minutes
    assert drained.params["gpu_hours_at_risk"] == pytest.approx(2 * 5 / 3600 + 30.5 / 60, abs=1e-3)
    assert done["gpu_hours_at_risk_at_request"] == pytest.approx(5 / 6, abs=1e-3)
    logged = AuditLog.read(tmp_path / "audit.jsonl")
    assert [(r["outcome"], r["params"]["checkpoint"]["state"]) for r in logged] == [("retry-later", "requested"),
                                                                                   ("applied", "done")]
    assert round_(actuator, cluster) == []  # drained: the node is cordoned with nothing left on it


def test_a_checkpoint_first_drain_goes_ahead_at_the_deadline_without_an_answer(tmp_path):
    clock, cluster, actuator = setup(tmp_path)
    (asked,) = round_(actuator, cluster)
    clock.advance(299)
    assert round_(actuator, cluster) == [] and cluster.applied == []
    clock.advance(1)
    (drained,) = round_(actuator, cluster)
    assert drained.outcome == Outcome.APPLIED and drained.params["checkpoint"]["state"] == "timed-out"
    assert drained.params["checkpoint"]["answers"] == [{"workload": "alpha/train", "answer": "no answer",
                                                        "checkpoint_at": None}]
    assert drained.params["at_risk"][1] == {  # the trainer's last checkpoint is 15 minutes old now
        "workload": "alpha/train", "gpus": 2.0, "gpu_hours": 0.5, "basis": "last-checkpoint",
        "since": iso(NOW - timedelta(minutes=10)), "checkpointable": True, "mode": "immediate"}


def test_a_restart_between_the_request_and_the_drain_resumes_the_same_request(tmp_path):
    clock, cluster, first = setup(tmp_path, lose_writes=1)  # it died after logging the request, before writing it
    (asked,) = round_(first, cluster)
    request_id = asked.params["checkpoint"]["request_id"]
    assert CHECKPOINT_REQUEST_ANNOTATION not in cluster.notes["alpha/train"]

    clock.advance(60)
    second = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=clock)
    assert round_(second, cluster) == []  # no second request: the log's is resumed, and written where it is missing
    assert cluster.notes["alpha/train"][CHECKPOINT_REQUEST_ANNOTATION] == request_id
    assert cluster.notes["alpha/train"][CHECKPOINT_DEADLINE_ANNOTATION] == iso(NOW + timedelta(seconds=300))

    clock.advance(30)
    cluster.answer("alpha/train", clock.now())
    third = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=clock)
    (drained,) = round_(third, cluster)
    assert (drained.outcome, drained.params["checkpoint"]["state"]) == (Outcome.APPLIED, "done")
    assert drained.params["checkpoint"]["request_id"] == request_id and len(cluster.events) == 1
    logged = AuditLog.read(tmp_path / "audit.jsonl")
    assert [r["params"]["checkpoint"]["request_id"] for r in logged] == [request_id, request_id]


def test_a_request_long_past_its_deadline_is_not_reused_a_new_drain_asks_anew(tmp_path):
    clock, cluster, actuator = setup(tmp_path)
    (first,) = round_(actuator, cluster)
    clock.advance(601)  # deadline (300 s) plus as long again: the request no longer stands
    (again,) = round_(actuator, cluster)
    assert again.outcome == Outcome.RETRY and again.params["checkpoint"]["state"] == "requested"
    assert again.params["checkpoint"]["request_id"] != first.params["checkpoint"]["request_id"]
    assert cluster.applied == []


def test_approve_mode_one_approval_asks_first_and_drains_after_the_answer(tmp_path):
    clock, cluster, actuator = setup(tmp_path, mode=Mode.APPROVE)
    (waiting,) = round_(actuator, cluster)
    assert waiting.outcome == Outcome.AWAITING_APPROVAL and "GPU-h at risk" in waiting.message
    assert waiting.params["checkpoint_first"]["workloads"] == ["alpha/train"]  # what the approver sees
    asked = actuator.approve(waiting.approval_id, by="alice")
    assert asked.outcome == Outcome.RETRY and asked.params["checkpoint"]["state"] == "requested"
    assert asked.approval_id is None and cluster.applied == []  # the approval stays open until the drain goes
    clock.advance(30)
    assert round_(actuator, cluster) == [] and not pending(tmp_path / "audit.jsonl")  # not asked again
    cluster.answer("alpha/train", clock.now())
    clock.advance(30)
    (drained,) = round_(actuator, cluster)
    assert (drained.outcome, drained.approval_id, drained.by) == (Outcome.APPLIED, waiting.approval_id, "alice")
    assert drained.params["checkpoint"]["state"] == "done"


def test_observe_mode_states_the_risk_and_asks_nothing(tmp_path):
    _, cluster, actuator = setup(tmp_path, mode=Mode.OBSERVE)
    (planned,) = round_(actuator, cluster)
    assert planned.outcome == Outcome.PLANNED and "checkpoint" not in planned.params
    assert planned.message == ("0.83 GPU-h at risk (last-checkpoint+start-time, 2 workload(s)); "
                               "mode: checkpoint-first (up to 300 s), then immediate")
    assert cluster.writes == 0 and cluster.events == [] and cluster.applied == []


class NoNotices:
    """A cluster that takes no workload annotations (the simulator's case)."""

    def __init__(self, inner):
        self.inner = inner

    def snapshot(self):
        return self.inner.snapshot()

    def apply(self, action):
        return self.inner.apply(action)


def test_a_cluster_that_takes_no_annotations_is_not_asked_and_the_log_says_so(tmp_path):
    clock = FakeClock(NOW)
    cluster = NoNotices(TrainerCluster(fleet(), clock))
    assert not isinstance(cluster, WorkloadNotices)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=clock)
    (drained,) = round_(actuator, cluster)
    assert drained.outcome == Outcome.APPLIED
    assert drained.params["checkpoint"] == {"state": "not-asked", "workloads": ["alpha/train"],
                                            "why": "this cluster takes no workload annotations"}


# -- what the Actions page shows -----------------------------------------------------------------------

def test_the_actions_page_shows_gpu_hours_at_risk_and_each_checkpoint(tmp_path, monkeypatch):
    store = tmp_path / "store"
    clock = FakeClock(NOW)
    cluster = TrainerCluster(fleet(), clock)
    actuator = Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(store / "actuator" / "audit.jsonl"), clock=clock)
    round_(actuator, cluster)
    clock.advance(40)
    cluster.answer("alpha/train", clock.now())
    round_(actuator, cluster)
    rows = risk_rows(AuditLog.read(store / "actuator" / "audit.jsonl"))
    assert [(r["outcome"], r["checkpoint"], r["answered"]) for r in rows] == [("applied", "done", "1/1"),
                                                                             ("retry-later", "requested", "0/1")]
    assert rows[1]["gpu_hours_at_risk"] == pytest.approx(0.833, abs=1e-3) and rows[0]["gpu_hours_at_risk"] < 0.6

    monkeypatch.delenv("GPUWARDEN_AUDIT", raising=False)
    monkeypatch.setenv("GPUWARDEN_STORE", str(store))
    app = AppTest.from_file(str(APP_PATH.parent / "views" / "actions.py"), default_timeout=30).run()
    assert not app.exception
    assert "Work at risk and checkpoints" in [h.value for h in app.subheader]
    table = next(d.value for d in app.dataframe if "GPU-h at risk" in d.value.columns)
    assert list(table["checkpoint"]) == ["done", "requested"] and list(table["answered"]) == ["1/1", "0/1"]
    assert any("checkpoint requested 1, done 1, timed out 0" in c.value for c in app.caption)


def test_the_drain_mode_label_is_the_one_the_kubernetes_drain_reads():
    from gpuwarden.kube.drain import DRAIN_MODE_LABEL as KUBE_LABEL

    assert DRAIN_MODE_LABEL == KUBE_LABEL
    assert datetime.fromisoformat(iso(datetime(2026, 1, 1, tzinfo=UTC))) == datetime(2026, 1, 1, tzinfo=UTC)


def test_the_checkpoint_timeouts_are_flags_of_the_actuator():
    from gpuwarden.cli import build_parser
    from gpuwarden.cli.actuator_cmd import _policy

    default = _policy(build_parser().parse_args(["actuator", "plan"]))
    assert dict(default.checkpoint_timeout_seconds_by_severity) == {"critical": 300.0, "warning": 900.0}
    tuned = _policy(build_parser().parse_args(["actuator", "plan", "--checkpoint-timeout-critical", "0",
                                               "--checkpoint-timeout-warning", "60"]))
    assert dict(tuned.checkpoint_timeout_seconds_by_severity) == {"critical": 0.0, "warning": 60.0}
