"""XID storms (issue 35 item 1): application XIDs over a gang's GPUs, or over many nodes at once,
are one job-level finding that never cordons; a hardware fault hidden in the storm is still found.
Fleets are built as fleet samples (the scan's production input) and read by ``scan``."""

from __future__ import annotations

import pytest
from builders import busy_fleet as fleet
from builders import step_counter as strike

from gpuwarden.analytics.health import scan
from gpuwarden.analytics.health.catalogue import CORDONING_ACTIONS
from gpuwarden.analytics.health.storm_rules import workload_stem
from gpuwarden.fleet import ActionKind, FindingKind

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
