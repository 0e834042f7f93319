"""The simulated fleet as an exporter GPU backend (the ``GpuBackend`` protocol in ``fleet``).

It serves the readings of the latest simulated step for one node or for all of them; it never
steps the simulation itself (the demo's clock does), so a scrape sees exactly what the store got.
"""

from __future__ import annotations

import math

from gpuwarden.fleet import METRIC_COLUMN_NAMES, GpuReading

from .engine import Simulation

_VALUE_COLUMNS = METRIC_COLUMN_NAMES


class SimGpuBackend:
    name = "sim"

    def __init__(self, simulation: Simulation, nodes: list[str] | None = None) -> None:
        self.simulation = simulation
        self.nodes = set(nodes) if nodes else None

    def driver_version(self) -> str:
        return "580.159.04-sim"

    def read(self) -> tuple[GpuReading, ...]:
        with self.simulation.lock:
            frame = self.simulation.latest
        if frame is None:
            return ()
        if self.nodes is not None:
            frame = frame[frame["node"].isin(self.nodes)]
        readings = []
        columns = {name: frame[name].to_numpy() for name in ("node", "gpu_uuid", "gpu_index", "model", "mig_instance", "namespace", "pod")}
        values = {name: frame[name].to_numpy(dtype="float64", na_value=math.nan) for name in _VALUE_COLUMNS}
        for i in range(len(frame)):
            mig = columns["mig_instance"][i]
            mig_id, mig_profile = (None, None)
            if isinstance(mig, str):
                head, _, mig_profile = mig.partition(":")
                mig_id = int(head)
            measured = {name: float(v[i]) for name, v in values.items() if not math.isnan(v[i])}
            lost = "gpu_util_ratio" not in measured and "power_watts" not in measured
            pod = columns["pod"][i]
            namespace = columns["namespace"][i]
            index = int(columns["gpu_index"][i])
            readings.append(
                GpuReading(
                    node=str(columns["node"][i]), gpu_uuid=str(columns["gpu_uuid"][i]), gpu_index=index,
                    model=str(columns["model"][i]), pci_bus_id=f"00000000:{0x18 + index * 0x10:02X}:00.0",
                    mig_instance_id=mig_id, mig_profile=mig_profile,
                    namespace=namespace if isinstance(namespace, str) else None,
                    pod=pod if isinstance(pod, str) else None, container="main" if isinstance(pod, str) else None,
                    lost=lost, values=measured,
                )
            )
        return tuple(readings)
