"""XID storms (issue 35 item 1): application XIDs over a gang's GPUs, or over many nodes at once,
are one job-level finding that never cordons; a hardware fault hidden in the storm is still found.
Fleets are built as fleet samples (the scan's production input) and read by ``scan``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuwarden.analytics.health import scan
from gpuwarden.analytics.health.catalogue import CORDONING_ACTIONS
from gpuwarden.analytics.health.storm_rules import workload_stem
from gpuwarden.fleet import ActionKind, SAMPLE_COLUMN_NAMES, FindingKind, XID_COLUMN_NAMES

START = pd.Timestamp("2026-01-05T00:00:00Z")
H100 = "NVIDIA H100 80GB HBM3"
COUNTERS = ["ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "remapped_rows_correctable_total",
            "remapped_rows_uncorrectable_total", "remapped_rows_pending", "remapped_rows_failure", "pcie_replay_total",
            "recovery_action", *XID_COLUMN_NAMES]


def fleet(nodes: int, pods: list[str | None], minutes: int = 60, seed: int = 0) -> pd.DataFrame:
    """``nodes`` x 8 busy H100s sampled each minute; node ``n``'s GPUs are held by ``pods[n]`` in
    namespace ``ml`` (None: not attributed)."""
    rng = np.random.default_rng(seed)
    n, g, m = np.meshgrid(np.arange(nodes), np.arange(8), np.arange(minutes), indexing="ij")
    n, g, m = n.ravel(), g.ravel(), m.ravel()
    rows = len(n)
    pod = np.array(pods, dtype=object)[n]
    frame = pd.DataFrame({
        "timestamp": START + pd.to_timedelta(m, unit="min"), "cluster": "test",
        "node": [f"gpu-{i:03d}" for i in n], "gpu_uuid": [f"GPU-{i}-{j}" for i, j in zip(n, g)], "gpu_index": g,
        "model": H100, "mig_instance": None, "namespace": np.where(pd.isna(pod), None, "ml"), "pod": pod,
        "team": "ml", "project": "core", "gpu_util_ratio": 0.97, "sm_active_ratio": 0.9, "tensor_active_ratio": 0.6,
        "dram_active_ratio": 0.2, "mem_used_bytes": 6e10, "mem_total_bytes": 8e10,
        "power_watts": 650 + rng.normal(0, 10, rows), "temperature_celsius": 60 + rng.normal(0, 1, rows),
        "sm_clock_mhz": 1500 + rng.normal(0, 20, rows), "throttle_reasons_bitmask": 0, **{c: 0 for c in COUNTERS},
    })
    return frame.reindex(columns=list(SAMPLE_COLUMN_NAMES))


def strike(frame: pd.DataFrame, node: int, column: str, minute: int, count: int = 1, gpus: range = range(8)) -> None:
    """Counter ``column`` on ``node``'s GPUs steps up by ``count`` at ``minute`` (and stays)."""
    mask = frame["node"].eq(f"gpu-{node:03d}") & frame["gpu_uuid"].isin([f"GPU-{node}-{g}" for g in gpus])
    mask &= frame["timestamp"] >= START + pd.Timedelta(minutes=minute)
    frame.loc[mask, column] = frame.loc[mask, column] + count


def test_a_gang_crash_over_dozens_of_nodes_is_one_job_finding_and_the_hidden_fault_is_found():
    """40 nodes of one gang (pods llm-worker-0..39) all raise XID 13 and thousands of XID 45 within two
    minutes; node 17's GPU 3 falls off the bus (XID 79) inside the storm. Four other nodes run other work."""
    pods = [f"llm-worker-{i}" for i in range(40)] + [f"notebook-{i}-7d9f8b6c4d-x2k4q" for i in range(4)]
    frame = fleet(44, pods)
    for node in range(40):
        minute = 30 + node % 2  # the crash spreads over two samples
        strike(frame, node, "xid_13_total", minute)
        strike(frame, node, "xid_45_total", minute, count=4000)
    strike(frame, 17, "xid_79_total", 31, gpus=range(3, 4))
    findings = scan(frame)
    storms = [f for f in findings if f.kind == FindingKind.XID_STORM]
    assert len(storms) == 1, [(f.kind, f.node) for f in findings]
    storm = storms[0]
    assert storm.evidence["workload"] == "ml/llm-worker" and storm.evidence["node_count"] == 40
    assert storm.evidence["gpu_count"] == 320 and storm.evidence["xids"] == [13, 45]
    assert storm.evidence["events"] == 320 * 4001 and storm.recommended_action is None
    assert not [f for f in findings if f.kind.startswith("app-xid")], "the per-GPU application findings are folded"
    fault = [f for f in findings if f.kind == FindingKind.OFF_THE_BUS]
    assert [(f.node, f.gpu_uuid) for f in fault] == [("gpu-017", "GPU-17-3")]
    acting = [f for f in findings if f.recommended_action in CORDONING_ACTIONS | {ActionKind.TAINT}]
    assert {f.gpu_uuid for f in acting} == {"GPU-17-3"}, [(f.kind, f.node, f.gpu_uuid) for f in acting]


def test_unattributed_xids_on_many_nodes_within_minutes_are_one_storm_a_few_are_not():
    frame = fleet(6, [None] * 6)
    for node in range(5):
        strike(frame, node, "xid_31_total", 20 + node // 3, gpus=range(2))
    strike(frame, 5, "xid_43_total", 50, gpus=range(1))  # half an hour later: its own finding
    findings = scan(frame)
    storm = [f for f in findings if f.kind == FindingKind.XID_STORM]
    assert len(storm) == 1 and storm[0].evidence["node_count"] == 5 and storm[0].evidence["workload"] is None
    assert [(f.kind, f.node) for f in findings if f.kind != FindingKind.XID_STORM] == [(FindingKind.APP_XID_43, "gpu-005")]


@pytest.mark.parametrize("nodes, apart_minutes, folded", [(1, 0, True), (2, 0, True), (2, 10, False)])
def test_one_workload_on_a_few_gpus(nodes: int, apart_minutes: int, folded: bool):
    """A 2-GPU or 2-node job's crash is one storm; the same workload failing again 10 minutes later
    is a second event, and two lone GPUs stay their own findings."""
    frame = fleet(3, ["trainer-0", "trainer-1", "other"])
    if nodes == 1:
        strike(frame, 0, "xid_13_total", 10, gpus=range(2))
    else:
        strike(frame, 0, "xid_13_total", 10, gpus=range(1))
        strike(frame, 1, "xid_13_total", 10 + apart_minutes, gpus=range(1))
    kinds = sorted(f.kind for f in scan(frame))
    assert kinds == ([FindingKind.XID_STORM] if folded else [FindingKind.APP_XID_13] * 2)


def test_other_workloads_crashing_alone_are_not_folded_together():
    frame = fleet(2, ["a-job-0", "b-job-0"])
    strike(frame, 0, "xid_13_total", 10, gpus=range(1))
    strike(frame, 1, "xid_13_total", 10, gpus=range(1))
    assert sorted(f.kind for f in scan(frame)) == [FindingKind.APP_XID_13] * 2


@pytest.mark.parametrize("namespace, pod, stem", [
    ("ml", "llm-worker-12", "ml/llm-worker"), ("ml", "train-7d9f8b6c4d-x2k4q", "ml/train"),
    ("ml", "job-0-abcde", "ml/job"), (None, "solo", "solo"), ("ml", None, None), ("ml", "12345", "ml/12345"),
])
def test_workload_stem(namespace, pod, stem):
    assert workload_stem(namespace, pod) == stem
