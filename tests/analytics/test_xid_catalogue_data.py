"""The XID catalogue as data (issue 35 item 1): NVIDIA's resolution buckets and the cancellation
pairs live in CSV files beside ``catalogue.py``; the rules follow them. A RESTART_APP bucket never
acts on a node, a CONTACT_SUPPORT one is critical, the rest keep the recovery wording's action; an
event a later XID cancels is a closed finding. Fleets are fleet samples read by ``scan``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from builders import busy_fleet as fleet
from builders import node, snapshot
from builders import step_counter as strike
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.analytics.health import StreamingScanner, fault_rules, features, scan
from gpuwarden.analytics.health.catalogue import (BUCKET_EFFECTS, CORDONING_ACTIONS, XID_BUCKETS, XID_BUCKETS_PATH,
                                                  XID_CANCELLATIONS, XID_CANCELLATIONS_PATH, XID_CATALOGUE,
                                                  XID_CATALOGUE_PATH, XID_RULES, Cancellation, XidRule, bucket_effect,
                                                  load_xid_catalogue)
from gpuwarden.fleet import TRACKED_XIDS, ActionKind, FindingKind, Severity
from gpuwarden.fleet.catalogue import CatalogueError
from gpuwarden.remediation import PlanningPolicy, plan_from_findings

START = pd.Timestamp("2026-01-05T00:00:00Z")  # builders.HEALTH_START
# NVIDIA's Xid catalogue, "Resolution Bucket (Immediate Action)", for the codes with a column.
PINNED = {13: "RESTART_APP", 31: "RESTART_APP", 43: "IGNORE", 45: "WORKFLOW_XID_45", 48: "WORKFLOW_XID_48",
          61: "CONTACT_SUPPORT", 62: "RESET_GPU", 63: "IGNORE", 64: "RESET_GPU", 68: "RESTART_APP",
          74: "WORKFLOW_NVLINK_ERR", 79: "RESTART_BM", 92: "IGNORE", 94: "RESTART_APP", 95: "RESET_GPU",
          119: "RESET_GPU", 120: "RESET_GPU"}
APP_BUCKET = sorted(code for code, rule in XID_RULES.items() if bucket_effect(rule.bucket) == "no-node-action")
HARDWARE = sorted(code for code, rule in XID_RULES.items() if rule.action in CORDONING_ACTIONS and code not in (63, 64))


def test_every_row_has_an_allowed_bucket_and_the_pinned_ones_are_nvidias():
    assert set(XID_BUCKETS.values()) <= set(BUCKET_EFFECTS)
    for code, entry in XID_CATALOGUE.items():
        assert entry.bucket == "" or entry.bucket in XID_BUCKETS, (code, entry.bucket)
    assert {code: rule.bucket for code, rule in XID_RULES.items()} == PINNED
    assert set(XID_RULES) == set(TRACKED_XIDS)
    assert sorted(code for code, entry in XID_CATALOGUE.items() if not entry.bucket) == [162, 163]  # empty in NVIDIA's table
    assert XID_CATALOGUE[154].bucket == "XID_154" and XID_CATALOGUE[163].mnemonic == "PSHC_DISENGAGED"
    assert APP_BUCKET == [13, 31, 68, 94]


def test_the_bucket_decides_action_and_severity():
    for code in APP_BUCKET:
        assert XID_RULES[code].action is None, code
    assert XID_RULES[61].severity is Severity.CRITICAL  # CONTACT_SUPPORT (the row's own severity: warning)
    assert {code: XID_RULES[code].action for code in (48, 62, 64, 74, 79, 95, 119, 120)} == {
        48: ActionKind.DRAIN, 62: ActionKind.CORDON, 64: ActionKind.DRAIN, 74: ActionKind.CORDON, 79: ActionKind.DRAIN,
        95: ActionKind.DRAIN, 119: ActionKind.CORDON, 120: ActionKind.CORDON}
    # Where gpuwarden acts though NVIDIA's immediate bucket says IGNORE (docs/health.md says why).
    assert {code: XID_RULES[code].action for code, bucket in PINNED.items() if bucket == "IGNORE"} == {
        43: None, 63: ActionKind.CORDON, 92: ActionKind.TAINT}


def test_the_cancellation_pairs_load():
    assert [(p.code, p.cancelled_by, p.window_s) for p in XID_CANCELLATIONS] == [(163, 162, None)]
    assert "NVSentinel" in XID_CANCELLATIONS[0].source and "PSHC" in XID_CANCELLATIONS[0].source


def _copies(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name, source in (("catalogue", XID_CATALOGUE_PATH), ("buckets", XID_BUCKETS_PATH),
                         ("cancellations", XID_CANCELLATIONS_PATH)):
        paths[name] = tmp_path / source.name
        shutil.copy(source, paths[name])
    return paths


def _edit(path: Path, old: str, new: str) -> int:
    """Replace ``old`` (once) in ``path``; the 1-based line it was on."""
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    return text[:text.index(old)].count("\n") + 1


@pytest.mark.parametrize("file, old, new, message", [
    ("catalogue", "13,ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY,RESTART_APP,",
     "13,ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY,RESTART_APPLICATION,",
     "XID 13, column 'bucket': 'RESTART_APPLICATION' is not one of RESTART_APP, IGNORE"),
    ("catalogue", "app-xid-31,", "app-xid-thirty-one,", "XID 31, column 'kind': 'app-xid-thirty-one' is not a finding kind"),
    ("catalogue", "GSP error,critical,true,0.95", "GSP error,critical,true,1.5",
     "XID 120, column 'confidence': '1.5' is not a number from 0 to 1"),
    ("catalogue", "GSP error,critical,true", "GSP error,severe,true", "XID 120, column 'severity': 'severe'"),
    ("catalogue", "163,PSHC_DISENGAGED,,,,", "163,PSHC_DISENGAGED,,,gsp-timeout,",
     "XID 163, column 'kind': XID 163 has no column in the fleet samples"),
    ("catalogue", "row remapping failed,critical,true,0.99,replace", "row remapping failed,critical,true,0.99,rma",
     "XID 64, column 'recovery': 'rma' is not one of"),
    ("buckets", "CONTACT_SUPPORT,critical,", "CONTACT_SUPPORT,page-someone,",
     "column 'effect' of CONTACT_SUPPORT: 'page-someone' is not one of"),
    ("cancellations", "163,162,,", "163,162,-5,", "column 'window_seconds': '-5' is not a positive number"),
    ("cancellations", "163,162,,", "163,999,,", "column 'cancelled_by': XID 999 has no row in xid_catalogue.csv"),
    ("cancellations", "163,162,,", "163,163,,", "XID 163 cannot cancel itself"),
])
def test_a_broken_copy_is_refused_naming_its_row_and_column(tmp_path, file, old, new, message):
    paths = _copies(tmp_path)
    line = _edit(paths[file], old, new)
    with pytest.raises(CatalogueError) as refused:
        load_xid_catalogue(paths["catalogue"], paths["buckets"], paths["cancellations"])
    assert str(refused.value).startswith(f"{paths[file]}:{line}: ") and message in str(refused.value)


def test_a_copy_missing_a_tracked_code_is_refused(tmp_path):
    paths = _copies(tmp_path)
    text = paths["catalogue"].read_text()
    paths["catalogue"].write_text("".join(line for line in text.splitlines(keepends=True) if not line.startswith("92,")))
    with pytest.raises(CatalogueError, match="XID 92 has a column in the fleet samples but no row with a kind"):
        load_xid_catalogue(paths["catalogue"], paths["buckets"], paths["cancellations"])


# -- the rules follow the data, through the production scan -------------------------------------
def _plan(findings, nodes: int):
    cluster = snapshot([node(f"gpu-{i:03d}", gpus=8) for i in range(nodes)], taken_at=START.to_pydatetime())
    return plan_from_findings(findings, cluster, PlanningPolicy())


events = st.lists(st.tuples(st.sampled_from(APP_BUCKET), st.integers(0, 2), st.integers(0, 7), st.integers(1, 28),
                            st.integers(1, 5000)), min_size=1, max_size=10)
pods = st.lists(st.sampled_from(["llm-worker-0", "llm-worker-1", "nb-7d9f8b6c4d-x2k4q", None]), min_size=3, max_size=3)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(events=events, held_by=pods)
def test_an_app_bucket_xid_never_cordons_or_drains(events, held_by):
    """Any mix of RESTART_APP-bucket XIDs (13, 31, 68, 94), on any GPUs, held by one workload,
    several, or none: findings (per GPU or a storm), and never a node action planned."""
    frame = fleet(3, held_by, minutes=30)
    for code, at_node, gpu, minute, count in events:
        strike(frame, at_node, f"xid_{code}_total", minute, count=count, gpus=range(gpu, gpu + 1))
    findings = scan(frame)
    assert findings, events
    assert all(f.recommended_action is None for f in findings), [(f.kind, f.recommended_action) for f in findings]
    assert _plan(findings, 3).actions == ()


@pytest.mark.parametrize("code", HARDWARE)
def test_a_hardware_bucket_xid_inside_an_app_storm_still_acts(code):
    """Three nodes of one gang crash (XID 13, 31 on every GPU); one GPU also logs a hardware XID:
    the storm is one finding with no action, the hardware XID keeps its catalogue action."""
    frame = fleet(3, ["llm-worker-0", "llm-worker-1", "llm-worker-2"], minutes=30)
    for at_node in range(3):
        strike(frame, at_node, "xid_13_total", 25)
        strike(frame, at_node, "xid_31_total", 25, count=40)
    strike(frame, 1, f"xid_{code}_total", 26, gpus=range(5, 6))
    findings = scan(frame)
    acting = [f for f in findings if f.recommended_action is not None]
    assert [(f.kind, f.gpu_uuid, f.recommended_action) for f in acting] == [(XID_RULES[code].kind, "GPU-1-5", XID_RULES[code].action)]
    assert acting[0].severity is XID_RULES[code].severity and acting[0].evidence["nvidia_bucket"] == PINNED[code]
    assert [f.kind for f in findings if f.kind == FindingKind.XID_STORM] == [FindingKind.XID_STORM]
    assert [(a.action.kind, a.action.target) for a in _plan(findings, 3).actions] == [(XID_RULES[code].action, "gpu-001")]


def test_contact_support_makes_a_finding_critical():
    frame = fleet(1, ["job-0"], minutes=30)
    strike(frame, 0, "xid_61_total", 20, gpus=range(2, 3))
    [finding] = scan(frame)
    assert finding.kind == FindingKind.PMU_BREAKPOINT and finding.severity is Severity.CRITICAL
    assert finding.evidence["nvidia_bucket"] == "CONTACT_SUPPORT" and finding.recommended_action == ActionKind.CORDON


# -- cancellation: XID 162 (PSHC re-engaged) cancels an earlier 163 (disengaged) -----------------
@pytest.fixture
def pshc_counted(monkeypatch):
    """XIDs 162 and 163 have no column in the fleet samples yet (fleet.TRACKED_XIDS): give them one,
    and give 163 a stand-in rule that cordons (reset-gpu), so a cancellation has something to undo."""
    monkeypatch.setattr(features, "COUNTERS", features.COUNTERS + ("xid_162_total", "xid_163_total"))
    stand_in = XidRule(163, FindingKind.GSP_ERROR, XID_CATALOGUE[163].title, Severity.CRITICAL, True, 0.95)
    monkeypatch.setattr(fault_rules, "XID_RULES", {**XID_RULES, 163: stand_in})


def _pshc(strikes: dict[str, list[int]], minutes: int = 60) -> pd.DataFrame:
    frame = fleet(1, ["job-0"], minutes=minutes)
    frame["xid_162_total"], frame["xid_163_total"] = 0, 0
    for column, at_minutes in strikes.items():
        for minute in at_minutes:
            strike(frame, 0, column, minute, gpus=range(4, 5))
    return frame


@pytest.mark.usefixtures("pshc_counted")
def test_163_alone_acts_and_163_then_162_is_closed_with_no_cordon():
    [alone] = scan(_pshc({"xid_163_total": [55]}))
    assert alone.evidence["xid"] == 163 and alone.recommended_action == ActionKind.CORDON and alone.active
    assert [a.action.kind for a in _plan([alone], 1).actions] == [ActionKind.CORDON]

    [closed] = scan(_pshc({"xid_163_total": [50], "xid_162_total": [55]}))
    assert closed.evidence["xid"] == 163 and closed.evidence["cancelled_by"] == 162
    assert closed.evidence["cancelled_at"] == (START + pd.Timedelta(minutes=55)).isoformat()
    assert closed.recommended_action is None and closed.active is False
    assert _plan([closed], 1).actions == ()


@pytest.mark.usefixtures("pshc_counted")
@pytest.mark.parametrize("minutes_162, why", [([50], "same sample: order unknown"), ([40], "162 before 163")])
def test_a_162_that_does_not_follow_cancels_nothing(minutes_162, why):
    [finding] = scan(_pshc({"xid_163_total": [50], "xid_162_total": minutes_162}))
    assert finding.recommended_action == ActionKind.CORDON and "cancelled_by" not in finding.evidence, why


@pytest.mark.usefixtures("pshc_counted")
def test_a_window_bounds_the_cancellation(tmp_path, monkeypatch):
    paths = _copies(tmp_path)
    _edit(paths["cancellations"], "163,162,,", "163,162,300,")
    bounded = load_xid_catalogue(paths["catalogue"], paths["buckets"], paths["cancellations"]).cancellations
    assert bounded == (Cancellation(163, 162, 300.0, XID_CANCELLATIONS[0].source),)
    monkeypatch.setattr(fault_rules, "XID_CANCELLATIONS", bounded)
    [inside] = scan(_pshc({"xid_163_total": [50], "xid_162_total": [54]}))
    [outside] = scan(_pshc({"xid_163_total": [50], "xid_162_total": [56]}))
    assert inside.evidence["cancelled_by"] == 162 and inside.recommended_action is None
    assert "cancelled_by" not in outside.evidence and outside.recommended_action == ActionKind.CORDON


@pytest.mark.usefixtures("pshc_counted")
def test_a_streaming_scan_closes_a_163_reported_open_in_an_earlier_chunk():
    frame = _pshc({"xid_163_total": [20], "xid_162_total": [45]})
    scanner = StreamingScanner()
    stamps = pd.to_datetime(frame["timestamp"], utc=True)
    first = scanner.feed(frame[stamps < START + pd.Timedelta(minutes=30)])
    assert [f.recommended_action for f in first] == [ActionKind.CORDON]  # live, it was open then
    scanner.feed(frame[stamps >= START + pd.Timedelta(minutes=30)])
    [merged] = scanner.findings()
    assert merged.evidence["cancelled_by"] == 162 and merged.recommended_action is None and merged.active is False
    assert merged.first_seen == START + pd.Timedelta(minutes=20)
