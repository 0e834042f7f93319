"""The API server's answers are checked before use (issue 24 item 7): valid JSON of the wrong shape
is a clear, temporary failure naming the resource and the object, never a traceback and never a
snapshot missing what could not be read. On the fake API server (tests/fake_kube_api.py: no real
API server can run here), through the official ``kubernetes`` client over HTTP."""

from __future__ import annotations

import pytest
from fake_kube_api import CORE, FakeKubeAPI
from kube_fleet import node, pod

from gpuwarden.kube import KubeApi, KubeCluster, KubeFailure, load_client
from gpuwarden.cli import main


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    node(server, "gpu-a")
    pod(server, "team-a", "trainer-0", "gpu-a", gpus=2)
    yield server
    server.stop()


def cluster(api: FakeKubeAPI, tmp_path) -> KubeCluster:
    client = load_client(api.kubeconfig(tmp_path / "kc.json"), timeout_seconds=2.0)
    return KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.02))


def test_a_list_answered_with_a_json_array_is_a_named_failure(api, tmp_path):
    api.inject("GET", "/api/v1/nodes$", "not-an-object")
    with pytest.raises(KubeFailure, match=r"list nodes: the API server's answer is a JSON list, not an object") as failure:
        cluster(api, tmp_path).snapshot()
    assert failure.value.temporary
    assert len(cluster(api, tmp_path).snapshot().workloads) == 1  # the next round reads a sound answer


def test_an_object_with_a_field_of_the_wrong_type_is_named_and_nothing_is_half_read(api, tmp_path):
    api.add(CORE, "pods", {"metadata": {"name": "odd", "namespace": "team-b"}, "spec": "not a pod spec",
                           "status": {"phase": "Running"}})
    with pytest.raises(KubeFailure, match=r"pod team-b/odd: the API server's answer has an unexpected shape"):
        cluster(api, tmp_path).snapshot()


def test_a_node_whose_labels_are_a_list_is_named(api, tmp_path):
    api.add(CORE, "nodes", {"metadata": {"name": "gpu-odd", "labels": ["nvidia.com/gpu.product"]},
                            "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    with pytest.raises(KubeFailure, match=r"node gpu-odd: the API server's answer has an unexpected shape"):
        cluster(api, tmp_path).snapshot()


def test_actuator_plan_on_a_wrong_shaped_answer_exits_1_with_the_reason_not_a_traceback(api, tmp_path, capsys):
    api.inject("GET", "/api/v1/nodes$", "not-an-object")
    samples = tmp_path / "s.csv"
    samples.write_text("timestamp,cluster,node,gpu_uuid,gpu_index,model,gpu_util_ratio\n"
                       "2026-11-30T00:00:00Z,c,gpu-a,GPU-0,0,NVIDIA H100 80GB HBM3,0.9\n")
    code = main(["actuator", "plan", "--source", "file", "--file", str(samples), "--kubeconfig",
                 api.kubeconfig(tmp_path / "kc.json"), "--no-hoarding"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "the API server's answer is a JSON list, not an object" in err
    assert "bug" not in err.lower() and "Traceback" not in err


def test_an_unreadable_answer_to_a_write_does_not_say_nothing_was_done():
    """The server answers a write after acting on it: an answer that is not JSON leaves open whether
    it did, where an unreadable answer to a read means nothing was done."""
    from gpuwarden.kube.answers import parse_object
    from gpuwarden.kube.failure import KubeFailure

    with pytest.raises(KubeFailure, match="patch nodes: the API server's answer is not JSON .*; the change may have been made"):
        parse_object(b"<html>proxy</html>", "patch", "nodes")
    with pytest.raises(KubeFailure, match="get nodes: the API server's answer is not JSON .*; nothing was acted on"):
        parse_object(b"<html>proxy</html>", "get", "nodes")
