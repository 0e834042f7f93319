"""docs/scheduling-live.md "Set up teams", followed as written (issue 31): the section's own YAML
applied to a cluster, and each sentence of its outcome checked.

No kube-apiserver can run here: the official client talks real HTTP to the fake API server
(``tests/fake_kube_api.py``) with its kube-scheduler and Job-controller stand-ins; gpuwarden's own
admission webhook runs over TLS with the certificates the scheduler makes (as in the chart without
cert-manager), so the pods the section submits are gated exactly as the section says. The nodes are
what the section describes: two 8-GPU H100 nodes and one H100 node in MIG mode (all-1g.10gb).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path

import pytest
import yaml
from fake_kube_api import BATCH, CORE, SCHEDULING
from kube_fleet import mutating_webhook, namespace
from shared_cluster import Shared, gpu_node

from gpuwarden.kube.certs import CertPolicy, WebhookCertificates
from gpuwarden.kube.gates import QUEUE_REASON_ANNOTATION
from gpuwarden.kube.webhook import WebhookService

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduling-live.md"
PATHS = {("v1", "Namespace"): ("/api/v1/namespaces", False), ("v1", "Pod"): ("/api/v1/namespaces/{ns}/pods", True),
         ("batch/v1", "Job"): ("/apis/batch/v1/namespaces/{ns}/jobs", True),
         ("scheduling.k8s.io/v1", "PriorityClass"): ("/apis/scheduling.k8s.io/v1/priorityclasses", False)}


def section_yaml(title: str = "## Set up teams") -> list[list[dict]]:
    """The YAML blocks of the section, each as its documents."""
    text = DOC.read_text()
    start = text.index(title)
    end = text.index("\n## ", start + len(title))
    return [[d for d in yaml.safe_load_all(block) if d]
            for block in re.findall(r"```yaml\n(.*?)```", text[start:end], flags=re.S)]


def apply(cluster: Shared, documents: list[dict]) -> None:
    """``kubectl apply`` of new objects: a POST each, as a user, through the API's rules and webhooks."""
    for doc in documents:
        path, namespaced = PATHS[(doc["apiVersion"], doc["kind"])]
        path = path.format(ns=doc["metadata"].get("namespace", "")) if namespaced else path
        status, answer = cluster.api.handle("POST", path, "application/json", json.dumps(doc).encode(),
                                            user="alice@example.com")
        assert status == 201, (doc["kind"], doc["metadata"]["name"], answer.get("message"))


@pytest.fixture
def cluster(tmp_path):
    made = Shared(tmp_path)
    api = made.api
    with api._lock:  # the section defines the priority classes it uses; the harness's are not the doc's
        api.store[(SCHEDULING, "priorityclasses")] = {}
    gpu_node(api, "h100-0", gpus=8, leaf="leaf-a")
    gpu_node(api, "h100-1", gpus=8, leaf="leaf-a")
    gpu_node(api, "h100-mig-0", gpus=8, mig={"1g.10gb": 56}, mig_config="all-1g.10gb", leaf="leaf-a")
    namespace(api, "gpuwarden")  # the release's namespace
    mutating_webhook(api, "gw-scheduler", None, service=("gpuwarden", "gw-scheduler", "/mutate-pods"),
                     namespace_selector={"matchExpressions": [{"key": "gpuwarden.io/queue", "operator": "Exists"}]})
    certificates = WebhookCertificates(made.cluster.api, CertPolicy("gw-scheduler", "gpuwarden"), "gw-webhook-cert",
                                       "gw-scheduler")
    webhook = WebhookService(tmp_path / "certs", 0, host="127.0.0.1",
                             refresh=functools.partial(certificates.ensure, tmp_path / "certs")).start()
    api.webhook_services[("gpuwarden", "gw-scheduler")] = f"https://127.0.0.1:{webhook.server.port}"
    try:
        yield made
    finally:
        webhook.stop()
        made.stop()


def renamed(doc: dict, name: str, namespace: str, gpus: int | None = None) -> dict:
    """A copy of one of the section's objects under another name (and ``gpus`` whole GPUs)."""
    out = copy.deepcopy(doc)
    out["metadata"] = {"name": name, "namespace": namespace}
    if gpus is not None:
        spec = out["spec"]["template"]["spec"] if out["kind"] == "Job" else out["spec"]
        spec["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": gpus}
    return out


def teams(cluster: Shared) -> dict[str, dict]:
    return {t["team"]: t for t in cluster.loop.queue["teams"]}


def test_the_worked_example_runs_as_the_docs_say(cluster):
    setup, work = section_yaml()
    apply(cluster, setup)
    apply(cluster, work)
    cluster.rounds(3)
    # "The webhook gates every pod; the next round admits all of them."
    pods = {p["metadata"]["name"]: p for p in cluster.live_pods()}
    assert len(pods) == 6 and all(p["spec"].get("nodeName") for p in pods.values()), {
        name: p["spec"].get("nodeName") for name, p in pods.items()}
    assert all(c.review["request"]["namespace"] in ("research", "research-batch", "vision")
               for c in cluster.api.webhook_calls) and len(cluster.api.webhook_calls) == 6
    # "research holding 12 GPUs (8 guaranteed, 4 borrowed, at its burst) and vision 2 and 1/7 (2.143,
    # within its guarantee)"
    research, vision = teams(cluster)["research"], teams(cluster)["vision"]
    assert [research[k] for k in ("guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "borrowed_gpus")] == [
        8.0, 12.0, 12.0, 4.0]
    assert [vision[k] for k in ("guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "borrowed_gpus")] == [
        4.0, None, 2.143, 0.0]
    snapshot = cluster.cluster.snapshot()
    by_key = {ws.workload.key: ws for ws in snapshot.workloads}
    assert by_key["research/pretrain"].workload.priority_class.value == "high"  # "research-high": ranked high
    assert by_key["research/pretrain"].workload.checkpointable and by_key["research/pretrain"].workload.gang_size == 2
    assert by_key["research-batch/eval"].workload.team == "research"  # "the same team"
    assert by_key["vision/sweep"].workload.gang_size == 2  # the two bare pods are one gang
    assert {t.name: t.weight for t in snapshot.teams} == {"research": 1.0, "vision": 2.0}
    # "One more 1-GPU Job in research-batch waits at position 1 with quota: ..."
    apply(cluster, [renamed(work[1], "more", "research-batch", gpus=1)])
    cluster.rounds(2)
    (row,) = cluster.loop.queue["workloads"]
    assert (row["position"], row["workload"]) == (1, "research-batch/more")
    assert row["reason"] == "quota: team research would use 13 GPUs, over its burst limit 12"
    (pod,) = [p for p in cluster.live_pods("research-batch") if p["metadata"]["name"].startswith("more-")]
    assert pod["metadata"]["annotations"][QUEUE_REASON_ANNOTATION] == row["reason"]


@pytest.mark.parametrize(("notes", "named"), [
    ({"gpuwarden.io/guaranteed-gpus": "8Gi"}, "gpuwarden.io/guaranteed-gpus='8Gi' is not a number of GPUs"),
    ({"gpuwarden.io/guaranteed-gpus": "-2"}, "gpuwarden.io/guaranteed-gpus='-2' must be a number of GPUs from 0"),
    ({"gpuwarden.io/guaranteed-gpus": "nan"}, "gpuwarden.io/guaranteed-gpus='nan' must be a number of GPUs from 0"),
    ({"gpuwarden.io/burst-gpus": "4"}, "gpuwarden.io/burst-gpus=4 is below gpuwarden.io/guaranteed-gpus=8"),
])
def test_a_quota_that_cannot_be_read_refuses_its_team_and_nothing_else(cluster, notes, named):
    """"Bad values": the team refused with one Event on the namespace naming the annotation and a line
    in /queue; its waiting work held with the reason; its running work left alone; the other team
    scheduled."""
    setup, work = section_yaml()
    apply(cluster, setup)
    apply(cluster, work)
    cluster.rounds(2)  # everything runs
    research = cluster.api.get(CORE, "namespaces", "research")
    cluster.api.act("admin", "PATCH", "/api/v1/namespaces/research",
                    {"metadata": {"annotations": {**research["metadata"]["annotations"], **notes}}},
                    "application/merge-patch+json")
    apply(cluster, [renamed(work[1], "more", "research-batch", gpus=1), renamed(work[2], "lab-2", "vision")])
    results = cluster.rounds(3)
    row = teams(cluster)["research"]
    assert named in row["error"], row
    held = {r["workload"]: r["reason"] for r in cluster.loop.queue["workloads"]}
    assert named in held["research-batch/more"]
    refusals = [e for e in cluster.events("research") if e["reason"] == "QuotaRefused"]
    assert len(refusals) == 1 and named in refusals[0]["message"] and refusals[0]["involvedObject"]["kind"] == "Namespace"
    assert not [r for r in results if r.action.target.startswith(("research/", "research-batch/"))]
    assert all(p["spec"].get("nodeName") for p in cluster.live_pods("research"))  # running work left alone
    assert cluster.api.get(CORE, "pods", "lab-2", "vision")["spec"].get("nodeName")  # the rest scheduled
    assert cluster.metrics.registry.get_sample_value("gpuwarden_scheduler_refused_teams") == 1
    # fixed: the team is scheduled again (its work waits for its quota's room, no longer refused)
    cluster.api.act("admin", "PATCH", "/api/v1/namespaces/research", {"metadata": {"annotations": research[
        "metadata"]["annotations"]}}, "application/merge-patch+json")
    cluster.rounds(1)
    assert "error" not in teams(cluster)["research"]
    assert cluster.api.get(BATCH, "jobs", "more", "research-batch") is not None


def test_two_namespaces_of_a_team_that_disagree_refuse_it_naming_both(cluster):
    setup, _ = section_yaml()
    setup[1]["metadata"]["annotations"] = {"gpuwarden.io/guaranteed-gpus": "6"}  # research-batch says otherwise
    apply(cluster, setup)
    cluster.rounds(1)
    error = teams(cluster)["research"]["error"]
    assert "namespaces research and research-batch of team research give different gpuwarden.io/guaranteed-gpus" in error
    assert "error" not in teams(cluster)["vision"]
