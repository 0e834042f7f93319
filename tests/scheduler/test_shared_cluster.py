"""Issue 31: live scheduling on a cluster shared with namespaces that never opted in.

Each test is one failure a new user met, from the docs alone, on a cluster with more than one kind
of tenant; each failed on the code before the fix. No kube-apiserver, kube-scheduler or Job
controller can run here: the official ``kubernetes`` client talks real HTTP to the fake API server
(``tests/fake_kube_api.py``: gates may only be removed, a gated pod's affinity only tightened,
evictions delete with the pod's grace period) with its kube-scheduler and Job-controller stand-ins
(``tests/fake_kube_scheduler.py``: NodeResourcesFit on every resource, taints, affinity), through
``tests/shared_cluster.py``.
"""

from __future__ import annotations

import pytest
from shared_cluster import Shared, gpu_node, pod_spec, team_namespace

from gpuwarden.kube.gates import (QUEUE_POSITION_ANNOTATION,
                                           QUEUE_REASON_ANNOTATION)
from gpuwarden.fleet import ActionKind

STOPS = (ActionKind.SUSPEND, ActionKind.PREEMPT, ActionKind.EVICT)
STARTS = (ActionKind.BIND, ActionKind.RESUME)


@pytest.fixture
def shared(tmp_path):
    made: list[Shared] = []

    def make(**kwargs) -> Shared:
        folder = tmp_path / str(len(made))
        folder.mkdir()
        made.append(Shared(folder, **kwargs))
        return made[-1]

    yield make
    for cluster in made:
        cluster.stop()


def _gated(pod: dict | None) -> bool:
    return bool(pod and any(g["name"] == "gpuwarden.io/admission" for g in pod["spec"].get("schedulingGates") or ()))


# -- 1. scope --------------------------------------------------------------------------------------------

def test_namespaces_outside_the_queue_are_never_touched_and_their_gated_pods_are_left_alone(shared):
    """A high-priority arrival in a queue namespace, a full cluster whose other half runs pods of a
    namespace without ``gpuwarden.io/queue`` (a bare pod and a Job), and a pod there carrying the gate
    by hand: nothing of that namespace is evicted, suspended, admitted, annotated or told an Event;
    its pods count as used; the gated one is listed once in /queue's ignored pods and the metric."""
    cluster = shared()
    api = cluster.api
    for i in range(2):
        gpu_node(api, f"gpu-{i}", leaf="leaf-a")
    team_namespace(api, "research", guaranteed="8", burst="16")
    team_namespace(api, "ops", queue=False)
    cluster.running("ops", "notebook", pod_spec(count=4, priority="low", gated=False), bare=True)
    cluster.running("ops", "etl", pod_spec(count=4, priority="low", gated=False))
    cluster.running("research", "sweep", pod_spec(count=8, priority="low", gated=False))
    cluster.pod("ops", "by-hand", pod_spec(count=1, priority="high"))  # the gate written by hand, outside the queue
    cluster.job("research", "urgent", pod_spec(count=8, priority="high"))
    results = cluster.rounds(6)

    assert cluster.writes("ops") == []
    assert {p["metadata"]["name"] for p in cluster.live_pods("ops") if p["spec"].get("nodeName")} >= {"notebook"}
    assert _gated(cluster.pod_named("ops", "by-hand"))
    assert not any(r.action.target.startswith("ops/") for r in results)
    queue = cluster.loop.queue
    assert "ops" not in {t["team"] for t in queue["teams"]}
    assert [p["pod"] for p in queue["ignored_pods"]] == ["ops/by-hand"]
    assert "gpuwarden.io/queue" in queue["ignored_pods"][0]["reason"]
    assert cluster.metrics.registry.get_sample_value("gpuwarden_scheduler_ignored_pods") == 1
    # its own team's low-priority work made room instead
    assert any(r.action.target == "research/sweep" and r.action.kind in STOPS for r in results)


# -- 2. guarantees ---------------------------------------------------------------------------------------

def test_a_team_within_its_guarantee_is_never_preempted_for_another_teams_borrowing(shared):
    """Team vision runs 16 of its 16 guaranteed GPUs as a low-priority gang; team nlp (guarantee 0)
    submits a high-priority 4-GPU pod. Borrowing never takes a guarantee: the gang keeps running and
    the pod waits with a reason that says so."""
    cluster = shared()
    api = cluster.api
    for i in range(2):
        gpu_node(api, f"gpu-{i}", leaf="leaf-a")
    team_namespace(api, "vision", guaranteed="16", burst="16")
    team_namespace(api, "nlp", guaranteed="0", burst="8")
    cluster.running("vision", "gang", pod_spec(count=8, priority="low", gated=False), parallelism=2,
                    annotations={"gpuwarden.io/checkpointable": "true"})
    cluster.pod("nlp", "probe", pod_spec(count=4, priority="high"))
    results = cluster.rounds(4)

    assert not [r for r in results if r.action.target.startswith("vision/") and r.action.kind in STOPS]
    assert not cluster.job_named("vision", "gang")["spec"].get("suspend")
    assert _gated(cluster.pod_named("nlp", "probe"))
    reason = cluster.pod_named("nlp", "probe")["metadata"]["annotations"][QUEUE_REASON_ANNOTATION]
    assert "guarantee" in reason, reason


# -- 3. reservations and victims ----------------------------------------------------------------------------

def test_nothing_is_admitted_and_evicted_in_one_round_and_a_preemptor_waits_for_its_victims(shared):
    """One time-sliced GPU (4 shares), 3 held by team b's gang of 4 whose last pod waits; team a's
    borrowing bare pod arrives. The bare pod (LAS level 0) comes first in the queue and takes the last
    share; b's pod (level 1, within b's guarantee) reclaims it. Before the fix both happened in one
    round: the bare pod was admitted and evicted 0.4 s later, lost, and b's pod admitted at once onto the
    share the victim still held. Now what a round admits is never its victim; when b reclaims the share
    (a bare pod: the last resort, said in the reason) its pod is held for the share and admitted only
    once the victim is gone."""
    def attained(snapshot):  # b's gang has run a while: its waiting part is at LAS level 1
        return {ws.workload.key: 7200.0 for ws in snapshot.workloads if ws.workload.namespace == "b"}

    cluster = shared(attained=attained)
    api = cluster.api
    gpu_node(api, "shared-0", gpus=1, shared=4)
    team_namespace(api, "a", guaranteed="0", burst="4")
    team_namespace(api, "b", guaranteed="2", burst="4")
    share = {"resource": "nvidia.com/gpu.shared", "count": 1, "cpu": "1", "memory": "1Gi"}
    gang = {"gpuwarden.io/gang": "serve", "gpuwarden.io/gang-size": "4"}
    for i in range(3):
        cluster.pod("b", f"serve-{i}", pod_spec(**share, gated=False), labels=gang)
    cluster.fake.step(0)
    cluster.pod("b", "serve-3", pod_spec(**share), labels=gang)
    cluster.pod("a", "scratch", pod_spec(**share))

    results = []
    for _ in range(12):
        done = cluster.round(5)
        results += done
        started = {r.action.target for r in done if r.ok and r.action.kind in STARTS}
        stopped = {r.action.target for r in done if r.ok and r.action.kind in STOPS}
        assert not started & stopped, f"admitted and stopped in one round: {started & stopped}"
        serve = cluster.pod_named("b", "serve-3")
        if not _gated(serve):  # admitted: nothing of the victim is left on the node
            assert cluster.pod_named("a", "scratch") is None, "admitted onto a share its victim still holds"
    assert cluster.loop.plans_refused == 0
    (stop,) = [r for r in results if r.action.target == "a/scratch" and r.action.kind in STOPS]
    assert "last resort" in stop.action.reason and stop.action.params["for"] == "b/serve"
    assert not _gated(cluster.pod_named("b", "serve-3")), "the reclaimed share was never given to b"
    assert cluster.pod_named("b", "serve-3")["spec"].get("nodeName") == "shared-0"


# -- 4. a reason for everything that waits -----------------------------------------------------------------

def test_everything_that_waits_is_listed_annotated_and_told_with_its_cause(shared):
    """Work that can never start as written, each in /queue at its position with a reason naming the
    cause, annotated, and one Event: a MIG profile no node offers, one no catalogue knows, a selector
    and an affinity matching no node, a taint nobody tolerates on the only nodes it selects, a pod
    larger than any node's whole GPUs (the 8-GPU nodes are time-sliced and MIG: not whole GPUs), a
    gang that fits under no single leaf switch, and a team at its burst."""
    cluster = shared()
    api = cluster.api
    gpu_node(api, "whole-a", gpus=4, leaf="leaf-a")
    gpu_node(api, "whole-b", gpus=4, leaf="leaf-b")
    gpu_node(api, "infer-0", gpus=4, leaf="leaf-b", labels={"pool": "infer"},
             taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}])
    gpu_node(api, "shared-0", gpus=8, shared=32, leaf="leaf-c")
    gpu_node(api, "mig-0", gpus=8, mig={"1g.10gb": 56}, mig_config="all-1g.10gb", leaf="leaf-c")
    team_namespace(api, "research", guaranteed="8", burst="12")
    team_namespace(api, "small", guaranteed="1", burst="1")
    cluster.running("small", "one", pod_spec(count=1, gated=False))
    waiting = {
        "mig-3g": pod_spec("nvidia.com/mig-3g.40gb", 1),
        "mig-unknown": pod_spec("nvidia.com/mig-5g.99gb", 1),
        "selector": pod_spec(count=1, node_selector={"gpu-type": "b200"}),
        "affinity": pod_spec(count=1, affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["mars"]}]}]}}}),
        "tainted": pod_spec(count=1, node_selector={"pool": "infer"}),
        "too-big": pod_spec(count=8),
    }
    for name, spec in waiting.items():
        cluster.pod("research", name, spec)
    cluster.job("research", "gang", pod_spec(count=4), parallelism=2)
    cluster.pod("small", "over-burst", pod_spec(count=1))
    cluster.rounds(3)

    expected = {"research/mig-3g": "3g.40gb", "research/mig-unknown": "5g.99gb", "research/selector": "gpu-type",
                "research/affinity": "affinity", "research/tainted": "dedicated=infer:NoSchedule",
                "research/too-big": "4 whole GPUs", "research/gang": "leaf", "small/over-burst": "burst"}
    rows = {row["workload"]: row for row in cluster.loop.queue["workloads"]}
    for key, cause in expected.items():
        assert key in rows, f"{key} missing from /queue"
        assert cause in rows[key]["reason"], (key, rows[key]["reason"])
    positions = sorted(row["position"] for row in rows.values())
    assert positions == list(range(1, len(positions) + 1))
    for key in expected:
        ns, name = key.split("/")
        pods = [p for p in cluster.live_pods(ns) if p["metadata"]["name"] == name
                or p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == name]
        assert pods, key
        for pod in pods:
            notes = pod["metadata"].get("annotations", {})
            assert QUEUE_POSITION_ANNOTATION in notes and notes[QUEUE_REASON_ANNOTATION] == rows[key]["reason"], key
        involved = [e for e in cluster.events(ns) if e["involvedObject"]["name"] in {name, *(p["metadata"]["name"] for p in pods)}]
        assert len(involved) == 1, (key, [e["message"] for e in involved])


def test_a_webhook_sent_every_namespace_still_gates_only_the_queues(shared, tmp_path):
    """A MutatingWebhookConfiguration edited to send every namespace (no namespaceSelector): the
    webhook's own list of the queue's namespaces (``QueueNamespaces``, listed apart from any review)
    keeps a pod outside the queue ungated, so kube-scheduler places it; a queue pod is gated."""
    import functools

    from kube_fleet import mutating_webhook

    from gpuwarden.kube.certs import CertPolicy, WebhookCertificates
    from gpuwarden.kube.queue_namespaces import QueueNamespaces
    from gpuwarden.kube.webhook import WebhookService

    cluster = shared()
    api = cluster.api
    gpu_node(api, "gpu-0")
    team_namespace(api, "research", guaranteed="8")
    team_namespace(api, "ops", queue=False)
    team_namespace(api, "gpuwarden", queue=False)
    mutating_webhook(api, "gw", None, service=("gpuwarden", "gw", "/mutate-pods"))  # no namespaceSelector
    certificates = WebhookCertificates(cluster.cluster.api, CertPolicy("gw", "gpuwarden"), "gw-cert", "gw")
    queue = QueueNamespaces(cluster.cluster.api).start()
    webhook = WebhookService(tmp_path / "certs", 0, host="127.0.0.1", namespaces=queue,
                             refresh=functools.partial(certificates.ensure, tmp_path / "certs")).start()
    try:
        api.webhook_services[("gpuwarden", "gw")] = f"https://127.0.0.1:{webhook.server.port}"
        cluster.pod("research", "queued", pod_spec(count=1, gated=False))
        cluster.pod("ops", "theirs", pod_spec(count=1, gated=False))
        assert {c.review["request"]["namespace"] for c in api.webhook_calls} == {"research", "ops"}  # both sent
        assert _gated(cluster.pod_named("research", "queued"))
        assert not cluster.pod_named("ops", "theirs")["spec"].get("schedulingGates")
        cluster.fake.step(0)
        assert cluster.pod_named("ops", "theirs")["spec"].get("nodeName") == "gpu-0"  # kube-scheduler's, at once
    finally:
        webhook.stop()
        queue.stop()
