"""Issue 21's end-to-end scenario: gpuwarden's scheduling round schedules a Kubernetes cluster.

No kube-apiserver, kube-scheduler or Job controller can run here, so the official ``kubernetes``
client talks real HTTP to fakes that enforce the real rules (``tests/fake_kube_api.py``: gates may
only be removed, a gated pod's node affinity may only be tightened; ``tests/fake_kube_scheduler.py``
binds an ungated pod only where its affinity and resources allow, else FailedScheduling;
``tests/fake_job_controller.py`` makes a Job's pods, deletes them on suspend, ends them on a virtual
clock). The scenario (``tests/gated_scenario.py``): 3 teams, 8 nodes x 8 H100 (5 whole, 1
time-sliced, 2 MIG), about 200 pods (gangs of 4 x 8 GPUs, MIG pods, time-sliced pods, single-GPU
jobs), every pod created behind the ``gpuwarden.io/admission`` gate, plus a high-priority job that
arrives into a full cluster. The loop is ``SchedulingRound(KubeCluster)``, what ``gpuwarden
scheduler run`` runs every interval.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from fake_job_controller import RUN_SECONDS_ANNOTATION
from fake_kube_api import BATCH, CORE, FakeKubeAPI
from gated_scenario import PRIORITY_CLASSES, TEAMS, FakeCluster, build, install_cluster, job_manifest, submit_due
from kube_fleet import namespace

from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.kube.gates import (ADMITTED_NODE_ANNOTATION, QUEUE_LABEL, QUEUE_POSITION_ANNOTATION,
                                           QUEUE_REASON_ANNOTATION)
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.fleet import ActionKind
from gpuwarden.fleet.clock import ModelClock

ROUND_SECONDS = 60
RUN_SCALE = 0.25  # the scenario's 10-120 min jobs run 2.5-30 min, so the queue drains within the test
HORIZON_SECONDS = 5 * 3600
URGENT_AT_SECONDS = 1800  # the cluster is full by then
# The urgent arrival's team: nothing else of it runs, so it is within its guarantee and may take GPUs
# back from borrowers (a borrowing team never takes a guarantee, issue 31)
ONCALL = ("oncall", 8, 8)
ALL_TEAMS = {**TEAMS, ONCALL[0]: ONCALL[1:]}
WHOLE_NODES = {f"gpu-0{i}" for i in range(5)}
SHARED_NODES = {"gpu-05"}
MIG_NODES = {"gpu-06", "gpu-07"}


def _gpus(pod: dict) -> tuple[str, int]:
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    (resource, count), = limits.items()
    return resource, int(count)


def _job(pod: dict) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['labels'].get('batch.kubernetes.io/job-name', '')}"


def _live(pod: dict) -> bool:
    return pod["status"].get("phase") not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The whole scenario, once: every round's observations for the tests below."""
    api = FakeKubeAPI().start()
    try:
        yield _run(api, tmp_path_factory.mktemp("e2e"))
    finally:
        api.stop()


def _run(api: FakeKubeAPI, tmp_path) -> dict:
    install_cluster(api)
    fake = FakeCluster(api)
    scenario = build(seed=7)
    for job in scenario.jobs:  # shorter runs: the same mix, drained within the horizon
        for meta in (job.manifest["metadata"], job.manifest["spec"]["template"]["metadata"]):
            meta["annotations"][RUN_SECONDS_ANNOTATION] = str(int(int(meta["annotations"][RUN_SECONDS_ANNOTATION]) * RUN_SCALE))
    namespace(api, ONCALL[0], {QUEUE_LABEL: ONCALL[0]}, {"gpuwarden.io/guaranteed-gpus": str(ONCALL[1]),
                                                         "gpuwarden.io/burst-gpus": str(ONCALL[2])})
    urgent = scenario.arrive(job_manifest("urgent", ONCALL[0], count=8, priority="high", run_seconds=1200),
                             URGENT_AT_SECONDS)
    clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
    client = load_client(api.kubeconfig(tmp_path / "kc.json"))
    cluster = KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05, clock=clock), clock=clock)
    loop = SchedulingRound(cluster)
    seen: dict = {"admitted": [], "violations": [], "allocation": [], "pending": [], "urgent": urgent.key,
                  "jobs": {j.key: j.manifest for j in scenario.jobs}, "suspended": {}, "resumed": {}, "bound_by": {}, "bound": [], "borrowed": [], "kube_preempted": [],
                  "positions": 0}
    submitted_at: dict[str, float] = {}
    for step in range(HORIZON_SECONDS // ROUND_SECONDS):
        now = fake.clock.now
        for key in submit_due(api, scenario, now):
            submitted_at[key] = now
        seen["kube_preempted"] += fake.step(ROUND_SECONDS if step else 0).preempted
        waiting = {_job(p) for p in api.objects(CORE, "pods") if _live(p) and p["spec"].get("schedulingGates")}
        seen["pending"].append((step, waiting))
        for result in loop.run_round():
            kind, target = result.action.kind, result.action.target
            assert result.ok or kind != ActionKind.BIND, result.message  # the plan fits what the cluster has
            if kind == ActionKind.BIND:
                nodes = tuple(p["node"] for p in result.action.params["placements"])
                seen["admitted"].append((step, target, nodes))
                gang = int(seen["jobs"][target]["spec"]["parallelism"]) if target in seen["jobs"] else 1
                if f": {gang} pod(s) to" not in result.message and f": {gang} pod(s) held for" not in result.message:
                    # every pod of a gang in the one round (held while the pods it preempted stop)
                    seen["violations"].append(f"round {step}: gang {target} admitted as {result.message!r}")
            elif kind in (ActionKind.SUSPEND, ActionKind.PREEMPT):
                seen["suspended"].setdefault(target, (step, result.action.reason))
            elif kind == ActionKind.RESUME:
                seen["resumed"].setdefault(target, step)
        _observe(api, seen, step)
        seen["borrowed"].append((step, {t["team"]: t["borrowed_gpus"] for t in loop.queue["teams"]}))
        if step > URGENT_AT_SECONDS // ROUND_SECONDS and not scenario_left(api, scenario):
            break
    seen["plans_refused"] = loop.plans_refused
    seen["submitted_at"] = submitted_at
    seen["reasons"] = {_job(p): p["metadata"].get("annotations", {}).get(QUEUE_REASON_ANNOTATION, "")
                       for p in api.objects(CORE, "pods") if _live(p)}
    seen["rounds"] = step + 1
    return seen


def scenario_left(api: FakeKubeAPI, scenario) -> bool:
    """Whether any of the scenario's Jobs still waits or runs."""
    if len(scenario.submitted) < len(scenario.jobs):
        return True
    return any(not any(c["type"] == "Complete" and c["status"] == "True" for c in (j.get("status") or {}).get("conditions") or ())
               for j in api.objects(BATCH, "jobs"))


def _observe(api: FakeKubeAPI, seen: dict, step: int) -> None:
    """Per round: no pod outside the plan, gangs whole, shapes on their nodes, a gang under one leaf
    switch, and each team's allocation."""
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in api.objects(CORE, "nodes")}
    stopped = {f"{j['metadata']['namespace']}/{j['metadata']['name']}" for j in api.objects(BATCH, "jobs") if j["spec"].get("suspend")}
    by_job: dict[str, list[dict]] = defaultdict(list)
    allocation: dict[str, float] = defaultdict(float)  # GPUs each team holds as the scheduler sees it
    bound_gpus = 0
    for pod in api.objects(CORE, "pods"):
        if not _live(pod):
            continue
        by_job[_job(pod)].append(pod)
        admitted = pod["metadata"].get("annotations", {}).get(ADMITTED_NODE_ANNOTATION)
        bound = pod["spec"].get("nodeName")
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if bound and bound != admitted:
            seen["violations"].append(f"round {step}: {name} bound to {bound}, admitted to {admitted}")
        if admitted and not bound:
            seen["bound_by"].setdefault(name, step)
            if step - seen["bound_by"][name] > 2:
                seen["violations"].append(f"round {step}: {name} admitted to {admitted} and not bound for 2 rounds")
        if QUEUE_POSITION_ANNOTATION in pod["metadata"].get("annotations", {}):
            seen["positions"] += 1
        resource, count = _gpus(pod)
        where = admitted or bound
        if where:
            allowed = MIG_NODES if resource.startswith("nvidia.com/mig-") else SHARED_NODES if resource.endswith(
                ".shared") else WHOLE_NODES
            if where not in allowed:
                seen["violations"].append(f"round {step}: {name} ({resource}) on {where}")
            if resource == "nvidia.com/gpu" and _job(pod) not in stopped:
                allocation[pod["metadata"]["namespace"]] += count
            if resource == "nvidia.com/gpu" and bound:
                bound_gpus += count
    for job, pods in by_job.items():
        admitted = [p for p in pods if p["metadata"].get("annotations", {}).get(ADMITTED_NODE_ANNOTATION)]
        parallelism = int(seen["jobs"][job]["spec"]["parallelism"]) if job in seen["jobs"] else 1
        if admitted and len(admitted) != len(pods):  # (a gang's pods may end at different times)
            seen["violations"].append(f"round {step}: gang {job} has {len(admitted)} of its {len(pods)} pods admitted")
        if parallelism > 1 and admitted:
            leaves = {nodes[p["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION]]["gpuwarden.io/leaf-switch"]
                      for p in admitted}
            if len(leaves) != 1:
                seen["violations"].append(f"round {step}: gang {job} spans leaf switches {sorted(leaves)}")
    seen["allocation"].append((step, dict(allocation)))
    seen["bound"].append((step, bound_gpus))


def test_no_pod_lands_outside_the_plan_gangs_are_whole_and_shapes_and_topology_hold(run):
    assert not run["violations"], run["violations"][:5]
    assert not run["kube_preempted"], run["kube_preempted"][:5]  # kube-scheduler never had to make room itself
    assert run["plans_refused"] == 0  # no plan broke an invariant (the verifier would have refused it whole)
    admitted = {target for _, target, _ in run["admitted"]}
    gangs = [k for k, m in run["jobs"].items() if m["spec"]["parallelism"] > 1]
    mig = [k for k, m in run["jobs"].items() if "mig-" in str(m["spec"]["template"]["spec"]["containers"][0]["resources"])]
    shared = [k for k, m in run["jobs"].items() if ".shared" in str(m["spec"]["template"]["spec"]["containers"][0]["resources"])]
    assert gangs and mig and shared
    # everything its team's burst limit allows was admitted (placements name nodes of its kind: checked
    # per round above); what it never allows waits with the quota named
    over_burst = {k for k, m in run["jobs"].items() if m["spec"]["parallelism"] * _gpus(m["spec"]["template"])[1] > ALL_TEAMS[
        m["metadata"]["namespace"]][1]}
    assert set(run["jobs"]) - over_burst <= admitted, sorted(set(run["jobs"]) - over_burst - admitted)
    for key in over_burst:
        assert key not in admitted and "over its burst limit" in run["reasons"][key], run["reasons"].get(key)
    assert run["positions"] > 0  # waiting pods carry their queue position


def test_queue_order_within_a_team_follows_priority_then_arrival(run):
    """Two single-pod jobs of one team asking the same shape, both waiting in a round: the one of
    higher priority, or of equal priority and earlier arrival, is admitted no later."""
    first: dict[str, int] = {}
    for step, target, _ in run["admitted"]:
        first.setdefault(target, step)
    shape = {k: (m["metadata"]["namespace"], str(m["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]))
             for k, m in run["jobs"].items() if m["spec"]["parallelism"] == 1}
    rank = {k: (-PRIORITY_CLASSES[m["spec"]["template"]["spec"]["priorityClassName"]], run["submitted_at"].get(k, 0.0))
            for k, m in run["jobs"].items()}
    checked, wrong = 0, []
    for step, waiting in run["pending"]:
        both = sorted(k for k in waiting if k in shape and k not in run["suspended"] and first.get(k, -1) >= step)
        for a in both:
            for b in both:
                if shape[a] == shape[b] and rank[a] < rank[b]:
                    checked += 1
                    if first[a] > first[b]:
                        wrong.append((step, a, b))
    assert checked > 100, checked
    assert not wrong, wrong[:5]


def test_teams_borrow_unused_guarantees_and_the_lender_gets_them_back(run):
    borrowed = {team for _, allocation in run["allocation"] for team, gpus in allocation.items() if gpus > ALL_TEAMS[team][0]}
    assert borrowed, "no team ever borrowed beyond its guarantee"
    for _, allocation in run["allocation"]:
        for team, gpus in allocation.items():
            assert gpus <= ALL_TEAMS[team][1], (team, gpus)  # never past the burst limit


def test_a_high_priority_arrival_into_a_full_cluster_suspends_a_checkpointable_borrower_which_resumes_later(run):
    urgent = run["urgent"]
    at = URGENT_AT_SECONDS // ROUND_SECONDS
    assert dict(run["bound"])[at] >= 8 * len(WHOLE_NODES) - 8  # it arrived into a busy cluster: no whole node free
    started = min(step for step, target, _ in run["admitted"] if target == urgent)
    victims = {key: (step, why) for key, (step, why) in run["suspended"].items() if f"preempted for {urgent}" in why}
    assert victims and started - at <= 3, (victims, started)
    borrowing = {team for team, gpus in dict(run["borrowed"])[at].items() if gpus > 0}  # as the scheduler saw it
    assert any(run["jobs"][v]["metadata"]["annotations"].get("gpuwarden.io/checkpointable") == "true"
               and run["jobs"][v]["metadata"]["namespace"] in borrowing for v in victims), (victims, borrowing)
    for victim in victims:
        manifest = run["jobs"][victim]
        assert PRIORITY_CLASSES[manifest["spec"]["template"]["spec"]["priorityClassName"]] < PRIORITY_CLASSES["high"]
        assert run["resumed"].get(victim, -1) > started, victim  # restarted later, by the scheduler


def test_the_webhook_gates_queue_pods_over_tls_and_the_round_admits_them(tmp_path):
    """gpuwarden's own webhook and certificates: the scheduler keeps its CA and serving pair in a
    Secret and the configuration's caBundle (no cert-manager); the fake API server calls the webhook
    over TLS on each pod create, verifying that bundle, and applies its patch. A pod of a queue
    namespace is gated and waits for the round; one elsewhere goes straight to kube-scheduler."""
    import functools

    from gpuwarden.kube.certs import CertPolicy, WebhookCertificates
    from gpuwarden.kube.webhook import WebhookService
    from kube_fleet import mutating_webhook

    api = FakeKubeAPI().start()
    try:
        install_cluster(api)
        namespace(api, "gpuwarden")
        namespace(api, "sandbox")  # no gpuwarden.io/queue label: not gpuwarden's
        mutating_webhook(api, "gw-scheduler", None, service=("gpuwarden", "gw-scheduler", "/mutate-pods"),
                         namespace_selector={"matchExpressions": [{"key": "gpuwarden.io/queue", "operator": "Exists"}]})
        fake = FakeCluster(api)
        clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
        kube = KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), backoff_seconds=0.01, clock=clock)
        certificates = WebhookCertificates(kube, CertPolicy("gw-scheduler", "gpuwarden"), "gw-webhook-cert", "gw-scheduler")
        webhook = WebhookService(tmp_path / "certs", 0, host="127.0.0.1",
                                 refresh=functools.partial(certificates.ensure, tmp_path / "certs")).start()
        try:
            api.webhook_services[("gpuwarden", "gw-scheduler")] = f"https://127.0.0.1:{webhook.server.port}"
            for manifest in (job_manifest("queued", "research", count=2, gated=False),
                             job_manifest("direct", "sandbox", count=1, gated=False)):
                ns = manifest["metadata"]["namespace"]
                assert api.handle("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", "application/json",
                                  json.dumps(manifest).encode())[0] == 201
            fake.step()
            pods = {p["metadata"]["namespace"]: p for p in api.objects(CORE, "pods")}
            assert pods["research"]["spec"]["schedulingGates"] == [{"name": "gpuwarden.io/admission"}]
            assert pods["research"]["spec"].get("nodeName") is None  # kube-scheduler leaves a gated pod alone
            assert not pods["sandbox"]["spec"].get("schedulingGates") and pods["sandbox"]["spec"]["nodeName"]
            (call,) = api.webhook_calls  # the namespace selector held: the sandbox pod was never sent
            assert (call.review["request"]["namespace"], call.outcome) == ("research", "patched")
            assert call.url.startswith("https://")
            results = SchedulingRound(KubeCluster(kube, clock=clock)).run_round()
            (admit,) = [r for r in results if r.action.kind == ActionKind.BIND]
            assert admit.ok and admit.action.target.startswith("research/queued")
            fake.step(1)
            pod = api.get(CORE, "pods", pods["research"]["metadata"]["name"], "research")
            assert pod["spec"]["nodeName"] == pod["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION]
            assert not pod["spec"].get("schedulingGates")
        finally:
            webhook.stop()
    finally:
        api.stop()
