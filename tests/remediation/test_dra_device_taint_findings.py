"""A GPU its DRA driver tainted after a fatal XID (``gpu.nvidia.com/xid=79``, NoSchedule) is a finding
the actuator acts on as if the samples had shown the XID, even where they did not: ``gpuwarden
actuator plan`` on the fake API server (the real protocol over HTTP; nothing real serves the
Kubernetes API here) plans the node's repair from the snapshot's device taints."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pandas as pd
import pytest
from builders import fleet_samples
from fake_kube_api import DEFAULT_RESOURCES, FakeKubeAPI
from fake_kube_dra import dra_node, gpu_device, nvidia_classes, resource_slice
from kube_fleet import node

from gpuwarden.analytics.health.device_taint_rules import findings_from_device_health
from gpuwarden.cli import main
from gpuwarden.fleet import DeviceHealthNote, FindingKind

START = pd.Timestamp("2026-11-23T00:00:00Z")
NOW = datetime(2026, 11, 23, 0, 30, tzinfo=UTC)


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    server.resources = set(DEFAULT_RESOURCES)
    server.with_dra()
    yield server
    server.stop()


def test_a_tainted_dra_gpu_is_planned_for_repair_though_the_samples_are_clean(api, tmp_path, capsys):
    nvidia_classes(api)
    node(api, "gpu-a")
    dra_node(api, "gpu-b")
    lost = gpu_device("gpu-b", 1)
    lost["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule",
                       "timeAdded": "2026-11-23T00:10:00Z"}]
    resource_slice(api, "gpu-b", [gpu_device("gpu-b", 0), lost])
    fleet_samples(30, start=START).to_csv(tmp_path / "s.csv", index=False)  # no XID anywhere
    assert main(["actuator", "plan", "--until", "2026-11-23T00:30:00Z", "--source", "file", "--file",
                 str(tmp_path / "s.csv"), "--kubeconfig", api.kubeconfig(tmp_path / "kc.json"), "--audit",
                 str(tmp_path / "audit.jsonl"), "--no-hoarding", "--max-cordoned-node-ratio", "0.5"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\b(drain|cordon)\s+gpu-b\b", out), out
    assert not re.search(r"\b(drain|cordon)\s+gpu-a\b", out), out


def test_each_taint_becomes_the_finding_of_its_xid_and_others_raise_nothing():
    notes = [DeviceHealthNote("n", "n/gpu-0", "GPU-0", "gpu.nvidia.com/xid=79:NoSchedule"),
             DeviceHealthNote("n", "n/gpu-1", "GPU-1", "gpu.nvidia.com/gpu-lost=:NoSchedule"),
             DeviceHealthNote("n", "n/gpu-2", "GPU-2", "gpu.nvidia.com/xid=48:NoSchedule"),
             DeviceHealthNote("n", "n/gpu-3", "GPU-3", "gpu.nvidia.com/xid=13:NoSchedule"),  # the application's
             DeviceHealthNote("n", "n/gpu-4", None, "example.com/other=x:NoSchedule"),
             DeviceHealthNote("n", "n/gpu-0", "GPU-0", "gpu.nvidia.com/xid=79:NoExecute")]  # the same finding
    found = {(f.gpu_uuid, f.kind) for f in findings_from_device_health(notes, NOW)}
    assert found == {("GPU-0", FindingKind.OFF_THE_BUS), ("GPU-1", FindingKind.OFF_THE_BUS),
                     ("GPU-2", FindingKind.ECC_DBE)}
