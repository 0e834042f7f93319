"""Observability collapse (collapse_rules): a warning, with its lead, before a GPU falls off the bus;
no cordon after an ordinary scrape gap (gpu-series-lost times a silence only while node-mates report)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings, strategies as st
from scenarios_collapse import from_presence, make_fleet, uuid

from gpuwarden.analytics.health import StreamingScanner, scan
from gpuwarden.analytics.health.coverage import Coverage
from gpuwarden.fleet import FindingKind, Severity
from gpuwarden.fleet.node_actions import CORDONING_ACTIONS

COLLAPSE = FindingKind.OBSERVABILITY_COLLAPSE


def _cordons(findings):
    return [f for f in findings if f.recommended_action in CORDONING_ACTIONS]


def test_collapse_before_xid79_is_a_warning_with_lead_and_named_evidence():
    fleet = make_fleet(3, nodes=8, days=0.75, detachments=2)
    for mode in (fleet.scrape, None):
        found = scan(fleet.samples, scrape=mode)
        for node, gpu, at in fleet.detachments:
            early = [f for f in found if f.kind == COLLAPSE and f.gpu_uuid == gpu and f.first_seen < at.to_pydatetime()]
            assert early, (node, gpu, mode is None)
            f = early[0]
            assert f.severity is Severity.WARNING and f.recommended_action is None and f.node == node
            assert "series_thinning" in f.evidence["signals"] and f.evidence["missed_samples"] >= 3
            lead = (at.to_pydatetime() - f.first_seen).total_seconds() / 60.0
            assert 2 <= lead <= 45, lead
            if mode is not None:  # with scrape health: at least two signals, the scrape figures beside them
                assert len(f.evidence["signals"]) >= 2 and f.evidence["scrape_health"] == "read"
                assert {"scrape_duration_max_s", "scrape_duration_baseline_s", "samples_scraped_min"} <= set(f.evidence)
            else:
                assert f.evidence["scrape_health"].startswith("none in this source")
            # the detachment itself: XID 79 and the series gone while node-mates report
            kinds = {x.kind for x in found if x.gpu_uuid == gpu}
            assert {FindingKind.OFF_THE_BUS, FindingKind.GPU_SERIES_LOST} <= kinds
        assert {f.gpu_uuid for f in _cordons(found)} == {gpu for _, gpu, _ in fleet.detachments}


def test_streaming_scan_reports_the_collapse_too():
    fleet = make_fleet(4, nodes=6, days=0.75, detachments=1)
    (node, gpu, at), = fleet.detachments
    scanner = StreamingScanner()
    stamps, scrape_stamps = fleet.samples["timestamp"], fleet.scrape["timestamp"]
    for start in pd.date_range(stamps.min(), stamps.max() + pd.Timedelta(hours=6), freq="6h"):
        end = start + pd.Timedelta(hours=6)
        scanner.feed(fleet.samples[(stamps >= start) & (stamps < end)],
                     fleet.scrape[(scrape_stamps >= start) & (scrape_stamps < end)])
    early = [f for f in scanner.findings() if f.kind == COLLAPSE and f.gpu_uuid == gpu]
    assert early and early[0].first_seen < at.to_pydatetime()


def test_ordinary_gaps_raise_no_cordon_and_no_series_lost():
    fleet = make_fleet(5, nodes=12, days=1.0)
    assert fleet.events.get("node_reboot", 0) >= 1
    for mode in (fleet.scrape, None):
        found = scan(fleet.samples, scrape=mode)
        assert not _cordons(found)
        assert not [f for f in found if f.kind == FindingKind.GPU_SERIES_LOST]


def _node_gap(nodes=2, gpus=4, n=240, gap=(60, 84), late=None):
    """Every GPU of node 0 silent over ``gap`` steps (60 s) and its target down; ``late``: GPU -> steps
    it comes back after its node-mates."""
    present = np.ones((nodes, gpus, n), dtype=bool)
    scraped = np.ones((nodes, n))
    present[0, :, gap[0]:gap[1]] = False
    scraped[0, gap[0]:gap[1]] = 0.0
    for gpu, steps in (late or {}).items():
        present[0, gpu, gap[1]:gap[1] + steps] = False
    return present, scraped


def test_a_gpu_back_late_after_a_node_reboot_is_not_lost():
    # node silent 24 min, one GPU back 3 scrapes after its node-mates: at HEAD that was 27 minutes
    # "silent" and a cordon; it was silent 3 minutes while its node-mates reported
    present, scraped = _node_gap(late={2: 3})
    fleet = from_presence(np.random.default_rng(0), present, scraped, step_s=60.0)
    for mode in (fleet.scrape, None):
        found = scan(fleet.samples, scrape=mode)
        assert not [f for f in found if f.kind == FindingKind.GPU_SERIES_LOST] and not _cordons(found)


def test_a_gpu_gone_while_its_node_mates_report_is_still_lost():
    present, scraped = _node_gap(late={2: 200})  # never back after the reboot
    present[1, 1, 150:] = False  # node 1: one GPU falls off, node-mates go on
    fleet = from_presence(np.random.default_rng(0), present, scraped, step_s=60.0)
    for mode in (fleet.scrape, None):
        lost = {(f.node, f.gpu_uuid): f for f in scan(fleet.samples, scrape=mode) if f.kind == FindingKind.GPU_SERIES_LOST}
        assert set(lost) == {("h100-000", uuid(0, 2)), ("h100-001", uuid(1, 1))}
        # timed from the node's return, not from before the reboot
        assert lost[("h100-000", uuid(0, 2))].evidence["silent_minutes_while_mates_reported"] >= 10
        assert lost[("h100-000", uuid(0, 2))].first_seen == (pd.Timestamp("2026-11-02T00:00:00Z")
                                                             + pd.Timedelta(minutes=84 + 10)).to_pydatetime()


def test_a_target_down_hides_its_gpus_only_where_scrape_health_says_so():
    # one node, two exporter targets (GPUs 0-1 and 2-3): the second target is down for 20 minutes
    present = np.ones((1, 4, 120), dtype=bool)
    present[0, 2:, 40:60] = False
    fleet = from_presence(np.random.default_rng(0), present, np.ones((1, 120)), step_s=60.0)
    scrape = fleet.scrape.copy()
    second = scrape.assign(instance="10.0.0.0:9401", up_drops=0.0)
    down = ((second["timestamp"] >= fleet.samples["timestamp"].min() + pd.Timedelta(minutes=40))
            & (second["timestamp"] < fleet.samples["timestamp"].min() + pd.Timedelta(minutes=60)))
    second.loc[down, "up_ratio"] = 0.0
    both = pd.concat([scrape, second], ignore_index=True)
    assert not [f for f in scan(fleet.samples, scrape=both) if f.kind == FindingKind.GPU_SERIES_LOST]
    # presence alone cannot tell: the known limit of a samples file
    assert {f.gpu_uuid for f in scan(fleet.samples) if f.kind == FindingKind.GPU_SERIES_LOST} == {uuid(0, 2), uuid(0, 3)}


def test_coverage_says_when_scrape_health_was_not_read():
    fleet = make_fleet(6, nodes=2, days=0.1)
    assert any("series presence only" in n for n in Coverage().add(fleet.samples).notes())
    assert not any("series presence only" in n for n in Coverage().add(fleet.samples).add_scrape(fleet.scrape).notes())


gaps = st.lists(st.tuples(st.integers(-1, 2),  # node (-1: the whole fleet: a Prometheus restart)
                          st.integers(5, 170),  # start step
                          st.integers(1, 40),  # length (steps of 60 s)
                          st.lists(st.integers(0, 4), min_size=4, max_size=4),  # each GPU back this late
                          st.booleans()),  # the target's up recorded as 0 (else: nothing recorded)
                max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gaps, st.booleans())
def test_any_pattern_of_node_and_target_gaps_never_cordons_a_gpu(pattern, with_scrape):
    nodes, gpus, n = 3, 4, 200
    present = np.ones((nodes, gpus, n), dtype=bool)
    scraped = np.ones((nodes, n))
    drops = np.zeros((nodes, n))
    for node, start, length, late, recorded in pattern:
        for k in range(nodes) if node < 0 else [node]:
            present[k, :, start:start + length] = False
            scraped[k, start:start + length] = 0.0 if recorded and node >= 0 else np.nan
            drops[k, start] = 1.0 if recorded else 0.0
            for gpu, steps in enumerate(late):
                present[k, gpu, start + length:start + length + steps] = False
    fleet = from_presence(np.random.default_rng(len(pattern)), present, scraped, drops, step_s=60.0)
    found = scan(fleet.samples, scrape=fleet.scrape if with_scrape else None)
    assert not _cordons(found), [(f.kind, f.node, f.gpu_uuid, f.evidence) for f in _cordons(found)]
