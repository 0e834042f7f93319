"""Demo data for the metrics endpoint and the Grafana dashboards' tests: a small simulated fleet
(faults made frequent, so a few hours hold findings) written to a real LocalStore, a cluster
snapshot from SimCluster, and an audit log written by the actuator's own AuditLog; and OpenMetrics
text with timestamps for ``promtool tsdb create-blocks-from openmetrics``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd

from gpuwarden.remediation.audit import AuditEntry, AuditLog, Outcome
from gpuwarden.cli.metrics_cmd import add_parser
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.fleet import cluster_state
from gpuwarden.sim import SimConfig
from gpuwarden.sim.cluster import SimCluster
from gpuwarden.store import LocalStore

STEP_SECONDS = 60
# Faults frequent enough that a few hours of 32 GPUs hold critical and warning findings.
FAULTS_PER_GPU_DAY = {"xid79_off_bus": 0.6, "xid119_gsp_timeout": 0.6, "thermal_throttle": 0.6, "row_remap_pending": 0.6}


def build_fleet(data_dir: Path, root: Path, hours: float, end: datetime) -> dict:
    """Store, cluster snapshot and audit log of ``hours`` of a 4x8-GPU simulated fleet ending at ``end``."""
    steps = int(hours * 3600 / STEP_SECONDS)
    start = end - timedelta(seconds=steps * STEP_SECONDS)
    config = SimConfig(nodes=4, gpus_per_node=8, warmup_days=0.5, data_dir=data_dir, start=start, training_load=3.0,
                       counts_overrides=FAULTS_PER_GPU_DAY)
    sim = simulated_fleet(config)
    store = LocalStore(root / "store")
    frames = []
    for frame in sim.iter_chunks(steps, chunk_steps=60):
        store.append(frame)
        frames.append(frame)
    cluster_dir = root / "cluster"
    cluster_state.write_snapshot(cluster_dir, SimCluster(sim).snapshot())
    audit = root / "audit.jsonl"
    write_audit(audit, end)
    return {"store": root / "store", "cluster": cluster_dir, "audit": audit, "samples": pd.concat(frames),
            "start": start, "end": end, "sim": sim}


def write_audit(path: Path, end: datetime) -> None:
    """What an actuator in approve mode leaves: applied and refused actions, two waiting, a breaker open."""
    log = AuditLog(path)
    at = end - timedelta(minutes=50)
    for minutes, outcome, kind, target, approval in (
        (0, Outcome.APPLIED, "cordon", "node-a", None), (5, Outcome.REFUSED, "drain", "node-a", None),
        (10, Outcome.AWAITING_APPROVAL, "drain", "node-b", "a1"), (20, Outcome.AWAITING_APPROVAL, "cordon", "node-c", "a2"),
        (30, Outcome.BREAKER_OPEN, "breaker", "actuator", None),
    ):
        log.record(AuditEntry(at=at + timedelta(minutes=minutes), mode="approve", outcome=outcome, kind=kind,
                              target=target, reason="test", approval_id=approval, by="actuator"))


def serve_args(paths: dict, *extra: str) -> argparse.Namespace:
    """The parsed arguments of ``gpuwarden metrics show`` over the demo store (the command's own parser)."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["metrics", "show", "--source", "local", "--store", str(paths["store"]),
                              "--audit", str(paths["audit"]), "--cluster-state", str(paths["cluster"]), *extra])


def openmetrics(series: Iterable[tuple[str, float, float]]) -> str:
    """OpenMetrics text of (series 'name{labels}', value, unix seconds), grouped by series in time order."""
    lines = sorted(series, key=lambda s: (s[0], s[2]))
    body = "".join(f"{name} {_number(value)} {stamp:.3f}\n" for name, value, stamp in lines)
    return body + "# EOF\n"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return {math.inf: "+Inf", -math.inf: "-Inf"}.get(value, repr(value))


def exposition_series(text: str, stamp: float) -> list[tuple[str, float, float]]:
    """The samples of an exposition-format scrape (text format 0.0.4) as (series, value, stamp): each
    sample line is ``series value``, so the series text is kept exactly as served."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out.append((series, float(value), stamp))
    return out


def now_floor() -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0)


def exporter_series(samples: pd.DataFrame) -> list[tuple[str, float, float]]:
    """What gpuwarden's exporter would have served for every step of ``samples`` (its own renderer over
    the simulated backend's readings), as timestamped series."""
    import threading
    from types import SimpleNamespace

    from gpuwarden.exporter import ExporterSnapshot, load_catalogue
    from gpuwarden.exporter.collector import render_text
    from gpuwarden.sim.backend import SimGpuBackend

    catalogue = load_catalogue()
    out: list[tuple[str, float, float]] = []
    for stamp, frame in samples.groupby("timestamp", sort=True):
        seconds = pd.Timestamp(stamp).timestamp()
        backend = SimGpuBackend(SimpleNamespace(lock=threading.Lock(), latest=frame))  # type: ignore[arg-type]
        snapshot = ExporterSnapshot(readings=backend.read(), driver_version=backend.driver_version(), success=True,
                                    timestamp_seconds=seconds, duration_seconds=0.05,
                                    last_success_timestamp_seconds=seconds, pod_attribution=True, attribution="known")
        out += exposition_series(render_text(snapshot, catalogue).decode(), seconds)
    return out
