"""Bad DRA input is skipped, counted and said (issue 34, "Bad input"): one Warning Event per skipped
claim (``GpuwardenClaimSkipped``, once per claim and reason per process, not every round), the
scheduler's metric counting skipped DRA objects by kind, and the rest of the cluster scheduled.
Through HTTP on the fake API server with the official client, the production round on top."""

from __future__ import annotations

import pytest
from fake_kube_api import CORE, RESOURCE, FakeKubeAPI
from fake_kube_dra import claim, claim_pod, dra_node, gpu_slice, nvidia_classes, request
from kube_fleet import connect, namespace

from gpuwarden.kube.dra_notices import SKIPPED_REASON, SkippedClaimEvents, skipped_by_kind
from gpuwarden.kube.gates import ADMITTED_NODE_ANNOTATION
from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics
from gpuwarden.scheduler.scheduling_round import SchedulingRound


@pytest.fixture
def api(dra_api):
    return dra_api


def _events(api: FakeKubeAPI) -> list[dict]:
    return [e for e in api.objects(CORE, "events") if e["reason"] == SKIPPED_REASON]


def test_each_skipped_claim_is_told_once_counted_by_kind_and_the_rest_scheduled(api, tmp_path):
    nvidia_classes(api)
    namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "8"})
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0", 4)
    api.add(RESOURCE, "resourceslices", {"metadata": {"name": "odd"}, "spec": {"driver": "gpu.nvidia.com",
                                                                                "pool": "not-an-object"}})
    claim(api, "ml", "count-words", [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": "two"}}])
    claim(api, "ml", "no-class", [request("gpus", "fpga.example.com")])
    claim_pod(api, "ml", "uses-bad", None, claims={"gpus": "count-words"}, gated=True)
    claim(api, "ml", "good", [request("gpus", "gpu.nvidia.com", 2)])
    claim_pod(api, "ml", "fine", None, claims={"gpus": "good"}, gated=True)
    cluster = connect(api, tmp_path)
    metrics = SchedulerMetrics(dra_skipped=lambda: skipped_by_kind(cluster.inventory.dra.skipped))
    loop = SchedulingRound(cluster, on_round=[metrics])
    notices = SkippedClaimEvents(cluster.api, clock=cluster.clock)

    for _ in range(3):  # three rounds: each claim told once, not every round
        loop.run_round()
        notices.tell(cluster.inventory.dra.skipped)
    events = _events(api)
    assert sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"], e["metadata"]["namespace"])
                  for e in events) == [("ResourceClaim", "count-words", "ml"), ("ResourceClaim", "no-class", "ml")]
    assert all(e["type"] == "Warning" and e["involvedObject"]["apiVersion"] == "resource.k8s.io/v1" for e in events)
    assert "fpga.example.com" in next(e["message"] for e in events if e["involvedObject"]["name"] == "no-class")

    def gauge(kind: str) -> float | None:
        return metrics.registry.get_sample_value("gpuwarden_scheduler_dra_skipped_objects", {"kind": kind})
    assert (gauge("ResourceClaim"), gauge("ResourceSlice"), gauge("DeviceClass")) == (2, 1, 0)
    # the rest is scheduled: the good claim's pod admitted, the bad one's held with the claim named
    pods = {p["metadata"]["name"]: p for p in api.objects(CORE, "pods")}
    assert pods["fine"]["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION] == "dra-0"
    assert "ResourceClaim count-words was skipped" in loop.queue["workloads"][0]["reason"]

    # fixed: forgotten and no longer counted; broken again, for another reason: told again
    claim(api, "ml", "count-words", [request("gpus", "gpu.nvidia.com", 1)])
    loop.run_round()
    assert notices.tell(cluster.inventory.dra.skipped) == 0 and gauge("ResourceClaim") == 1
    claim(api, "ml", "count-words", [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": True}}])
    loop.run_round()
    assert notices.tell(cluster.inventory.dra.skipped) == 1 and len(_events(api)) == 3


def test_gpuwarden_scheduler_run_tells_a_skipped_claim_and_admits_the_rest(api, tmp_path):
    """The wiring of ``gpuwarden scheduler run`` (the command an operator runs): its rounds post the
    Event and leave the good claim's pod admitted."""
    from gpuwarden.cli import main

    nvidia_classes(api)
    namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "8"})
    dra_node(api, "dra-0")
    gpu_slice(api, "dra-0", 4)
    claim(api, "ml", "no-class", [request("gpus", "fpga.example.com")])
    claim_pod(api, "ml", "uses-bad", None, claims={"gpus": "no-class"}, gated=True)
    claim(api, "ml", "good", [request("gpus", "gpu.nvidia.com", 2)])
    claim_pod(api, "ml", "fine", None, claims={"gpus": "good"}, gated=True)
    assert main(["scheduler", "run", "--rounds", "2", "--interval-seconds", "0.1", "--port", "0",
                 "--no-attained-service", "--kubeconfig", api.kubeconfig(tmp_path / "kc.json")]) == 0
    assert [(e["involvedObject"]["name"], e["source"]["component"]) for e in _events(api)] == [
        ("no-class", "gpuwarden-scheduler")]
    pods = {p["metadata"]["name"]: p for p in api.objects(CORE, "pods")}
    assert pods["fine"]["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION] == "dra-0"
