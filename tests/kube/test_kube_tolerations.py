"""A live cluster feeds the planner taints and the pods' tolerations, as kube-scheduler reads them:
GPU nodes commonly carry a NoSchedule taint that GPU pods tolerate (``KubeCluster`` over the fake
API server, the official client unmodified over HTTP)."""

from __future__ import annotations

import pytest
from fake_kube_api import CORE, FakeKubeAPI
from kube_fleet import namespace, node

from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.fleet import ActionKind
from gpuwarden.scheduling import plan

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def pending_pod(api: FakeKubeAPI, name: str, tolerations: list[dict]) -> None:
    api.add(CORE, "pods", {
        "metadata": {"name": name, "namespace": "ml", "labels": {}, "annotations": {}},
        "spec": {"containers": [{"name": "main", "image": "trainer",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}], "tolerations": tolerations,
                 "schedulingGates": [{"name": "gpuwarden.io/admission"}]},  # waits for gpuwarden's admission
        "status": {"phase": "Pending"}})


def test_tolerations_reach_the_planner(api, tmp_path):
    node(api, "gpu-a", gpus=2, taints=[GPU_TAINT])
    namespace(api, "ml", {"gpuwarden.io/queue": "vision"})
    pending_pod(api, "tolerant", [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    pending_pod(api, "equal", [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}])
    pending_pod(api, "everything", [{"operator": "Exists"}])
    pending_pod(api, "intolerant", [{"key": "other", "operator": "Exists"}])
    cluster = KubeCluster(KubeApi(load_client(api.kubeconfig(tmp_path / "kc.json"))))
    snapshot = cluster.snapshot()
    read = {w.workload.name: w.workload.tolerations for w in snapshot.workloads}
    assert read == {"tolerant": ("nvidia.com/gpu:NoSchedule",), "equal": ("nvidia.com/gpu=present",),
                    "everything": ("",), "intolerant": ("other",)}
    assert snapshot.taints["gpu-a"] == ("nvidia.com/gpu=present:NoSchedule",)
    assert all(w.attained_gpu_seconds == 0.0 for w in snapshot.workloads)  # not measured yet (issue 21)
    started = {a.target for a in plan(snapshot).actions if a.kind == ActionKind.BIND}
    assert "ml/intolerant" not in started and len(started) == 2  # two GPUs, three pods that may use them
    assert started <= {"ml/tolerant", "ml/equal", "ml/everything"}
