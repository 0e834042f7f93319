"""``gpuwarden demo --dra``: the simulated fleet as a cluster whose GPUs NVIDIA's DRA driver allocates
(issue 34 item 8). Its pods hold GPUs and MIG devices through claims named as Kubernetes names them;
Kubernetes' own reader (``gpuwarden.kube.dra``, over HTTP on the fake API server) reads its objects as
the fleet counts them; the queue counts what the claims hold in GPU units; the exporter's series carry
dcgm-exporter's claim labels; without ``--dra`` nothing of it is there."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from gpuwarden.cli.demo_dra import DraBackend, demo_backend
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.fleet import WorkloadPhase
from gpuwarden.sim import SimConfig
from gpuwarden.sim.backend import SimGpuBackend
from gpuwarden.sim.dra import DRIVER, claim_name

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]{5}"


@pytest.fixture(scope="module")
def fleet(data_dir):
    """A DRA fleet with MIG GPUs, a few simulated hours in: whole-GPU, gang and MIG pods running."""
    simulation = simulated_fleet(SimConfig(nodes=16, warmup_days=0.3, data_dir=data_dir, dra=True))
    simulation.run(20)
    return simulation


def _claims_by_pod(simulation) -> dict[tuple[str, str], dict]:
    out = {}
    for claim in simulation.cluster.dra.claims():
        owner = claim["metadata"]["ownerReferences"][0]
        out[(claim["metadata"]["namespace"], owner["name"])] = claim
    return out


def test_a_claim_is_named_as_the_resource_claim_controller_names_it():
    name = claim_name("svc-000001", "gpu", "seed-1")
    assert re.fullmatch(f"svc-000001-gpu-{SUFFIX}", name)
    assert claim_name("svc-000001", "gpu", "seed-1") == name != claim_name("svc-000001", "gpu", "seed-2")
    long_pod = "a-very-long-training-job-name-for-the-llm-pretraining-team-0042-7"
    cut = claim_name(long_pod, "gpu", "x")
    # generateName past 57 characters: both parts cut in proportion (no hyphen after), 5 characters added
    assert len(cut) <= 63 and re.fullmatch(f"{long_pod[:65 * 57 // 70]}-gp{SUFFIX}", cut)


def test_every_gpu_pod_holds_its_devices_through_its_own_claim(fleet):
    claims = _claims_by_pod(fleet)
    running = [job for job in fleet.jobs if job.phase == WorkloadPhase.RUNNING]
    assert running
    held_devices = 0
    for job in running:
        workload = job.spec.workload
        pods = [workload.name] if workload.gang_size == 1 else [f"{workload.name}-{k}" for k in range(workload.gang_size)]
        for pod in pods:
            claim = claims[(workload.namespace, pod)]
            assert re.fullmatch(f"{re.escape(pod)}-gpu-{SUFFIX}", claim["metadata"]["name"])
            assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": pod,
                                                       "uid": claim["metadata"]["ownerReferences"][0]["uid"]}]
            results = claim["status"]["allocation"]["devices"]["results"]
            assert {r["driver"] for r in results} == {DRIVER}
            held_devices += len(results)
    assert held_devices == int((fleet.dev_job >= 0).sum())  # every device a job holds, through exactly one claim
    waiting = [job for job in fleet.jobs if job.phase == WorkloadPhase.PENDING]
    for job in waiting:  # made with the pod, not allocated until the round binds it
        assert claims[(job.spec.workload.namespace, job.spec.workload.name)]["status"] == {}


def test_kubernetes_reader_reads_the_objects_as_the_fleet_counts_them(fleet, tmp_path):
    """The objects through HTTP, the official client and gpuwarden's DRA reader: nothing skipped, each
    running pod's GPU units from its claim (a MIG device its share) as the simulation holds them."""
    from fake_kube_api import RESOURCE, FakeKubeAPI

    from gpuwarden.kube import KubeApi, load_client
    from gpuwarden.kube.dra import read_dra
    from gpuwarden.kube.inventory_nodes import PodRequest

    objects = fleet.cluster.dra.objects()
    server = FakeKubeAPI().start().with_dra()
    try:
        for plural in ("deviceclasses", "resourceslices", "resourceclaims"):
            for item in objects[plural]:
                server.add(RESOURCE, plural, item)
        inventory = read_dra(KubeApi(load_client(server.kubeconfig(tmp_path / "kc.json")), backoff_seconds=0.01))
    finally:
        server.stop()
    assert inventory.served and not inventory.skipped
    assert len(inventory.devices) == fleet.device_count  # every GPU and MIG device published once
    held = fleet.cluster.dra.held()
    units_of = defaultdict(float)
    for device in held.values():
        units_of[(device.claim_namespace, device.pod)] += device.gpu_units
    mig_pods = 0
    for pod in objects["pods"]:
        if "nodeName" not in pod["spec"]:
            continue
        request = inventory.pod_request(pod, PodRequest())
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        read = inventory.pods[f"{key[0]}/{key[1]}"]
        assert read.allocated and read.gpu_units == pytest.approx(units_of[key])
        mig_pods += request.mig is not None
    assert mig_pods  # MIG devices among them, each counted by its share of its GPU


def test_the_queue_counts_what_the_claims_hold_in_gpu_units(fleet):
    from gpuwarden.scheduling.queue_report import quota_table

    snapshot = fleet.cluster.snapshot()
    held = fleet.cluster.dra.held()
    by_team = defaultdict(float)
    for device in held.values():
        by_team[device.claim_namespace] += device.gpu_units
    table = quota_table(snapshot).set_index("team")["allocated_gpus"]
    for team, units in by_team.items():
        assert table[team] == pytest.approx(units)
    mig = [d for d in held.values() if d.device.count("-mig-")]
    assert mig
    for device in mig:  # a MIG device is its share of its GPU: 3g.40gb on an A100 is 3/7
        slices = int(re.search(r"-mig-(\d)g\d+gb-", device.device).group(1))
        assert slices < 7 and device.gpu_units == pytest.approx(slices / 7)
    # a pod of the trace asking a fraction holds a whole GPU or a MIG device: counted as that, as a DRA cluster reads it
    running = {s.workload.key: s for s in snapshot.workloads if s.phase == WorkloadPhase.RUNNING}
    assert all(s.workload.gpus.fraction_milli == 1000 for s in running.values())


def test_exporter_series_carry_the_claim_labels(fleet):
    from gpuwarden.exporter import ExporterService

    backend = demo_backend(fleet)
    assert isinstance(backend, DraBackend)
    exporter = ExporterService(backend, interval_seconds=60, host="127.0.0.1", port=0)
    exporter.start()
    try:
        exporter.collect_now()
        with urllib.request.urlopen(exporter.url, timeout=10) as response:
            body = response.read().decode()
    finally:
        exporter.stop()
    utilisation = [line for line in body.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    labelled = {}
    for line in utilisation:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if "dra_claim_name" in labels:
            labelled[(labels["Hostname"], labels["UUID"], labels["GPU_I_ID"] or None)] = labels
        else:
            assert not labels.get("pod")  # a GPU a pod holds is held through a claim on a DRA node
    held = fleet.cluster.dra.held()
    assert len(labelled) == len(held)
    for (node, uuid, mig_id), device in held.items():
        labels = labelled[(node, uuid, str(mig_id) if mig_id else None)]
        assert (labels["dra_claim_name"], labels["dra_claim_namespace"], labels["pod"]) == (
            device.claim_name, device.claim_namespace, device.pod)
        assert (labels["dra_driver_name"], labels["dra_pool_name"], labels["dra_device_name"]) == (
            DRIVER, node, device.device)


def test_fleet_samples_carry_the_claim_each_device_is_held_through(fleet):
    """The samples' dra_claim is the claim the exporter labels the device with (SimDra's names)."""
    frame = fleet.latest
    held = fleet.cluster.dra.held()
    got = {}
    for row in frame[frame["dra_claim"].notna()].itertuples():
        mig = int(row.mig_instance.partition(":")[0]) if isinstance(row.mig_instance, str) else None
        got[(row.node, row.gpu_uuid, mig)] = (row.pod, row.dra_claim)
    assert got == {key: (d.pod, f"{d.claim_namespace}/{d.claim_name}") for key, d in held.items()}
    assert any(key[2] is not None for key in got)  # MIG devices among them
    assert frame.loc[frame["pod"].isna(), "dra_claim"].isna().all()


def test_without_dra_there_is_no_claim_anywhere(data_dir):
    simulation = simulated_fleet(SimConfig(nodes=4, warmup_days=0.1, data_dir=data_dir))
    frame = simulation.run(3)
    assert frame["dra_claim"].isna().all() and frame["pod"].notna().any()
    assert simulation.cluster.dra is None
    backend = demo_backend(simulation)
    assert isinstance(backend, SimGpuBackend)
    assert not any(hasattr(reading, "claim") for reading in backend.read())
    assert any(s.workload.gpus.fraction_milli < 1000 for s in simulation.cluster.snapshot().workloads)


def test_demo_help_shows_dra_and_the_headless_demo_runs_as_a_dra_cluster(tmp_path, data_dir):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    shown = subprocess.run([sys.executable, "-m", "gpuwarden.cli", "demo", "--help"], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=60)
    assert "--dra" in shown.stdout
    bad = subprocess.run([sys.executable, "-m", "gpuwarden.cli", "demo", "--dra=yes"], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=60)
    assert bad.returncode == 2 and "--dra" in bad.stderr and "Traceback" not in bad.stderr
    store = tmp_path / "store"
    result = subprocess.run(
        [sys.executable, "-m", "gpuwarden.cli", "demo", "--dra", "--headless", "--duration", "2", "--nodes", "8",
         "--days", "0.05", "--warmup-days", "0.2", "--store", str(store), "--exporter-listen", "127.0.0.1:0",
         "--step-interval", "0.5", "--data-dir", str(data_dir)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "GPUs allocated by DRA (driver gpu.nvidia.com)" in out
    claims, allocated = map(int, re.search(r"DRA claims:\s+(\d+) ResourceClaims of driver gpu\.nvidia\.com, "
                                           r"(\d+) allocated", out).groups())
    assert claims >= allocated > 0
    assert re.search(rf"\S+/\S+-gpu-{SUFFIX} \(pod \S+\): \S+/gpu-\d", out)  # claims named, with their devices
    objects = json.loads((store / "cluster" / "dra.json").read_text())
    assert len(objects["resourceclaims"]) == claims and len(objects["resourceslices"]) == 8
    # the stored week (backfill and live steps) keeps the claims; the cost report breaks them down
    from gpuwarden.analytics import build_ledger, build_report
    from gpuwarden.store import LocalStore

    samples = LocalStore(store).read(columns=["timestamp", "pod", "dra_claim", "mig_instance"])
    claimed = samples[samples["dra_claim"].notna()]
    assert len(claimed) and claimed["pod"].notna().all()
    assert all(re.fullmatch(rf"[^/]+/{re.escape(p)}-gpu-{SUFFIX}", c)
               for p, c in zip(claimed["pod"].astype(str), claimed["dra_claim"].astype(str)))
    by_claim = build_report("cost", build_ledger(LocalStore(store))).tables["by_claim"]
    assert set(by_claim["claim"]) == set(claimed["dra_claim"].astype(str)) and (by_claim["cost"] > 0).all()
    assert by_claim["mig_devices"].sum() > 0
