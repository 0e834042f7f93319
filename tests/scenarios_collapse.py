"""Fleets for the observability-collapse rule: fleet samples plus the scrape health Prometheus would
record, with ordinary scrape gaps and no fault, or with GPUs falling off the bus (XID 79) after their
observability collapsed.

Ordinary gaps, per node-day unless said: a Prometheus restart (the whole fleet silent 1-5 min, once a
fleet-day), the node's exporter target down 1-10 min (0.5), a slow spell of the node's scrapes (3-8x
for 5-30 min, 0.5), the whole fleet's scrapes slow (2-4x for 10-30 min, once a fleet-day), a network
blip (one failed scrape, 2), a node reboot (silent 5-15 min, its GPUs back one by one over 0-3 scrapes
with slow first scrapes, 0.3). A detachment: over 10-40 minutes before its XID 79 the GPU's series
thin out (missing at 15% to 60% of scrapes), the node's scrapes slow down (up to 5x) and lose its
samples, ``up`` fails now and then; at the XID the GPU's series stop for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

GPUS = 8
MODEL = "NVIDIA H100 80GB HBM3"
T0 = pd.Timestamp("2026-11-02T00:00:00Z")
SAMPLES_PER_GPU, SAMPLES_PER_NODE = 40, 60


@dataclass
class CollapseFleet:
    samples: pd.DataFrame
    scrape: pd.DataFrame
    detachments: list[tuple[str, str, pd.Timestamp]] = field(default_factory=list)  # (node, GPU, XID 79 time)
    node_days: float = 0.0
    events: dict[str, int] = field(default_factory=dict)


def make_fleet(seed: int, nodes: int = 12, days: float = 1.0, step_s: float = 30.0, detachments: int = 0,
               ordinary: bool = True) -> CollapseFleet:
    rng = np.random.default_rng(seed)
    n = int(days * 86400 / step_s)
    steps = lambda seconds: max(1, int(round(seconds / step_s)))  # noqa: E731
    present = np.ones((nodes, GPUS, n), dtype=bool)  # GPU series in the samples
    scraped = np.ones((nodes, n))  # up ratio of the node's target in the step; NaN: no scrape recorded
    drops = np.zeros((nodes, n))
    slow = np.ones((nodes, n))
    events: dict[str, int] = {}

    def count(name: str) -> None:
        events[name] = events.get(name, 0) + 1

    def poisson(rate: float, span: float) -> int:
        return int(rng.poisson(rate * span))

    if ordinary:
        for _ in range(max(1, poisson(1.0, days))):  # Prometheus restarts: nothing recorded at all
            at, length = rng.integers(0, n), steps(rng.uniform(60, 300))
            present[:, :, at:at + length] = False
            scraped[:, at:at + length] = np.nan
            count("prometheus_restart")
        for _ in range(poisson(1.0, days)):  # the whole fleet's scrapes slow
            at, length = rng.integers(0, n), steps(rng.uniform(600, 1800))
            slow[:, at:at + length] *= rng.uniform(2, 4)
            count("fleet_slow_scrapes")
        for node in range(nodes):
            for _ in range(poisson(0.5, days)):  # target down
                at, length = rng.integers(0, n), steps(rng.uniform(60, 600))
                present[node, :, at:at + length] = False
                scraped[node, at:at + length] = 0.0
                drops[node, at] = 1
                count("target_down")
            for _ in range(poisson(0.5, days)):  # slow spell of one node's scrapes
                at, length = rng.integers(0, n), steps(rng.uniform(300, 1800))
                slow[node, at:at + length] *= rng.uniform(3, 8)
                count("node_slow_scrapes")
            for _ in range(poisson(2.0, days)):  # network blip: one scrape fails
                at = rng.integers(0, n)
                present[node, :, at] = False
                scraped[node, at] = 0.0
                drops[node, at] = 1
                count("network_blip")
            for _ in range(poisson(0.3, days)):  # node reboot: GPUs come back one by one, first scrapes slow
                at, length = rng.integers(0, n), steps(rng.uniform(300, 900))
                present[node, :, at:at + length] = False
                scraped[node, at:at + length] = 0.0
                drops[node, at] = 1
                back = at + length
                for gpu in range(GPUS):
                    present[node, gpu, back:back + int(rng.integers(0, 4))] = False
                slow[node, back:back + 3] *= 2.5
                count("node_reboot")
    truth: list[tuple[int, int, int]] = []
    for k in range(detachments):
        node, gpu = int(rng.integers(0, nodes)), int(rng.integers(0, GPUS))
        if any(node == d[0] for d in truth):
            node = (node + k + 1) % nodes
        xid = int(rng.integers(steps(8 * 3600), n - steps(3600)))
        lead = steps(rng.uniform(600, 2400))
        ramp = np.linspace(0.0, 1.0, lead)
        start = xid - lead
        missing = rng.random(lead) < 0.15 + 0.45 * ramp
        present[node, gpu, start:xid] &= ~missing
        slow[node, start:xid] *= 1.0 + 4.0 * ramp
        fails = (rng.random(lead) < 0.12) & (ramp > 0.4)
        scraped[node, start:xid] = np.where(fails, 0.5, scraped[node, start:xid])
        drops[node, start:xid] += fails
        present[node, gpu, xid + 1:] = False
        present[node, gpu, xid] = True
        truth.append((node, gpu, xid))
        count("detachment")
    return from_presence(rng, present, scraped, drops, slow, truth, step_s, events)


def from_presence(rng: np.random.Generator, present: np.ndarray, scraped: np.ndarray, drops: np.ndarray | None = None,
                  slow: np.ndarray | None = None, truth: list[tuple[int, int, int]] | None = None, step_s: float = 30.0,
                  events: dict[str, int] | None = None) -> CollapseFleet:
    """A fleet from its presence (node, GPU, step) and its targets' up ratio (node, step; NaN: no
    scrape recorded), failed-scrape counts and slowness factors; ``truth``: (node, GPU, step) of XID 79."""
    nodes, _, n = present.shape
    times = T0 + pd.to_timedelta(np.arange(n) * step_s, unit="s")
    drops = np.zeros((nodes, n)) if drops is None else drops
    slow = np.ones((nodes, n)) if slow is None else slow
    truth = truth or []
    samples = _samples(rng, times, present, truth)
    scrape = _scrape(rng, times, present, scraped, drops, slow)
    node_names = [f"h100-{i:03d}" for i in range(nodes)]
    return CollapseFleet(samples, scrape, [(node_names[nd], uuid(nd, g), times[x]) for nd, g, x in truth],
                         nodes * n * step_s / 86400.0, events or {})


def uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:04d}{gpu:04d}-0000-4000-8000-000000000000"


def _samples(rng: np.random.Generator, times: pd.DatetimeIndex, present: np.ndarray,
             truth: list[tuple[int, int, int]]) -> pd.DataFrame:
    nodes, gpus, n = present.shape
    node_i, gpu_i, t_i = np.nonzero(present)
    rows = node_i.size
    util = np.clip(0.85 + rng.normal(0, 0.03, rows), 0, 1)
    xid = np.zeros(rows, dtype=np.int64)
    for node, gpu, at in truth:
        xid[(node_i == node) & (gpu_i == gpu) & (t_i >= at)] = 1
    return pd.DataFrame({
        "timestamp": times[t_i], "cluster": "collapse", "node": np.array([f"h100-{i:03d}" for i in range(nodes)])[node_i],
        "gpu_uuid": np.array([[uuid(a, b) for b in range(gpus)] for a in range(nodes)])[node_i, gpu_i],
        "gpu_index": gpu_i.astype(np.int64), "model": MODEL, "mem_total_bytes": 85.0e9,
        "mem_used_bytes": 60.0e9 + rng.normal(0, 1e9, rows), "gpu_util_ratio": util,
        "sm_active_ratio": util * 0.9, "power_watts": 550.0 + rng.normal(0, 15, rows),
        "temperature_celsius": 62.0 + rng.normal(0, 1.5, rows), "sm_clock_mhz": 1980.0 + rng.normal(0, 8, rows),
        "xid_79_total": pd.array(xid, dtype="Int64"),
    })


def _scrape(rng: np.random.Generator, times: pd.DatetimeIndex, present: np.ndarray, scraped: np.ndarray,
            drops: np.ndarray, slow: np.ndarray) -> pd.DataFrame:
    nodes, _, n = present.shape
    base = rng.uniform(0.2, 0.6, (nodes, 1))
    duration = base * slow * rng.lognormal(0, 0.08, (nodes, n))
    samples = SAMPLES_PER_NODE + SAMPLES_PER_GPU * present.sum(axis=1).astype(float)
    ok = scraped > 0
    node_i, t_i = np.nonzero(np.isfinite(scraped))
    return pd.DataFrame({
        "timestamp": times[t_i], "node": np.array([f"h100-{i:03d}" for i in range(nodes)])[node_i], "job": "gpuwarden",
        "instance": np.array([f"10.0.0.{i}:9400" for i in range(nodes)])[node_i],
        "up_ratio": scraped[node_i, t_i], "up_drops": drops[node_i, t_i],
        "scrape_duration_seconds": np.where(ok, duration, 0.002)[node_i, t_i],
        "scrape_samples_scraped": np.where(ok, samples, 0.0)[node_i, t_i],
    })
