"""The admission webhook (``kube/webhook.py``) and its self-managed certificates
(``kube/certs.py``).

- the decision on AdmissionReview v1 JSON shaped as the API server sends it: a GPU pod is gated by a
  base64 JSONPatch; already gated, Kueue's, no GPU, DaemonSet, static and bound pods are left
  alone; garbage is answered allowed and unchanged (never an error to the API server), ``uid`` echoed;
- the HTTPS server end to end with ``urllib`` trusting the generated CA: the patch applied to the
  pod gives the gate, the body bound, and a rotated certificate served without a restart;
- the certificates against ``tests/fake_kube_api.py`` (the official client over HTTP): created into a
  Secret and the webhook configuration's caBundle, left alone when current, rotated near expiry
  (the CA with overlap), and two replicas racing end with one Secret both agree on.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import logging
import ssl
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from fake_kube_api import CORE, FakeKubeAPI
from polling import tick, wait_for

from gpuwarden.kube.api import KubeApi, load_client
from gpuwarden.kube.certs import CA_CERT, CertPolicy, WebhookCertificates, plan_rotation, write_cert_files
from gpuwarden.kube.gates import ADMISSION_GATE, gated_by_gpuwarden
from gpuwarden.kube.webhook import (CERT_FILE, WebhookCertificateError, WebhookService, admission_response,
                                    serve_webhook)
from gpuwarden.fleet.clock import FakeClock

ADMISSION = "apis/admissionregistration.k8s.io/v1"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = CertPolicy("gw-scheduler", "gpuwarden", extra_dns_names=("localhost",))


def pod(resources=None, gates=None, labels=None, owner=None, init_resources=None, **spec_fields) -> dict:
    container = {"name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                 "resources": resources if resources is not None else {"limits": {"nvidia.com/gpu": "8"}}}
    spec = {"containers": [container], **spec_fields}
    if init_resources is not None:
        spec["initContainers"] = [{"name": "init", "image": "busybox", "resources": init_resources}]
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    meta = {"generateName": "train-", "namespace": "research", "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "x", "uid": "u", "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def review(obj, uid="705ab4f5-6393-11e8-b7cc-42010a800002", operation="CREATE", kind="Pod") -> dict:
    """An AdmissionReview v1 as kube-apiserver sends it (the fields of its documentation's example)."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "research", "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:job-controller", "groups": ["system:serviceaccounts"]},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def apply_json_patch(obj: dict, patch: list[dict]) -> dict:
    """RFC 6902 "add" as the API server applies it (the only op the webhook sends)."""
    obj = copy.deepcopy(obj)
    for op in patch:
        assert op["op"] == "add", op
        *parents, last = op["path"].strip("/").split("/")
        node = obj
        for part in parents:
            node = node[part]
        if last == "-":
            node.append(op["value"])
        else:
            assert last not in node, f"add over an existing {op['path']}"
            node[last] = op["value"]
    return obj


def patched(response: dict, obj: dict) -> dict:
    answer = response["response"]
    if "patch" not in answer:
        return obj
    assert answer["patchType"] == "JSONPatch"
    return apply_json_patch(obj, json.loads(base64.b64decode(answer["patch"])))


# -- the decision ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("obj", [
    pod(),
    pod({"requests": {"nvidia.com/mig-1g.10gb": 1}, "limits": {"nvidia.com/mig-1g.10gb": 1}}),
    pod({"limits": {"nvidia.com/gpu.shared": "1"}}),
    pod({"requests": {"cpu": "1"}}, init_resources={"limits": {"nvidia.com/gpu": 1}}),
    pod(gates=["example.com/quota"]),
], ids=["whole-gpus", "mig", "time-sliced", "init-container", "other-gate-kept"])
def test_a_gpu_pod_is_created_behind_the_gate(obj):
    response = admission_response(review(obj))
    assert response["apiVersion"] == "admission.k8s.io/v1" and response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["response"]["allowed"] is True
    after = patched(response, obj)
    assert gated_by_gpuwarden(after)
    before_gates = [g["name"] for g in obj["spec"].get("schedulingGates", [])]
    assert [g["name"] for g in after["spec"]["schedulingGates"]] == before_gates + [ADMISSION_GATE]
    assert {k: v for k, v in after["spec"].items() if k != "schedulingGates"} == \
        {k: v for k, v in obj["spec"].items() if k != "schedulingGates"}  # nothing else changed


@pytest.mark.parametrize("obj", [
    pod(gates=[ADMISSION_GATE]),
    pod(labels={"kueue.x-k8s.io/queue-name": "team-a"}),
    pod(gates=["kueue.x-k8s.io/admission"]),
    pod({"requests": {"cpu": "2", "memory": "4Gi"}}),
    pod({"limits": {"nvidia.com/gpu": "0"}}),
    pod(owner="DaemonSet"),
    pod(owner="Node"),
    pod(nodeName="gpu-node-1"),
    pod(schedulerName="volcano"),
], ids=["already-gated", "kueue-label", "kueue-gate", "no-gpu", "zero-gpus", "daemonset", "static", "bound",
        "other-scheduler"])
def test_pods_that_are_not_gpuwardens_pass_unchanged(obj):
    response = admission_response(review(obj))
    assert response["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_only_pod_creates_in_the_given_namespaces_are_gated():
    assert "patch" in admission_response(review(pod()), namespaces={"research"})["response"]
    assert "patch" not in admission_response(review(pod()), namespaces={"vision"})["response"]
    assert "patch" not in admission_response(review(pod(), operation="UPDATE"))["response"]
    assert "patch" not in admission_response(review(pod(), kind="Deployment"))["response"]


@pytest.mark.parametrize("body", [
    None, "not a review", [], {"request": "x"}, {"request": {"uid": 7}},
    review({"spec": {"containers": "nope"}}),
    review({"spec": {"containers": [{"resources": {"limits": ["nvidia.com/gpu"]}}]}}),
    review({"metadata": {"ownerReferences": "x"}, "spec": {}}),
], ids=["null", "string", "list", "request-string", "uid-number", "containers-string", "limits-list", "owners-string"])
def test_what_cannot_be_read_is_allowed_unchanged_and_logged(body, caplog):
    with caplog.at_level(logging.WARNING, "gpuwarden.kube.webhook"):
        response = admission_response(body)
    answer = response["response"]
    assert answer["allowed"] is True and "patch" not in answer
    uid = body.get("request", {}).get("uid") if isinstance(body, dict) and isinstance(body.get("request"), dict) else None
    assert answer["uid"] == (uid if isinstance(uid, str) else "")
    assert caplog.records, "an unreadable review leaves a warning line"


# -- the HTTPS server -----------------------------------------------------------------------------------

def _tls_client(ca_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca_pem.decode())


def _post(server, body: bytes, ca_pem: bytes, path: str = "/mutate-pods", timeout: float = 5.0):
    request = urllib.request.Request(f"https://localhost:{server.port}{path}", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, context=_tls_client(ca_pem), timeout=timeout) as answer:
        return answer.status, json.loads(answer.read())


@pytest.fixture
def certified(tmp_path):
    rotation = plan_rotation(None, POLICY, datetime.now(UTC))
    write_cert_files(rotation.data, tmp_path / "certs")
    return rotation.data, tmp_path / "certs"


@pytest.fixture
def server(certified):
    _, cert_dir = certified
    running = serve_webhook(cert_dir, port=0, host="127.0.0.1", max_body_bytes=64 * 1024, timeout_seconds=2.0,
                            reload_check_seconds=0.0)
    yield running
    running.stop()


def test_the_https_server_gates_a_pod_end_to_end(server, certified):
    data, _ = certified
    ca = base64.b64decode(data[CA_CERT])
    obj = pod()
    status, response = _post(server, json.dumps(review(obj)).encode(), ca)
    assert status == 200 and gated_by_gpuwarden(patched(response, obj))
    status, response = _post(server, b"{not json", ca)  # garbage: allowed, unchanged
    assert status == 200 and response["response"] == {"uid": "", "allowed": True}
    with urllib.request.urlopen(f"https://localhost:{server.port}/healthz", context=_tls_client(ca), timeout=5) as ok:
        assert ok.read() == b"ok"
    # A body over the bound is not read: allowed, unchanged from its Content-Length (issue 35).
    connection = http.client.HTTPSConnection("localhost", server.port, context=_tls_client(ca), timeout=5)
    connection.putrequest("POST", "/mutate-pods")
    connection.putheader("Content-Length", str(64 * 1024 + 1))
    connection.endheaders()
    too_big = connection.getresponse()
    assert too_big.status == 200 and json.loads(too_big.read())["response"] == {"uid": "", "allowed": True}
    connection.close()
    other_ca = base64.b64decode(plan_rotation(None, POLICY, datetime.now(UTC)).data[CA_CERT])
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _post(server, b"{}", other_ca)  # a client trusting another CA refuses it: TLS is real


def test_no_certificate_yet_refuses_to_start_until_one_is_written(tmp_path, certified):
    data, _ = certified
    empty = tmp_path / "not-yet"
    empty.mkdir()
    with pytest.raises(WebhookCertificateError, match="tls.crt: no such file"):  # issue 35: refused at start
        serve_webhook(empty, port=0, host="127.0.0.1", reload_check_seconds=0.0)
    write_cert_files(data, empty)  # what the scheduler does once the Secret holds a pair
    server = serve_webhook(empty, port=0, host="127.0.0.1", reload_check_seconds=0.0)
    try:
        status, _ = _post(server, json.dumps(review(pod())).encode(), base64.b64decode(data[CA_CERT]))
        assert status == 200
    finally:
        server.stop()


def test_a_silent_client_does_not_hold_the_server(server, certified):
    import socket

    data, _ = certified
    idle = socket.create_connection(("127.0.0.1", server.port))  # connects, never says hello
    try:
        status, _ = _post(server, json.dumps(review(pod())).encode(), base64.b64decode(data[CA_CERT]))
        assert status == 200
    finally:
        idle.close()


def test_a_rotated_certificate_is_served_without_a_restart(server, certified):
    data, cert_dir = certified
    old_ca = base64.b64decode(data[CA_CERT])
    assert _post(server, json.dumps(review(pod())).encode(), old_ca)[0] == 200
    loads = server.tls.loads
    rotation = plan_rotation(None, POLICY, datetime.now(UTC))  # a new CA and serving pair, as after expiry
    write_cert_files(rotation.data, cert_dir)
    new_ca = base64.b64decode(rotation.data[CA_CERT])
    status, _ = wait_for(lambda: _post(server, json.dumps(review(pod())).encode(), new_ca), 5.0,
                         "the new certificate to be served", tolerate_errors=True)
    assert status == 200 and server.tls.loads == loads + 1


# -- certificates in the cluster ------------------------------------------------------------------------

@pytest.fixture
def api():
    fake = FakeKubeAPI().start()
    fake.add(CORE, "secrets", {"metadata": {"name": "placeholder", "namespace": "other"}})
    fake.add(ADMISSION, "mutatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "gw-scheduler"},
        "webhooks": [{"name": "pods.gpuwarden.io", "failurePolicy": "Ignore", "sideEffects": "None",
                      "admissionReviewVersions": ["v1"],
                      "clientConfig": {"service": {"name": "gw-scheduler", "namespace": "gpuwarden",
                                                   "path": "/mutate-pods", "port": 443}}}]})
    yield fake
    fake.stop()


def manager(api, tmp_path, clock) -> WebhookCertificates:
    kube = KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json"), timeout_seconds=2.0), attempts=1)
    return WebhookCertificates(kube, POLICY, "gw-webhook-cert", "gw-scheduler", clock=clock)


def secret_data(api) -> dict:
    return api.get(CORE, "secrets", "gw-webhook-cert", "gpuwarden")["data"]


def ca_bundle(api) -> str:
    return api.get(ADMISSION, "mutatingwebhookconfigurations", "gw-scheduler")["webhooks"][0]["clientConfig"]["caBundle"]


def certs_in(data: dict, key: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(base64.b64decode(data[key]))


def test_certificates_are_created_injected_and_then_left_alone(api, tmp_path):
    clock = FakeClock(T0)
    result = manager(api, tmp_path, clock).ensure(tmp_path / "served")
    assert result.rotated == "no certificate yet" and result.ca_bundle_patched
    data = secret_data(api)
    assert api.get(CORE, "secrets", "gw-webhook-cert", "gpuwarden")["type"] == "kubernetes.io/tls"
    assert ca_bundle(api) == data[CA_CERT]
    (ca,) = certs_in(data, CA_CERT)
    (cert,) = certs_in(data, CERT_FILE)
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "gw-scheduler.gpuwarden.svc" in names
    assert (tmp_path / "served" / CERT_FILE).read_bytes() == base64.b64decode(data[CERT_FILE])
    writes = len(api.calls("POST")) + len(api.calls("PATCH"))
    clock.advance(timedelta(days=300).total_seconds())
    again = manager(api, tmp_path, clock).ensure()
    assert again.rotated is None and not again.ca_bundle_patched
    assert len(api.calls("POST")) + len(api.calls("PATCH")) == writes  # reads only
    assert secret_data(api) == data


def test_the_serving_certificate_rotates_before_expiry_under_the_same_ca(api, tmp_path):
    clock = FakeClock(T0)
    first = manager(api, tmp_path, clock).ensure().data
    clock.advance(timedelta(days=365 - 29).total_seconds())  # inside the 30-day window
    result = manager(api, tmp_path, clock).ensure()
    assert result.rotated and "expires" in result.rotated
    assert result.data[CA_CERT] == first[CA_CERT] and result.data[CERT_FILE] != first[CERT_FILE]
    assert not result.ca_bundle_patched  # same CA: the API server's trust is unchanged
    (patch,) = api.calls("PATCH", "/secrets/gw-webhook-cert$")
    assert patch.body["metadata"]["resourceVersion"]  # written with the version it read


def test_the_ca_rotates_with_overlap_until_the_old_one_expires(api, tmp_path):
    clock = FakeClock(T0)
    first = manager(api, tmp_path, clock).ensure().data
    (old_ca,) = certs_in(first, CA_CERT)
    clock.advance(timedelta(days=3650 - 89).total_seconds())  # inside the CA's 90-day window
    rotated = manager(api, tmp_path, clock).ensure()
    assert "CA expires" in rotated.rotated and rotated.ca_bundle_patched
    new_ca, kept = certs_in(rotated.data, CA_CERT)
    assert kept == old_ca and new_ca != old_ca  # both trusted while replicas switch
    (cert,) = certs_in(rotated.data, CERT_FILE)
    cert.verify_directly_issued_by(new_ca)
    assert ca_bundle(api) == rotated.data[CA_CERT]
    clock.advance(timedelta(days=90).total_seconds())  # the old CA has expired
    dropped = manager(api, tmp_path, clock).ensure()
    assert certs_in(dropped.data, CA_CERT) == [new_ca] and dropped.ca_bundle_patched
    assert dropped.data[CERT_FILE] == rotated.data[CERT_FILE]


def test_a_secret_holding_garbage_is_replaced(api, tmp_path):
    api.add(CORE, "secrets", {"metadata": {"name": "gw-webhook-cert", "namespace": "gpuwarden"},
                              "data": {CA_CERT: base64.b64encode(b"junk").decode()}})
    result = manager(api, tmp_path, FakeClock(T0)).ensure()
    assert "no usable certificate" in result.rotated and "missing" in result.rotated
    assert len(certs_in(secret_data(api), CA_CERT)) == 1


def test_two_replicas_racing_agree_on_one_certificate(api, tmp_path):
    clock = FakeClock(T0)
    a, b = manager(api, tmp_path, clock), manager(api, tmp_path, clock)
    first = a.ensure().data
    clock.advance(timedelta(days=340).total_seconds())
    # b read the Secret, then a wrote its rotation before b's write: b's write is a 409, b re-reads a's.
    real_read = b._read_secret
    reads = []

    def read_then_a_wins():
        current = real_read()
        if not reads:
            a.ensure()
        reads.append(current)
        return current

    b._read_secret = read_then_a_wins
    result = b.ensure()
    assert result.rotated is None  # it wrote nothing: a's certificate is current
    assert [r.path for r in api.calls("PATCH", "/secrets/")].count("/api/v1/namespaces/gpuwarden/secrets/gw-webhook-cert") == 2
    conflicts = [r for r in api.calls("PATCH", "/secrets/")]
    assert conflicts[0].body["metadata"]["resourceVersion"] == conflicts[1].body["metadata"]["resourceVersion"]
    assert result.data == secret_data(api) != first
    assert ca_bundle(api) == result.data[CA_CERT]


def test_a_missing_webhook_configuration_is_reported_not_fatal(api, tmp_path, caplog):
    api.store[(ADMISSION, "mutatingwebhookconfigurations")].clear()
    with caplog.at_level(logging.WARNING, "gpuwarden.kube.certs"):
        result = manager(api, tmp_path, FakeClock(T0)).ensure()
    assert result.rotated and not result.ca_bundle_patched
    assert "not found" in caplog.text


def test_the_service_writes_its_pair_before_serving_and_refreshes_it_on_the_clock(api, tmp_path, caplog):
    clock = FakeClock(datetime.now(UTC))  # the served certificate must be valid for urllib now
    certificates = manager(api, tmp_path, clock)
    service = WebhookService(tmp_path / "served", port=0, host="127.0.0.1", refresh_seconds=3600, clock=clock,
                             refresh=lambda: certificates.ensure(tmp_path / "served")).start()
    try:
        ca = base64.b64decode(secret_data(api)[CA_CERT])
        assert ca_bundle(api) == secret_data(api)[CA_CERT]
        assert _post(service.server, json.dumps(review(pod())).encode(), ca)[0] == 200  # served from the first moment
        api.inject("GET", "/secrets/gw-webhook-cert$", 503, times=1)
        with caplog.at_level(logging.WARNING, "gpuwarden.kube.webhook"):
            tick(clock, 3600)
            wait_for(lambda: service.refreshes == 2, what="the hourly refresh")
        assert "refresh failed" in caplog.text  # a warning; it keeps serving
        assert _post(service.server, json.dumps(review(pod())).encode(), ca)[0] == 200
        tick(clock, timedelta(days=340).total_seconds())  # the serving certificate is now due
        wait_for(lambda: service.refreshes == 3, what="the refresh after the window opened")
        (cert,) = certs_in(secret_data(api), CERT_FILE)
        assert (tmp_path / "served" / CERT_FILE).read_bytes() == base64.b64decode(secret_data(api)[CERT_FILE])
        assert cert.not_valid_after_utc > clock.now() + timedelta(days=300)  # renewed
    finally:
        service.stop()


def test_bad_rotation_settings_name_the_key():
    with pytest.raises(ValueError, match="cert_rotate_before_days=400 must be above 0 and below cert_validity_days=365"):
        CertPolicy("svc", "ns", cert_rotate_before_days=400)
