"""A fault scenario written as a DEFAULT dcgm-exporter would serve it, as OpenMetrics text with
timestamps for ``promtool tsdb create-blocks-from openmetrics``.

What a default dcgm-exporter serves (its ``etc/default-counters.csv``): clocks, temperatures,
power, energy, the PCIe replay counter, NVML utilisation (GPU, memory copy, encoder, decoder),
``DCGM_FI_DEV_XID_ERRORS`` as the gauge of the LAST XID, framebuffer memory, NVLink bandwidth,
row-remap counters, and the DCP profiling gauges (graphics engine, tensor pipe, DRAM, PCIe bytes).
No ECC or NVLink error counters, no SM activity, no throttle reasons, no gpuwarden series. Labels
as dcgm-exporter writes them (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname``, ``DCGM_FI_DRIVER_VERSION``; ``GPU_I_PROFILE``/``GPU_I_ID`` on MIG instances;
``pod``/``namespace``/``container`` in its Kubernetes mode where a pod holds the device), plus
Prometheus' ``job``/``instance``.

The fleet behaves as GPUs do, written from how the hardware and workloads behave, not from any
detector's threshold: training pods run at 60-95% utilisation at full clocks; GPUs nobody holds
flicker at 0-5%; one data-loader-bound pod runs one busy minute in three. The faults are the
ground truth a test checks the findings against (``Scenario.truth``). Bad input rides along: a
device without a UUID, a ``gpu`` label that is not a number, a model nobody catalogued, and a
PCIe replay counter that goes backwards (a driver reload).

Counters are declared ``unknown``: OpenMetrics types a counter only when its samples end in
``_total``, and DCGM's names do not (the TSDB keeps no type anyway).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

SCRAPE_S = 30
HOURS = 6
DRIVER = "550.54.15"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
UNKNOWN_MODEL = "NVIDIA Z900 Prototype 141GB"
MIB = 1024 * 1024

GAUGES = ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
          "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
          "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
          "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
          "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
          "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES")
COUNTERS = ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")


@dataclass
class Device:
    """One GPU (or MIG instance) as dcgm-exporter labels it, and what happens to it."""

    node: str
    index: str  # the gpu label as served (a bad one is not a number)
    uuid: str | None
    model: str = H100
    pod: str | None = None
    namespace: str = "ml"
    load: str = "busy"  # busy | idle | starved
    mig: tuple[str, str] | None = None  # (GPU_I_ID, GPU_I_PROFILE)
    xids: list[tuple[float, int]] = field(default_factory=list)  # (hours, code)
    stops_at_h: float | None = None  # its series end here
    replay_reset_at_h: float | None = None  # the PCIe replay counter drops to 0 here

    def labels(self, instance: str) -> dict[str, str]:
        out = {"gpu": self.index, "pci_bus_id": f"00000000:{18 + int(self.index) if self.index.isdigit() else 99:02X}:00.0",
               "device": f"nvidia{self.index}", "modelName": self.model, "Hostname": self.node,
               "DCGM_FI_DRIVER_VERSION": DRIVER, "job": "dcgm-exporter", "instance": instance}
        if self.uuid is not None:
            out["UUID"] = self.uuid
        if self.mig is not None:
            out["GPU_I_ID"], out["GPU_I_PROFILE"] = self.mig
        if self.pod is not None:
            out.update(pod=self.pod, namespace=self.namespace, container="main")
        return out


@dataclass
class Scenario:
    devices: list[Device]
    node_stops_at_h: dict[str, float]
    start_s: int
    hours: float = HOURS

    @property
    def end_s(self) -> int:
        return self.start_s + int(self.hours * 3600)

    def valid(self) -> list[Device]:
        """Devices a reader can identify (a UUID and a numeric index)."""
        return [d for d in self.devices if d.uuid is not None and d.index.isdigit()]

    def stop_s(self, device: Device) -> int:
        stops = [self.end_s]
        if device.stops_at_h is not None:
            stops.append(self.start_s + int(device.stops_at_h * 3600))
        if device.node in self.node_stops_at_h:
            stops.append(self.start_s + int(self.node_stops_at_h[device.node] * 3600))
        return min(stops)

    def truth(self) -> dict[str, object]:
        """The faults as they happened: XID events (uuid, code), GPUs whose series stopped while
        node-mates reported, nodes gone silent, and the GPUs with no fault at all."""
        fatal = {(d.uuid, code) for d in self.devices for _, code in d.xids if code not in (13, 31, 43, 45, 68)}
        application = {(d.uuid, code) for d in self.devices for _, code in d.xids if code in (13, 31, 43, 45, 68)}
        lost = {d.uuid for d in self.devices if d.stops_at_h is not None and d.node not in self.node_stops_at_h}
        faulty = {uuid for uuid, _ in fatal} | lost
        return {"xid_events": fatal, "application_events": application, "lost": lost,
                "silent_nodes": set(self.node_stops_at_h),
                "healthy": {d.uuid for d in self.valid() if d.uuid not in faulty}}


def scenario(start_s: int) -> Scenario:
    """The fleet: four 4-GPU H100 nodes, a MIG A100, and a node of an uncatalogued model."""
    def uuid(node: str, index: int) -> str:
        digest = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
        return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"

    d: list[Device] = []
    # dgx-a: pod mapping on; GPU 1 logs XID 79 and falls off the bus.
    d += [Device("dgx-a", "0", uuid("dgx-a", 0), pod="train-a-0", replay_reset_at_h=3.0),
          Device("dgx-a", "1", uuid("dgx-a", 1), pod="train-a-1", xids=[(2.0, 79)], stops_at_h=2.02),
          Device("dgx-a", "2", uuid("dgx-a", 2), load="idle"), Device("dgx-a", "3", uuid("dgx-a", 3), load="idle")]
    # dgx-b: GPU 2 a double-bit ECC error (XID 48); GPU 3's series stop with no XID (its exporter
    # lost it); GPU 1 is a data-loader-bound pod; a device whose gpu label is not a number.
    d += [Device("dgx-b", "0", uuid("dgx-b", 0), pod="train-b-0"),
          Device("dgx-b", "1", uuid("dgx-b", 1), pod="loader-b-1", load="starved"),
          Device("dgx-b", "2", uuid("dgx-b", 2), pod="train-b-2", xids=[(1.5, 48)]),
          Device("dgx-b", "3", uuid("dgx-b", 3), load="idle", stops_at_h=3.0),
          Device("dgx-b", "nvidia4", "GPU-badindex-0000-0000-0000-000000000000", load="idle")]
    # dgx-c: application XIDs on GPU 0, contained ECC (94), uncontained ECC (95), NVLink (74, twice:
    # the second is the same value again, invisible in the gauge); a device without a UUID.
    d += [Device("dgx-c", "0", uuid("dgx-c", 0), pod="notebook-c-0", namespace="research", xids=[(1.0, 13), (2.5, 31)]),
          Device("dgx-c", "1", uuid("dgx-c", 1), pod="train-c-1", xids=[(3.5, 94)]),
          Device("dgx-c", "2", uuid("dgx-c", 2), pod="train-c-2", xids=[(4.5, 95)]),
          Device("dgx-c", "3", uuid("dgx-c", 3), pod="train-c-3", xids=[(4.0, 74), (4.8, 74)]),
          Device("dgx-c", "4", None, load="idle")]
    # dgx-d: an exporter without pod mapping; the whole node goes silent at 5 h (node down).
    d += [Device("dgx-d", str(i), uuid("dgx-d", i), load="busy" if i < 2 else "idle") for i in range(4)]
    # mig-e: one A100 split in two 3g.40gb instances, one held.
    mig_uuid = uuid("mig-e", 0)
    d += [Device("mig-e", "0", mig_uuid, model=A100, pod="serve-e-1", namespace="inference", mig=("1", "3g.40gb")),
          Device("mig-e", "0", mig_uuid, model=A100, load="idle", mig=("2", "3g.40gb"))]
    # proto-f: a model nobody catalogued.
    d += [Device("proto-f", "0", uuid("proto-f", 0), model=UNKNOWN_MODEL, pod="bench-f-0"),
          Device("proto-f", "1", uuid("proto-f", 1), model=UNKNOWN_MODEL, load="idle")]
    return Scenario(d, {"dgx-d": 5.0}, start_s)


def _utilisation(device: Device, minute: int, rng: random.Random) -> float:
    if device.load == "idle":
        return float(rng.randint(0, 5))
    if device.load == "starved":  # one busy minute in three, waiting on input between
        return float(rng.randint(55, 80)) if minute % 3 == 0 else float(rng.randint(0, 1))
    return float(rng.randint(60, 95))


def _readings(device: Device, scenario: Scenario, rng: random.Random):
    """(time, {metric: value}) every scrape while the device's series exist."""
    energy_mj = rng.uniform(1e9, 5e9)
    replays = 0.0 if device.replay_reset_at_h is None else 480.0
    for t in range(scenario.start_s, scenario.stop_s(device), SCRAPE_S):
        hours = (t - scenario.start_s) / 3600.0
        util = _utilisation(device, (t - scenario.start_s) // 60, rng)
        share = util / 100.0
        power = 70.0 + 600.0 * share + rng.gauss(0, 8)
        energy_mj += power * SCRAPE_S * 1000.0
        if device.replay_reset_at_h is not None and abs(hours - device.replay_reset_at_h) < SCRAPE_S / 7200.0:
            replays = 0.0  # a driver reload
        total_mib = 40960.0 if device.mig else 81559.0
        used_mib = 200.0 if device.pod is None else total_mib * rng.uniform(0.35, 0.85)
        xid = 0
        for at_h, code in device.xids:
            if hours >= at_h:
                xid = code
        values = {
            "DCGM_FI_DEV_SM_CLOCK": 1980.0 if util > 2 else 345.0, "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
            "DCGM_FI_DEV_GPU_TEMP": 32.0 + 35.0 * share + rng.gauss(0, 1.0),
            "DCGM_FI_DEV_MEMORY_TEMP": 36.0 + 30.0 * share + rng.gauss(0, 1.0),
            "DCGM_FI_DEV_POWER_USAGE": round(power, 3), "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(util * 0.4), "DCGM_FI_DEV_ENC_UTIL": 0.0, "DCGM_FI_DEV_DEC_UTIL": 0.0,
            "DCGM_FI_DEV_XID_ERRORS": float(xid), "DCGM_FI_DEV_FB_USED": round(used_mib),
            "DCGM_FI_DEV_FB_FREE": round(total_mib - used_mib - 500.0), "DCGM_FI_DEV_FB_RESERVED": 500.0,
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0.0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(share * 0.95, 4), "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(share * 0.5, 4),
            "DCGM_FI_PROF_DRAM_ACTIVE": round(share * 0.6, 4), "DCGM_FI_PROF_PCIE_TX_BYTES": round(share * 2e9),
            "DCGM_FI_PROF_PCIE_RX_BYTES": round(share * 3e9),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round(energy_mj), "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": replays,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0.0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0,
        }
        yield t, values


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def openmetrics(scenario: Scenario, seed: int = 7) -> str:
    """The whole scenario as one OpenMetrics exposition with timestamps (one family at a time)."""
    rng = random.Random(seed)
    instances = {node: f"10.0.0.{i + 10}:9400" for i, node in enumerate(sorted({d.node for d in scenario.devices}))}
    samples: dict[str, list[str]] = {m: [] for m in (*GAUGES, *COUNTERS)}
    for device in scenario.devices:
        labels = _label_text(device.labels(instances[device.node]))
        per_metric: dict[str, list[str]] = {m: [] for m in samples}
        for t, values in _readings(device, scenario, rng):
            for metric, value in values.items():
                per_metric[metric].append(f"{metric}{{{labels}}} {value:g} {t}")
        for metric, lines in per_metric.items():
            samples[metric].extend(lines)
    out = []
    for metric, lines in samples.items():
        out.append(f"# TYPE {metric} {'gauge' if metric in GAUGES else 'unknown'}")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"
