"""Pod attribution through the kubelet pod-resources API, against a real gRPC server.

The server is grpcio's own, listening on a unix socket in a temporary folder and implementing the
real ``v1.PodResourcesLister/List`` service with the kubelet's protobuf messages (generated from
the vendored ``api.proto``). GPUs come from the replay backend: a recorded H200 (no GPU on CI).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpuwarden.exporter import ExporterService
from gpuwarden.exporter.podresources import PodAttributor, PodRef, PodResourcesClient, api_pb2, device_map
from gpuwarden.exporter.replay import ReplayBackend


class Kubelet:
    """A pod-resources server: ``self.pods`` is [(namespace, pod, container, resource, [device ids])]."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self.pods: list[tuple[str, str, str, str, list[str]]] = []
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self.list,
                request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
                response_serializer=api_pb2.ListPodResourcesResponse.SerializeToString,
            ),
        })
        self.server.add_generic_rpc_handlers((handler,))
        assert self.server.add_insecure_port(f"unix:{socket_path}") == 1

    def list(self, request: api_pb2.ListPodResourcesRequest, context) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        response = api_pb2.ListPodResourcesResponse()
        by_pod: dict[tuple[str, str], api_pb2.PodResources] = {}
        for namespace, pod, container, resource, devices in self.pods:
            entry = by_pod.get((namespace, pod))
            if entry is None:
                entry = by_pod[(namespace, pod)] = response.pod_resources.add(name=pod, namespace=namespace)
            resources = entry.containers.add(name=container, cpu_ids=[2, 3])
            resources.devices.add(resource_name=resource, device_ids=devices,
                                  topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)]))
        return response

    def __enter__(self) -> "Kubelet":
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0).wait(5)


@pytest.fixture
def socket_dir():
    # unix socket paths must stay short (108 bytes): pytest's tmp_path can be too long
    with tempfile.TemporaryDirectory(prefix="gw-kubelet-") as folder:
        yield Path(folder)


@pytest.fixture
def replay(data_dir: Path):
    made = []

    def make(**kwargs) -> ReplayBackend:
        backend = ReplayBackend("node-a", data_dir / "h200" / "phase_trace.csv", data_dir / "h200" / "nvml_probe.json",
                                xid_wait_ms=20, **kwargs)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def series(service: ExporterService, metric: str) -> list[dict[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    body = service.render_metrics().decode()
    return [s.labels for f in text_string_to_metric_families(body) for s in f.samples if s.name == metric]


def test_device_map_keeps_gpu_resources_and_strips_replicas():
    response = api_pb2.ListPodResourcesResponse()
    pod = response.pod_resources.add(name="p", namespace="ns")
    container = pod.containers.add(name="c")
    container.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-a::3"])
    container.devices.add(resource_name="nvidia.com/mig-1g.18gb", device_ids=["MIG-b"])
    container.devices.add(resource_name="example.com/nic", device_ids=["GPU-c"])
    wire = api_pb2.ListPodResourcesResponse.FromString(response.SerializeToString())
    assert device_map(wire) == {"GPU-a": (PodRef("ns", "p", "c"),), "MIG-b": (PodRef("ns", "p", "c"),)}


def test_pods_label_gpus_mig_instances_and_time_sliced_gpus_over_grpc(socket_dir, replay):
    backend = replay(gpus=3, mig_profiles=())
    recorded = backend.recorded
    uuids = [recorded.gpu_uuid(i) for i in range(3)]
    socket_path = str(socket_dir / "kubelet.sock")
    with Kubelet(socket_path) as kubelet:
        kubelet.pods = [
            ("ml", "train-0", "trainer", "nvidia.com/gpu", [uuids[0]]),
            ("serve", "infer-a", "server", "nvidia.com/gpu", [f"{uuids[1]}::0"]),  # time-sliced replicas
            ("serve", "infer-b", "server", "nvidia.com/gpu", [f"{uuids[1]}::1"]),
            ("ml", "sidecar", "nic", "example.com/nic", [uuids[2]]),  # not a GPU resource
        ]
        attributor = PodAttributor(socket_path)
        service = ExporterService(backend, interval_seconds=60, node_name="node-a", attributor=attributor)
        service.collect_now()
        util = {(s["gpu"], s["pod"]): s for s in series(service, "DCGM_FI_DEV_POWER_USAGE")}
        assert set(util) == {("0", "train-0"), ("1", "infer-a"), ("1", "infer-b"), ("2", "")}
        assert (util[("0", "train-0")]["namespace"], util[("0", "train-0")]["container"]) == ("ml", "trainer")
        assert util[("1", "infer-b")]["namespace"] == "serve"
        assert kubelet.calls == 1
        up = series(service, "gpuwarden_exporter_pod_attribution_up")
        assert up == [{"node": "node-a"}] and service.registry.get_sample_value(
            "gpuwarden_exporter_pod_attribution_up", {"node": "node-a"}) == 1

        # the pod goes away: its series go with it on the next collection
        kubelet.pods = kubelet.pods[:1]
        service.collect_now()
        pods = {(s["gpu"], s["pod"]) for s in series(service, "DCGM_FI_DEV_POWER_USAGE")}
        assert pods == {("0", "train-0"), ("1", ""), ("2", "")}
        attributor.close()


def test_mig_instances_are_attributed_by_mig_uuid(socket_dir, replay):
    backend = replay(gpus=1, mig_profiles=["1g.18gb"] * 2)
    service = ExporterService(backend, interval_seconds=60, node_name="node-a")
    readings = service.collect_now().readings
    migs = sorted((r for r in readings if r.mig_instance_id is not None), key=lambda r: r.mig_instance_id)
    socket_path = str(socket_dir / "kubelet.sock")
    with Kubelet(socket_path) as kubelet:
        kubelet.pods = [("ml", "small-job", "main", "nvidia.com/mig-1g.18gb", [migs[1].mig_uuid])]
        service.attributor = PodAttributor(socket_path)
        service.collect_now()
        used = {(s["GPU_I_ID"], s["pod"]) for s in series(service, "DCGM_FI_DEV_FB_USED")}
        assert used == {("", ""), (str(migs[0].mig_instance_id), ""), (str(migs[1].mig_instance_id), "small-job")}
        service.attributor.close()


def test_absent_kubelet_socket_runs_without_pod_labels_and_says_so_once(socket_dir, replay, caplog):
    backend = replay(gpus=2)
    service = ExporterService(backend, interval_seconds=60, node_name="node-a",
                              attributor=PodAttributor(str(socket_dir / "missing.sock")))
    with caplog.at_level(logging.WARNING, logger="gpuwarden.exporter"):
        for _ in range(3):
            service.collect_now()
    said = [r for r in caplog.records if "pod-resources socket" in r.getMessage()]
    assert len(said) == 1 and "without pod labels" in said[0].getMessage()
    assert {s["pod"] for s in series(service, "DCGM_FI_DEV_GPU_UTIL")} == {""}
    assert len(series(service, "DCGM_FI_DEV_GPU_UTIL")) == 2
    assert service.registry.get_sample_value("gpuwarden_exporter_pod_attribution_up", {"node": "node-a"}) == 0
    assert service.registry.get_sample_value("gpuwarden_exporter_last_collection_success", {"node": "node-a"}) == 1


def test_kubelet_going_away_keeps_last_labels_and_logs_once(socket_dir, replay, caplog):
    backend = replay(gpus=1)
    uuid = backend.recorded.gpu_uuid(0)
    socket_path = str(socket_dir / "kubelet.sock")
    attributor = PodAttributor(socket_path, client=PodResourcesClient(socket_path, timeout=0.5))
    service = ExporterService(backend, interval_seconds=60, node_name="node-a", attributor=attributor)
    with Kubelet(socket_path) as kubelet:
        kubelet.pods = [("ml", "train-0", "trainer", "nvidia.com/gpu", [uuid])]
        service.collect_now()
    Path(socket_path).touch()  # a dead socket file: the kubelet is restarting
    with caplog.at_level(logging.WARNING, logger="gpuwarden.exporter"):
        service.collect_now()
        service.collect_now()
    assert {s["pod"] for s in series(service, "DCGM_FI_DEV_GPU_UTIL")} == {"train-0"}
    assert sum("pod-resources List failed" in r.getMessage() for r in caplog.records) == 1
    assert service.registry.get_sample_value("gpuwarden_exporter_pod_attribution_up", {"node": "node-a"}) == 0
    attributor.close()
