"""``gpuwarden demo --dra``: the simulated fleet as a cluster whose GPUs are allocated by Dynamic Resource
Allocation (NVIDIA's DRA driver, ``gpu.nvidia.com``).

The simulation carries it (``SimConfig.dra``, :mod:`gpuwarden.sim.dra`): its pods hold GPUs and MIG
devices through ResourceClaims named as Kubernetes names them, and the scheduling round plans on what
the claims hold, in GPU units. Here, above the simulator and the exporter, the CLI wires the rest:

- the exporter's series of a device a pod holds through a claim carry dcgm-exporter's labels
  ``dra_claim_name``, ``dra_claim_namespace``, ``dra_driver_name``, ``dra_pool_name``,
  ``dra_device_name`` (:class:`DraBackend`: the readings attributed as the kubelet's pod-resources
  answer attributes them on a DRA node);
- the summary counts the claims and names a few, and the objects (DeviceClasses, ResourceSlices,
  ResourceClaims, the pods' claim fields) are written as ``resource.k8s.io/v1`` JSON beside the
  cluster snapshot, ``<store>/cluster/dra.json``, each actuator round (with the snapshot) and at the end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy rooms are imported when the demo runs, not when it parses
    from gpuwarden.fleet import GpuBackend, GpuReading
    from gpuwarden.sim import Simulation
    from gpuwarden.sim.dra import SimDra

DRA_HELP = ("run the simulated fleet as a cluster whose GPUs NVIDIA's DRA driver allocates: pods hold GPUs and MIG "
            "devices through ResourceClaims, the exporter labels them with the claims (docs/dra.md)")
OBJECTS_FILE = "dra.json"  # under <store>/cluster/
SUMMARY_CLAIMS = 3  # claims named in the summary


def dra_config(config, dra: bool):
    """``config`` as a DRA cluster when ``--dra`` was given (a ``dra: true`` in ``--config`` stays)."""
    return config.replace(dra=True) if dra else config


def demo_backend(simulation: Simulation) -> GpuBackend:
    """The exporter's backend of the demo's fleet: the simulated GPUs, attributed through claims on a DRA fleet."""
    from gpuwarden.sim.backend import SimGpuBackend

    backend = SimGpuBackend(simulation)
    dra = simulation.cluster.dra
    return DraBackend(backend, dra) if dra is not None else backend


class DraBackend:
    """A simulated node's GPUs as the exporter reads them on a DRA node: each reading of a device a pod
    holds through a claim carries the claim (driver, pool, device), as the kubelet's ``dynamic_resources``
    give it; a reading without a pod (unallocated, or a node whose kubelet does not answer) carries none."""

    name = "sim"
    labels_pods = True

    def __init__(self, backend: GpuBackend, dra: SimDra) -> None:
        self.backend = backend
        self.dra = dra

    def driver_version(self) -> str:
        return self.backend.driver_version()

    def read(self) -> Sequence[GpuReading]:
        from gpuwarden.exporter.snapshot import DraClaim, attributed
        from gpuwarden.sim.dra import DRIVER

        with self.dra.sim.lock:  # the readings and the claims of one step
            readings = self.backend.read()
            held = self.dra.held()
        out: list[GpuReading] = []
        for reading in readings:
            device = held.get((reading.node, reading.gpu_uuid, reading.mig_instance_id))
            if device is None or reading.pod != device.pod:
                out.append(reading)
                continue
            out.append(attributed(reading, claim=DraClaim(device.claim_namespace, device.claim_name, DRIVER,
                                                          device.pool, device.device)))
        return tuple(out)


def write_objects(store_root: Path, dra: SimDra) -> Path:
    """The fleet's DRA objects as JSON, ``{"deviceclasses": [...], "resourceslices": [...], ...}``."""
    path = Path(store_root) / "cluster" / OBJECTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dra.objects(), indent=1))
    return path


def summary_lines(simulation: Simulation, store_root: Path) -> list[str]:
    """The summary's DRA lines: claims, what the allocated ones hold in GPU units, a few by name; [] off DRA."""
    dra = simulation.cluster.dra
    if dra is None:
        return []
    claims = dra.claims()
    held = dra.held()
    mig = [d for d in held.values() if d.gpu_units < 1.0]
    allocated = sum(1 for c in claims if c["status"])
    units = sum(d.gpu_units for d in held.values())
    lines = [f"DRA claims:       {len(claims)} ResourceClaims of driver gpu.nvidia.com, {allocated} allocated: "
             f"{len(held) - len(mig)} whole GPUs and {len(mig)} MIG devices = {units:,.2f} GPU units; "
             f"{len(claims) - allocated} waiting"]
    by_claim: dict[tuple[str, str], list] = {}
    for device in held.values():
        by_claim.setdefault((device.claim_namespace, device.claim_name), []).append(device)
    shown = sorted(by_claim.items(), key=lambda item: (min(d.gpu_units for d in item[1]) >= 1.0, item[0]))
    for (namespace, name), devices in shown[:SUMMARY_CLAIMS]:
        names = ", ".join(f"{d.pool}/{d.device}" for d in devices[:2]) + (" ..." if len(devices) > 2 else "")
        lines.append(f"                  {namespace}/{name} (pod {devices[0].pod}): {names}, "
                     f"{sum(d.gpu_units for d in devices):.3g} GPU unit(s)")
    lines.append(f"                  objects (resource.k8s.io/v1): {write_objects(store_root, dra)}")
    return lines
