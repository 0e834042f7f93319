"""The webhook gates a pod whose GPUs come only through DRA claims (issue 34): ``GpuClaims`` reads the
cluster's DeviceClasses, ResourceClaimTemplates and ResourceClaims over HTTP with the official client
on the fake API server (nothing real serves the Kubernetes API here), and ``admission_response``
gates such a pod, never one whose claims ask other drivers' devices, and never one on a cluster
without DRA."""

from __future__ import annotations

import base64
import json

import pytest
from fake_kube_api import DEFAULT_RESOURCES, RESOURCE, FakeKubeAPI
from fake_kube_dra import claim, claim_template, nvidia_classes, request

from gpuwarden.kube import KubeApi, load_client
from gpuwarden.kube.gates import ADMISSION_GATE
from gpuwarden.kube.webhook import admission_response
from gpuwarden.kube.webhook_claims import GpuClaims


@pytest.fixture
def api(dra_api):
    return dra_api


def _claims(api: FakeKubeAPI, tmp_path) -> GpuClaims:
    claims = GpuClaims(KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json")), attempts=1))
    claims.refresh()
    return claims


def _pod(entries: dict[str, tuple[str, str]]) -> dict:
    """A pod asking no GPU resource; ``entries``: claim entry -> (field, name)."""
    return {"metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"cpu": "1"}}}],
                     "resourceClaims": [{"name": e, f: n} for e, (f, n) in entries.items()]}}


def _gated(pod: dict, claims: GpuClaims | None) -> bool:
    review = {"request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "ml", "object": pod}}
    answer = admission_response(review, None, claims.asks_gpu if claims else None)["response"]
    return "patch" in answer


def _nic_class(api: FakeKubeAPI) -> None:
    api.add(RESOURCE, "deviceclasses", {"metadata": {"name": "nic.example.com"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'nic.example.com'"}}]}})


def test_a_pod_claiming_gpus_or_a_mig_device_is_gated_one_claiming_a_nic_is_not(api, tmp_path):
    nvidia_classes(api)
    _nic_class(api)
    claim_template(api, "ml", "two-gpus", [request("gpus", "gpu.nvidia.com", 2)])
    claim_template(api, "ml", "nic", [request("nic", "nic.example.com")])
    claim(api, "ml", "one-mig", [request("mig", "mig-1g.10gb.gpu.nvidia.com")])
    claims = _claims(api, tmp_path)
    assert _gated(_pod({"gpus": ("resourceClaimTemplateName", "two-gpus")}), claims)
    assert _gated(_pod({"mig": ("resourceClaimName", "one-mig")}), claims)
    assert _gated(_pod({"nic": ("resourceClaimTemplateName", "nic"), "gpus": ("resourceClaimTemplateName", "two-gpus")}),
                  claims)
    assert not _gated(_pod({"nic": ("resourceClaimTemplateName", "nic")}), claims)
    assert not _gated(_pod({"gpus": ("resourceClaimTemplateName", "two-gpus")}), None)  # not wired: as before


def test_a_template_made_just_before_its_pod_is_read_on_the_review(api, tmp_path):
    nvidia_classes(api)
    claims = _claims(api, tmp_path)
    claim_template(api, "ml", "late", [request("gpus", "gpu.nvidia.com", 1)])  # after the last list
    assert _gated(_pod({"gpus": ("resourceClaimTemplateName", "late")}), claims)
    # one that does not exist: not gated on account of it (kube-scheduler says it is missing), logged
    assert not _gated(_pod({"gpus": ("resourceClaimTemplateName", "never-made")}), claims)


def test_a_cluster_without_dra_gates_nothing_on_account_of_claims(tmp_path):
    running = FakeKubeAPI().start()  # resource.k8s.io/v1 not served: every list is 404
    try:
        running.resources = set(DEFAULT_RESOURCES)
        claims = _claims(running, tmp_path)
        assert claims.served is False
        assert not _gated(_pod({"gpus": ("resourceClaimTemplateName", "two-gpus")}), claims)
    finally:
        running.stop()


def test_a_review_with_wrong_typed_claims_is_allowed_unchanged(api, tmp_path):
    nvidia_classes(api)
    claims = _claims(api, tmp_path)
    pod = _pod({})
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": 7}]
    assert not _gated(pod, claims)
    pod["spec"]["resourceClaims"] = "gpus"
    assert not _gated(pod, claims)


def test_the_gate_is_the_admission_gate(api, tmp_path):
    nvidia_classes(api)
    claim_template(api, "ml", "two-gpus", [request("gpus", "gpu.nvidia.com", 2)])
    claims = _claims(api, tmp_path)
    review = {"request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "ml",
                          "object": _pod({"gpus": ("resourceClaimTemplateName", "two-gpus")})}}
    patch = json.loads(base64.b64decode(admission_response(review, None, claims.asks_gpu)["response"]["patch"]))
    assert patch[-1]["value"] == [{"name": ADMISSION_GATE}] or patch[-1]["value"] == {"name": ADMISSION_GATE}
