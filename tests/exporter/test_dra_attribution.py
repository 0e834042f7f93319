"""The exporter's DRA attribution against a recorded pod-resources answer.

``data/dra_pod_resources.pb`` is a kubelet ``List`` answer (how it was built: ``data/README.md``):
ml/train-dra-0 holds gpu-0 and gpu-1 through a DRA claim, serve/infer-mig-0 holds the MIG device
gpu-2-mig-1g18gb-19-1, batch/legacy-0 holds GPU 3 through the device plugin, and ml/stale-0 holds
gpu-4, which this node's NVML does not list. A grpcio server on a unix socket serves those bytes as
they are; the exporter's own client reads them, and the GPUs are the replay backend's recorded
H200s (four, GPU 2 with MIG on: two 1g.18gb instances at placements 0 and 1).
"""

from __future__ import annotations

import logging
import tempfile
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.exporter import ExporterService
from gpuwarden.exporter.nvml import DeviceIdentity
from gpuwarden.exporter.podresources import PodAttributor, api_pb2
from gpuwarden.exporter.podresources.dra import DeviceNames, device_name, name_profile, parse_device_name
from gpuwarden.exporter.replay import ReplayBackend

RECORDED = Path(__file__).parent / "data" / "dra_pod_resources.pb"
NODE = "node-a"
TRAIN_CLAIM = {"dra_claim_name": "train-dra-0-gpus-5c7xq", "dra_claim_namespace": "ml",
               "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": NODE}


class RecordedKubelet:
    """``v1.PodResourcesLister/List`` answering with recorded bytes, sent as they are."""

    def __init__(self, socket_path: str, answer: bytes):
        self.answer = answer
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self.list, request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
                response_serializer=lambda raw: raw),
        })
        self.server.add_generic_rpc_handlers((handler,))
        assert self.server.add_insecure_port(f"unix:{socket_path}") == 1

    def list(self, request: api_pb2.ListPodResourcesRequest, context: object) -> bytes:
        self.calls += 1
        return self.answer

    def __enter__(self) -> RecordedKubelet:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0).wait(5)


@pytest.fixture
def node(data_dir: Path):
    """(replay backend, socket path): four recorded H200s, GPU 2 split into two 1g.18gb instances."""
    backend = ReplayBackend(NODE, data_dir / "h200" / "phase_trace.csv", data_dir / "h200" / "nvml_probe.json",
                            gpus=4, mig_profiles=["1g.18gb"] * 2, mig_gpus=[2], xid_events=False)
    with tempfile.TemporaryDirectory(prefix="gw-dra-") as folder:  # a unix socket path stays short
        yield backend, str(Path(folder) / "kubelet.sock")
    backend.close()


def exporter(backend: ReplayBackend, socket_path: str) -> ExporterService:
    attributor = PodAttributor(socket_path, identities=backend.device_identities)
    return ExporterService(backend, interval_seconds=60, node_name=NODE, attributor=attributor)


def by_device(service: ExporterService, metric: str) -> dict[tuple[str, str], dict[str, str]]:
    """(gpu index, GPU_I_ID) -> the labels of the series (one per device: no GPU here is shared)."""
    body = service.render_metrics().decode()
    out: dict[tuple[str, str], dict[str, str]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == metric:
                key = (sample.labels["gpu"], sample.labels["GPU_I_ID"])
                assert key not in out, f"{key} has two series"
                out[key] = sample.labels
    return out


def states(service: ExporterService) -> dict[tuple[str, str], str]:
    return {k: v["state"] for k, v in by_device(service, "gpuwarden_pod_attribution_state").items()}


def dra(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith("dra_")}


def value(service: ExporterService, name: str) -> float | None:
    return service.registry.get_sample_value(name, {"node": NODE})


def test_the_recorded_answer_labels_dra_gpus_the_mig_device_and_the_device_plugin_gpu(node, caplog):
    backend, socket_path = node
    service = exporter(backend, socket_path)
    with RecordedKubelet(socket_path, RECORDED.read_bytes()) as kubelet, \
            caplog.at_level(logging.WARNING, logger="gpuwarden.exporter"):
        service.collect_now()
        series = by_device(service, "DCGM_FI_DEV_FB_USED")
        uuids = {key: labels["UUID"] for key, labels in series.items()}
        assert uuids[("3", "")] == "GPU-e6afee92-eeec-8648-8873-5d6a10f1ac07"  # the recorded answer's device-plugin GPU
        pods = {key: (labels["namespace"], labels["pod"], labels["container"]) for key, labels in series.items()}
        assert pods == {
            ("0", ""): ("ml", "train-dra-0", "trainer"),
            ("1", ""): ("ml", "train-dra-0", "trainer"),
            ("2", ""): ("", "", ""),  # GPU 2 itself: MIG on, held by nobody whole
            ("2", "7"): ("", "", ""),  # its first 1g.18gb (placement 0): free
            ("2", "8"): ("serve", "infer-mig-0", "server"),  # placement 1: gpu-2-mig-1g18gb-19-1
            ("3", ""): ("batch", "legacy-0", "main"),  # the device plugin's
        }
        assert dra(series[("0", "")]) == {**TRAIN_CLAIM, "dra_device_name": "gpu-0"}
        assert dra(series[("1", "")]) == {**TRAIN_CLAIM, "dra_device_name": "gpu-1"}
        assert dra(series[("2", "8")]) == {"dra_claim_name": "infer-mig-0-mig-8kq2w", "dra_claim_namespace": "serve",
                                           "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": NODE,
                                           "dra_device_name": "gpu-2-mig-1g18gb-19-1"}
        assert series[("2", "8")]["GPU_I_PROFILE"] == "1g.18gb"
        assert dra(series[("3", "")]) == {} and dra(series[("2", "7")]) == {}
        # gpu-4 (ml/stale-0) names no GPU here: counted, attributed to nothing, every GPU's state "known"
        assert states(service) == dict.fromkeys(series, "known")
        assert (value(service, "gpuwarden_exporter_dra_devices"), value(service, "gpuwarden_exporter_dra_devices_unresolved"),
                value(service, "gpuwarden_exporter_dra_devices_unresolved_total")) == (3, 1, 1)
        assert value(service, "gpuwarden_exporter_pod_attribution_up") == 1

        service.collect_now()  # the same allocation again: not counted twice, not said twice
        assert value(service, "gpuwarden_exporter_dra_devices_unresolved_total") == 1
        assert kubelet.calls == 2
    said = [r.getMessage() for r in caplog.records if "DRA device" in r.getMessage()]
    assert len(said) == 1 and "gpu-4" in said[0] and "ml/stale-0" in said[0] and "no_device" in said[0]
    service.attributor.close()


def test_without_mig_placements_the_mig_device_is_ambiguous_and_only_its_gpu_loses_attribution(node, caplog):
    """NVML gives GPU-instance placements to a privileged process only; without them two 1g.18gb
    instances on GPU 2 both fit the name: neither is chosen, and both are of unknown owner."""
    backend, socket_path = node
    backend.recorded.gpu_instances_refused = True
    service = exporter(backend, socket_path)
    with RecordedKubelet(socket_path, RECORDED.read_bytes()), caplog.at_level(logging.INFO, logger="gpuwarden.exporter"):
        service.collect_now()
    pods = {key: labels["pod"] for key, labels in by_device(service, "DCGM_FI_DEV_FB_USED").items()}
    assert pods == {("0", ""): "train-dra-0", ("1", ""): "train-dra-0", ("2", ""): "", ("2", "7"): "", ("2", "8"): "",
                    ("3", ""): "legacy-0"}
    assert states(service) == {("0", ""): "known", ("1", ""): "known", ("3", ""): "known",
                               ("2", ""): "failed", ("2", "7"): "failed", ("2", "8"): "failed"}
    assert (value(service, "gpuwarden_exporter_dra_devices"), value(service, "gpuwarden_exporter_dra_devices_unresolved")) == (2, 2)
    messages = [r.getMessage() for r in caplog.records]
    assert any("gpu-2-mig-1g18gb-19-1" in m and "ambiguous" in m for m in messages)
    assert sum("no GPU-instance placement" in m for m in messages) == 1
    service.attributor.close()


def test_minor_numbers_not_nvml_indices_name_the_gpus(node):
    backend, socket_path = node
    backend.recorded.minors = {0: 1, 1: 0}  # /dev/nvidia1 is NVML's GPU 0 on this node
    service = exporter(backend, socket_path)
    with RecordedKubelet(socket_path, RECORDED.read_bytes()):
        service.collect_now()
    series = by_device(service, "DCGM_FI_DEV_FB_USED")
    assert (series[("0", "")]["dra_device_name"], series[("1", "")]["dra_device_name"]) == ("gpu-1", "gpu-0")
    service.attributor.close()


def test_a_name_of_an_unknown_form_is_said_and_never_matched_to_a_gpu_by_its_number(node, caplog):
    """A name the exporter does not know the form of is not read as "gpu-2" because it starts so:
    GPU 2's devices without a pod are of unknown owner; its MIG device held by a pod, and every
    other GPU, keep their attribution."""
    backend, socket_path = node
    answer = api_pb2.ListPodResourcesResponse.FromString(RECORDED.read_bytes())
    stale = next(p for p in answer.pod_resources if p.name == "stale-0")
    stale.containers[0].dynamic_resources[0].claim_resources[0].device_name = "gpu-2-vgpu-1"
    service = exporter(backend, socket_path)
    with RecordedKubelet(socket_path, answer.SerializeToString()), caplog.at_level(logging.WARNING, logger="gpuwarden.exporter"):
        service.collect_now()
    assert states(service) == {("0", ""): "known", ("1", ""): "known", ("3", ""): "known", ("2", "8"): "known",
                               ("2", ""): "failed", ("2", "7"): "failed"}
    assert by_device(service, "DCGM_FI_DEV_FB_USED")[("2", "8")]["pod"] == "infer-mig-0"
    assert any("gpu-2-vgpu-1" in r.getMessage() and "unknown_name" in r.getMessage() for r in caplog.records)
    service.attributor.close()


def test_the_fast_render_equals_prometheus_clients_with_dra_labels_and_counters(node):
    backend, socket_path = node
    backend.recorded.gpu_instances_refused = True  # owner-unknown series too
    service = exporter(backend, socket_path)
    with RecordedKubelet(socket_path, RECORDED.read_bytes()):
        service.collect_now()
    assert service.collector.render() == generate_latest(service.registry)
    assert b"# TYPE gpuwarden_exporter_dra_devices_unresolved_total counter" in service.collector.render()
    service.attributor.close()


def test_without_nvml_identities_no_dra_device_is_mapped_and_each_is_said(node):
    backend, socket_path = node
    service = ExporterService(backend, interval_seconds=60, node_name=NODE, attributor=PodAttributor(socket_path))
    with RecordedKubelet(socket_path, RECORDED.read_bytes()):
        service.collect_now()
    pods = {key: labels["pod"] for key, labels in by_device(service, "DCGM_FI_DEV_FB_USED").items()}
    assert pods[("3", "")] == "legacy-0" and {p for k, p in pods.items() if k != ("3", "")} == {""}
    assert set(states(service).values()) == {"known", "failed"} and states(service)[("3", "")] == "known"
    assert value(service, "gpuwarden_exporter_dra_devices_unresolved") == 4
    service.attributor.close()


def test_the_exporters_command_line_wires_nvml_identities_into_the_attribution(node):
    import argparse

    from gpuwarden.exporter.main import add_arguments, build_service

    backend, socket_path = node
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--backend", "replay", "--kubelet-socket", socket_path, "--proc-root", "none",
                              "--listen", "127.0.0.1:0"])
    service = build_service(args, backend, node=NODE)
    with RecordedKubelet(socket_path, RECORDED.read_bytes()):
        service.collect_now()
    assert by_device(service, "DCGM_FI_DEV_FB_USED")[("2", "8")]["dra_device_name"] == "gpu-2-mig-1g18gb-19-1"
    service.attributor.close()


# -- the names, without a kubelet ---------------------------------------------------------------

def test_the_drivers_device_names_parse_in_both_mig_forms():
    whole = parse_device_name("gpu-3")
    assert whole is not None and (whole.kind, whole.minor, whole.profile) == ("gpu", 3, None)
    new = parse_device_name("gpu-0-mig-1g18gb-me-20-6")  # v25.12 on: profile, profile id, start
    assert new is not None and (new.kind, new.minor, new.profile, new.gi_profile_id, new.placement_start) == ("mig", 0, "1g18gb-me", 20, 6)
    old = parse_device_name("gpu-7-mig-9-4-4")  # up to v25.8: profile id, start, size
    assert old is not None and (old.minor, old.profile, old.gi_profile_id, old.placement_start, old.placement_size) == (7, None, 9, 4, 4)
    for unknown in ("gpu-vfio-0", "gpu-2-vgpu-1", "gpu-", "GPU-0", "nic-0", ""):
        assert parse_device_name(unknown) is None, unknown
    assert name_profile("1g.18gb+me") == "1g18gb-me" and name_profile("7g.141gb") == "7g141gb"


def test_the_device_name_comes_from_the_cdi_device_when_the_kubelet_leaves_it_empty():
    resource = api_pb2.ClaimResource(driver_name="gpu.nvidia.com", pool_name=NODE, cdi_devices=[
        api_pb2.CDIDevice(name="k8s.gpu.nvidia.com/claim=dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-2-mig-1g18gb-19-1")])
    assert device_name(resource) == "gpu-2-mig-1g18gb-19-1"
    assert device_name(api_pb2.ClaimResource(cdi_devices=[api_pb2.CDIDevice(name="vendor.com/x=y")])) == ""


def test_names_resolve_only_to_one_device_and_say_why_not():
    gpu = [DeviceIdentity("GPU-b", 0), DeviceIdentity("GPU-a", 1)]
    placed = [DeviceIdentity("MIG-p0", 1, "GPU-a", "1g.18gb", 19, 0, 1), DeviceIdentity("MIG-p2", 1, "GPU-a", "2g.35gb", 14, 2, 2)]
    names = DeviceNames(gpu + placed)
    assert names.resolve("gpu-0") == ("GPU-b", "") and names.resolve("gpu-1") == ("GPU-a", "")
    assert names.resolve("gpu-1-mig-2g35gb-14-2") == ("MIG-p2", "")
    assert names.resolve("gpu-1-mig-14-2-2") == ("MIG-p2", "")  # the older form names the same device
    assert names.resolve("gpu-1-mig-1g18gb-19-1") == (None, "no_device")  # nothing at placement 1
    assert names.resolve("gpu-5") == (None, "no_device")
    assert names.resolve("gpu-vfio-0") == (None, "passthrough") and names.suspects("gpu-vfio-0", "passthrough") == ()
    assert names.resolve("gpu-1-foo") == (None, "unknown_name")
    assert set(names.suspects("gpu-1-foo", "unknown_name")) == {"GPU-a", "MIG-p0", "MIG-p2"}
    assert names.suspects("weird", "unknown_name") is None  # any GPU may be it
    # NVML without placements: the profile decides where only one instance has it
    unplaced = DeviceNames(gpu + [DeviceIdentity("MIG-u0", 1, "GPU-a", "1g.18gb"), DeviceIdentity("MIG-u1", 1, "GPU-a", "1g.18gb"),
                                  DeviceIdentity("MIG-u2", 1, "GPU-a", "2g.35gb")])
    assert unplaced.resolve("gpu-1-mig-2g35gb-14-2") == ("MIG-u2", "")
    assert unplaced.resolve("gpu-1-mig-1g18gb-19-1") == (None, "ambiguous")
    assert unplaced.resolve("gpu-1-mig-14-2-2") == (None, "ambiguous")  # the older form has no profile to go by
    assert unplaced.resolve("gpu-1-mig-3g71gb-9-4") == (None, "no_device")
    assert DeviceNames(None).resolve("gpu-0") == (None, "no_identity")
