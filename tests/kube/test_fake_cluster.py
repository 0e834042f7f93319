"""Tests of the fake cluster itself: the fake API server's pod rules and webhook calls, and the stand-ins
for kube-scheduler and the Job controller.

No kube-apiserver, kube-scheduler or controller-manager can run here, so these are fakes that speak
the real protocol (the official ``kubernetes`` client over HTTP; AdmissionReview v1 over HTTPS to a
real TLS server) and enforce the real rules; each rule is checked refused and allowed here, so the
gpuwarden tests that run on the fake can trust it.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import ssl
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fake_job_controller import FakeJobController, FakeJobSetController
from fake_kube_api import ADMISSION, BATCH, CORE, JOBSET, FakeKubeAPI
from fake_kube_scheduler import FakeKubeScheduler, pod_requests
from gated_scenario import ADMISSION_GATE, FakeCluster, build, install_cluster, job_manifest, submit, submit_due
from kube_fleet import mutating_webhook, namespace, node, priority_class
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

MERGE = "application/merge-patch+json"
WEBHOOK_SERVICE = ("gpuwarden-system", "gpuwarden-webhook", "/mutate-pods")


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture
def api():
    fake = FakeKubeAPI().start()
    yield fake
    fake.stop()


@pytest.fixture
def core(api):
    configuration = client.Configuration()
    configuration.host = api.url
    with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client)


def _pod(name: str, gates=(ADMISSION_GATE,), gpus: int = 1, affinity: dict | None = None, **spec) -> dict:
    pod_spec = {"containers": [{"name": "main", "image": "trainer:1",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}], **spec}
    if gates:
        pod_spec["schedulingGates"] = [{"name": g} for g in gates]
    if affinity:
        pod_spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": pod_spec}


def _required(*terms: dict) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def _on_node(name: str) -> dict:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}


def _refused(call, status: int) -> dict:
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status == status, caught.value.body
    return json.loads(caught.value.body)


def _patch(core, name: str, body: dict, ns: str = "team"):
    return core.patch_namespaced_pod(name, ns, body, _content_type=MERGE, _preload_content=False)


def _bind(core, name: str, node_name: str, ns: str = "team"):
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}}
    return core.create_namespaced_pod_binding(name, ns, body, _preload_content=False)


# -- API-server rules for pods --------------------------------------------------------------------
def test_scheduling_gates_may_be_removed_never_added(api, core):
    core.create_namespaced_pod("team", _pod("p", gates=("a", ADMISSION_GATE)), _preload_content=False)
    status = _refused(lambda: _patch(core, "p", {"spec": {"schedulingGates": [{"name": "a"}, {"name": ADMISSION_GATE},
                                                                              {"name": "b"}]}}), 422)
    assert status["reason"] == "Invalid"
    assert status["message"] == ('Pod "p" is invalid: spec.schedulingGates[2].name: Forbidden: only deletion is allowed, '
                                 "but found new scheduling gate 'b'")
    _patch(core, "p", {"spec": {"schedulingGates": [{"name": "a"}]}})  # another controller's gate is kept
    assert api.get(CORE, "pods", "p", "team")["spec"]["schedulingGates"] == [{"name": "a"}]
    _patch(core, "p", {"spec": {"schedulingGates": None}})
    _refused(lambda: _patch(core, "p", {"spec": {"schedulingGates": [{"name": "a"}]}}), 422)


def test_a_gated_pods_node_affinity_may_only_be_tightened(api, core):
    core.create_namespaced_pod("team", _pod("p", affinity=_required(
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]})), _preload_content=False)
    tightened = _required({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}],
                           "matchFields": _on_node("gpu-01")["matchFields"]})
    _patch(core, "p", {"spec": {"affinity": tightened}})
    assert api.get(CORE, "pods", "p", "team")["spec"]["affinity"] == tightened
    changed = _required({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a100"]}],
                         "matchFields": _on_node("gpu-01")["matchFields"]})
    status = _refused(lambda: _patch(core, "p", {"spec": {"affinity": changed}}), 422)
    assert ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
            ".matchExpressions: Invalid value") in status["message"]
    assert "only additions are allowed (no mutations or deletions)" in status["message"]
    status = _refused(lambda: _patch(core, "p", {"spec": {"affinity": _required(tightened["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0], _on_node("gpu-02"))}}), 422)
    assert "no additions/deletions to non-empty NodeSelectorTerms list are allowed" in status["message"]
    _refused(lambda: _patch(core, "p", {"spec": {"affinity": None}}), 422)  # removing it loosens it
    two_nodes = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-01", "gpu-02"]}]}
    status = _refused(lambda: _patch(core, "p", {"spec": {"affinity": _required(
        {**tightened["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0],
         "matchFields": [*_on_node("gpu-01")["matchFields"], *two_nodes["matchFields"]]})}}), 422)
    assert "must be only one value when `operator` is 'In' or 'NotIn' for node field selector" in status["message"]


def test_a_gated_pod_without_node_affinity_may_get_any(api, core):
    core.create_namespaced_pod("team", _pod("p"), _preload_content=False)
    _patch(core, "p", {"spec": {"affinity": _required(_on_node("gpu-03")), "nodeSelector": {"pool": "h100"}}})
    _patch(core, "p", {"spec": {"nodeSelector": {"pool": "h100", "zone": "a"}}})  # additions only
    status = _refused(lambda: _patch(core, "p", {"spec": {"nodeSelector": {"pool": "a100", "zone": "a"}}}), 422)
    assert "only additions to spec.nodeSelector are allowed (no mutations or deletions)" in status["message"]


def test_once_ungated_scheduling_fields_and_the_spec_are_immutable(api, core):
    core.create_namespaced_pod("team", _pod("p"), _preload_content=False)
    _patch(core, "p", {"spec": {"affinity": _required(_on_node("gpu-03")), "schedulingGates": []}})
    status = _refused(lambda: _patch(core, "p", {"spec": {"affinity": _required(
        {"matchFields": [*_on_node("gpu-03")["matchFields"], {"key": "metadata.name", "operator": "NotIn",
                                                               "values": ["gpu-04"]}]})}}), 422)
    assert status["message"].startswith('Pod "p" is invalid: spec: Forbidden: pod updates may not change fields')
    assert status["details"]["causes"][0]["field"] == "spec"
    _refused(lambda: _patch(core, "p", {"spec": {"nodeSelector": {"a": "b"}}}), 422)
    _refused(lambda: _patch(core, "p", {"spec": {"nodeName": "gpu-03"}}), 422)  # only binding sets it
    _refused(lambda: _patch(core, "p", {"spec": {"containers": [{"name": "main", "image": "trainer:1"}]}}), 422)
    _patch(core, "p", {"spec": {"containers": [{"name": "main", "image": "trainer:2",
                                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    _patch(core, "p", {"metadata": {"annotations": {"gpuwarden.io/queue-position": "1"}}})  # metadata is free


def test_json_patch_and_strategic_merge_of_gates(api, core):
    """A JSON patch with a test on resourceVersion is the API's compare-and-swap; a strategic merge patch merges
    schedulingGates by name (a list sent there does not replace the gates: $patch delete removes one)."""
    core.create_namespaced_pod("team", _pod("p", gates=("a", ADMISSION_GATE)), _preload_content=False)
    version = api.get(CORE, "pods", "p", "team")["metadata"]["resourceVersion"]
    json_patch = "application/json-patch+json"
    stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}, {"op": "remove", "path": "/spec/schedulingGates/1"}]
    status = _refused(lambda: core.patch_namespaced_pod("p", "team", stale, _content_type=json_patch, _preload_content=False), 422)
    assert "test at /metadata/resourceVersion failed" in status["message"]
    fresh = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, {"op": "remove", "path": "/spec/schedulingGates/1"}]
    core.patch_namespaced_pod("p", "team", fresh, _content_type=json_patch, _preload_content=False)
    assert api.get(CORE, "pods", "p", "team")["spec"]["schedulingGates"] == [{"name": "a"}]
    strategic = "application/strategic-merge-patch+json"
    _refused(lambda: core.patch_namespaced_pod("p", "team", {"spec": {"schedulingGates": [{"name": "b"}]}},
                                               _content_type=strategic, _preload_content=False), 422)  # merged: an addition
    core.patch_namespaced_pod("p", "team", {"spec": {"schedulingGates": [{"name": "a", "$patch": "delete"}]}},
                              _content_type=strategic, _preload_content=False)
    assert not api.get(CORE, "pods", "p", "team")["spec"].get("schedulingGates")


def test_priority_admission(api, core):
    priority_class(api, "high", 10000)
    core.create_namespaced_pod("team", _pod("p", priorityClassName="high"), _preload_content=False)
    assert (api.get(CORE, "pods", "p", "team")["spec"]["priority"], api.get(CORE, "pods", "p", "team")["spec"][
        "preemptionPolicy"]) == (10000, "PreemptLowerPriority")
    status = _refused(lambda: core.create_namespaced_pod("team", _pod("q", priorityClassName="urgent"),
                                                         _preload_content=False), 403)
    assert status["message"] == 'pods "q" is forbidden: no PriorityClass with name urgent was found'
    core.create_namespaced_pod("team", _pod("r"), _preload_content=False)
    assert api.get(CORE, "pods", "r", "team")["spec"]["priority"] == 0


def test_binding_refuses_gated_and_bound_pods(api, core):
    core.create_namespaced_pod("team", _pod("p"), _preload_content=False)
    status = _refused(lambda: _bind(core, "p", "gpu-01"), 409)
    assert status["message"] == 'Operation cannot be fulfilled on pods/binding "p": pod p has non-empty .spec.schedulingGates'
    _patch(core, "p", {"spec": {"schedulingGates": None}})
    assert _bind(core, "p", "gpu-01").status == 201
    pod = api.get(CORE, "pods", "p", "team")
    assert pod["spec"]["nodeName"] == "gpu-01"
    assert {"type": "PodScheduled", "status": "True"}.items() <= pod["status"]["conditions"][0].items()
    assert "already assigned to node" in _refused(lambda: _bind(core, "p", "gpu-02"), 409)["message"]
    _refused(lambda: _bind(core, "nobody", "gpu-02"), 404)


def test_create_rules(api, core):
    status = _refused(lambda: core.create_namespaced_pod("team", _pod("p", nodeName="gpu-01"), _preload_content=False), 422)
    assert "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared" in status["message"]
    status = _refused(lambda: core.create_namespaced_pod("team", _pod("q", gates=("a", "a")), _preload_content=False), 422)
    assert 'spec.schedulingGates[1].name: Duplicate value: "a"' in status["message"]
    core.create_namespaced_pod("team", _pod("r", gates=(), nodeName="gpu-01"), _preload_content=False)
    assert api.get(CORE, "pods", "r", "team")["metadata"]["creationTimestamp"]
    _refused(lambda: core.create_namespaced_pod("team", _pod("Bad_Name", gates=()), _preload_content=False), 422)


def test_job_create_rules(api):
    manifest = job_manifest("train", "team")
    del manifest["spec"]["template"]["spec"]["restartPolicy"]  # Always, the pod default, is not a Job's
    status, answer = submit(api, manifest)
    assert (status, answer["message"]) == (422, 'Job.batch "train" is invalid: spec.template.spec.restartPolicy: '
                                                 'Required value: valid values: "OnFailure", "Never"')
    status, answer = submit(api, job_manifest("x" * 64, "team"))
    assert status == 422 and "must be no more than 63 characters" in answer["message"]
    assert submit(api, job_manifest("train", "team"))[0] == 201


# -- the mutating webhook over TLS ----------------------------------------------------------------
def _certificates(tmp_path, names: list[str]) -> tuple[bytes, str, str]:
    """A CA (PEM) and a serving certificate + key (file paths) for ``names`` (DNS names or IPs)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
          .not_valid_after(now + dt.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    alt = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False).sign(ca_key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca.public_bytes(serialization.Encoding.PEM), str(cert_path), str(key_path)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a caller that timed out and left
        pass


class GateWebhook:
    """A small admission webhook: adds gpuwarden's gate with a JSONPatch, or denies, or hangs."""

    def __init__(self, cert: str, key: str, mode: str = "gate"):
        self.mode, self.reviews = mode, []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.reviews.append((self.path, review))
                if hook.mode == "hang":
                    time.sleep(2.5)
                request = review["request"]
                gates = request["object"]["spec"].get("schedulingGates")
                patch = [{"op": "add", "path": "/spec/schedulingGates/-" if gates else "/spec/schedulingGates",
                          "value": {"name": ADMISSION_GATE} if gates else [{"name": ADMISSION_GATE}]}]
                response = {"uid": request["uid"], "allowed": hook.mode != "deny"}
                if hook.mode == "deny":
                    response["status"] = {"code": 403, "message": "team quota is closed"}
                elif hook.mode == "gate":
                    response |= {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}
                data = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": response}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tls(tmp_path):
    return _certificates(tmp_path, ["gpuwarden-webhook.gpuwarden-system.svc", "127.0.0.1"])


@pytest.fixture
def webhook(tls):
    hook = GateWebhook(tls[1], tls[2])
    yield hook
    hook.stop()


QUEUED = {"matchExpressions": [{"key": "gpuwarden.io/queue", "operator": "Exists"}]}


def test_webhook_gates_pods_in_queue_namespaces_over_tls(api, core, tls, webhook):
    namespace(api, "research", {"gpuwarden.io/queue": "research"})
    namespace(api, "other", {})
    api.webhook_services[WEBHOOK_SERVICE[:2]] = webhook.url
    mutating_webhook(api, "gpuwarden-admission", tls[0], service=WEBHOOK_SERVICE, namespace_selector=QUEUED)
    core.create_namespaced_pod("research", _pod("p", gates=("kueue.x-k8s.io/other",)), _preload_content=False)
    core.create_namespaced_pod("other", _pod("q", gates=()), _preload_content=False)
    assert api.get(CORE, "pods", "p", "research")["spec"]["schedulingGates"] == [
        {"name": "kueue.x-k8s.io/other"}, {"name": ADMISSION_GATE}]
    assert not api.get(CORE, "pods", "q", "other")["spec"].get("schedulingGates")  # not selected: not called
    assert [(c.webhook, c.outcome) for c in api.webhook_calls] == [("gpuwarden-admission.gpuwarden.io", "patched")]
    path, review = webhook.reviews[0]
    assert path == "/mutate-pods?timeout=10s"
    request = review["request"]
    assert (review["apiVersion"], review["kind"], request["operation"], request["namespace"]) == (
        "admission.k8s.io/v1", "AdmissionReview", "CREATE", "research")
    assert request["object"]["metadata"]["name"] == "p" and request["kind"]["kind"] == "Pod"


def test_webhook_by_url_and_object_selector(api, core, tls, webhook):
    mutating_webhook(api, "by-url", tls[0], url=f"{webhook.url}/mutate",
                     object_selector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]})
    core.create_namespaced_pod("team", _pod("p", gates=()), _preload_content=False)
    skipped = _pod("q", gates=())
    skipped["metadata"]["labels"] = {"skip": "yes"}
    core.create_namespaced_pod("team", skipped, _preload_content=False)
    assert api.get(CORE, "pods", "p", "team")["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]
    assert not api.get(CORE, "pods", "q", "team")["spec"].get("schedulingGates")


@pytest.mark.parametrize("policy, created", [("Ignore", True), ("Fail", False)])
def test_a_failed_call_follows_the_failure_policy(api, core, tmp_path, tls, webhook, policy, created):
    """A certificate the caBundle does not sign is a TLS failure: Fail refuses the pod, Ignore creates it unchanged."""
    (tmp_path / "other").mkdir()
    other_ca, _, _ = _certificates(tmp_path / "other", ["elsewhere"])
    api.webhook_services[WEBHOOK_SERVICE[:2]] = webhook.url
    mutating_webhook(api, "wrong-ca", other_ca, service=WEBHOOK_SERVICE, failure_policy=policy)
    create = lambda: core.create_namespaced_pod("team", _pod("p", gates=()), _preload_content=False)  # noqa: E731
    if created:
        create()
        assert not api.get(CORE, "pods", "p", "team")["spec"].get("schedulingGates")
    else:
        status = _refused(create, 500)
        assert status["message"].startswith('Internal error occurred: failed calling webhook "wrong-ca.gpuwarden.io": '
                                            'failed to call webhook: Post "https://gpuwarden-webhook.gpuwarden-system.svc:443')
        assert api.get(CORE, "pods", "p", "team") is None
    assert not webhook.reviews  # the handshake failed before any request
    assert [c.outcome for c in api.webhook_calls] == ["failed-open" if created else "failed-closed"]
    assert "certificate verify failed" in api.webhook_calls[0].error


def test_the_certificate_must_name_the_service(api, core, tmp_path):
    """The API server dials NAME.NAMESPACE.svc: a certificate for another name fails, even from the right CA."""
    ca, cert, key = _certificates(tmp_path, ["127.0.0.1"])
    hook = GateWebhook(cert, key)
    try:
        api.webhook_services[WEBHOOK_SERVICE[:2]] = hook.url
        mutating_webhook(api, "wrong-name", ca, service=WEBHOOK_SERVICE, failure_policy="Fail")
        _refused(lambda: core.create_namespaced_pod("team", _pod("p", gates=()), _preload_content=False), 500)
        api.store.clear()
        mutating_webhook(api, "right-name", ca, url=f"{hook.url}/mutate", failure_policy="Fail")
        core.create_namespaced_pod("team", _pod("p", gates=()), _preload_content=False)
    finally:
        hook.stop()


def test_a_rotated_ca_bundle_is_used_from_the_next_create(api, core, tmp_path, tls, webhook):
    """What gpuwarden does without cert-manager: its CA in a Secret, the webhook's caBundle patched to it."""
    (tmp_path / "old").mkdir()
    old_ca, _, _ = _certificates(tmp_path / "old", ["elsewhere"])
    mutating_webhook(api, "gpuwarden-admission", old_ca, url=f"{webhook.url}/mutate", failure_policy="Fail")
    _refused(lambda: core.create_namespaced_pod("team", _pod("p", gates=()), _preload_content=False), 500)
    configuration = client.Configuration()
    configuration.host = api.url
    with client.ApiClient(configuration) as api_client:
        client.CoreV1Api(api_client).create_namespaced_secret("gpuwarden", {
            "metadata": {"name": "gpuwarden-webhook-tls"}, "type": "kubernetes.io/tls",
            "data": {"ca.crt": base64.b64encode(tls[0]).decode()}}, _preload_content=False)
        stored = api.get(ADMISSION, "mutatingwebhookconfigurations", "gpuwarden-admission")
        stored["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(tls[0]).decode()
        client.AdmissionregistrationV1Api(api_client).patch_mutating_webhook_configuration(
            "gpuwarden-admission", {"webhooks": stored["webhooks"]}, _content_type=MERGE, _preload_content=False)
    core.create_namespaced_pod("team", _pod("p", gates=()), _preload_content=False)
    assert api.get(CORE, "pods", "p", "team")["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]


def test_timeout_and_denial(api, core, tls, webhook):
    mutating_webhook(api, "slow", tls[0], url=f"{webhook.url}/mutate", failure_policy="Ignore", timeout_seconds=1)
    webhook.mode = "hang"
    started = time.monotonic()
    core.create_namespaced_pod("team", _pod("p", gates=()), _preload_content=False)
    assert time.monotonic() - started < 2.4  # timeoutSeconds honoured, then Ignore lets it through
    assert api.webhook_calls[-1].outcome == "failed-open" and "timed out" in api.webhook_calls[-1].error
    webhook.mode = "deny"
    status = _refused(lambda: core.create_namespaced_pod("team", _pod("q", gates=()), _preload_content=False), 403)
    assert status["message"] == 'admission webhook "slow.gpuwarden.io" denied the request: team quota is closed'


# -- kube-scheduler stand-in ----------------------------------------------------------------------
def _gpu_pods(api, core):
    node(api, "gpu-01", 8)
    node(api, "gpu-02", 8, taints=[{"key": "maintenance", "value": "true", "effect": "NoSchedule"}])
    node(api, "gpu-03", 8, unschedulable=True)
    core.create_namespaced_pod("team", _pod("gated", gpus=1), _preload_content=False)
    core.create_namespaced_pod("team", _pod("fits", gates=(), gpus=4), _preload_content=False)
    core.create_namespaced_pod("team", _pod("too-big", gates=(), gpus=8), _preload_content=False)
    core.create_namespaced_pod("team", _pod("elsewhere", gates=(), gpus=1, affinity=_required(_on_node("gpu-02"))),
                               _preload_content=False)


def test_scheduler_binds_only_ungated_pods_that_fit(api, core):
    _gpu_pods(api, core)
    result = FakeKubeScheduler(api).step()
    assert result.bound == [("team/fits", "gpu-01")]
    assert result.unschedulable == {
        "team/too-big": "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
                        "{maintenance: true}, 1 node(s) were unschedulable.",
        "team/elsewhere": "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had "
                          "untolerated taint {maintenance: true}, 1 node(s) were unschedulable."}
    fits = api.get(CORE, "pods", "fits", "team")
    assert (fits["spec"]["nodeName"], fits["status"]["phase"]) == ("gpu-01", "Running") and fits["status"]["startTime"]
    gated = api.get(CORE, "pods", "gated", "team")
    assert "nodeName" not in gated["spec"]
    assert gated["status"]["conditions"][0]["reason"] == "SchedulingGated"
    too_big = api.get(CORE, "pods", "too-big", "team")["status"]["conditions"][0]
    assert (too_big["status"], too_big["reason"]) == ("False", "Unschedulable")
    events = sorted((e["involvedObject"]["name"], e["reason"], e["type"]) for e in api.objects(CORE, "events"))
    assert events == [("elsewhere", "FailedScheduling", "Warning"), ("fits", "Scheduled", "Normal"),
                      ("too-big", "FailedScheduling", "Warning")]
    FakeKubeScheduler(api).step()
    assert len(api.objects(CORE, "events")) == 3  # the same message is not repeated
    assert api.calls("POST", "binding$", user="system:kube-scheduler")  # it went through the API


def test_scheduler_leaves_pods_of_another_scheduler(api, core):
    node(api, "gpu-01", 8)
    core.create_namespaced_pod("team", _pod("mine", gates=(), schedulerName="default-scheduler"), _preload_content=False)
    core.create_namespaced_pod("team", _pod("theirs", gates=(), schedulerName="volcano"), _preload_content=False)
    assert FakeKubeScheduler(api).step().bound == [("team/mine", "gpu-01")]
    assert "nodeName" not in api.get(CORE, "pods", "theirs", "team")["spec"]


def test_scheduler_tolerations_mig_and_freed_capacity(api, core):
    _gpu_pods(api, core)
    mig = _pod("mig", gates=(), gpus=0)
    mig["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    core.create_namespaced_pod("team", mig, _preload_content=False)
    scheduler = FakeKubeScheduler(api)
    scheduler.step()
    assert "Insufficient nvidia.com/mig-1g.10gb" in api.get(CORE, "pods", "mig", "team")["status"]["conditions"][0]["message"]
    core.patch_namespaced_pod("elsewhere", "team", {"spec": {"tolerations": [
        {"key": "maintenance", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]}},
        _content_type=MERGE, _preload_content=False)
    core.delete_namespaced_pod("fits", "team", _preload_content=False)
    bound = dict(scheduler.step().bound)
    assert bound == {"team/too-big": "gpu-01", "team/elsewhere": "gpu-02"}  # fits' 4 GPUs were freed


def test_scheduler_preempts_lower_priority_pods_as_kube_scheduler_does(api, core):
    api.graceful_deletion = True
    node(api, "gpu-01", 8)
    priority_class(api, "low", 100)
    priority_class(api, "high", 10000)
    core.create_namespaced_pod("team", _pod("low", gates=(), gpus=8, priorityClassName="low"), _preload_content=False)
    scheduler = FakeKubeScheduler(api)
    assert scheduler.step().bound == [("team/low", "gpu-01")]
    priority_class(api, "high-polite", 10000, "Never")
    status = _refused(lambda: core.create_namespaced_pod("team", _pod("polite", gates=(), gpus=8, priorityClassName="high",
                                                                      preemptionPolicy="Never"), _preload_content=False), 403)
    assert "the string value of PreemptionPolicy (Never) must not be provided in pod spec" in status["message"]
    core.create_namespaced_pod("team", _pod("polite", gates=(), gpus=8, priorityClassName="high-polite"),
                               _preload_content=False)
    assert scheduler.step().preempted == []  # its class says Never
    core.delete_namespaced_pod("polite", "team", _preload_content=False)
    core.create_namespaced_pod("team", _pod("high", gates=(), gpus=8, priorityClassName="high"), _preload_content=False)
    result = scheduler.step()
    assert result.preempted == [("team/low", "team/high")] and result.bound == []
    low = api.get(CORE, "pods", "low", "team")
    assert low["metadata"]["deletionTimestamp"] and low["metadata"]["deletionGracePeriodSeconds"] == 30
    assert any(c["type"] == "DisruptionTarget" for c in low["status"]["conditions"])
    assert api.get(CORE, "pods", "high", "team")["status"]["nominatedNodeName"] == "gpu-01"
    node(api, "gpu-02", 8)
    core.create_namespaced_pod("team", _pod("low-2", gates=(), gpus=8, priorityClassName="low", nodeName="gpu-02"),
                               _preload_content=False)
    again = scheduler.step()
    assert again.bound == [] and again.preempted == []  # the victim holds its GPUs for its grace period; no more victims
    api.clock = lambda: time.time() + 31
    assert scheduler.step().bound == [("team/high", "gpu-01")]
    assert api.get(CORE, "pods", "low", "team") is None
    assert sorted(e["reason"] for e in api.objects(CORE, "events") if e["involvedObject"]["name"] == "low") == [
        "Preempted", "Scheduled"]


# -- Job controller stand-in ----------------------------------------------------------------------
def test_job_controller_creates_pods_through_the_webhook_and_deletes_on_suspend(api, tls, webhook):
    cluster = FakeCluster(api)
    namespace(api, "research", {"gpuwarden.io/queue": "research"})
    node(api, "gpu-01", 8)
    priority_class(api, "normal", 1000)
    api.webhook_services[WEBHOOK_SERVICE[:2]] = webhook.url
    mutating_webhook(api, "gpuwarden-admission", tls[0], service=WEBHOOK_SERVICE, namespace_selector=QUEUED)
    assert submit(api, job_manifest("train", "research", count=2, parallelism=2, gated=False, run_seconds=600))[0] == 201
    assert cluster.step().bound == []
    pods = api.objects(CORE, "pods")
    assert [p["metadata"]["generateName"] for p in pods] == ["train-0-", "train-1-"]  # Indexed: one pod per index
    assert all(p["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}] for p in pods)  # the webhook's
    assert all(p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "train" for p in pods)
    assert all(p["metadata"]["ownerReferences"][0]["controller"] for p in pods)
    assert len(api.webhook_calls) == 2
    job = api.get(BATCH, "jobs", "train", "research")
    assert job["status"]["active"] == 2 and job["status"]["startTime"] == "2026-12-01T08:00:00Z"
    api.handle("PATCH", "/apis/batch/v1/namespaces/research/jobs/train", MERGE, b'{"spec": {"suspend": true}}')
    cluster.step(60)  # gated pods were never bound: deleted at once
    assert api.objects(CORE, "pods") == []
    job = api.get(BATCH, "jobs", "train", "research")
    assert "startTime" not in job["status"] and job["status"]["active"] == 0
    assert any(c["type"] == "Suspended" and c["status"] == "True" for c in job["status"]["conditions"])


def test_a_suspended_jobs_running_pods_terminate_with_grace_before_start_time_is_cleared(api):
    cluster = FakeCluster(api)
    node(api, "gpu-01", 8)
    priority_class(api, "normal", 1000)
    submit(api, job_manifest("train", "team", count=8, gated=False, grace_seconds=120))
    assert cluster.step().bound
    api.handle("PATCH", "/apis/batch/v1/namespaces/team/jobs/train", MERGE, b'{"spec": {"suspend": true}}')
    cluster.step(10)
    (pod,) = api.objects(CORE, "pods")
    assert pod["metadata"]["deletionTimestamp"] == "2026-12-01T08:02:10Z"
    assert api.get(BATCH, "jobs", "train", "team")["status"]["startTime"]  # its pod is still terminating
    cluster.step(120)
    cluster.step(1)
    assert api.objects(CORE, "pods") == [] and "startTime" not in api.get(BATCH, "jobs", "train", "team")["status"]


def test_job_controller_completes_pods_and_jobs_on_its_clock(api):
    cluster = FakeCluster(api)
    node(api, "gpu-01", 8)
    priority_class(api, "normal", 1000)
    submit(api, job_manifest("train", "team", count=4, parallelism=2, gated=False, run_seconds=600))
    assert sorted(n for _, n in cluster.step().bound) == ["gpu-01", "gpu-01"]
    cluster.step(599)
    assert {p["status"]["phase"] for p in api.objects(CORE, "pods")} == {"Running"}
    cluster.step(1)
    assert {p["status"]["phase"] for p in api.objects(CORE, "pods")} == {"Succeeded"}
    cluster.step(1)
    job = api.get(BATCH, "jobs", "train", "team")
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in job["status"]["conditions"])
    assert len(api.objects(CORE, "pods")) == 2  # no replacement for succeeded pods


def test_evicted_pods_are_replaced_and_jobsets_make_child_jobs(api):
    priority_class(api, "normal", 1000)
    api.resources.add((JOBSET, "jobsets"))
    api.add(JOBSET, "jobsets", {"metadata": {"name": "js", "namespace": "team"}, "spec": {"replicatedJobs": [
        {"name": "workers", "replicas": 2, "template": job_manifest("x", "team", parallelism=1, gated=True)}]}})
    FakeJobSetController(api).step(0)
    jobs = FakeJobController(api)
    jobs.step(0)
    assert [j["metadata"]["name"] for j in api.objects(BATCH, "jobs")] == ["js-workers-0", "js-workers-1"]
    pods = api.objects(CORE, "pods")
    assert len(pods) == 2 and all(p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] == "js" for p in pods)
    api.handle("POST", f"/api/v1/namespaces/team/pods/{pods[0]['metadata']['name']}/eviction", "application/json", b"{}")
    jobs.step(1)
    assert len(api.objects(CORE, "pods")) == 2


# -- the scenario ---------------------------------------------------------------------------------
def test_scenario_is_the_issues_mix_and_deterministic():
    scenario = build(seed=7)
    assert scenario.pods == 200
    assert [j.manifest for j in scenario.jobs] == [j.manifest for j in build(seed=7).jobs]
    assert [j.manifest for j in scenario.jobs] != [j.manifest for j in build(seed=8).jobs]
    gangs = [j for j in scenario.jobs if j.manifest["spec"]["parallelism"] == 4]
    assert len(gangs) == 5
    resources = {next(iter(j.manifest["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]))
                 for j in scenario.jobs}
    assert {"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"} <= resources
    assert all(j.manifest["spec"]["template"]["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]
               for j in scenario.jobs)
    assert {j.manifest["spec"]["template"]["spec"]["priorityClassName"] for j in scenario.jobs} == {"low", "normal", "high"}
    assert any(j.manifest["metadata"]["annotations"].get("gpuwarden.io/checkpointable") == "true" for j in scenario.jobs)


def test_scenario_runs_on_the_fake_and_nothing_binds_while_gated(api):
    """Without gpuwarden's scheduler every pod waits behind its gate; admitting one by hand (affinity + ungate in
    one PATCH, as the contract says) lets kube-scheduler bind it, on that node only."""
    install_cluster(api)
    cluster, scenario = FakeCluster(api), build(seed=1)
    submit_due(api, scenario, cluster.clock.now + 3600)
    assert cluster.step().bound == [] and len(api.objects(CORE, "pods")) == 200
    assert len(api.objects(CORE, "nodes")) == 8
    gang = next(j for j in scenario.jobs if j.manifest["spec"]["parallelism"] == 4)
    ns = gang.manifest["metadata"]["namespace"]
    mine = [p for p in api.objects(CORE, "pods") if p["metadata"]["labels"]["batch.kubernetes.io/job-name"]
            == gang.manifest["metadata"]["name"]]
    for pod, target in zip(mine, ["gpu-00", "gpu-01", "gpu-02", "gpu-03"]):
        body = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
                "spec": {"schedulingGates": [], "affinity": _required(_on_node(target))}}
        assert api.handle("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}", MERGE,
                          json.dumps(body).encode())[0] == 200
    bound = cluster.step(10).bound
    assert sorted(bound) == sorted((f"{ns}/{p['metadata']['name']}", t) for p, t in
                                   zip(mine, ["gpu-00", "gpu-01", "gpu-02", "gpu-03"]))


def test_without_gates_kube_scheduler_alone_runs_the_mix_to_completion_without_overcommitting(api):
    """The fake as a whole: every Job completes, no node ever holds more than its allocatable, MIG and shared
    pods land only where their resource exists, and contention shows as FailedScheduling, never as a lost pod."""
    install_cluster(api)
    cluster, scenario = FakeCluster(api), build(seed=5, gated=False, gangs=2, mig_pods=10, shared_pods=8, single_jobs=30)
    allocatable = {n["metadata"]["name"]: {k: Decimal(parse_quantity(v)) for k, v in n["status"]["allocatable"].items()}
                   for n in api.objects(CORE, "nodes")}
    placed: dict[str, str] = {}
    preempted = []
    for _ in range(80):
        submit_due(api, scenario, cluster.clock.now)
        result = cluster.step(600)
        placed.update(result.bound)
        preempted += result.preempted
        used: dict[str, dict[str, Decimal]] = {}
        for pod in api.objects(CORE, "pods"):
            where = pod["spec"].get("nodeName")
            if where and pod["status"].get("phase") not in ("Succeeded", "Failed"):
                for k, v in pod_requests(pod).items():
                    used.setdefault(where, {})[k] = used.setdefault(where, {}).get(k, Decimal(0)) + v
        assert all(v <= allocatable[n].get(k, Decimal(0)) for n, u in used.items() for k, v in u.items())
        if len(scenario.submitted) == len(scenario.jobs) and all(
                any(c["type"] == "Complete" for c in j["status"].get("conditions", ())) for j in api.objects(BATCH, "jobs")):
            break
    else:
        pytest.fail("the mix did not complete in 80 steps of 10 minutes")
    assert len(placed) == scenario.pods + len(preempted)  # a preempted pod's Job replaced it
    assert scenario.pods == 2 * 4 + 10 + 8 + 30
    for key, where in placed.items():
        if key.split("/")[1].startswith("mig-"):
            assert where in ("gpu-06", "gpu-07")
        elif key.split("/")[1].startswith("shared-"):
            assert where == "gpu-05"
        else:
            assert where in {f"gpu-0{i}" for i in range(5)}
    assert any(e["reason"] == "FailedScheduling" for e in api.objects(CORE, "events"))


def test_the_rack_repeats_for_a_bench(api):
    install_cluster(api, racks=2)
    nodes = api.objects(CORE, "nodes")
    assert [n["metadata"]["name"] for n in nodes] == [f"gpu-{i:02d}" for i in range(16)]
    leaves = {n["metadata"]["labels"]["gpuwarden.io/leaf-switch"] for n in nodes}
    assert leaves == {"leaf-a", "leaf-b", "leaf-1-a", "leaf-1-b"}
    assert [n["metadata"]["name"] for n in nodes if "nvidia.com/mig.config" in n["metadata"]["labels"]] == [
        "gpu-06", "gpu-07", "gpu-14", "gpu-15"]
    assert api.get(CORE, "namespaces", "research")["metadata"]["annotations"]["gpuwarden.io/guaranteed-gpus"] == "32"


def _admit(api, pod: dict, target: str) -> None:
    """What gpuwarden's BIND does to one pod (contract): one merge PATCH, required node affinity + gate removed."""
    meta = pod["metadata"]
    body = {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {"gpuwarden.io/admitted-node": target}},
            "spec": {"schedulingGates": [g for g in pod["spec"]["schedulingGates"] if g["name"] != ADMISSION_GATE],
                     "affinity": _required(_on_node(target))}}
    status, answer = api.handle("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", MERGE,
                                json.dumps(body).encode())
    assert status == 200, answer


def _pods_of(api, job: str) -> list[dict]:
    return [p for p in api.objects(CORE, "pods") if p["metadata"]["labels"].get("batch.kubernetes.io/job-name") == job]


def test_the_issues_preemption_cycle_can_be_driven_through_the_fake(api):
    """The steps gpuwarden's loop will take, by hand: a high-priority job arrives into a full cluster, a checkpointable
    borrower is suspended, its pods hold their GPUs for their grace period, the arrival is admitted and bound once
    they are gone (kube-scheduler never preempts on its own), and the borrower resumes with gated pods."""
    install_cluster(api)
    cluster = FakeCluster(api)
    submit(api, job_manifest("borrower", "nlp", count=8, parallelism=4, priority="low", checkpointable=True,
                             run_seconds=86400, grace_seconds=60))
    cluster.step()
    for pod, target in zip(_pods_of(api, "borrower"), ["gpu-00", "gpu-01", "gpu-02", "gpu-03"]):
        _admit(api, pod, target)
    assert len(cluster.step(1).bound) == 4
    submit(api, job_manifest("urgent", "research", count=8, priority="high"))
    cluster.step(1)
    api.handle("PATCH", "/apis/batch/v1/namespaces/nlp/jobs/borrower", MERGE,
               json.dumps({"metadata": {"annotations": {"gpuwarden.io/suspended-by": "scheduler"}},
                           "spec": {"suspend": True}}).encode())
    (urgent,) = _pods_of(api, "urgent")
    _admit(api, urgent, "gpu-00")
    result = cluster.step(1)  # the Job controller deletes the borrower's pods: they terminate for 60 s
    assert result.bound == [] and "Insufficient nvidia.com/gpu" in result.unschedulable[f"research/{urgent['metadata']['name']}"]
    assert result.preempted == []  # the victims are already terminating
    assert api.get(BATCH, "jobs", "borrower", "nlp")["status"]["startTime"]
    assert cluster.step(30).bound == []
    assert cluster.step(30).bound == [(f"research/{urgent['metadata']['name']}", "gpu-00")]
    cluster.step(1)
    borrower = api.get(BATCH, "jobs", "borrower", "nlp")
    assert "startTime" not in borrower["status"] and _pods_of(api, "borrower") == []
    api.handle("PATCH", "/apis/batch/v1/namespaces/nlp/jobs/borrower", MERGE,
               json.dumps({"metadata": {"annotations": {"gpuwarden.io/suspended-by": None}},
                           "spec": {"suspend": False}}).encode())
    cluster.step(1)
    pods = _pods_of(api, "borrower")
    assert len(pods) == 4 and all(p["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}] for p in pods)
    assert not [e for e in api.objects(CORE, "events") if e["reason"] == "Preempted"]


def test_an_admitted_pod_that_does_not_fit_its_node_stays_pending_with_kube_schedulers_reason(api):
    """The contract's 'admitted but not bound': pinned to a full (or MIG) node it stays Pending, with the message
    a real kube-scheduler writes, until the capacity is there."""
    install_cluster(api)
    cluster = FakeCluster(api)
    submit(api, job_manifest("first", "research", count=8))
    submit(api, job_manifest("second", "research", count=1))
    submit(api, job_manifest("on-mig", "vision", count=1))
    cluster.step()
    _admit(api, _pods_of(api, "first")[0], "gpu-00")
    _admit(api, _pods_of(api, "second")[0], "gpu-00")
    _admit(api, _pods_of(api, "on-mig")[0], "gpu-06")
    result = cluster.step(1)
    assert [n for _, n in result.bound] == ["gpu-00"]
    second, on_mig = (f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in
                      (_pods_of(api, "second")[0], _pods_of(api, "on-mig")[0]))
    assert result.unschedulable == {
        second: "0/8 nodes are available: 1 Insufficient nvidia.com/gpu, 7 node(s) didn't match Pod's node affinity/selector.",
        on_mig: "0/8 nodes are available: 1 Insufficient nvidia.com/gpu, 7 node(s) didn't match Pod's node affinity/selector."}
    pod = api.get(CORE, "pods", second.split("/")[1], "research")
    assert pod["status"]["phase"] == "Pending" and pod["status"]["conditions"][-1]["reason"] == "Unschedulable"
    assert pod["metadata"]["annotations"]["gpuwarden.io/admitted-node"] == "gpu-00"
