"""Test data, built in one place: GPU readings, fleet-sample frames, cluster snapshots, workloads,
and a cluster that misbehaves on chosen actions.

Each builder gives a healthy, busy default and takes keywords for what a test is about, so a test
names only the values it checks (kueue's ``MakeWorkload(...).Obj()`` and KAI's scenario builders
are the model). Counters default to 0, everything unmeasured to null: never a fake 0 for a gauge.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, UTC
from typing import Any

import numpy as np
import pandas as pd

from gpuwarden.fleet import SAMPLE_COLUMNS, XID_COLUMN_NAMES
from gpuwarden.store import coerce

from gpuwarden.fleet import (
    SAMPLE_COLUMN_NAMES,
    THROTTLE_REASONS,
    Action,
    ActionResult,
    ClusterSnapshot,
    Gpu,
    GpuReading,
    GpuRequest,
    Location,
    Node,
    Placement,
    PriceTier,
    PriorityClass,
    Team,
    Topology,
    Workload,
    WorkloadKind,
    WorkloadPhase,
    WorkloadState,
)

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
GIB = 2**30
START = pd.Timestamp("2026-11-23T00:00:00Z")
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

# Sample columns that are monotonic counters (or codes whose healthy value is 0).
COUNTER_COLUMNS = tuple(name for name in SAMPLE_COLUMN_NAMES
                        if name.startswith(("xid_", "ecc_", "remapped_", "pcie_", "nvlink_")) or name == "recovery_action")

# -- GPU readings (what a backend gives the exporter) ---------------------------------------------

H100_READING_VALUES: Mapping[str, float] = {
    "gpu_util_ratio": 0.22, "mem_used_bytes": 10 * GIB, "mem_total_bytes": 80 * GIB, "power_watts": 312.5,
    "temperature_celsius": 61.0, "sm_clock_mhz": 1980.0, "ecc_sbe_volatile_total": 3, "ecc_dbe_volatile_total": 0,
    "remapped_rows_correctable_total": 1, "remapped_rows_uncorrectable_total": 0, "remapped_rows_pending": 0,
    "remapped_rows_failure": 0, "pcie_replay_total": 7, "recovery_action": 0,
    "throttle_reasons_bitmask": THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_power_cap"],
    "xid_48_total": 2, "xid_79_total": 0, "xid_other_total": 5,
}


def gpu_reading(index: int = 0, *, node: str = "node-a", model: str = H100, uuid: str | None = None,
                namespace: str | None = "ml", pod: str | None = "", container: str | None = "trainer",
                base: Mapping[str, float] = H100_READING_VALUES, **values: float) -> GpuReading:
    """A whole GPU held by pod ``train-<index>`` (``pod=""``; None: no pod), with ``base`` values
    updated by ``values``."""
    return GpuReading(
        node=node, gpu_uuid=uuid or f"GPU-0000-{index}", gpu_index=index, model=model,
        pci_bus_id=f"00000000:{index + 0x18:02X}:00.0",
        namespace=namespace if pod is not None else None, pod=f"train-{index}" if pod == "" else pod,
        container=container if pod is not None else None, values={**base, **values},
    )


def mig_reading(instance: int = 2, profile: str = "3g.40gb", *, index: int = 1, node: str = "node-a",
                model: str = A100, uuid: str = "GPU-bbb", **values: float) -> GpuReading:
    """One MIG instance without a pod; no GPM (its SM activity is absent)."""
    return GpuReading(node=node, gpu_uuid=uuid, gpu_index=index, model=model, mig_instance_id=instance,
                      mig_profile=profile, values={"gpu_util_ratio": 0.5, "mem_used_bytes": GIB,
                                                   "mem_total_bytes": 40 * GIB, **values})


# -- fleet samples (the store's table) --------------------------------------------------------------

BUSY_SAMPLE: Mapping[str, object] = {
    "gpu_util_ratio": 0.97, "sm_active_ratio": 0.9, "mem_used_bytes": 6e10, "mem_total_bytes": 8e10,
    "power_watts": 650.0, "temperature_celsius": 60.0, "sm_clock_mhz": 1500.0, "throttle_reasons_bitmask": 0,
}


def sample_row(timestamp: pd.Timestamp | datetime, node: str, gpu_index: int, *, cluster: str = "test",
               model: str = H100, pod: str | None = "", team: str | None = "ml", **values: object) -> dict[str, object]:
    """One sample of a busy, healthy GPU ``GPU-<node>-<index>``, held by pod ``job-<node>`` of
    ``team`` (``pod=""``; None: unallocated). Counters are 0; ``values`` override anything."""
    pod = f"job-{node}" if pod == "" else pod
    row: dict[str, object] = {
        "timestamp": timestamp, "cluster": cluster, "node": node, "gpu_uuid": f"GPU-{node}-{gpu_index}",
        "gpu_index": gpu_index, "model": model, "mig_instance": None,
        "namespace": team if pod else None, "pod": pod, "team": team if pod else None,
        "project": "core" if pod else None, **BUSY_SAMPLE, **dict.fromkeys(COUNTER_COLUMNS, 0),
    }
    row.update(values)
    return row


ONE_MINUTE = pd.Timedelta(minutes=1)


def samples_frame(rows: Iterable[Mapping[str, object]]) -> pd.DataFrame:
    """Rows as a frame with every sample column, in the documented order (absent ones null)."""
    return pd.DataFrame(list(rows)).reindex(columns=list(SAMPLE_COLUMN_NAMES))


def fleet_samples(minutes: int, nodes: Sequence[str] = ("gpu-a", "gpu-b"), gpus_per_node: int = 2, *,
                  start: pd.Timestamp = START, step: pd.Timedelta = ONE_MINUTE,
                  vary: Callable[[int, str, int], Mapping[str, object]] | None = None,
                  **values: object) -> pd.DataFrame:
    """``minutes`` samples of every GPU of ``nodes``; ``vary(minute, node, gpu_index)`` gives the
    values of one sample that differ from the others (a fault, a phase)."""
    rows = []
    for minute in range(minutes):
        for node in nodes:
            for gpu in range(gpus_per_node):
                row = sample_row(start + minute * step, node, gpu)
                row.update(values)
                row.update(vary(minute, node, gpu) if vary is not None else {})
                rows.append(row)
    return samples_frame(rows)


# -- cluster snapshots and workloads ----------------------------------------------------------------


ONE_TOPOLOGY = Topology("nvl-0", "leaf-0", "rack-0")


def node(name: str, gpus: int = 4, *, pool: str = "train", model: str = H100, price_tier: str = "on-demand",
         topology: Topology = ONE_TOPOLOGY) -> Node:
    return Node(name, pool, Location("cloud"), PriceTier(price_tier), topology, model, gpus, 64000, 2**39)


def gpus_of(*nodes: Node) -> tuple[Gpu, ...]:
    """Every GPU of the nodes, named ``GPU-<node>-<index>``."""
    return tuple(Gpu(f"GPU-{n.name}-{g}", g, n.name, n.gpu_model) for n in nodes for g in range(n.gpu_count))


def workload(name: str, team: str = "alpha", gpus: int = 1, phase: WorkloadPhase = WorkloadPhase.RUNNING, *,
             on: str | None = None, priority: str = "normal", kind: str = "training",
             submitted_at: datetime = NOW - timedelta(hours=1), **state: Any) -> WorkloadState:
    """A workload of ``gpus`` whole GPUs in namespace ``team``; ``on`` a node name binds it to that
    node's first GPUs (started 30 minutes before :data:`NOW`)."""
    spec = Workload(name, team, WorkloadKind(kind), team, team, PriorityClass(priority), GpuRequest(count=gpus))
    placements = tuple(Placement(on, f"GPU-{on}-{g}") for g in range(gpus)) if on else ()
    started = NOW - timedelta(minutes=30) if on else None
    return WorkloadState(spec, phase, submitted_at, started, placements, **state)


def snapshot(nodes: Sequence[Node] = (), workloads: Sequence[WorkloadState] = (),
             teams: Sequence[Team] = (Team("alpha", 4, 8), Team("beta", 4, 8)), *,
             taken_at: datetime = NOW, **fields: Any) -> ClusterSnapshot:
    """A snapshot of ``nodes`` (default: two 4-GPU nodes) with all their GPUs."""
    nodes = tuple(nodes) or (node("node-0"), node("node-1"))
    return ClusterSnapshot(taken_at=taken_at, nodes=tuple(nodes), gpus=gpus_of(*nodes), workloads=tuple(workloads),
                           teams=tuple(teams), **fields)


class InterceptedCluster:
    """A ``Cluster`` whose ``apply`` goes through ``intercept`` first: it may answer an action
    itself (a refusal), raise (the API server went away), or return None to pass it on."""

    def __init__(self, inner: Any, intercept: Callable[[Action], ActionResult | None]):
        self.inner = inner
        self.intercept = intercept

    def snapshot(self) -> ClusterSnapshot:
        snapshot: ClusterSnapshot = self.inner.snapshot()
        return snapshot

    def apply(self, action: Action) -> ActionResult:
        answer = self.intercept(action)
        if answer is not None:
            return answer
        result: ActionResult = self.inner.apply(action)
        return result


def make_samples(start="2026-11-01T00:00:00Z", steps=30, gpus=4, step_seconds=60) -> pd.DataFrame:
    """A small, schema-correct frame: ``gpus`` GPUs on two nodes, one with SM activity missing."""
    rng = np.random.default_rng(0)
    times = pd.date_range(start, periods=steps, freq=f"{step_seconds}s", tz="UTC")
    rows = len(times) * gpus
    frame = {}
    for column in SAMPLE_COLUMNS:
        if column.kind == "float":
            frame[column.name] = rng.random(rows)
        elif column.kind == "int":
            frame[column.name] = np.tile(np.arange(gpus), len(times))
    frame.update(
        timestamp=np.repeat(times, gpus),
        cluster="c1",
        node=np.tile([f"node-{g // 2}" for g in range(gpus)], len(times)),
        gpu_uuid=np.tile([f"GPU-{g:04d}" for g in range(gpus)], len(times)),
        gpu_index=np.tile(np.arange(gpus) % 2, len(times)),
        model="NVIDIA H100 80GB HBM3",
        mig_instance=None,
        namespace=np.tile(["team-a", None] * (gpus // 2), len(times)),
        pod=np.tile(["pod-1", None] * (gpus // 2), len(times)),
        team=np.tile(["team-a", None] * (gpus // 2), len(times)),
        project=np.tile(["proj", None] * (gpus // 2), len(times)),
        mem_total_bytes=80.0 * 2**30,
    )
    out = pd.DataFrame(frame)
    out.loc[out["gpu_uuid"] == "GPU-0003", ["sm_active_ratio", "tensor_active_ratio", "dram_active_ratio"]] = np.nan
    out.loc[out["gpu_uuid"] == "GPU-0002", "recovery_action"] = None
    return coerce(out)


class FakeBackend:
    """A fake GPU backend (no GPU on CI): serves ``self.readings``; can raise or block on demand."""

    name = "fake"

    def __init__(self, readings: list[GpuReading]):
        self.readings = list(readings)
        self.error: Exception | None = None
        self.gate: threading.Event | None = None  # when set to an unset Event, read() blocks on it
        self.reads = 0

    def read(self) -> tuple[GpuReading, ...]:
        self.reads += 1
        gate = self.gate
        if gate is not None:
            gate.wait(10)
        if self.error is not None:
            raise self.error
        return tuple(self.readings)

    def driver_version(self) -> str:
        return DRIVER


DRIVER = "550.90.07"


# -- tiered nodes: one busy H100 per node, priced by its tier (fleet/price_tiers, the Cost page) ----

TIER_START = pd.Timestamp("2026-03-02T00:00:00Z")
TIER_HOURS = 2
TIER_WATTS = 500.0
TIER_NODES = ("gpu-spot-0", "gpu-owned-0", "gpu-plain-0")


def tier_samples() -> pd.DataFrame:
    """One busy H100 per node of TIER_NODES for TIER_HOURS from TIER_START, at 60 s, drawing TIER_WATTS."""
    rows = []
    for minute in range(TIER_HOURS * 60):
        for index, node in enumerate(TIER_NODES):
            row = dict.fromkeys(SAMPLE_COLUMN_NAMES, np.nan)
            row.update(timestamp=TIER_START + pd.Timedelta(minutes=minute), cluster="c", node=node,
                       gpu_uuid=f"GPU-{index}", gpu_index=0, model=H100, mig_instance=None, pod=f"job-{index}",
                       namespace="ns-a", team="a", project="a-p", attribution="known", gpu_util_ratio=0.9,
                       sm_active_ratio=0.9, mem_used_bytes=60.0 * 2**30, mem_total_bytes=80.0 * 2**30,
                       power_watts=TIER_WATTS)
            rows.append(row)
    return coerce(pd.DataFrame(rows))


# -- busy H100 fleets for the health scan's fleet-wide rules (storms, failure domains) --------------
HEALTH_START = pd.Timestamp("2026-01-05T00:00:00Z")
HEALTH_COUNTERS = ["ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "remapped_rows_correctable_total",
                   "remapped_rows_uncorrectable_total", "remapped_rows_pending", "remapped_rows_failure",
                   "pcie_replay_total", "recovery_action", *XID_COLUMN_NAMES]


def busy_fleet(nodes: int, pods: list[str | None], minutes: int = 60, seed: int = 0) -> pd.DataFrame:
    """``nodes`` x 8 busy H100s sampled each minute; node ``n``'s GPUs are held by ``pods[n]`` in
    namespace ``ml`` (None: not attributed)."""
    rng = np.random.default_rng(seed)
    n, g, m = np.meshgrid(np.arange(nodes), np.arange(8), np.arange(minutes), indexing="ij")
    n, g, m = n.ravel(), g.ravel(), m.ravel()
    rows = len(n)
    pod = np.array(pods, dtype=object)[n]
    frame = pd.DataFrame({
        "timestamp": HEALTH_START + pd.to_timedelta(m, unit="min"), "cluster": "test",
        "node": [f"gpu-{i:03d}" for i in n], "gpu_uuid": [f"GPU-{i}-{j}" for i, j in zip(n, g)], "gpu_index": g,
        "model": "NVIDIA H100 80GB HBM3", "mig_instance": None, "namespace": np.where(pd.isna(pod), None, "ml"), "pod": pod,
        "team": "ml", "project": "core", "gpu_util_ratio": 0.97, "sm_active_ratio": 0.9, "tensor_active_ratio": 0.6,
        "dram_active_ratio": 0.2, "mem_used_bytes": 6e10, "mem_total_bytes": 8e10,
        "power_watts": 650 + rng.normal(0, 10, rows), "temperature_celsius": 60 + rng.normal(0, 1, rows),
        "sm_clock_mhz": 1500 + rng.normal(0, 20, rows), "throttle_reasons_bitmask": 0, **{c: 0 for c in HEALTH_COUNTERS},
    })
    return frame.reindex(columns=list(SAMPLE_COLUMN_NAMES))


def step_counter(frame: pd.DataFrame, node: int, column: str, minute: int, count: int = 1, gpus: range = range(8)) -> None:
    """Counter ``column`` on ``node``'s GPUs steps up by ``count`` at ``minute`` (and stays)."""
    mask = frame["node"].eq(f"gpu-{node:03d}") & frame["gpu_uuid"].isin([f"GPU-{node}-{g}" for g in gpus])
    mask &= frame["timestamp"] >= HEALTH_START + pd.Timedelta(minutes=minute)
    frame.loc[mask, column] = frame.loc[mask, column] + count
