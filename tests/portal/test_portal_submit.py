"""The portal's submissions (gpuwarden.portal.submit, .submitters): a team template file, a request
refused naming the field when it leaves its template, the exact Job created through the official
client against the fake API server, the lead-only priority change, and the scheduler endpoint the
demo serves (a stand-in HTTP server here; the scheduler's own is wired at integration)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from fake_kube_api import BATCH, FakeKubeAPI
from queue_server_stand_in import QueueServerStandIn, queue

from gpuwarden.portal import submit as sub
from gpuwarden.kube import KubeApi, load_client
from gpuwarden.portal.submitters import KubeSubmitter, SchedulerEndpoint, submitter_from_env

TEMPLATES = """
teams:
  research:
    namespace: research
    images: ["nvcr.io/nvidia/pytorch:24.05-py3"]
    shapes: [{gpus: 1}, {gpus: 8}, {gpus: 8, pods: 4}, {migProfile: 1g.10gb}, {sharedGpu: true}]
    priorityClasses: [low, normal, high]
    leads: ["alice@example.com"]
    maxGpus: 32
  vision:
    images: ["vision:1"]
    shapes: [{gpus: 2}]
    priorityClasses: [normal]
"""


@pytest.fixture
def templates(tmp_path):
    path = tmp_path / "teams.yaml"
    path.write_text(TEMPLATES)
    return sub.load_templates(path)


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


@pytest.fixture
def kube(api, tmp_path):
    client = load_client(api.kubeconfig(tmp_path / "kubeconfig.json"), timeout_seconds=2.0)
    return KubeSubmitter(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.02))


def request(**change) -> sub.PortalRequest:
    base = sub.PortalRequest("research", "train-7", "nvcr.io/nvidia/pytorch:24.05-py3", sub.Shape(gpus=8, pods=4),
                             "high", checkpointable=True, command=("torchrun", "train.py"))
    return replace(base, **change)


def test_the_template_file_reads_as_the_contract_says(templates):
    research, vision = templates["research"], templates["vision"]
    assert [s.label for s in research.shapes] == ["1 GPU", "8 GPUs", "4 pods x 8 GPUs", "MIG 1g.10gb", "a shared GPU"]
    assert research.priority_classes == ("low", "normal", "high") and research.max_gpus == 32.0
    assert research.is_lead("Alice@Example.com") and not research.is_lead("bob@example.com")
    assert vision.namespace == "vision" and vision.max_gpus is None and vision.leads == ()  # namespace defaults to the team


@pytest.mark.parametrize(("edit", "message"), [
    (("    maxGpus: 32", "    maxGpu: 32"),
     "team 'research': unknown key 'maxGpu'; allowed keys: namespace, images, shapes, priorityClasses, leads, maxGpus"),
    (("{gpus: 1}, {gpus: 8},", "{gpus: 1}, {gpu: 8},"),
     "team 'research', shapes[1]: unknown key 'gpu'; allowed keys: gpus, pods, migProfile, sharedGpu"),
    (("[low, normal, high]", "[low, urgent]"),
     "team 'research': priorityClasses 'urgent': allowed: best-effort, low, normal, high, critical"),
    (("{migProfile: 1g.10gb}", "{migProfile: 9g.99gb}"), "team 'research', shapes[3]: unknown MIG profile '9g.99gb'"),
    (("{sharedGpu: true}", "{sharedGpu: true, gpus: 1}"), "shapes[4]: a shape asks for exactly one of gpus"),
    (('images: ["vision:1"]', "images: []"), "team 'vision': images: at least one is needed"),
    (("    maxGpus: 32", "    maxGpus: -1"), "team 'research': maxGpus -1: a number of GPUs above 0"),
])
def test_a_wrong_template_names_the_file_the_team_and_the_key(tmp_path, edit, message):
    path = tmp_path / "teams.yaml"
    path.write_text(TEMPLATES.replace(*edit))
    with pytest.raises(sub.PortalError, match=re.escape(message)) as raised:
        sub.load_templates(path)
    assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)


def test_the_exact_job_created_through_the_api(kube, api, templates):
    key, message = kube.submit(request(), templates["research"], "alice@example.com")
    [post] = api.calls("POST", "/jobs$")
    assert post.path == "/apis/batch/v1/namespaces/research/jobs"
    marks = {"gpuwarden.io/requested-by": "alice@example.com", "gpuwarden.io/checkpointable": "true"}
    labels = {"app.kubernetes.io/created-by": "gpuwarden-portal"}
    assert post.body == {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"generateName": "train-7-", "namespace": "research", "labels": labels, "annotations": marks},
        "spec": {"parallelism": 4, "completions": 4, "suspend": False, "backoffLimit": 0, "completionMode": "Indexed",
                 "template": {"metadata": {"labels": labels, "annotations": marks}, "spec": {
                     "restartPolicy": "Never", "priorityClassName": "high",
                     "schedulingGates": [{"name": "gpuwarden.io/admission"}],
                     "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                     "command": ["torchrun", "train.py"],
                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}
    [(namespace, name)] = api.store[(BATCH, "jobs")]
    assert namespace == "research" and name.startswith("train-7-") and key == f"research/{name}"
    assert key in message and "gpuwarden.io/admission" in message


@pytest.mark.parametrize(("shape", "limits"), [
    (sub.Shape(mig_profile="1g.10gb"), {"nvidia.com/mig-1g.10gb": "1"}),
    (sub.Shape(shared_gpu=True), {"nvidia.com/gpu.shared": "1"}),
    (sub.Shape(gpus=1), {"nvidia.com/gpu": "1"}),
])
def test_each_shape_asks_its_resource_from_one_pod(kube, api, templates, shape, limits):
    kube.submit(request(shape=shape, checkpointable=False, command=()), templates["research"], "bob@example.com")
    [job] = api.store[(BATCH, "jobs")].values()
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"], "completionMode" in spec) == (1, 1, False)
    [container] = spec["template"]["spec"]["containers"]
    assert container["resources"] == {"limits": limits} and "command" not in container
    assert job["metadata"]["annotations"]["gpuwarden.io/checkpointable"] == "false"


@pytest.mark.parametrize(("change", "held", "message"), [
    ({"image": "ubuntu:latest"}, 0, "image 'ubuntu:latest': allowed for team research: nvcr.io/nvidia/pytorch:24.05-py3"),
    ({"shape": sub.Shape(gpus=2)}, 0,
     "shape '2 GPUs': allowed for team research: 1 GPU, 8 GPUs, 4 pods x 8 GPUs, MIG 1g.10gb, a shared GPU"),
    ({"priority_class": "critical"}, 0, "priorityClass 'critical': allowed for team research: low, normal, high"),
    ({"name": "Train_8"}, 0, "name 'Train_8': 1 to 52 lower-case letters"),
    ({"name": "x" * 53}, 0, "1 to 52 lower-case letters"),
    ({"team": "vision"}, 0, "team 'vision': this template is team 'research''s"),
    ({}, 1, "shape '4 pods x 8 GPUs': 32 GPUs with the 1 team research already has queued or running exceed its "
            "maxGpus 32"),
])
def test_a_request_outside_its_template_is_refused_naming_the_field(kube, api, templates, change, held, message):
    with pytest.raises(sub.PortalError, match=re.escape(message)):
        kube.submit(request(**change), templates["research"], "alice@example.com", held_gpus=held)
    assert not api.calls("POST")  # refused before anything reaches the API server


def test_a_mig_slice_counts_by_its_compute_share_against_max_gpus(templates):
    sub.validate(request(shape=sub.Shape(mig_profile="1g.10gb")), templates["research"], held_gpus=31.8)
    with pytest.raises(sub.PortalError, match="exceed its maxGpus 32"):
        sub.validate(request(shape=sub.Shape(mig_profile="1g.10gb")), templates["research"], held_gpus=31.9)


def test_only_a_lead_changes_a_priority_within_the_allowed_classes(kube, api, templates):
    key, _ = kube.submit(request(priority_class="low"), templates["research"], "bob@example.com")
    research = templates["research"]
    refusals = [
        ("bob@example.com", key, "high", "identity 'bob@example.com': only team research's leads may change its "
                                         "priorities (leads: alice@example.com)"),
        ("alice@example.com", key, "critical", "priorityClass 'critical': allowed for team research: low, normal, high"),
        ("alice@example.com", "vision/other", "high", "workload 'vision/other': not a Job of team research's namespace"),
    ]
    for who, target, cls, message in refusals:
        with pytest.raises(sub.PortalError, match=re.escape(message)):
            kube.change_priority(research, target, cls, who)
    assert not api.calls("PATCH")
    said = kube.change_priority(research, key, "high", "alice@example.com")
    [patch] = api.calls("PATCH")
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body == {"metadata": {"annotations": {"gpuwarden.io/priority-class": "high"}}}
    namespace, name = key.split("/")
    job = api.get(BATCH, "jobs", name, namespace)
    assert job["metadata"]["annotations"]["gpuwarden.io/priority-class"] == "high"
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "low"  # a pod's priority is fixed at creation
    assert key in said
    with pytest.raises(sub.PortalError, match=r"priority of research/gone not changed: .*not found"):
        kube.change_priority(research, "research/gone", "high", "alice@example.com")


def test_an_api_refusal_is_one_line_naming_verb_and_resource(kube, api, templates):
    api.inject("POST", "/jobs$", 403)
    with pytest.raises(sub.PortalError) as raised:
        kube.submit(request(), templates["research"], "alice@example.com")
    assert "Job not created in namespace research: forbidden" in str(raised.value) and "'create'" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_scheduler_endpoint_posts_the_request_and_reads_its_answer(templates):
    def decide(req, identity):
        if req["priorityClass"] == "low":
            return 400, {"error": "priorityClass 'low': the demo takes normal or high"}
        return 201, {"workload": f"research/{req['name']}", "message": f"queued for {identity}"}

    server = QueueServerStandIn(queue([], []), submit=decide).start()
    try:
        endpoint = SchedulerEndpoint(server.url + "/")
        assert endpoint.submit(request(), templates["research"], "alice@example.com") == (
            "research/train-7", "queued for alice@example.com")
        assert server.posted == [{"request": {
            "team": "research", "name": "train-7", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "shape": {"gpus": 8, "pods": 4}, "priorityClass": "high", "checkpointable": True,
            "command": ["torchrun", "train.py"]}, "identity": "alice@example.com"}]
        # what the endpoint receives reads back as the same request
        assert sub.PortalRequest.from_mapping(server.posted[0]["request"]) == request()
        with pytest.raises(sub.PortalError, match=re.escape("refused it: priorityClass 'low': the demo takes normal")):
            endpoint.submit(request(priority_class="low"), templates["research"], "alice@example.com")
        with pytest.raises(sub.PortalError, match="image 'x'"):  # checked here before anything is posted
            endpoint.submit(request(image="x"), templates["research"], "alice@example.com")
        assert len(server.posted) == 2 and not endpoint.can_change_priority
    finally:
        server.stop()
    with pytest.raises(sub.PortalError, match=re.escape(f"{server.url}/submit: no answer")):
        endpoint.submit(request(), templates["research"], "alice@example.com")


def test_a_posted_request_with_a_wrong_key_is_named():
    with pytest.raises(sub.PortalError, match=re.escape("request: unknown key 'gpus'; allowed keys: team, name")):
        sub.PortalRequest.from_mapping({**request().to_mapping(), "gpus": 3})
    with pytest.raises(sub.PortalError, match="request: image is missing"):
        sub.PortalRequest.from_mapping({k: v for k, v in request().to_mapping().items() if k != "image"})


def test_the_submitter_comes_from_the_environment(api, tmp_path):
    kubeconfig = api.kubeconfig(tmp_path / "kc.json")
    assert submitter_from_env({}) is None
    endpoint = submitter_from_env({"GPUWARDEN_SCHEDULER_URL": "http://sched:8083"})
    assert isinstance(endpoint, SchedulerEndpoint) and endpoint.url == "http://sched:8083"
    kube = submitter_from_env({"GPUWARDEN_SCHEDULER_URL": "http://sched:8083", "GPUWARDEN_KUBECONFIG": kubeconfig})
    assert isinstance(kube, KubeSubmitter) and kubeconfig in kube.where  # a cluster wins over the demo's endpoint
    forced = submitter_from_env({"GPUWARDEN_PORTAL_SUBMIT": "scheduler", "GPUWARDEN_SCHEDULER_URL": "http://s:1",
                                 "GPUWARDEN_KUBECONFIG": kubeconfig})
    assert isinstance(forced, SchedulerEndpoint)
    for env, message in [({"GPUWARDEN_PORTAL_SUBMIT": "kube"}, "GPUWARDEN_PORTAL_SUBMIT='kube': allowed: kubernetes, scheduler"),
                         ({"GPUWARDEN_PORTAL_SUBMIT": "scheduler"}, "needs GPUWARDEN_SCHEDULER_URL"),
                         ({"GPUWARDEN_KUBECONFIG": str(tmp_path / "missing")}, "cannot load the kubeconfig"),
                         ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "GPUWARDEN_SCHEDULER_URL": "http://s:1"},
                          "cannot load the in-cluster service account")]:  # in a pod: its service account, not the URL
        with pytest.raises(sub.PortalError, match=re.escape(message)):
            submitter_from_env(env)


def test_the_demo_templates_cover_the_simulated_teams():
    from gpuwarden.sim.catalog import MIG_LAYOUTS
    from gpuwarden.sim.fleetgen import TEAM_NAMES

    demo = sub.load_templates(sub.DEMO_TEMPLATES_PATH)
    assert sorted(demo) == sorted(TEAM_NAMES)
    assert all(t.namespace == t.team for t in demo.values())  # the simulator's namespaces are its teams
    offered = {profile for layout in MIG_LAYOUTS.values() for profile in layout}
    assert {s.mig_profile for t in demo.values() for s in t.shapes if s.mig_profile} <= offered  # placeable in the demo


def test_the_workload_a_simulated_cluster_adds_for_a_request(templates):
    research = templates["research"]
    gang = sub.workload_of(request(), research, "train-7-x1")
    assert (gang.key, gang.team, gang.priority_class.value, gang.gang_size) == ("research/train-7-x1", "research", "high", 4)
    assert (gang.gpus.count, gang.total_gpu_equivalents, gang.checkpointable) == (8, 32.0, True)
    shared = sub.workload_of(request(shape=sub.Shape(shared_gpu=True), checkpointable=False), research, "s", 250)
    assert (shared.gpus.fraction_milli, shared.gang_size, shared.checkpoint_interval_seconds) == (250, 1, None)
    with pytest.raises(sub.PortalError, match="image 'x'"):
        sub.workload_of(request(image="x"), research, "bad")
