"""Devices NVIDIA's DRA driver taints (KEP-5055: ``gpu.nvidia.com/xid=<code>`` NoSchedule after a fatal
XID, ``gpu.nvidia.com/gpu-lost``) are allocated to no new claim by kube-scheduler, so the round never
counts them free: a pod is pinned only where untainted devices are enough. A taint that stops
nothing (effect None: ``gpu.nvidia.com/unmonitored``, a non-fatal XID) changes nothing. Through
HTTP on the fake API server with the official client (nothing real serves the Kubernetes API here)."""

from __future__ import annotations

import pytest
from fake_kube_api import CORE, RESOURCE, FakeKubeAPI
from fake_kube_dra import claim, claim_pod, dra_node, gpu_device, nvidia_classes, request, resource_slice
from kube_fleet import connect, namespace

from gpuwarden.kube.gates import ADMITTED_NODE_ANNOTATION
from gpuwarden.scheduler.scheduling_round import SchedulingRound


@pytest.fixture
def api(dra_api):
    return dra_api


def _tainted(node: str, minor: int, key: str, value: str, effect: str) -> dict:
    device = gpu_device(node, minor)
    device["taints"] = [{"key": key, "value": value, "effect": effect, "timeAdded": "2026-12-04T10:00:00Z"}]
    return device


def _cluster(api: FakeKubeAPI, effect: str) -> None:
    nvidia_classes(api)
    namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "8"})
    dra_node(api, "dra-0")
    resource_slice(api, "dra-0", [gpu_device("dra-0", 0), gpu_device("dra-0", 1),
                                  _tainted("dra-0", 2, "gpu.nvidia.com/xid", "79", effect),
                                  {**_tainted("dra-0", 3, "gpu.nvidia.com/gpu-lost", "", effect)}])
    for name, count in (("three", 3), ("two", 2)):
        claim(api, "ml", f"{name}-gpus", [request("gpus", "gpu.nvidia.com", count)])
        claim_pod(api, "ml", name, None, claims={"gpus": f"{name}-gpus"}, gated=True)


def _admitted(api: FakeKubeAPI) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["annotations"][ADMITTED_NODE_ANNOTATION]
            for p in api.objects(CORE, "pods") if ADMITTED_NODE_ANNOTATION in (p["metadata"].get("annotations") or {})}


def test_devices_tainted_noschedule_are_never_counted_free(api, tmp_path):
    _cluster(api, "NoSchedule")
    cluster = connect(api, tmp_path)
    loop = SchedulingRound(cluster)
    loop.run_round()
    assert _admitted(api) == {"two": "dra-0"}  # 2 untainted GPUs: the 3-GPU pod waits
    assert cluster.snapshot().unhealthy_gpus == {"dra-0/gpu-2", "dra-0/gpu-3"}


def test_a_taint_with_no_effect_changes_nothing(api, tmp_path):
    _cluster(api, "None")
    SchedulingRound(connect(api, tmp_path)).run_round()
    assert set(_admitted(api)) == {"three"}  # first in the queue, 3 of the 4 GPUs; "two" waits for room


def test_a_wrong_typed_taint_skips_its_slice_and_says_why(api, tmp_path):
    _cluster(api, "NoSchedule")
    bad = api.get(RESOURCE, "resourceslices", "dra-0-gpu.nvidia.com-slice")
    bad["spec"]["devices"][2]["taints"] = [{"key": 79, "effect": "NoSchedule"}]  # a number where a string belongs
    api.add(RESOURCE, "resourceslices", bad)
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    assert any("taints[0].key" in why for why in cluster.inventory.dra.skipped.values())


def test_a_node_whose_slices_vanish_is_a_warning_for_the_node(api, tmp_path):
    """The driver stops (its slices deleted) on a node still in the cluster: the next snapshot notes it
    and the health rule makes it one ``dra-devices-gone`` warning, with no action."""
    from datetime import UTC, datetime

    from gpuwarden.analytics.health.device_taint_rules import findings_from_device_health
    from gpuwarden.fleet import FindingKind

    _cluster(api, "None")
    cluster = connect(api, tmp_path)
    assert cluster.snapshot().device_health == ()
    api.act("", "DELETE", "/apis/resource.k8s.io/v1/resourceslices/dra-0-gpu.nvidia.com-slice")
    notes = cluster.snapshot().device_health
    assert [(n.node, n.gpu_uuid) for n in notes] == [("dra-0", "")]
    (finding,) = findings_from_device_health(notes, datetime(2026, 12, 4, tzinfo=UTC))
    assert (finding.kind, finding.node, finding.gpu_uuid, finding.recommended_action) == (
        FindingKind.DRA_DEVICES_GONE, "dra-0", None, None)
    assert cluster.snapshot().device_health == notes  # kept, since the first, while the slices stay away
    resource_slice(api, "dra-0", [gpu_device("dra-0", 0)])  # the driver is back
    assert cluster.snapshot().device_health == ()
