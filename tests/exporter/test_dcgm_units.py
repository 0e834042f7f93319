"""The parts of reading a dcgm-exporter, one at a time (no server): XID events from the last-XID
gauge, series checks, the pod-attribution rule, the series-lost finding, coverage notes and the
starved rule on plain utilisation. ``tests/exporter/test_dcgm_exporter.py`` runs them end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuwarden.analytics.classifier import Context, activity, classify
from gpuwarden.analytics.health import scan
from gpuwarden.analytics.health.coverage import Coverage
from gpuwarden.analytics.params import IdleParams
from gpuwarden.analytics.state_codes import STARVED, UNATTRIBUTED
from gpuwarden.store.prometheus.attribution import PodAttribution
from gpuwarden.store.prometheus.series_checks import MAX_NOTES, ReadNotes, check_series
from gpuwarden.store.prometheus.xid_gauge import XidGauges, xid_counts

H100 = "NVIDIA H100 80GB HBM3"
MIN_NS = 60 * 1_000_000_000


def test_a_change_of_the_last_xid_is_one_event_and_the_same_value_again_is_none():
    times = np.arange(8) * MIN_NS
    counts = xid_counts(times, np.array([0, 0, 79, 79, 0, 48, 48, 1000], dtype=float))
    assert counts["79"].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert counts["48"].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert counts["other"].tolist() == [0, 0, 0, 0, 0, 0, 0, 1]  # a code without its own column
    assert xid_counts(times, np.full(8, 13.0)) == {}  # already showing at the start: no event here


def test_a_gpu_with_gpuwardens_counter_is_not_counted_twice_and_chunks_join():
    gauges = XidGauges()
    a = {"Hostname": "n1", "UUID": "GPU-a", "gpu": "0"}
    b = {"Hostname": "n1", "UUID": "GPU-b", "gpu": "1"}
    # Two overlapping chunks of one series (each starts one step early): one series, one event.
    gauges.add(a, np.arange(0, 4) * MIN_NS, np.array([0, 0, 0, 94.0]))
    gauges.add(a, np.arange(3, 7) * MIN_NS, np.array([94.0, 94, 94, 94]))
    gauges.add(b, np.arange(0, 7) * MIN_NS, np.array([0, 0, 79, 79, 79, 79, 79.0]))
    gauges.counted.add(("n1", "GPU-b"))
    events = gauges.events(start_ns=MIN_NS)
    assert [(labels["UUID"], xid, counts.tolist()) for labels, xid, _, counts in events] == [("GPU-a", "94", [0, 0, 1, 1, 1, 1])]
    assert gauges.gauge_gpus() == 1


def test_bad_series_are_skipped_or_kept_with_a_note_naming_them():
    notes = ReadNotes()
    good = {"Hostname": "n1", "UUID": "GPU-a", "gpu": "0", "modelName": H100}
    assert check_series("DCGM_FI_DEV_GPU_UTIL", good, np.array([1.0, 2.0]), False, notes)
    assert notes.lines() == []
    assert not check_series("DCGM_FI_DEV_GPU_UTIL", {**good, "UUID": ""}, np.array([1.0]), False, notes)
    assert not check_series("DCGM_FI_DEV_GPU_UTIL", {**good, "gpu": "x"}, np.array([1.0]), False, notes)
    assert check_series("DCGM_FI_DEV_GPU_UTIL", {**good, "modelName": "Mystery GPU"}, np.array([1.0]), False, notes)
    assert check_series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", good, np.array([5.0, 7.0, 0.0, 1.0]), True, notes)
    text = "\n".join(notes.lines())
    assert 'the series{Hostname="n1",gpu="0"}: no UUID label: skipped' in text
    assert "gpu label 'x' is not a number: skipped" in text
    assert "model 'Mystery GPU' is not in the GPU catalogue" in text and "kept" in text
    assert 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{Hostname="n1",UUID="GPU-a",gpu="0"}: the counter went backwards 1 time(s)' in text
    for i in range(MAX_NOTES + 5):
        notes.add(f"note {i}")
    assert len(notes.lines()) == MAX_NOTES + 2 and notes.lines()[-1].startswith("... and")  # + the count of skipped series


def samples(node_gpus: dict[str, int], minutes: int, stops: dict[tuple[str, int], int] | None = None,
            pods: dict[tuple[str, int], str] | None = None) -> pd.DataFrame:
    rows = []
    start = pd.Timestamp("2026-01-01", tz="UTC")
    for node, count in node_gpus.items():
        for gpu in range(count):
            for minute in range(min(minutes, (stops or {}).get((node, gpu), minutes))):
                rows.append({"timestamp": start + pd.Timedelta(minutes=minute), "cluster": "c", "node": node,
                             "gpu_uuid": f"GPU-{node}-{gpu}", "gpu_index": gpu, "model": H100, "mig_instance": None,
                             "pod": (pods or {}).get((node, gpu)), "attribution": None, "gpu_util_ratio": 0.5,
                             "temperature_celsius": 50.0, "power_watts": 400.0, "sm_clock_mhz": 1980.0,
                             "mem_used_bytes": 1e9, "mem_total_bytes": 8e10})
    return pd.DataFrame(rows)


def test_a_gpu_whose_series_stop_while_node_mates_report_is_a_finding_a_silent_node_is_a_note():
    frame = samples({"n1": 4, "n2": 2}, 120, stops={("n1", 2): 30, ("n2", 0): 60, ("n2", 1): 60})
    findings = scan(frame)
    lost = [f for f in findings if f.kind == "gpu-series-lost"]
    assert [(f.node, f.gpu_uuid) for f in lost] == [("n1", "GPU-n1-2")]
    finding = lost[0]
    assert finding.first_seen == pd.Timestamp("2026-01-01 00:39", tz="UTC")  # last seen 00:29 + 10 min
    assert finding.active and finding.evidence["node_mates_reporting"] == 3
    notes = Coverage().add(frame).notes()
    assert any(n.startswith("node n2: no series from any of its GPUs since 2026-01-01 00:59") for n in notes)
    # A brief gap (a missed scrape or two) is no finding.
    gap = samples({"n1": 4}, 120)
    gap = gap[~((gap["gpu_uuid"] == "GPU-n1-1") & gap["timestamp"].between(gap["timestamp"].min() + pd.Timedelta(minutes=50),
                                                                         gap["timestamp"].min() + pd.Timedelta(minutes=53)))]
    assert not [f for f in scan(gap) if f.kind == "gpu-series-lost"]


def test_coverage_names_the_detectors_without_signals():
    notes = Coverage().add(samples({"n1": 2}, 10)).notes()
    assert any(n.startswith("no ECC counters in this source: HBM degradation is seen only through row remaps") for n in notes)
    assert any(n.startswith("no XID source") for n in notes)
    assert not any("no GPU temperature" in n for n in notes)


def test_pod_attribution_rule_per_exporter_and_its_overrides():
    frame = samples({"mapped": 2, "plain": 2}, 2, pods={("mapped", 0): "train-0"})
    frame["attribution"] = pd.Categorical([None] * len(frame))
    rule = PodAttribution("auto")
    rule.learn([{"instance": f"10.0.0.{i}:9400", "Hostname": node, "UUID": f"GPU-{node}-{gpu}"}
                for i, node in enumerate(("mapped", "plain")) for gpu in range(2)], {"10.0.0.0:9400"})
    out = rule.apply(frame).assign(node=frame["node"], gpu=frame["gpu_index"])
    states = out.groupby(["node", "gpu"])["attribution"].first().astype(object)
    assert states[("mapped", 1)] == "known" and pd.isna(states[("plain", 0)])
    assert "plain" in rule.note() and rule.note().startswith("pod attribution: auto")
    assert (PodAttribution("on").apply(frame)["attribution"] == "known").all()
    off = PodAttribution("off").apply(frame)["attribution"].astype(object)
    assert off.notna().sum() == 2  # only the pod's rows
    with pytest.raises(ValueError, match="'maybe' is not one of auto, on, off"):
        PodAttribution("maybe")


def test_a_gpu_flickering_at_a_few_percent_is_not_starved_a_bursty_pod_is():
    params = IdleParams()
    n = 60
    rng = np.random.default_rng(0)
    flicker = rng.integers(0, 6, n) / 100.0  # NVML utilisation 0-5%, nothing else measured
    bursts = np.where(np.arange(n) % 3 == 0, 0.6, 0.0)  # a busy minute in three, waiting between
    ts = np.arange(n, dtype=np.int64) * MIN_NS
    for util, holder, starved in ((flicker, UNATTRIBUTED, False), (flicker, 0, False), (bursts, 0, True),
                                  (bursts, UNATTRIBUTED, False)):
        acts = activity(util, np.full(n, np.nan), params)
        out = classify(np.zeros(n, np.int64), ts, np.full(n, holder, np.int64), acts, np.zeros(n), Context.empty(),
                       params, MIN_NS)
        assert bool((out.state == STARVED).sum() > n // 2) is starved, (holder, util[:6])


def test_the_cli_offers_the_stores_attribution_rules():
    from gpuwarden.cli.source_notes import POD_ATTRIBUTION_RULES
    from gpuwarden.store.prometheus.attribution import RULES

    assert POD_ATTRIBUTION_RULES == RULES


def test_dcgm_exporters_throttle_bitmask_becomes_the_throttle_reasons_column():
    from gpuwarden.fleet import THROTTLE_REASONS
    from gpuwarden.store.prometheus.throttle_gauge import bits_spec, reason_series
    from gpuwarden.store.scraper import FrameAssembler, SeriesMapper

    mapper = SeriesMapper()
    spec = bits_spec(mapper.catalogue)
    assert spec is not None
    labels = {"Hostname": "n1", "UUID": "GPU-a", "gpu": "0", "modelName": H100}
    masks = np.array([0, THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_power_cap"], np.nan, 1])
    assembler = FrameAssembler(mapper)
    times = np.arange(4) * MIN_NS
    assembler.add("DCGM_FI_DEV_GPU_UTIL", labels, times, np.full(4, 50.0))
    for reason_labels, values in reason_series(spec, labels, masks):
        assembler.add(spec.metric, reason_labels, times, values)
    frame = assembler.frame(["timestamp", "gpu_uuid", "gpu_util_ratio", "throttle_reasons_bitmask"])
    got = frame["throttle_reasons_bitmask"].astype("float64").tolist()
    assert got[:2] == [0.0, 0x44] and np.isnan(got[2]) and got[3] == 1.0  # unmeasured stays null, never 0


def test_the_rule_applies_to_the_recording_rules_states_too():
    """The rules call a pod-less GPU unallocated only where the exporter serves its attribution
    state; under the rule, the recorded states agree with the raw read."""
    frame = pd.DataFrame({"node": ["mapped", "mapped", "plain", "stated"], "gpu_uuid": ["GPU-m", "GPU-m", "GPU-p", "GPU-s"],
                          "pod": [None, "rollup-pod", None, None],
                          "state": ["underutilized", "busy", "idle_unattributed", "busy"]})
    rule = PodAttribution("auto")
    rule.learn([{"instance": node, "node": node, "UUID": uuid} for node, uuid in
                (("mapped", "GPU-m"), ("plain", "GPU-p"), ("stated", "GPU-s"))], {"mapped", "stated"})
    rule.state_nodes.add("stated")  # gpuwarden's exporter: its own state decided already
    assert rule.apply_states(frame)["state"].astype(object).tolist() == ["unallocated", "busy", "idle_unattributed", "busy"]
    assert "plain" in rule.note()
    on = PodAttribution("on")
    on.state_nodes.add("stated")
    assert on.apply_states(frame)["state"].astype(object).tolist() == ["unallocated", "busy", "unallocated", "busy"]
    assert PodAttribution("off").apply_states(frame)["state"].astype(object).tolist() == frame["state"].tolist()
