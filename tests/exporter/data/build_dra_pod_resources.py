"""Writes ``dra_pod_resources.pb``: a kubelet ``v1.PodResourcesLister/List`` answer, serialized.

The answer a 1.34 kubelet (``KubeletPodResourcesDynamicResources`` on by default) gives on a node
with four H200s (the replay backend's GPUs 0-3; GPU 2 with MIG on, two 1g.18gb instances) where the
NVIDIA DRA driver (``gpu.nvidia.com``, v25.12 names) and the device plugin both run:

- ml/train-dra-0: container ``trainer`` holds gpu-0 and gpu-1 through one claim, and a ComputeDomain
  channel (another driver: not a GPU); container ``log-shipper`` holds nothing;
- serve/infer-mig-0: container ``server`` holds the MIG device gpu-2-mig-1g18gb-19-1 (GPU 2's
  second 1g.18gb instance, placement start 1) through its claim;
- batch/legacy-0: container ``main`` holds GPU 3 through the device plugin (``nvidia.com/gpu``);
- ml/stale-0: container ``main`` holds gpu-4 through a claim: a GPU this node's NVML no longer
  lists (it fell off the bus), so the exporter must count it and attribute nothing to it.

Device names, CDI device ids (``k8s.gpu.nvidia.com/claim=<claim uid>-<device>``) and claim names
(``<pod>-<claim in the pod spec>-<5 random>``, as claims made from a ResourceClaimTemplate are
named) follow the driver and the kubelet. Run from the repository root:

    .venv/bin/python tests/exporter/data/build_dra_pod_resources.py
"""

from __future__ import annotations

from pathlib import Path

from gpuwarden.exporter.podresources import api_pb2

NODE = "node-a"
GPU_3 = "GPU-e6afee92-eeec-8648-8873-5d6a10f1ac07"  # the replay backend's GPU 3
OUT = Path(__file__).with_name("dra_pod_resources.pb")


def claim(container: api_pb2.ContainerResources, namespace: str, name: str, uid: str, driver: str,
          devices: list[str], cdi_vendor: str = "k8s.gpu.nvidia.com") -> None:
    dynamic = container.dynamic_resources.add(claim_name=name, claim_namespace=namespace)
    for device in devices:
        dynamic.claim_resources.add(driver_name=driver, pool_name=NODE, device_name=device,
                                    cdi_devices=[api_pb2.CDIDevice(name=f"{cdi_vendor}/claim={uid}-{device}")])


def build() -> api_pb2.ListPodResourcesResponse:
    response = api_pb2.ListPodResourcesResponse()
    numa0 = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)])

    train = response.pod_resources.add(name="train-dra-0", namespace="ml")
    trainer = train.containers.add(name="trainer", cpu_ids=[4, 5, 6, 7])
    claim(trainer, "ml", "train-dra-0-gpus-5c7xq", "3f2b8c1e-9d4a-4e6b-8f0c-1a2b3c4d5e6f", "gpu.nvidia.com",
          ["gpu-0", "gpu-1"])
    claim(trainer, "ml", "train-dra-0-channel-h2v8m", "7c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f", "compute-domain.nvidia.com",
          ["channel-0"], cdi_vendor="k8s.compute-domain.nvidia.com")
    train.containers.add(name="log-shipper")

    infer = response.pod_resources.add(name="infer-mig-0", namespace="serve")
    server = infer.containers.add(name="server", cpu_ids=[8, 9])
    claim(server, "serve", "infer-mig-0-mig-8kq2w", "b5e6f7a8-1c2d-4e3f-9a4b-5c6d7e8f9a0b", "gpu.nvidia.com",
          ["gpu-2-mig-1g18gb-19-1"])

    legacy = response.pod_resources.add(name="legacy-0", namespace="batch")
    main = legacy.containers.add(name="main", cpu_ids=[10])
    main.devices.add(resource_name="nvidia.com/gpu", device_ids=[GPU_3], topology=numa0)

    stale = response.pod_resources.add(name="stale-0", namespace="ml")
    claim(stale.containers.add(name="main"), "ml", "stale-0-gpu-7wz4d", "0d9e8f7a-6b5c-4d3e-8f2a-1b0c9d8e7f6a",
          "gpu.nvidia.com", ["gpu-4"])
    return response


if __name__ == "__main__":
    OUT.write_bytes(build().SerializeToString())
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
