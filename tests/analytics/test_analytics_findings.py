"""Findings over fleet samples, as the CLI hands them to the actuator's reconciler
(``gpuwarden.analytics.findings``, moved from the actuator: analytics finds, the actuator acts)."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd

from builders import START, fleet_samples
from gpuwarden.analytics.findings import findings_from_frame, hoarding_findings
from gpuwarden.fleet import FindingKind, Severity

HOURS = 3


def _hoarding_fleet() -> pd.DataFrame:
    """Two nodes for three hours; gpu-a's pod holds 60 GB on both GPUs and never computes."""
    def vary(minute: int, node: str, gpu: int) -> dict[str, object]:
        return {"gpu_util_ratio": 0.0, "sm_active_ratio": 0.0} if node == "gpu-a" else {}
    return fleet_samples(HOURS * 60, vary=vary)


def test_a_hoarding_pod_is_one_finding_naming_it():
    now = (START + pd.Timedelta(hours=HOURS)).to_pydatetime()
    findings = hoarding_findings(_hoarding_fleet(), now)
    assert [(f.kind, f.severity, f.evidence["namespace"], f.evidence["pod"], f.evidence["gpus"]) for f in findings] == [
        (FindingKind.HOARDED, Severity.WARNING, "ml", "job-gpu-a", 2)]
    evidence = findings[0].evidence
    assert evidence["hoarded_share"] > 0.5 and evidence["mean_hoarded_mem_gib"] == round(6e10 / 2**30, 2)
    # first_seen goes back by the hours each of the pod's GPUs was hoarded (less the grace period)
    hoarded_hours_per_gpu = evidence["hoarded_gpu_hours"] / 2
    assert abs((now - findings[0].first_seen) - timedelta(hours=hoarded_hours_per_gpu)) < timedelta(seconds=1)
    assert 2 < hoarded_hours_per_gpu <= HOURS


def test_findings_from_frame_leaves_hoarding_out_on_request_and_an_empty_frame_gives_none():
    frame = _hoarding_fleet()
    now = (START + pd.Timedelta(hours=HOURS)).to_pydatetime()
    with_hoarding = findings_from_frame(frame, now)
    without = findings_from_frame(frame, now, hoarding=False)
    assert [f for f in with_hoarding if f.kind is FindingKind.HOARDED]
    assert not [f for f in without if f.kind is FindingKind.HOARDED]
    assert findings_from_frame(frame.iloc[:0], now) == [] and findings_from_frame(None, now) == []
