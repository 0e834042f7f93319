"""A pod asking the device plugin's resources (``nvidia.com/gpu``, a MIG resource) on a cluster where
some GPU nodes publish their GPUs only through DRA: kube-scheduler binds it only where the node's
allocatable holds the resource, unless a DeviceClass maps it (KEP-5004, ``extendedResourceName``),
so gpuwarden pins it only there. Through HTTP on the fake API server with the official client and
the production round (nothing real serves the Kubernetes API here)."""

from __future__ import annotations

import pytest
from fake_kube_api import CORE, RESOURCE, FakeKubeAPI
from fake_kube_dra import dra_node, gpu_slice, nvidia_classes
from kube_fleet import connect, gpu_pod, namespace, node

from gpuwarden.kube.gates import ADMITTED_NODE_ANNOTATION
from gpuwarden.scheduler.scheduling_round import SchedulingRound


@pytest.fixture
def api(dra_api):
    return dra_api


def _classes_without_kep_5004(api: FakeKubeAPI) -> None:
    nvidia_classes(api)
    plain = api.get(RESOURCE, "deviceclasses", "gpu.nvidia.com")
    plain["spec"].pop("extendedResourceName")
    api.add(RESOURCE, "deviceclasses", plain)


def _admitted(api: FakeKubeAPI) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION]
            for p in api.objects(CORE, "pods") if ADMITTED_NODE_ANNOTATION in (p["metadata"].get("annotations") or {})}


def _fleet(api: FakeKubeAPI) -> None:
    namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "16"})
    dra_node(api, "dra-0")  # 8 GPUs through DRA only: no nvidia.com/gpu in its allocatable
    gpu_slice(api, "dra-0", 8)
    node(api, "dp-0", gpus=2)  # the device plugin's node, 2 GPUs


def test_a_device_plugin_pod_is_pinned_only_where_the_plugin_serves_gpus(api, tmp_path):
    _classes_without_kep_5004(api)
    _fleet(api)
    gpu_pod(api, "ml", "fits-plugin", 2)
    gpu_pod(api, "ml", "too-big-for-plugin", 4, created="2026-11-30T11:01:00Z")
    loop = SchedulingRound(connect(api, tmp_path))
    loop.run_round()
    assert _admitted(api) == {"fits-plugin": "dp-0"}  # never dra-0, where kube-scheduler would leave it Pending
    waiting = {w["name"]: w for w in loop.queue["workloads"]}
    assert "too-big-for-plugin" in str(waiting)


def test_where_a_device_class_maps_the_resource_dra_nodes_take_it(api, tmp_path):
    nvidia_classes(api)  # gpu.nvidia.com backs nvidia.com/gpu (KEP-5004)
    _fleet(api)
    gpu_pod(api, "ml", "fits-plugin", 2)
    gpu_pod(api, "ml", "too-big-for-plugin", 4, created="2026-11-30T11:01:00Z")
    SchedulingRound(connect(api, tmp_path)).run_round()
    admitted = _admitted(api)
    assert admitted["too-big-for-plugin"] == "dra-0" and set(admitted) == {"fits-plugin", "too-big-for-plugin"}


def test_a_cluster_without_dra_only_nodes_is_read_as_before(api, tmp_path):
    _classes_without_kep_5004(api)
    namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "16"})
    dra_node(api, "mixed-0", allocatable_gpus=8)  # the device plugin beside the DRA driver
    gpu_slice(api, "mixed-0", 8)
    gpu_pod(api, "ml", "plain", 4)
    cluster = connect(api, tmp_path)
    SchedulingRound(cluster).run_round()
    assert _admitted(api) == {"plain": "mixed-0"} and not cluster.inventory.dra.dra_only_nodes
