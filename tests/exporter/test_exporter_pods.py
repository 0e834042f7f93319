"""Pod attribution through the kubelet pod-resources API, against a real gRPC server.

The server is grpcio's own, listening on a unix socket in a temporary folder and implementing the
real ``v1.PodResourcesLister/List`` service with the kubelet's protobuf messages (generated from
the vendored ``api.proto``). GPUs come from the replay backend: a recorded H200 (no GPU on CI).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from gpuwarden.exporter import ExporterService
from gpuwarden.exporter.podresources import (
    PodAttributor,
    PodRef,
    PodResourcesClient,
    api_pb2,
    device_map,
)
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

    def __enter__(self) -> Kubelet:
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


# -- per-pod memory on time-sliced GPUs: NVML processes -> /proc/<pid>/cgroup -> pods ------------

from gpuwarden.exporter.nvml import NVML_ERROR_NOT_SUPPORTED  # noqa: E402
from gpuwarden.exporter.podresources.processes import PodMemory, parse_cgroup  # noqa: E402

MIB = 1024**2
UID_A = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"  # infer-a: containerd, systemd driver, cgroup v2
UID_B = "6fa459ea-ee8a-3ca4-894e-db77e160355e"  # infer-b: CRI-O, cgroupfs driver, cgroup v1
UID_C = "9a8b7c6d-1111-2222-3333-444455556666"  # infer-c: holds a replica, runs nothing
CID_A1, CID_A2, CID_B = "a" * 64, "ab" * 32, "b" * 64


def test_parse_cgroup_reads_v1_and_v2_paths_of_every_driver_and_runtime():
    systemd_v2 = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_A.replace('-', '_')}.slice/"
                  f"cri-containerd-{CID_A1}.scope\n")
    assert parse_cgroup(systemd_v2) == (UID_A, CID_A1)
    cgroupfs_v1 = f"12:pids:/kubepods/burstable/pod{UID_B}/{CID_B}\n4:memory:/kubepods/burstable/pod{UID_B}/{CID_B}\n1:name=systemd:/\n"
    assert parse_cgroup(cgroupfs_v1) == (UID_B, CID_B)
    guaranteed_crio = f"0::/kubepods.slice/kubepods-pod{UID_C.replace('-', '_')}.slice/crio-{CID_B}.scope"
    assert parse_cgroup(guaranteed_crio) == (UID_C, CID_B)
    nested_namespace = f"0::/../../kubepods-besteffort-pod{UID_A.replace('-', '_')}.slice/docker-{CID_A2}.scope"
    assert parse_cgroup(nested_namespace) == (UID_A, CID_A2)
    static_pod = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3c9d7c0e8b1f4d2e9a0b1c2d3e4f5a6b.slice"
    assert parse_cgroup(static_pod) == ("3c9d7c0e8b1f4d2e9a0b1c2d3e4f5a6b", None)
    assert parse_cgroup("0::/system.slice/nvidia-persistenced.service\n") is None
    assert parse_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n12:memory:/user.slice\n") is None


class HostTree:
    """A fixture host: /proc/<pid>/cgroup, the kubelet's pods/<uid>/ and containerd's OCI specs."""

    def __init__(self, root: Path):
        self.proc, self.kubelet, self.runtime = root / "proc", root / "kubelet", root / "containerd"
        for folder in (self.proc, self.kubelet, self.runtime):
            folder.mkdir(parents=True)

    def process(self, pid: int, cgroup: str) -> None:
        (self.proc / str(pid)).mkdir()
        (self.proc / str(pid) / "cgroup").write_text(cgroup)

    def containerd(self, container_id: str, namespace: str, pod: str, container: str) -> None:
        (self.runtime / container_id).mkdir()
        (self.runtime / container_id / "config.json").write_text(json.dumps({"ociVersion": "1.1.0", "annotations": {
            "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.container-name": container,
            "io.kubernetes.cri.sandbox-name": pod, "io.kubernetes.cri.sandbox-namespace": namespace}}))

    def kubelet_pod(self, uid: str, namespace: str, pod: str) -> None:
        folder = self.kubelet / "pods" / uid
        (folder / "volumes" / "kubernetes.io~projected" / "kube-api-access-x7k2p").mkdir(parents=True)
        (folder / "volumes" / "kubernetes.io~projected" / "kube-api-access-x7k2p" / "namespace").write_text(namespace)
        (folder / "etc-hosts").write_text(f"# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n"
                                          f"10.244.1.7\t{pod}\n")

    def memory(self) -> PodMemory:
        return PodMemory(str(self.proc), str(self.kubelet), runtime_configs=(str(self.runtime / "{id}" / "config.json"),))


@pytest.fixture
def host(tmp_path: Path) -> HostTree:
    tree = HostTree(tmp_path)
    tree.process(101, f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_A.replace('-', '_')}.slice/"
                      f"cri-containerd-{CID_A1}.scope\n")
    tree.process(102, f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_A.replace('-', '_')}.slice/"
                      f"cri-containerd-{CID_A2}.scope\n")
    tree.process(201, f"11:memory:/kubepods/besteffort/pod{UID_B}/{CID_B}\n3:cpu,cpuacct:/kubepods/besteffort/pod{UID_B}/{CID_B}\n")
    tree.process(301, "0::/system.slice/some-host-daemon.service\n")  # a host process: nobody's memory
    tree.containerd(CID_A1, "serve", "infer-a", "server")
    tree.containerd(CID_A2, "serve", "infer-a", "server")
    tree.kubelet_pod(UID_B, "serve", "infer-b")  # no runtime spec: named by the kubelet's pod folder
    return tree


@contextmanager
def shared_gpu_service(backend: ReplayBackend, socket_dir: Path, memory: PodMemory) -> Iterator[ExporterService]:
    """A kubelet (gRPC on a real socket) listing :func:`SHARED_PODS` for the backend's two GPUs, and
    an exporter service that attributes through it; the attributor is closed afterwards."""
    socket_path = str(socket_dir / "kubelet.sock")
    with Kubelet(socket_path) as kubelet:
        kubelet.pods = SHARED_PODS([backend.recorded.gpu_uuid(i) for i in range(2)])
        attributor = PodAttributor(socket_path, memory=memory)
        try:
            yield ExporterService(backend, interval_seconds=60, node_name="node-a", attributor=attributor)
        finally:
            attributor.close()

def by_pod(service: ExporterService, metric: str, gpu: str = "0") -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    body = service.render_metrics().decode()
    return {s.labels["pod"]: s.value for f in text_string_to_metric_families(body) for s in f.samples
            if s.name == metric and s.labels["gpu"] == gpu}


def SHARED_PODS(uuids: list[str]) -> list[tuple[str, str, str, str, list[str]]]:
    """GPU 0 time-sliced among three pods (device-plugin replicas), GPU 1 held whole by one."""
    return [
    ("serve", "infer-a", "server", "nvidia.com/gpu", [f"{uuids[0]}::0"]),
    ("serve", "infer-b", "server", "nvidia.com/gpu", [f"{uuids[0]}::1"]),
    ("serve", "infer-c", "server", "nvidia.com/gpu", [f"{uuids[0]}::2"]),
    ("ml", "train-0", "trainer", "nvidia.com/gpu", [uuids[1]]),
]


def gpu_memory_mib(backend, index: int) -> tuple[float, float]:
    """(used, free) MiB the recorded GPU reports at the next read (NVML must be initialised), as
    the v2 memory call counts them: the driver-reserved memory in neither."""
    recorded = backend.recorded
    info = recorded.nvmlDeviceGetMemoryInfo(recorded.nvmlDeviceGetHandleByIndex(index), recorded.nvmlMemory_v2)
    return info.used / MIB, info.free / MIB


def test_time_sliced_gpu_pods_carry_their_own_fb_used_and_gpu_wide_values_over_grpc(socket_dir, replay, host):
    backend = replay(gpus=2)
    recorded = backend.recorded
    recorded.processes[0] = [(101, 100 * MIB), (102, 50 * MIB), (201, 200 * MIB), (301, 25 * MIB)]
    recorded.cursor = next(i for i, row in enumerate(recorded.rows) if row.phase == "idle_memory_hoarded_64g")
    with shared_gpu_service(backend, socket_dir, host.memory()) as service:
        backend.open()
        used0, free0 = gpu_memory_mib(backend, 0)
        used1, _ = gpu_memory_mib(backend, 1)
        service.collect_now()
        calls = backend.query.calls["nvmlDeviceGetComputeRunningProcesses"]
        assert calls == 2  # one call per GPU per collection, on the collection thread

        fb_used = by_pod(service, "DCGM_FI_DEV_FB_USED")
        assert fb_used == {"infer-a": 150.0, "infer-b": 200.0, "infer-c": 0.0}  # the host process is nobody's
        assert sum(fb_used.values()) < used0
        assert by_pod(service, "gpuwarden_pod_fb_used_attributed") == {"infer-a": 1, "infer-b": 1, "infer-c": 1}
        assert by_pod(service, "DCGM_FI_DEV_FB_FREE") == {p: pytest.approx(free0) for p in ("infer-a", "infer-b", "infer-c")}
        power = by_pod(service, "DCGM_FI_DEV_POWER_USAGE")
        assert len(set(power.values())) == 1 and set(power) == {"infer-a", "infer-b", "infer-c"}  # GPU-wide, repeated
        temperature = by_pod(service, "DCGM_FI_DEV_GPU_TEMP")
        assert len(set(temperature.values())) == 1 and len(temperature) == 3
        # a GPU held by one pod keeps its whole memory and has no attribution series
        assert by_pod(service, "DCGM_FI_DEV_FB_USED", gpu="1") == {"train-0": pytest.approx(used1)}
        assert by_pod(service, "gpuwarden_pod_fb_used_attributed", gpu="1") == {}

        # scrapes render the snapshot: no NVML call
        for _ in range(3):
            service.render_metrics()
        assert backend.query.calls["nvmlDeviceGetComputeRunningProcesses"] == calls

        # infer-b's process ends: its series says 0 on the next collection
        recorded.processes[0] = [(101, 100 * MIB), (102, 50 * MIB)]
        service.collect_now()
        assert by_pod(service, "DCGM_FI_DEV_FB_USED") == {"infer-a": 150.0, "infer-b": 0.0, "infer-c": 0.0}


def test_process_memory_unsupported_falls_back_to_the_gpu_value_logged_once(socket_dir, replay, host, caplog):
    backend = replay(gpus=2)
    backend.recorded.processes[0] = NVML_ERROR_NOT_SUPPORTED
    with shared_gpu_service(backend, socket_dir, host.memory()) as service, caplog.at_level(logging.WARNING, logger="gpuwarden.exporter"):
        for _ in range(3):
            backend.open()
            used0, _ = gpu_memory_mib(backend, 0)
            snapshot = service.collect_now()
            assert snapshot.success
            assert by_pod(service, "DCGM_FI_DEV_FB_USED") == {p: pytest.approx(used0) for p in ("infer-a", "infer-b", "infer-c")}
            assert by_pod(service, "gpuwarden_pod_fb_used_attributed") == {"infer-a": 0, "infer-b": 0, "infer-c": 0}
    assert sum("NVML lists no processes" in r.getMessage() for r in caplog.records) == 1


def test_vanished_pid_and_missing_memory_figure_fall_back_per_pod_logged_once(socket_dir, replay, host, caplog):
    backend = replay(gpus=2)
    # 999 exited between the NVML read and the /proc read: it may have been infer-c's
    backend.recorded.processes[0] = [(101, 100 * MIB), (999, 70 * MIB), (201, None)]
    with shared_gpu_service(backend, socket_dir, host.memory()) as service, caplog.at_level(logging.WARNING, logger="gpuwarden.exporter"):
        for _ in range(2):
            backend.open()
            used0, _ = gpu_memory_mib(backend, 0)
            assert service.collect_now().success
            fb_used = by_pod(service, "DCGM_FI_DEV_FB_USED")
            assert fb_used == {"infer-a": 100.0, "infer-b": pytest.approx(used0), "infer-c": pytest.approx(used0)}
            assert by_pod(service, "gpuwarden_pod_fb_used_attributed") == {"infer-a": 1, "infer-b": 0, "infer-c": 0}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("pid 999 exited" in m for m in messages) == 1
    assert sum("no memory figure for pid 201" in m for m in messages) == 1


def test_unresolvable_pod_uid_leaves_pods_without_processes_on_the_gpu_value(socket_dir, replay, host, caplog):
    backend = replay(gpus=2)
    host.process(401, f"0::/kubepods/pod{UID_C}/{'c' * 64}\n")  # neither a runtime spec nor a kubelet pod folder
    backend.recorded.processes[0] = [(101, 100 * MIB), (201, 200 * MIB), (401, 10 * MIB)]
    with shared_gpu_service(backend, socket_dir, host.memory()) as service, caplog.at_level(logging.WARNING, logger="gpuwarden.exporter"):
        backend.open()
        used0, _ = gpu_memory_mib(backend, 0)
        service.collect_now()
        assert by_pod(service, "DCGM_FI_DEV_FB_USED") == {"infer-a": 100.0, "infer-b": 200.0, "infer-c": pytest.approx(used0)}
        # the kubelet's pod folder appears (the pod's volumes are set up): infer-c is named from then on
        host.kubelet_pod(UID_C, "serve", "infer-c")
        backend.open()
        service.collect_now()
        assert by_pod(service, "DCGM_FI_DEV_FB_USED") == {"infer-a": 100.0, "infer-b": 200.0, "infer-c": 10.0}
    assert sum(f"pod uid {UID_C}" in r.getMessage() for r in caplog.records) == 1


def test_backend_reads_processes_through_the_gate_and_can_turn_them_off(replay):
    backend = replay(gpus=2)
    backend.recorded.processes[0] = [(101, 100 * MIB), (102, None)]
    backend.recorded.processes[1] = NVML_ERROR_NOT_SUPPORTED
    readings = {r.gpu_index: r for r in backend.read()}
    assert readings[0].processes == ((101, 100.0 * MIB), (102, None))
    assert readings[1].processes is None  # unsupported: absent, not an empty list
    assert backend.query.calls["nvmlDeviceGetComputeRunningProcesses"] == 2
    quiet = replay(gpus=1, processes=False)
    assert quiet.read()[0].processes is None
    assert "nvmlDeviceGetComputeRunningProcesses" not in quiet.query.calls


def test_exporter_flags_wire_per_pod_memory(replay, tmp_path):
    import argparse

    from gpuwarden.exporter.main import add_arguments, build_service

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    backend = replay(gpus=1)
    args = parser.parse_args(["--proc-root", str(tmp_path / "proc"), "--kubelet-root", str(tmp_path / "kubelet")])
    memory = build_service(args, backend, node="node-a").attributor.memory
    assert (memory.proc_root, memory.kubelet_root) == (str(tmp_path / "proc"), str(tmp_path / "kubelet"))
    off = build_service(parser.parse_args(["--proc-root", "none"]), backend, node="node-a")
    assert off.attributor is not None and off.attributor.memory is None


def test_mps_clients_split_the_gpu_memory_among_their_pods(socket_dir, replay, host):
    """Under MPS NVML's compute list shows only the MPS server (a host daemon here, pid 301); the
    clients, listed by nvmlDeviceGetMPSComputeRunningProcesses, carry each pod's own memory."""
    backend = replay(gpus=2)
    recorded = backend.recorded
    recorded.cursor = next(i for i, row in enumerate(recorded.rows) if row.phase == "idle_memory_hoarded_64g")
    recorded.processes[0] = [(301, 900 * MIB)]  # nvidia-cuda-mps-server
    recorded.mps_processes[0] = [(101, 100 * MIB), (102, 60 * MIB), (201, 300 * MIB)]
    with shared_gpu_service(backend, socket_dir, host.memory()) as service:
        service.collect_now()
        assert by_pod(service, "DCGM_FI_DEV_FB_USED") == {"infer-a": 160.0, "infer-b": 300.0, "infer-c": 0.0}
        assert by_pod(service, "gpuwarden_pod_fb_used_attributed") == {"infer-a": 1, "infer-b": 1, "infer-c": 1}
        recorded.mps_processes[0] = []  # the clients ended; the server stays
        service.collect_now()
        assert by_pod(service, "DCGM_FI_DEV_FB_USED") == {"infer-a": 0.0, "infer-b": 0.0, "infer-c": 0.0}
