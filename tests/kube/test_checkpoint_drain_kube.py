"""A checkpoint-first drain on Kubernetes, end to end: the plan states the GPU-hours at risk, the
actuator writes the checkpoint request on the workload's pods and Job, the trainer answers on its
pod, and the drain evicts only then (or at the deadline); the audit log says what was asked and
what happened, and a process that stops in between resumes the same request.

No kube-apiserver here: gpuwarden's client and the trainer's (the official ``kubernetes`` client,
unmodified) speak real HTTP to ``tests/fake_kube_api.py``, which speaks the real REST protocol."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fake_kube_api import BATCH, CORE, FakeKubeAPI
from kube_fleet import job_with_pods, namespace, node, pod
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.fleet.object_names import (CHECKPOINT_DEADLINE_ANNOTATION, CHECKPOINT_DONE_ANNOTATION,
                                          CHECKPOINT_DONE_AT_ANNOTATION, CHECKPOINT_REQUEST_ANNOTATION)
from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, SafetyLimits, plan_from_findings

NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)  # the fleet's pods started at midnight: 6 hours of work each
ROOMY = SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=1.0)
CHECKPOINTABLE = {"gpuwarden.io/checkpointable": "true"}


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def fleet(api: FakeKubeAPI) -> None:
    """n0 holds rank 0 of a checkpointable 2-pod training Job (rank 1 on n1) and a bare notebook pod."""
    for name in ("n0", "n1", "n2"):
        node(api, name)
    namespace(api, "ml")
    job_with_pods(api, "ml", "train", ["n0", "n1"], annotations=CHECKPOINTABLE)
    pod(api, "ml", "notebook", "n0")


def connect(api: FakeKubeAPI, tmp_path, clock: FakeClock) -> KubeCluster:
    client = load_client(api.kubeconfig(tmp_path / "kubeconfig.json"), timeout_seconds=2.0)
    return KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05), clock=clock)


def actuator_on(api, tmp_path, clock) -> tuple[KubeCluster, Actuator]:
    """A fresh process: its own client, cluster and actuator, over the one audit log."""
    cluster = connect(api, tmp_path, clock)
    return cluster, Actuator(cluster, Mode.AUTO, ROOMY, AuditLog(tmp_path / "audit.jsonl"), clock=clock)


def row_remap(node_name: str = "n0") -> Finding:
    return Finding(FindingKind.ROW_REMAP_FAILURE, Severity.CRITICAL, node_name, f"GPU-{node_name}-0", {"count": 1},
                   ActionKind.DRAIN, 0.99, NOW - timedelta(minutes=5), NOW)


def round_(cluster: KubeCluster, actuator: Actuator):
    snapshot = cluster.snapshot()
    return actuator.execute(plan_from_findings([row_remap()], snapshot, now=actuator.clock.now()), snapshot)


def trainer_answers(api: FakeKubeAPI, tmp_path, pod_name: str, checkpoint_at: datetime) -> str:
    """The trainer (rank 1) reads the request its pod carries and answers on its pod, with the
    official client as a trainer would use it; returns the request id it answered."""
    core = k8s.CoreV1Api(k8s_config.new_client_from_config(api.kubeconfig(tmp_path / "trainer.json")))
    notes = core.read_namespaced_pod(pod_name, "ml").metadata.annotations
    request = notes[CHECKPOINT_REQUEST_ANNOTATION]
    core.patch_namespaced_pod(pod_name, "ml", {"metadata": {"annotations": {
        CHECKPOINT_DONE_ANNOTATION: request, CHECKPOINT_DONE_AT_ANNOTATION: checkpoint_at.strftime("%Y-%m-%dT%H:%M:%SZ")}}})
    return request


def notes_of(api: FakeKubeAPI, prefix: str, plural: str, name: str) -> dict:
    return api.get(prefix, plural, name, "ml")["metadata"].get("annotations") or {}


def evicted(api: FakeKubeAPI) -> list[str]:
    return sorted(c.path.split("/")[-2] for c in api.calls("POST", "/eviction$"))


def test_the_drain_asks_for_a_checkpoint_and_evicts_once_the_trainer_answered(api, tmp_path):
    fleet(api)
    clock = FakeClock(NOW)
    cluster, actuator = actuator_on(api, tmp_path, clock)
    plan = plan_from_findings([row_remap()], cluster.snapshot())
    said = plan.actions[0].statement  # the plan: 2 GPUs x 6 h of training and 1 GPU x 6 h of notebook at risk
    assert (said["gpu_hours_at_risk"], said["at_risk_basis"]) == (18.0, "start-time")
    assert said["checkpoint_first"] == {"timeout_seconds": 300.0, "workloads": ["ml/train"]}

    (asked,) = round_(cluster, actuator)
    checkpoint = asked.params["checkpoint"]
    assert (asked.outcome, checkpoint["state"], checkpoint["workloads"]) == (Outcome.RETRY, "requested", ["ml/train"])
    wanted = {CHECKPOINT_REQUEST_ANNOTATION: checkpoint["request_id"], CHECKPOINT_DEADLINE_ANNOTATION: "2026-11-23T06:05:00Z"}
    for prefix, plural, name in [(CORE, "pods", "train-0"), (CORE, "pods", "train-1"), (BATCH, "jobs", "train")]:
        assert wanted.items() <= notes_of(api, prefix, plural, name).items(), name
    (event,) = api.calls("POST", "/namespaces/ml/events")
    assert (event.body["reason"], event.body["involvedObject"]["name"]) == ("CheckpointRequested", "train")
    assert checkpoint["request_id"] in event.body["message"]
    assert evicted(api) == [] and not api.get(CORE, "nodes", "n0")["spec"].get("unschedulable")

    clock.advance(20)
    patches = len(api.calls("PATCH"))
    assert round_(cluster, actuator) == [] and evicted(api) == [] and len(api.calls("PATCH")) == patches

    clock.advance(10)
    assert trainer_answers(api, tmp_path, "train-1", clock.now() - timedelta(seconds=4)) == checkpoint["request_id"]
    (drained,) = round_(cluster, actuator)
    assert drained.outcome == Outcome.APPLIED and evicted(api) == ["notebook", "train-0"]
    assert api.get(CORE, "nodes", "n0")["spec"]["unschedulable"] is True
    done = drained.params["checkpoint"]
    assert (done["state"], done["request_id"], done["waited_seconds"]) == ("done", checkpoint["request_id"], 30.0)
    assert done["answers"] == [{"workload": "ml/train", "answer": "done", "checkpoint_at": "2026-11-23T06:00:26Z"}]
    # what the drain cost: the notebook's 6 hours, the trainer's 4 seconds (not its 6 hours)
    assert drained.params["gpu_hours_at_risk"] == pytest.approx(6 + 30 / 3600 + 2 * 4 / 3600, abs=1e-3)
    assert done["gpu_hours_at_risk_at_request"] == 18.0
    logged = AuditLog.read(tmp_path / "audit.jsonl")
    assert [(r["outcome"], r["params"]["checkpoint"]["state"]) for r in logged] == [("retry-later", "requested"),
                                                                                   ("applied", "done")]


def test_the_drain_goes_ahead_at_the_deadline_when_nobody_answers(api, tmp_path):
    fleet(api)
    clock = FakeClock(NOW)
    cluster, actuator = actuator_on(api, tmp_path, clock)
    (asked,) = round_(cluster, actuator)
    clock.advance(299)
    assert round_(cluster, actuator) == [] and evicted(api) == []
    clock.advance(1)
    (drained,) = round_(cluster, actuator)
    assert drained.outcome == Outcome.APPLIED and evicted(api) == ["notebook", "train-0"]
    assert drained.params["checkpoint"]["state"] == "timed-out"
    assert drained.params["checkpoint"]["request_id"] == asked.params["checkpoint"]["request_id"]
    assert drained.params["checkpoint"]["answers"][0]["answer"] == "no answer"
    assert drained.params["gpu_hours_at_risk"] == pytest.approx(18 + 3 * 300 / 3600, abs=1e-3)


def test_a_process_that_stops_between_the_request_and_the_drain_is_resumed_by_the_next(api, tmp_path):
    fleet(api)
    clock = FakeClock(NOW)
    first_cluster, first = actuator_on(api, tmp_path, clock)
    api.inject("PATCH", r"/pods/train-\d$", 500, times=8)  # the request is logged; writing it on the pods fails
    (asked,) = round_(first_cluster, first)
    request_id = asked.params["checkpoint"]["request_id"]
    assert CHECKPOINT_REQUEST_ANNOTATION not in notes_of(api, CORE, "pods", "train-1")
    assert notes_of(api, BATCH, "jobs", "train")[CHECKPOINT_REQUEST_ANNOTATION] == request_id
    del first, first_cluster  # the process stops

    clock.advance(60)
    cluster, second = actuator_on(api, tmp_path, clock)
    assert round_(cluster, second) == []  # nothing new to log: the same request, still waiting
    for name in ("train-0", "train-1"):  # written now, the same id and deadline
        assert notes_of(api, CORE, "pods", name)[CHECKPOINT_REQUEST_ANNOTATION] == request_id
        assert notes_of(api, CORE, "pods", name)[CHECKPOINT_DEADLINE_ANNOTATION] == "2026-11-23T06:05:00Z"
    assert len(api.calls("POST", "/namespaces/ml/events")) == 1 and evicted(api) == []

    clock.advance(30)
    trainer_answers(api, tmp_path, "train-1", clock.now())
    cluster, third = actuator_on(api, tmp_path, clock)  # and another restart: the answer is on the cluster
    (drained,) = round_(cluster, third)
    assert (drained.outcome, drained.params["checkpoint"]["state"]) == (Outcome.APPLIED, "done")
    assert drained.params["checkpoint"]["request_id"] == request_id and evicted(api) == ["notebook", "train-0"]
    logged = AuditLog.read(tmp_path / "audit.jsonl")
    assert [(r["outcome"], r["params"]["checkpoint"]["request_id"]) for r in logged] == [
        ("retry-later", request_id), ("applied", request_id)]
