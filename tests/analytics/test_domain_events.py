"""Failure domains (issue 35 item 2): many nodes of one rack failing within minutes are one
domain-event finding; a GPU that comes back healthy after it was never faulty; one that does not keeps
its own finding. Fleets are fleet samples read by the production ``scan``."""

from __future__ import annotations

import pandas as pd
import pytest
from builders import HEALTH_START, busy_fleet, step_counter

from gpuwarden.analytics.health import scan
from gpuwarden.analytics.health.catalogue import CORDONING_ACTIONS
from gpuwarden.fleet import FindingKind

RACKS = {f"gpu-{n:03d}": f"rack-{n // 4}" for n in range(12)}  # 3 racks of 4 nodes


def power_event(frame: pd.DataFrame, nodes: range, minute: int, gone_minutes: int,
                never_back: tuple[int, int] | None = None) -> pd.DataFrame:
    """``nodes`` lose power at ``minute``: every GPU logs XID 79 (off the bus), the nodes report
    nothing for ``gone_minutes``, then come back. ``never_back`` (node, gpu): that GPU stays gone."""
    for node in nodes:
        step_counter(frame, node, "xid_79_total", minute + node % 2)  # over two samples, node by node
    stamp = frame["timestamp"]
    gone = frame["node"].isin([f"gpu-{n:03d}" for n in nodes])
    gone &= (stamp > HEALTH_START + pd.Timedelta(minutes=minute + 1))
    gone &= stamp < HEALTH_START + pd.Timedelta(minutes=minute + 1 + gone_minutes)
    if never_back is not None:
        node, gpu = never_back
        gone |= frame["gpu_uuid"].eq(f"GPU-{node}-{gpu}") & (stamp > HEALTH_START + pd.Timedelta(minutes=minute + 1))
    return frame[~gone].reset_index(drop=True)


def acting(findings):
    return [f for f in findings if f.recommended_action in CORDONING_ACTIONS]


@pytest.mark.parametrize("domains", [RACKS, None], ids=["racks-known", "no-topology"])
def test_a_rack_power_event_is_one_domain_finding_and_nothing_is_cordoned(domains):
    frame = power_event(busy_fleet(12, [f"job-{n}" for n in range(12)], minutes=90), range(4), 20, 10)
    findings = scan(frame, domains=domains)
    events = [f for f in findings if f.kind == FindingKind.DOMAIN_EVENT]
    assert len(events) == 1, [(f.kind, f.node) for f in findings]
    event = events[0].evidence
    assert event["domain"] == ("rack-0" if domains else "(no topology: the fleet)")
    assert event["cause"] == "power" and event["node_count"] == 4 and event["gpu_count"] == 32
    assert event["came_back_healthy"] == 32 and event["nodes_still_faulty"] == []
    assert events[0].recommended_action is None
    assert not acting(findings) and not [f for f in findings if f.kind == FindingKind.OFF_THE_BUS]


def test_a_gpu_that_never_comes_back_keeps_its_finding_marked_with_the_event():
    frame = power_event(busy_fleet(12, [f"job-{n}" for n in range(12)], minutes=90), range(4), 20, 10,
                        never_back=(2, 5))
    findings = scan(frame, domains=RACKS)
    event = next(f for f in findings if f.kind == FindingKind.DOMAIN_EVENT)
    assert event.evidence["came_back_healthy"] == 31 and event.evidence["nodes_still_faulty"] == ["gpu-002"]
    left = [f for f in findings if f.kind != FindingKind.DOMAIN_EVENT]
    assert {f.gpu_uuid for f in left} == {"GPU-2-5"}, [(f.kind, f.gpu_uuid) for f in left]
    # its fall off the bus is marked with the event; its series never returning is its own later finding
    assert [f.evidence.get("domain_event") for f in left if f.kind == FindingKind.OFF_THE_BUS] == ["rack-0"]
    assert FindingKind.GPU_SERIES_LOST in {f.kind for f in left}
    assert {f.gpu_uuid for f in acting(findings)} == {"GPU-2-5"}


def test_failures_spread_over_racks_are_not_one_rack_event_but_are_one_where_no_topology_is_known():
    """Two nodes in each of two racks at once: below the three nodes a rack needs; with no topology
    the fleet is one domain and the four are one event."""
    frame = power_event(busy_fleet(12, [f"job-{n}" for n in range(12)], minutes=90), range(0, 2), 20, 10)
    frame = power_event(frame, range(4, 6), 20, 10)
    assert not [f for f in scan(frame, domains=RACKS) if f.kind == FindingKind.DOMAIN_EVENT]
    events = [f for f in scan(frame) if f.kind == FindingKind.DOMAIN_EVENT]
    assert len(events) == 1 and events[0].evidence["node_count"] == 4


def test_lone_faults_minutes_apart_stay_their_own_findings():
    frame = busy_fleet(12, [f"job-{n}" for n in range(12)], minutes=90)
    for k, node in enumerate((0, 5, 9)):
        step_counter(frame, node, "xid_79_total", 10 + 20 * k, gpus=range(1))
    findings = scan(frame, domains=RACKS)
    assert sorted(f.kind for f in findings) == [FindingKind.OFF_THE_BUS] * 3
    assert len(acting(findings)) == 3


@pytest.mark.parametrize("chunk_minutes", [1, 7, 30])
def test_a_streamed_scan_finds_the_same_event(chunk_minutes):
    """Chunks as small as one sample: each sees an ongoing episode as starting at its first sample, so
    the event is folded over the merged findings, and matches one scan over everything."""
    from gpuwarden.analytics.health import StreamingScanner

    frame = power_event(busy_fleet(12, [f"job-{n}" for n in range(12)], minutes=60), range(4), 20, 10,
                        never_back=(2, 5))
    scanner = StreamingScanner(context_s=1800.0, domains=RACKS)
    for _, chunk in frame.groupby(frame["timestamp"].dt.floor(f"{chunk_minutes}min"), sort=True):
        scanner.feed(chunk)
    streamed = [f for f in scanner.findings() if f.kind == FindingKind.DOMAIN_EVENT]
    whole = [f for f in scan(frame, domains=RACKS) if f.kind == FindingKind.DOMAIN_EVENT]
    assert len(streamed) == len(whole) == 1
    keys = ("domain", "node_count", "gpu_count", "came_back_healthy", "nodes_still_faulty")
    assert {k: streamed[0].evidence[k] for k in keys} == {k: whole[0].evidence[k] for k in keys}
    assert streamed[0].first_seen == whole[0].first_seen
