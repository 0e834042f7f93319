"""DRA-attributed series as the store reads them: dcgm-exporter's (``--kubernetes-enable-dra``) and ours.

dcgm-exporter, with DRA on, maps each ``gpu.nvidia.com`` device a pod holds to a GPU through the
ResourceSlices' ``uuid`` / ``parentUUID`` attributes and copies the GPU's series once per pod and
container, adding ``dra_claim_name``, ``dra_claim_namespace``, ``dra_driver_name``,
``dra_pool_name`` and ``dra_device_name`` (the Kubernetes docs' KubeletPodResourcesDynamicResources
page shows such a series). A MIG device is mapped to its *parent* GPU, so the copies land on the
whole GPU's series (no ``GPU_I_ID``) with ``dra_mig_profile`` and ``dra_mig_device_uuid``; the MIG
instance's own series get no pod. The store reads the whole-GPU copies as the pods' and does not
charge a whole GPU to a pod holding one of its MIG devices.
"""

from __future__ import annotations

import pandas as pd

from gpuwarden.exporter.collector import render_text
from gpuwarden.exporter.snapshot import DraClaim, ExporterSnapshot, attributed
from gpuwarden.fleet import GpuReading
from gpuwarden.fleet.catalogue import load_catalogue
from gpuwarden.store.scraper import parse_exposition
from gpuwarden.store.series import SeriesMapper

AT = pd.Timestamp("2026-05-01T12:00:00Z")
GPU = 'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000009:01:00.0",device="nvidia{gpu}",modelName="NVIDIA GH200 96GB HBM3",Hostname="gh-01"'
CLAIM = ('container="ctr",dra_claim_name="single-gpu",dra_claim_namespace="gpu-test3",dra_device_name="gpu-0",'
         'dra_driver_name="gpu.nvidia.com",dra_pool_name="gh-01",namespace="gpu-test3",pod="{pod}"')
MIG_POD = ('container="main",dra_claim_name="{pod}-mig",dra_claim_namespace="serve",dra_device_name="gpu-1-mig-1g12gb-19-{n}",'
           'dra_driver_name="gpu.nvidia.com",dra_pool_name="gh-01",dra_mig_profile="1g.12gb",dra_mig_device_uuid="MIG-{n}",'
           'namespace="serve",pod="{pod}"')


def series(labels: str, used: float, free: float) -> str:
    return f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}\nDCGM_FI_DEV_FB_FREE{{{labels}}} {free}\n"


def rows(text: str) -> pd.DataFrame:
    """The fleet-samples rows of one page, identity columns as objects with None for null."""
    frame = parse_exposition(text, SeriesMapper(cluster="c"), AT)
    for column in ("pod", "namespace", "mig_instance", "attribution", "team"):
        frame[column] = pd.Series([None if pd.isna(v) else v for v in frame[column].astype(object)], dtype=object,
                                  index=frame.index)
    return frame.sort_values(["gpu_uuid", "mig_instance", "pod"], na_position="last").reset_index(drop=True)


def test_dcgm_exporters_dra_series_carry_the_pods_of_a_shared_claim():
    """The docs' example: one claim shared by pod1 and pod2 on GPU 0; GPU 2 held by nobody."""
    gpu0 = GPU.format(gpu=0, uuid="GPU-a4f34abc-7715-3560-dcea-7238b9611a45")
    text = (series(f"{gpu0},{CLAIM.format(pod='pod1')}", 23792, 70000) + series(f"{gpu0},{CLAIM.format(pod='pod2')}", 23792, 70000)
            + series(GPU.format(gpu=2, uuid="GPU-c"), 0, 96000))
    frame = rows(text)
    held = frame[frame["gpu_uuid"] == "GPU-a4f34abc-7715-3560-dcea-7238b9611a45"]
    assert held[["namespace", "pod"]].values.tolist() == [["gpu-test3", "pod1"], ["gpu-test3", "pod2"]]
    assert held["team"].tolist() == ["gpu-test3", "gpu-test3"]
    assert held["mem_used_bytes"].tolist() == [23792 * 2**20] * 2
    free = frame[frame["gpu_uuid"] == "GPU-c"]
    assert free["pod"].tolist() == [None]


def test_a_whole_gpus_series_copied_for_mig_device_pods_is_charged_to_none_of_them():
    parent = GPU.format(gpu=1, uuid="GPU-mig-parent")
    mig = lambda n: f'{parent},GPU_I_PROFILE="1g.12gb",GPU_I_ID="{n}"'  # noqa: E731
    text = (series(f"{parent},{MIG_POD.format(pod='infer-a', n=0)}", 5000, 90000)
            + series(f"{parent},{MIG_POD.format(pod='infer-b', n=1)}", 5000, 90000)
            + series(mig(3), 4000, 8000) + series(mig(4), 1000, 11000))
    frame = rows(text)
    assert len(frame) == 3  # the GPU once (its two copies are one row) and its two instances
    assert frame["pod"].tolist() == [None] * 3
    assert frame["mig_instance"].tolist() == ["3:1g.12gb", "4:1g.12gb", None]
    assert frame["attribution"].tolist() == [None] * 3  # nobody can tell from these series who holds the instances


def test_our_exporters_dra_series_read_back_per_gpu_and_per_mig_instance():
    """The exporter's DRA series through the scraper's reader: the pod per GPU and per MIG
    instance, and "failed" where a device nobody could map may be the instance."""
    values = {"mem_used_bytes": 2.0 * 2**30, "mem_total_bytes": 80.0 * 2**30}

    def mig(instance: int, **pod: str) -> GpuReading:
        return GpuReading("node-a", "GPU-1", 1, "NVIDIA H200", mig_instance_id=instance, mig_profile="1g.18gb",
                          mig_uuid=f"MIG-{instance}", values=values, **pod)

    snapshot = ExporterSnapshot(readings=(
        attributed(GpuReading("node-a", "GPU-0", 0, "NVIDIA H200", namespace="ml", pod="train-0", container="t", values=values),
                   claim=DraClaim("ml", "train-0-gpus", "gpu.nvidia.com", "node-a", "gpu-0")),
        attributed(mig(8, namespace="serve", pod="infer-0", container="s"),
                   claim=DraClaim("serve", "infer-0-mig", "gpu.nvidia.com", "node-a", "gpu-1-mig-1g18gb-19-1")),
        attributed(mig(7), owner_unknown=True),
    ), success=True, node="node-a", attribution="known")
    frame = rows(render_text(snapshot, load_catalogue()).decode())
    got = frame[["gpu_uuid", "mig_instance", "pod", "attribution"]].astype(object).values.tolist()
    assert got == [["GPU-0", None, "train-0", "known"], ["GPU-1", "7:1g.18gb", None, "failed"],
                   ["GPU-1", "8:1g.18gb", "infer-0", "known"]]
