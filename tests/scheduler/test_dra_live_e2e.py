"""Issue 34's end-to-end scenario: gpuwarden's live loop schedules a cluster that mixes device-plugin
and Dynamic Resource Allocation nodes, as one fleet.

The fake API server speaks the real protocol; nothing real exists here. No kube-apiserver,
kube-scheduler, kube-controller-manager or DRA driver can run in this sandbox, so the official
``kubernetes`` client talks real HTTP to fakes that enforce the real rules: ``tests/fake_kube_api.py``
(``with_dra()``: resource.k8s.io/v1), the Job controller stand-in, the ResourceClaim controller
(claims made from templates) and kube-scheduler's DynamicResources (``tests/fake_kube_dra_alloc.py``:
claims allocated on binding from the node's ResourceSlices by class, count and CEL selectors, a device
never in two claims, else the pod Pending with "cannot allocate all claims"), inside the kube-scheduler
stand-in (``tests/fake_kube_scheduler.py``). The objects are written as NVIDIA's DRA driver writes
them (``tests/fake_kube_dra.py``).

The cluster: a device-plugin pool (2 x 8 H100, ``nvidia.com/gpu``), a DRA-only pool (2 x 8 H100
published in ResourceSlices, no ``nvidia.com/gpu`` in allocatable), a DRA node of 4 A100, and an A100
node whose MIG devices (7 x 1g.10gb on one GPU, 2 x 3g.40gb on the other) are published through DRA.
The DeviceClass ``gpu.nvidia.com`` maps ``nvidia.com/gpu`` (KEP-5004). Two teams with guarantees
submit Jobs as users do (ungated: gpuwarden's own webhook over TLS gates a pod asking ``nvidia.com/gpu``
and a pod whose GPUs come only through claims alike): a PodGroup gang (scheduling.k8s.io/v1alpha2, gang minCount 4) of pods claiming 2 GPUs each from a
template, MIG claims, a claim whose selector names a product only one pool has, KEP-5004 pods asking
``nvidia.com/gpu``, and more than one team's quota allows. The loop is ``SchedulingRound(KubeCluster)``,
what ``gpuwarden scheduler run`` runs every interval; the rounds go on until nothing changes.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from fake_kube_api import CORE, RESOURCE, FakeKubeAPI
from fake_kube_dra import (A100, DRIVER, claim_template, dra_node, gpu_slice, mig_device, nvidia_classes,
                           request, resource_slice)
from fake_job_controller import RUN_SECONDS_ANNOTATION
from gated_scenario import FakeCluster, gpu_node, job_manifest, submit
from kube_fleet import mutating_webhook, namespace, priority_class

from gpuwarden.fleet import ActionKind
from gpuwarden.fleet.clock import ModelClock
from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.kube.gates import ADMITTED_NODE_ANNOTATION, QUEUE_LABEL, QUEUE_REASON_ANNOTATION
from gpuwarden.scheduler.scheduling_round import SchedulingRound

V1ALPHA2 = "apis/scheduling.k8s.io/v1alpha2"
TEAMS = {"research": (16, 28), "vision": (8, 12)}  # team -> (guaranteed, burst) GPUs
DEVICE_PLUGIN_NODES = {"dp-0", "dp-1"}
DRA_NODES = {"dra-0", "dra-1", "a100-0", "mig-0"}
ROUND_SECONDS = 60
MAX_ROUNDS = 20
RUN_SECONDS = 24 * 3600  # nothing ends within the test: the cluster settles
MIG_SLICES = {"1g.10gb": 1, "3g.40gb": 3}  # compute slices of an A100's 7
PRODUCT_SELECTOR = f"device.attributes['{DRIVER}'].productName == '{A100}'"
TEMPLATE_UNITS = {"two-gpus": 2.0, "one-gpu": 1.0, "small-mig": 1 / 7, "big-mig": 3 / 7, "two-a100": 2.0}


def _cluster(api: FakeKubeAPI) -> None:
    nvidia_classes(api)
    for team, (guaranteed, burst) in TEAMS.items():
        namespace(api, team, {QUEUE_LABEL: team}, {"gpuwarden.io/guaranteed-gpus": str(guaranteed),
                                                   "gpuwarden.io/burst-gpus": str(burst)})
    namespace(api, "gpuwarden")
    priority_class(api, "normal", 1000)
    for i, name in enumerate(sorted(DEVICE_PLUGIN_NODES)):
        gpu_node(api, name, i, {"nvidia.com/gpu": 8}, {})
    for name in ("dra-0", "dra-1"):  # DRA only: the product comes from the slices (no GPU feature discovery label)
        dra_node(api, name, labels={"kubernetes.io/hostname": name})
        gpu_slice(api, name)
    dra_node(api, "a100-0", labels={"kubernetes.io/hostname": "a100-0"})
    gpu_slice(api, "a100-0", gpus=4, product=A100)
    dra_node(api, "mig-0", labels={"kubernetes.io/hostname": "mig-0", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    resource_slice(api, "mig-0", [mig_device("mig-0", 0, "1g.10gb", start) for start in range(7)]
                   + [mig_device("mig-0", 1, "3g.40gb", 0), mig_device("mig-0", 1, "3g.40gb", 4)])
    claim_template(api, "research", "two-gpus", [request("gpus", "gpu.nvidia.com", 2)])
    claim_template(api, "research", "one-gpu", [request("gpu", "gpu.nvidia.com", 1)])
    claim_template(api, "vision", "small-mig", [request("mig", "mig-1g.10gb.gpu.nvidia.com")])
    claim_template(api, "vision", "big-mig", [request("mig", "mig.nvidia.com", cel=(
        f"device.attributes['{DRIVER}'].profile == '3g.40gb'"))])
    claim_template(api, "vision", "two-a100", [request("gpus", "gpu.nvidia.com", 2, cel=PRODUCT_SELECTOR)])
    api.add(V1ALPHA2, "podgroups", {"metadata": {"name": "trainers", "namespace": "research"},
                                    "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}})


def _job(name: str, team: str, gpus: int = 0, parallelism: int = 1, templates: dict[str, str] | None = None,
         group: str | None = None) -> dict:
    """A Job as a user writes it; ``gpus``: ``nvidia.com/gpu`` (KEP-5004 where a DRA node serves it),
    ``templates``: its pods' claims {entry: template}."""
    # created ungated, as a user writes it: gpuwarden's webhook gates it, claims-only pods included
    manifest = job_manifest(name, team, count=max(gpus, 1), parallelism=parallelism, run_seconds=RUN_SECONDS,
                            gated=False)
    pod_spec = manifest["spec"]["template"]["spec"]
    resources = pod_spec["containers"][0]["resources"]
    if not gpus:
        resources["requests"].pop("nvidia.com/gpu")
        resources["limits"].pop("nvidia.com/gpu")
    if templates:
        pod_spec["resourceClaims"] = [{"name": entry, "resourceClaimTemplateName": t} for entry, t in templates.items()]
    if group:
        pod_spec["schedulingGroup"] = {"podGroupName": group}
    return manifest


WORKLOADS = [
    _job("gang", "research", parallelism=4, templates={"gpus": "two-gpus"}, group="trainers"),  # 8 GPUs, one gang
    # KEP-5004: a device-plugin node's 8 or a DRA node's; the gang's claims need a DRA H100 node, so one of
    # these two goes to the device plugin's. Named after the gang: the Job controller makes pods in name
    # order and the queue takes them in that order; the other order:
    # test_pods_that_may_go_anywhere_leave_dra_nodes_to_pods_that_need_them
    _job("wide-eight-a", "research", gpus=8),
    _job("wide-eight-b", "research", gpus=8),
    _job("one-dra", "research", templates={"gpu": "one-gpu"}),
    *(_job(f"mig-small-{i}", "vision", templates={"mig": "small-mig"}) for i in range(3)),
    _job("mig-big", "vision", templates={"mig": "big-mig"}),
    _job("ampere", "vision", templates={"gpus": "two-a100"}),  # only a100-0's product matches
    _job("wide-two", "vision", gpus=2),
    _job("over-quota", "vision", gpus=6, parallelism=2),  # a gang of 12: vision's burst of 12 never has room
]


def _units(device: dict) -> float:
    """A device in GPU units: a whole GPU 1, a MIG device its compute slices over its GPU's 7."""
    attributes = device["attributes"]
    if attributes["type"]["string"] == "gpu":
        return 1.0
    return MIG_SLICES[attributes["profile"]["string"]] / 7


def _live(pod: dict) -> bool:
    return pod["status"].get("phase") not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def _job_of(pod: dict) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['labels'].get('batch.kubernetes.io/job-name', '')}"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The whole scenario once, with gpuwarden's webhook serving TLS: every round's observations."""
    from gpuwarden.kube.certs import CertPolicy, WebhookCertificates
    from gpuwarden.kube.webhook import WebhookService
    from gpuwarden.kube.webhook_claims import GpuClaims

    tmp_path = tmp_path_factory.mktemp("dra-e2e")
    api = FakeKubeAPI().with_dra().start()
    webhook = claims = None
    try:
        _cluster(api)
        mutating_webhook(api, "gw-scheduler", None, service=("gpuwarden", "gw-scheduler", "/mutate-pods"),
                         namespace_selector={"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]})
        fake = FakeCluster(api)
        clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
        kube = KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), backoff_seconds=0.01,
                       max_backoff_seconds=0.05, clock=clock)
        certificates = WebhookCertificates(kube, CertPolicy("gw-scheduler", "gpuwarden"), "gw-webhook-cert",
                                           "gw-scheduler")
        claims = GpuClaims(kube, clock=clock).start()  # as scheduler run wires it
        webhook = WebhookService(tmp_path / "certs", 0, host="127.0.0.1", claims_ask_gpu=claims.asks_gpu,
                                 refresh=functools.partial(certificates.ensure, tmp_path / "certs")).start()
        api.webhook_services[("gpuwarden", "gw-scheduler")] = f"https://127.0.0.1:{webhook.server.port}"
        for manifest in WORKLOADS:
            status, answer = submit(api, manifest)
            assert status == 201, answer
        yield _rounds(api, fake, SchedulingRound(KubeCluster(kube, clock=clock)))
    finally:
        if webhook is not None:
            webhook.stop()
        if claims is not None:
            claims.stop()
        api.stop()


def _rounds(api: FakeKubeAPI, fake: FakeCluster, loop: SchedulingRound) -> dict:
    seen: dict = {"admitted": [], "violations": [], "usage": [], "unbound_since": {}, "rounds": 0, "gpuwarden": []}
    quiet = 0
    for step in range(MAX_ROUNDS):
        fake.step(ROUND_SECONDS if step else 0)
        binds = []
        for result in loop.run_round():
            if result.action.kind == ActionKind.BIND:
                assert result.ok, result.message
                binds.append((result.action.target, tuple(p["node"] for p in result.action.params["placements"]),
                              result.message))
        seen["admitted"] += [(step, *b) for b in binds]
        seen["gpuwarden"].append((step, {t["team"]: t["allocated_gpus"] for t in loop.queue["teams"]}))
        _observe(api, seen, step)
        seen["rounds"] = step + 1
        quiet = 0 if binds else quiet + 1
        if quiet >= 3:  # three rounds admitting nothing: the cluster has settled
            break
    fake.step(ROUND_SECONDS)  # kube-scheduler's last pass over what the last round admitted
    _observe(api, seen, seen["rounds"])
    seen["plans_refused"] = loop.plans_refused
    seen["http"] = {"dra lists": len([r for r in api.calls("GET", "^/apis/resource.k8s.io/v1/", user="")]),
                    "pod patches": len(api.calls("PATCH", r"^/api/v1/namespaces/[^/]+/pods/[^/]+$", user=""))}
    seen["webhook"] = {(c.review["request"]["namespace"], c.outcome) for c in api.webhook_calls}
    seen["webhook_pods"] = [(c.review["request"]["object"], c.outcome) for c in api.webhook_calls]
    seen["pods"] = [p for p in api.objects(CORE, "pods") if _live(p)]
    seen["claims"] = api.objects(RESOURCE, "resourceclaims")
    seen["events"] = [e for e in api.objects(CORE, "events") if e["reason"] == "FailedScheduling"]
    return seen


def _observe(api: FakeKubeAPI, seen: dict, step: int) -> None:
    """Per round: admitted pods bound where admitted within a round, no device in two claims, each team's
    GPUs (held through claims and the device plugin, or admitted and not yet bound) in GPU units."""
    devices = {(s["spec"]["pool"]["name"], d["name"]): d for s in api.objects(RESOURCE, "resourceslices")
               for d in s["spec"]["devices"]}
    holder: dict[tuple[str, str], str] = {}
    units: dict[str, float] = {}  # claim name -> its devices in GPU units
    for claim in api.objects(RESOURCE, "resourceclaims"):
        name = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        allocation = (claim.get("status") or {}).get("allocation") or {}
        units[name] = 0.0
        for result in (allocation.get("devices") or {}).get("results") or ():
            key = (result["pool"], result["device"])
            if key in holder:
                seen["violations"].append(f"round {step}: {key} in {holder[key]} and {name}")
            holder[key] = name
            units[name] += _units(devices[key])
    usage: dict[str, float] = defaultdict(float)
    for pod in api.objects(CORE, "pods"):
        if not _live(pod):
            continue
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        admitted = pod["metadata"].get("annotations", {}).get(ADMITTED_NODE_ANNOTATION)
        bound = pod["spec"].get("nodeName")
        if bound and bound != admitted:
            seen["violations"].append(f"round {step}: {ns}/{name} bound to {bound}, admitted to {admitted}")
        if admitted and not bound:
            since = seen["unbound_since"].setdefault(f"{ns}/{name}", step)
            if step - since >= 2:
                scheduled = next((c for c in pod["status"].get("conditions") or () if c["type"] == "PodScheduled"), {})
                seen["violations"].append(f"round {step}: {ns}/{name} admitted to {admitted}, Pending: "
                                          f"{scheduled.get('message')}")
        if not admitted:
            continue
        claims = [s["resourceClaimName"] for s in pod["status"].get("resourceClaimStatuses") or ()]
        extended = (pod["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        held = sum(units.get(f"{ns}/{c}", 0.0) for c in [*claims, *([extended] if extended else [])])
        asked = int(pod["spec"]["containers"][0]["resources"].get("limits", {}).get("nvidia.com/gpu", 0))
        if bound and extended is None and admitted in DEVICE_PLUGIN_NODES:
            held += asked  # the device plugin's GPUs
        elif not bound:  # admitted, not bound yet: what it asks
            held = asked + sum(TEMPLATE_UNITS[e["resourceClaimTemplateName"]] for e in pod["spec"].get("resourceClaims") or ())
        usage[ns] += held
    seen["usage"].append((step, dict(usage)))


def test_every_admitted_pod_is_bound_where_it_was_admitted_and_no_device_is_in_two_claims(run):
    assert not run["violations"], run["violations"][:5]
    assert run["plans_refused"] == 0
    admitted = [p for p in run["pods"] if p["metadata"].get("annotations", {}).get(ADMITTED_NODE_ANNOTATION)]
    assert admitted and all(p["spec"].get("nodeName") == p["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION]
                            for p in admitted)
    # nothing gpuwarden admitted waited on its pinned node: kube-scheduler never had to say FailedScheduling
    assert not [e["message"] for e in run["events"]]
    held = [(r["pool"], r["device"]) for c in run["claims"]
            for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()]
    assert held and len(held) == len(set(held))


def test_each_teams_gpus_in_gpu_units_stay_within_its_quota_and_what_exceeds_it_waits(run):
    for step, usage in run["usage"]:
        for team, gpus in usage.items():
            assert gpus <= TEAMS[team][1] + 1e-9, (step, team, gpus)
    final = run["usage"][-1][1]
    assert final["vision"] == pytest.approx(2 + 2 + 3 / 7 + 3 / 7)  # MIG counted as its share of its GPU
    assert final["research"] == pytest.approx(8 + 8 + 8 + 1)
    # and gpuwarden's own count (its queue's allocation, read back from the claims at the next round's start)
    # is the same in every round, in GPU units
    theirs = dict(run["gpuwarden"])
    compared = [(step, usage) for step, usage in run["usage"] if step + 1 in theirs]
    assert len(compared) >= 3
    for step, usage in compared:
        assert theirs[step + 1] == pytest.approx(usage, abs=1e-3), (step, theirs[step + 1], usage)
    waiting = [p for p in run["pods"] if _job_of(p) == "vision/over-quota"]
    assert waiting and all(p["spec"].get("schedulingGates") for p in waiting)
    reason = waiting[0]["metadata"].get("annotations", {}).get(QUEUE_REASON_ANNOTATION, "")
    assert "burst" in reason, reason


def test_the_pod_group_gang_is_admitted_whole_in_one_round(run):
    gang = [(nodes, message) for _, target, nodes, message in run["admitted"] if target == "research/podgroup:trainers"]
    assert len(gang) == 1 and ": 4 pod(s) to" in gang[0][1], gang  # once, its 4 pods together
    pods = [p for p in run["pods"] if _job_of(p) == "research/gang"]
    assert len(pods) == 4 and all(p["spec"].get("nodeName") in DRA_NODES for p in pods)
    assert all(p["spec"]["schedulingGroup"] == {"podGroupName": "trainers"} for p in pods)


def test_device_plugin_and_dra_nodes_are_scheduled_as_one_fleet(run):
    rounds: dict[int, set[str]] = defaultdict(set)
    for step, _, nodes, _ in run["admitted"]:
        rounds[step] |= set(nodes)
    assert any(nodes & DEVICE_PLUGIN_NODES and nodes & DRA_NODES for nodes in rounds.values()), dict(rounds)
    bound = {p["spec"]["nodeName"] for p in run["pods"] if p["spec"].get("nodeName")}
    assert bound & DEVICE_PLUGIN_NODES and bound & DRA_NODES


def test_mig_devices_published_through_dra_are_allocated_on_the_mig_node(run):
    by_job = {_job_of(p): p for p in run["pods"]}
    claims = {c["metadata"]["name"]: c for c in run["claims"]}
    for job, profile in [*((f"vision/mig-small-{i}", "1g10gb") for i in range(3)), ("vision/mig-big", "3g40gb")]:
        pod = by_job[job]
        assert pod["spec"].get("nodeName") == "mig-0", (job, pod["spec"].get("nodeName"))
        (made,) = pod["status"]["resourceClaimStatuses"]
        (result,) = claims[made["resourceClaimName"]]["status"]["allocation"]["devices"]["results"]
        assert f"-mig-{profile}-" in result["device"]


def test_a_claim_whose_selector_names_one_pools_product_lands_on_that_pool(run):
    pod = next(p for p in run["pods"] if _job_of(p) == "vision/ampere")
    assert pod["spec"].get("nodeName") == "a100-0", pod["metadata"].get("annotations")


def test_a_kep_5004_pod_on_a_dra_node_gets_its_claim_and_on_a_device_plugin_node_none(run):
    ext = [p for p in run["pods"] if _job_of(p).startswith(("research/wide-", "vision/wide-"))]
    assert ext and all(p["spec"].get("nodeName") for p in ext)
    claims = {c["metadata"]["name"]: c for c in run["claims"]}
    on_dra = [p for p in ext if p["spec"]["nodeName"] in DRA_NODES]
    assert on_dra and len(on_dra) < len(ext)  # both ways in the one scenario
    for pod in ext:
        status = pod["status"].get("extendedResourceClaimStatus")
        assert (status is not None) == (pod in on_dra), pod["metadata"]["name"]
        if status is not None:
            made = claims[status["resourceClaimName"]]
            assert made["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
            asked = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            assert len(made["status"]["allocation"]["devices"]["results"]) == asked


def test_the_scenario_went_through_http_with_the_official_client_and_the_webhook_over_tls(run):
    """gpuwarden's reads of resource.k8s.io/v1 and its admissions went over HTTP (user ""); the webhook
    gated the pods that asked ``nvidia.com/gpu``."""
    assert run["rounds"] >= 4  # it settled: three rounds in a row admitted nothing
    assert run["http"]["dra lists"] >= 4 * run["rounds"]  # four lists a snapshot
    assert run["http"]["pod patches"] >= len([a for a in run["admitted"]])
    assert ("research", "patched") in run["webhook"] and ("vision", "patched") in run["webhook"]


def test_the_webhook_gates_the_pods_whose_gpus_come_only_through_claims(run):
    """Pods asking no ``nvidia.com/gpu`` whose claims' templates ask GPU or MIG devices were gated by the
    webhook (their claims read by ``GpuClaims``), so the queue and the quotas counted them."""
    claims_only = [(pod, outcome) for pod, outcome in run["webhook_pods"] if pod["spec"].get("resourceClaims")
                   and not any("nvidia.com/gpu" in (c.get("resources") or {}).get("limits", {})
                               for c in pod["spec"]["containers"])]
    assert len(claims_only) >= 4 + 1 + 3 + 1 + 1  # the gang's 4, one-dra, the MIG pods, ampere
    assert {outcome for _, outcome in claims_only} == {"patched"}


def test_pods_that_may_go_anywhere_leave_dra_nodes_to_pods_that_need_them(tmp_path):
    """One device-plugin node and one DRA node of 8 H100 each; a KEP-5004 pod of 8 ``nvidia.com/gpu``
    (either node serves it) arrives before a pod claiming 8 GPUs (only the DRA node can). Both fit, one
    node each: the fleet is one only if the first is laid where the second cannot go."""
    api = FakeKubeAPI().with_dra().start()
    try:
        nvidia_classes(api)
        namespace(api, "research", {QUEUE_LABEL: "research"}, {"gpuwarden.io/guaranteed-gpus": "16",
                                                               "gpuwarden.io/burst-gpus": "16"})
        priority_class(api, "normal", 1000)
        gpu_node(api, "dp-0", 0, {"nvidia.com/gpu": 8}, {})
        dra_node(api, "dra-0", labels={"kubernetes.io/hostname": "dra-0"})
        gpu_slice(api, "dra-0")
        claim_template(api, "research", "eight", [request("gpus", "gpu.nvidia.com", 8)])
        for manifest in (_job("a-wide", "research", gpus=8), _job("b-claims", "research", templates={"gpus": "eight"})):
            manifest["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "gpuwarden.io/admission"}]
            assert submit(api, manifest)[0] == 201
        _settle(api, tmp_path, rounds=4)
        where = {_job_of(p): p["spec"].get("nodeName") for p in api.objects(CORE, "pods") if _live(p)}
        reasons = {_job_of(p): p["metadata"].get("annotations", {}).get(QUEUE_REASON_ANNOTATION)
                   for p in api.objects(CORE, "pods") if _live(p)}
        assert where == {"research/a-wide": "dp-0", "research/b-claims": "dra-0"}, (where, reasons)
    finally:
        api.stop()


def _settle(api: FakeKubeAPI, tmp_path, rounds: int) -> None:
    """``rounds`` rounds of the live loop, each after a minute of the stand-ins; then kube-scheduler's last pass."""
    fake = FakeCluster(api)
    clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
    kube = KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), backoff_seconds=0.01, clock=clock)
    loop = SchedulingRound(KubeCluster(kube, clock=clock))
    for step in range(rounds):
        fake.step(ROUND_SECONDS if step else 0)
        loop.run_round()
    fake.step(ROUND_SECONDS)


def test_a_finished_pods_devices_are_released_and_the_next_claim_gets_them(tmp_path):
    """A DRA node of 8 H100; a pod claiming all 8 runs 3 minutes, another claiming 8 waits. When the first
    ends, the ResourceClaim controller releases and deallocates its claim, gpuwarden reads the devices free
    and admits the second to that node, and kube-scheduler allocates it the same 8 devices."""
    api = FakeKubeAPI().with_dra().start()
    try:
        nvidia_classes(api)
        namespace(api, "research", {QUEUE_LABEL: "research"}, {"gpuwarden.io/guaranteed-gpus": "16",
                                                               "gpuwarden.io/burst-gpus": "16"})
        priority_class(api, "normal", 1000)
        dra_node(api, "dra-0", labels={"kubernetes.io/hostname": "dra-0"})
        gpu_slice(api, "dra-0")
        claim_template(api, "research", "eight", [request("gpus", "gpu.nvidia.com", 8)])
        first, second = (_job(name, "research", templates={"gpus": "eight"}) for name in ("first", "second"))
        for meta in (first["metadata"], first["spec"]["template"]["metadata"]):
            meta["annotations"][RUN_SECONDS_ANNOTATION] = "180"
        for manifest in (first, second):
            assert submit(api, manifest)[0] == 201
        _settle(api, tmp_path, rounds=8)
        pods = {_job_of(p): p for p in api.objects(CORE, "pods")}
        assert pods["research/first"]["status"]["phase"] == "Succeeded"
        assert pods["research/second"]["spec"].get("nodeName") == "dra-0", pods["research/second"]["metadata"]
        claims = {c["metadata"]["ownerReferences"][0]["name"]: c for c in api.objects(RESOURCE, "resourceclaims")}
        assert not claims[pods["research/first"]["metadata"]["name"]]["status"].get("allocation")
        held = claims[pods["research/second"]["metadata"]["name"]]["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in held) == sorted(f"gpu-{i}" for i in range(8))
    finally:
        api.stop()


def test_reclaim_preempts_a_borrowers_claims_and_their_devices_go_to_the_owner(tmp_path):
    """A DRA node of 8 H100; team vision is guaranteed 8, team research none. research's checkpointable
    Job borrows the whole node (its pod's claim holds all 8); then vision's Job claiming 8 arrives. The
    round suspends the borrower (gpuwarden.io/suspended-by), its pod goes, the claim controller releases
    and deallocates its claim, and vision's Job is admitted to that node and allocated the same 8
    devices: reclaim and preemption hold for DRA work as for extended resources, and no device is ever
    in two claims."""
    api = FakeKubeAPI().with_dra().start()
    try:
        nvidia_classes(api)
        namespace(api, "research", {QUEUE_LABEL: "research"}, {"gpuwarden.io/guaranteed-gpus": "0",
                                                               "gpuwarden.io/burst-gpus": "8"})
        namespace(api, "vision", {QUEUE_LABEL: "vision"}, {"gpuwarden.io/guaranteed-gpus": "8",
                                                           "gpuwarden.io/burst-gpus": "8"})
        priority_class(api, "normal", 1000)
        dra_node(api, "dra-0", labels={"kubernetes.io/hostname": "dra-0"})
        gpu_slice(api, "dra-0")
        for team in ("research", "vision"):
            claim_template(api, team, "eight", [request("gpus", "gpu.nvidia.com", 8)])
        low, urgent = _job("low", "research", templates={"gpus": "eight"}), _job("urgent", "vision", templates={"gpus": "eight"})
        for meta in (low["metadata"], low["spec"]["template"]["metadata"]):
            meta["annotations"]["gpuwarden.io/checkpointable"] = "true"
        fake = FakeCluster(api)
        clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
        kube = KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), backoff_seconds=0.01, clock=clock)
        loop = SchedulingRound(KubeCluster(kube, clock=clock))
        for manifest in (low, urgent):
            manifest["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "gpuwarden.io/admission"}]
        assert submit(api, low)[0] == 201
        twice = []

        def devices_once() -> None:
            allocated = [(r["pool"], r["device"]) for c in api.objects(RESOURCE, "resourceclaims")
                         for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])]
            twice.extend(d for d in set(allocated) if allocated.count(d) > 1)

        for step in range(3):
            fake.step(ROUND_SECONDS if step else 0)
            loop.run_round()
            devices_once()
        assert submit(api, urgent)[0] == 201
        kinds = []
        for _ in range(9):
            fake.step(ROUND_SECONDS)
            kinds += [r.action.kind for r in loop.run_round() if r.ok]
            devices_once()
        fake.step(ROUND_SECONDS)
        assert ActionKind.SUSPEND in kinds or ActionKind.PREEMPT in kinds, kinds
        pods = {_job_of(p): p for p in api.objects(CORE, "pods") if _live(p)}
        assert pods["vision/urgent"]["spec"].get("nodeName") == "dra-0"
        assert "research/low" not in pods  # suspended: its pod is gone and its devices free
        claims = {c["metadata"]["ownerReferences"][0]["name"]: c for c in api.objects(RESOURCE, "resourceclaims")}
        held = claims[pods["vision/urgent"]["metadata"]["name"]]["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in held) == sorted(f"gpu-{i}" for i in range(8))
        assert twice == []
    finally:
        api.stop()
