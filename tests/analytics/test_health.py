"""Health findings: each rule, the early-warning detectors, counter resets and bad input, on small
hand-built fleets (one 8-GPU pod, minutes at 60 s) where the expected finding is known exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from gpuwarden.analytics.health import (
    APPLICATION_XIDS,
    CounterBurstDetector,
    FindingLog,
    PeerDeviationDetector,
    XID_RULES,
    scan,
)
from gpuwarden.analytics.health.catalogue import CORDONING_ACTIONS
from gpuwarden.fleet import ActionKind, SAMPLE_COLUMN_NAMES, Severity, THROTTLE_REASONS, XID_COLUMN_NAMES

START = pd.Timestamp("2026-01-05T00:00:00Z")
H100 = "NVIDIA H100 80GB HBM3"
COUNTERS = ["ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "remapped_rows_correctable_total",
            "remapped_rows_uncorrectable_total", "remapped_rows_pending", "remapped_rows_failure", "pcie_replay_total",
            "recovery_action", *XID_COLUMN_NAMES]


def fleet(minutes: int = 120, gpus: int = 8, pool: str = "train-h100", seed: int = 0, nodes: int = 1) -> pd.DataFrame:
    """``gpus`` busy GPUs per node, one 8-GPU pod per node, samples every minute, no faults."""
    rng = np.random.default_rng(seed)
    rows = []
    for minute in range(minutes):
        for n in range(nodes):
            for g in range(gpus):
                rows.append({
                    "timestamp": START + pd.Timedelta(minutes=minute), "cluster": "test", "node": f"{pool}-{n:03d}",
                    "gpu_uuid": f"GPU-{pool}-{n}-{g}", "gpu_index": g, "model": H100, "mig_instance": None,
                    "namespace": "ml", "pod": f"{pool}-job-{n}", "team": "ml", "project": "core",
                    "gpu_util_ratio": 0.97, "sm_active_ratio": 0.9, "tensor_active_ratio": 0.6, "dram_active_ratio": 0.2,
                    "mem_used_bytes": 6e10, "mem_total_bytes": 8e10, "power_watts": 650 + rng.normal(0, 10),
                    "temperature_celsius": 60 + rng.normal(0, 1), "sm_clock_mhz": 1500 + rng.normal(0, 20),
                    "throttle_reasons_bitmask": 0, **{c: 0 for c in COUNTERS},
                })
    return pd.DataFrame(rows).reindex(columns=list(SAMPLE_COLUMN_NAMES))


def at(frame: pd.DataFrame, gpu: int, from_minute: int, to_minute: int | None = None, node: int = 0) -> pd.Series:
    stamp = frame["timestamp"]
    mask = frame["gpu_uuid"].str.endswith(f"-{node}-{gpu}") & (stamp >= START + pd.Timedelta(minutes=from_minute))
    if to_minute is not None:
        mask &= stamp < START + pd.Timedelta(minutes=to_minute)
    return mask


def kinds(findings) -> set[str]:
    return {f.kind for f in findings}


def only(findings, kind):
    matching = [f for f in findings if f.kind == kind]
    assert len(matching) == 1, [(f.kind, f.first_seen) for f in findings]
    return matching[0]


def test_healthy_fleet_has_no_findings():
    assert scan(fleet()) == []


# -- rules for known faults ----------------------------------------------------------------------
GPU_XIDS = sorted(code for code in XID_RULES if code not in APPLICATION_XIDS and code not in (63, 64))


@pytest.mark.parametrize("code", GPU_XIDS)
def test_each_gpu_xid_becomes_its_rule_finding(code):
    frame = fleet(60)
    frame.loc[at(frame, 3, 30), f"xid_{code}_total"] = 1
    rule = XID_RULES[code]
    finding = only(scan(frame), rule.kind)
    assert finding.gpu_uuid.endswith("-0-3") and finding.node == "train-h100-000"
    assert finding.first_seen == START + pd.Timedelta(minutes=30)
    assert finding.recommended_action == rule.action and finding.severity == rule.severity
    assert finding.evidence["xid"] == code and finding.evidence["events"] == 1
    assert finding.evidence["recovery"] == rule.recovery


@pytest.mark.parametrize("code, action", [(48, ActionKind.DRAIN), (79, ActionKind.DRAIN), (95, ActionKind.DRAIN),
                                          (119, ActionKind.CORDON), (74, ActionKind.CORDON), (94, None)])
def test_recovery_of_the_catalogue(code, action):
    assert XID_RULES[code].action == action


@pytest.mark.parametrize("code", APPLICATION_XIDS)
def test_application_xids_never_cordon(code):
    frame = fleet(60)
    frame.loc[at(frame, 1, 10), f"xid_{code}_total"] = 1
    frame.loc[at(frame, 1, 40), f"xid_{code}_total"] = 2
    findings = scan(frame)
    assert [f.kind for f in findings] == [f"app-xid-{code}"]
    assert findings[0].recommended_action is None and findings[0].severity == Severity.INFO
    assert findings[0].evidence["implicates_gpu"] is False and findings[0].evidence["events"] == 2


@pytest.mark.parametrize("value, kind, action", [(1, "recovery-gpu-reset", ActionKind.CORDON),
                                                 (2, "recovery-node-reboot", ActionKind.DRAIN),
                                                 (3, "recovery-drain-p2p", ActionKind.DRAIN),
                                                 (4, "recovery-drain-and-reset", ActionKind.DRAIN)])
def test_nvml_recovery_action(value, kind, action):
    frame = fleet(60)
    frame.loc[at(frame, 2, 20, 45), "recovery_action"] = value
    finding = only(scan(frame), kind)
    assert finding.recommended_action == action
    assert (finding.first_seen, finding.last_seen) == (START + pd.Timedelta(minutes=20), START + pd.Timedelta(minutes=44))
    assert finding.active is False  # it cleared 15 minutes before the end


def test_row_remap_pending_from_xid_63_and_the_pending_flag_is_one_finding():
    frame = fleet(60)
    frame.loc[at(frame, 5, 15), "xid_63_total"] = 1
    frame.loc[at(frame, 5, 15), "remapped_rows_pending"] = 1
    frame.loc[at(frame, 5, 15), "remapped_rows_uncorrectable_total"] = 1
    finding = only(scan(frame), "row-remap-pending")
    assert finding.recommended_action == ActionKind.CORDON and finding.evidence["xid_events"] == 1
    assert finding.active is True


def test_row_remap_failure_flag_without_an_xid_still_means_replace():
    frame = fleet(60)
    frame.loc[at(frame, 6, 25), "remapped_rows_failure"] = 1
    finding = only(scan(frame), "row-remap-failure")
    assert finding.recommended_action == ActionKind.DRAIN and finding.evidence["recovery"] == "replace"


def test_double_bit_error_without_xid_is_uncorrectable_ecc_but_with_xid_94_it_is_contained():
    frame = fleet(60)
    frame.loc[at(frame, 0, 20), "ecc_dbe_volatile_total"] = 1
    frame.loc[at(frame, 7, 20), "ecc_dbe_volatile_total"] = 1
    frame.loc[at(frame, 7, 20), "xid_94_total"] = 1
    findings = scan(frame)
    assert only(findings, "uncorrectable-ecc").gpu_uuid.endswith("-0-0")
    contained = only(findings, "contained-ecc")
    assert contained.gpu_uuid.endswith("-0-7") and contained.recommended_action is None


# -- counter resets and bad input ----------------------------------------------------------------
def test_counter_reset_after_repair_gives_no_fatal_finding():
    """A GPU whose counters were high when the window opened, then reset by a driver reload / GPU
    repair (everything volatile back to 0): no XID, DBE, recovery or precursor finding at all."""
    frame = fleet(120)
    before, after = at(frame, 4, 0, 60), at(frame, 4, 60)
    for column, value in (("xid_48_total", 2), ("xid_79_total", 1), ("xid_95_total", 1), ("ecc_dbe_volatile_total", 3),
                          ("ecc_sbe_volatile_total", 5000), ("pcie_replay_total", 90000), ("xid_13_total", 4)):
        frame.loc[before, column] = value
        frame.loc[after, column] = 0
    assert scan(frame) == []


def test_counter_reset_then_a_real_event_is_still_caught():
    frame = fleet(120)
    frame.loc[at(frame, 4, 0, 60), "xid_48_total"] = 2
    frame.loc[at(frame, 4, 60), "xid_48_total"] = 0
    frame.loc[at(frame, 4, 90), "xid_48_total"] = 1
    finding = only(scan(frame), "ecc-dbe")
    assert finding.first_seen == START + pd.Timedelta(minutes=90) and finding.evidence["events"] == 1


def test_missing_health_columns_vanishing_gpu_and_nulls_do_not_crash():
    frame = fleet(90)
    frame = frame.drop(columns=["recovery_action", "pcie_replay_total", "remapped_rows_failure", "sm_active_ratio",
                                "throttle_reasons_bitmask"])
    frame = frame[~at(frame, 2, 30, 60)]  # GPU 2 vanishes for half an hour
    frame.loc[at(frame, 3, 40, 50), ["ecc_sbe_volatile_total", "xid_48_total", "sm_clock_mhz", "power_watts"]] = np.nan
    # Half an hour without GPU 2 while its node-mates report is its series lost (and found again):
    # that finding alone, no crash and nothing from the missing columns or the nulls.
    findings = scan(frame)
    assert [(f.kind, f.gpu_uuid) for f in findings] == [("gpu-series-lost", frame.loc[at(frame, 2, 0), "gpu_uuid"].iloc[0])]
    assert scan(frame.iloc[0:0]) == []


def test_now_cuts_the_window_and_marks_active_findings():
    frame = fleet(60)
    frame.loc[at(frame, 1, 40), "xid_79_total"] = 1
    assert scan(frame, now=START + pd.Timedelta(minutes=39)) == []
    finding = only(scan(frame, now=START + pd.Timedelta(minutes=45)), "off-the-bus")
    assert finding.active is True


def test_mig_instances_are_one_gpu():
    frame = fleet(30, gpus=2)
    mig = frame[frame["gpu_uuid"].str.endswith("-0-1")]
    extra = mig.assign(mig_instance="2:2g.20gb")
    frame.loc[mig.index, "mig_instance"] = "1:3g.40gb"
    frame = pd.concat([frame, extra], ignore_index=True)
    frame.loc[at(frame, 1, 10), "xid_48_total"] = 1  # both instances report the GPU's counter
    finding = only(scan(frame), "ecc-dbe")
    assert finding.evidence["events"] == 1


# -- early warning -------------------------------------------------------------------------------
def test_sbe_burst_is_hbm_degrading_with_a_trend():
    frame = fleet(360)  # 5 quiet hours first: the GPU's own history says it is normally quiet
    rows = at(frame, 2, 300)
    frame.loc[rows, "ecc_sbe_volatile_total"] = np.arange(rows.sum()) * 2  # 2 per minute from minute 300
    finding = only(scan(frame), "hbm-degrading")
    assert finding.recommended_action == ActionKind.CORDON
    assert START + pd.Timedelta(minutes=300) < finding.first_seen <= START + pd.Timedelta(minutes=310)
    assert finding.evidence["log10_p"] < -6 and finding.evidence["sbe_errors"] > 50


def test_sbe_baseline_is_learned_per_peer_group():
    """The same trickle of single-bit errors is normal in a pool where every GPU shows it and an
    anomaly in a pool where none does: peers, not one global threshold."""
    noisy, quiet = fleet(120, pool="train-a", seed=1), fleet(120, pool="train-b", seed=2)
    noisy["ecc_sbe_volatile_total"] = (noisy["timestamp"] - START).dt.total_seconds() // 60 // 3  # 20 per hour each
    rows = at(quiet, 0, 0)
    quiet.loc[rows, "ecc_sbe_volatile_total"] = np.arange(rows.sum()) // 3
    findings = scan(pd.concat([noisy, quiet], ignore_index=True))
    assert [(f.kind, f.gpu_uuid) for f in findings] == [("hbm-degrading", "GPU-train-b-0-0")]


def test_climbing_pcie_replays_warn_of_falling_off_the_bus_but_a_storm_only_taints():
    # 6 quiet hours first: a burst before the GPU's own history (own_min_history_hours) only taints
    frame = fleet(420)
    rows = at(frame, 1, 360)
    frame.loc[rows, "pcie_replay_total"] = np.cumsum(np.arange(rows.sum()) // 10 + 3)
    rows = at(frame, 6, 360)
    frame.loc[rows, "pcie_replay_total"] = np.arange(rows.sum()) * 300
    findings = scan(frame)
    degrading, storm = only(findings, "pcie-degrading"), only(findings, "pcie-replay-storm")
    assert degrading.gpu_uuid.endswith("-0-1") and degrading.recommended_action == ActionKind.CORDON
    assert storm.gpu_uuid.endswith("-0-6") and storm.recommended_action == ActionKind.TAINT
    assert storm.evidence["peak_replays_per_minute"] >= 300


@pytest.mark.parametrize("bits, kind", [
    (THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["sw_thermal_slowdown"], "thermal-throttle"),
    (THROTTLE_REASONS["hw_power_brake_slowdown"] | THROTTLE_REASONS["hw_slowdown"], "power-brake-throttle"),
    (THROTTLE_REASONS["hw_slowdown"], "hw-slowdown"),
])
def test_throttle_share(bits, kind):
    frame = fleet(60)
    frame.loc[at(frame, 3, 30), "throttle_reasons_bitmask"] = bits
    frame.loc[at(frame, 3, 30), "sm_clock_mhz"] *= 0.5
    frame.loc[at(frame, 3, 50, 52), "throttle_reasons_bitmask"] = np.nan  # unmeasured samples do not count
    finding = only(scan(frame), kind)
    assert finding.recommended_action == ActionKind.TAINT and finding.evidence["share_last_10m"] == 1.0
    assert finding.evidence["clock_vs_peers"] < 0.6


def test_a_sw_power_cap_or_idle_bit_is_not_a_finding():
    frame = fleet(60)
    frame["throttle_reasons_bitmask"] = THROTTLE_REASONS["sw_power_cap"] | THROTTLE_REASONS["gpu_idle"]
    assert scan(frame) == []


def test_a_gpu_warming_alone_is_cooling_degrading_and_only_taints():
    frame = fleet(90)
    frame.loc[at(frame, 2, 30), "temperature_celsius"] += 30
    finding = only(scan(frame), "cooling-degrading")
    assert finding.gpu_uuid.endswith("-0-2") and finding.recommended_action == ActionKind.TAINT
    assert START + pd.Timedelta(minutes=30) < finding.first_seen <= START + pd.Timedelta(minutes=50)


def test_straggler_slower_than_its_gang_with_no_error():
    frame = fleet(180)
    frame.loc[at(frame, 5, 60), "sm_clock_mhz"] *= 0.8
    frame.loc[at(frame, 5, 60), "power_watts"] *= 0.85
    finding = only(scan(frame), "straggler")
    assert finding.gpu_uuid.endswith("-0-5") and finding.recommended_action == ActionKind.CORDON
    assert finding.evidence["clock_vs_peers_60m"] == pytest.approx(0.8, abs=0.03)
    assert START + pd.Timedelta(minutes=75) <= finding.first_seen <= START + pd.Timedelta(minutes=110)


def test_straggler_on_a_mig_gpu_is_compared_with_instances_of_the_same_profile():
    """Free MIG instances draw power by their share of the GPU; a 3g instance must be compared with
    3g instances, not with the mixed median of 3g and 1g ones."""
    frame = fleet(150, gpus=8, pool="infer-a100")
    frame["pod"] = None  # no pod: peers are instances of the same profile at the same operating point
    frame["gpu_util_ratio"] = 0.9
    big = frame.assign(mig_instance="1:3g.40gb", power_watts=frame["power_watts"] * 3 / 7)
    small = frame.assign(mig_instance="2:1g.10gb", power_watts=frame["power_watts"] / 7)
    small2 = frame.assign(mig_instance="3:1g.10gb", power_watts=frame["power_watts"] / 7)
    mig = pd.concat([big, small, small2], ignore_index=True)
    assert scan(mig) == []
    slow = at(mig, 4, 40)
    mig.loc[slow, "sm_clock_mhz"] *= 0.8
    mig.loc[slow, "power_watts"] *= 0.85
    finding = only(scan(mig), "straggler")
    assert finding.gpu_uuid.endswith("-0-4")
    assert finding.evidence["power_vs_peers_60m"] == pytest.approx(0.85, abs=0.03)


def test_slow_but_throttled_or_high_power_is_not_a_straggler():
    frame = fleet(180)
    frame.loc[at(frame, 5, 60), "sm_clock_mhz"] *= 0.8  # slower clock at higher power: a heavier phase
    frame.loc[at(frame, 5, 60), "power_watts"] *= 1.2
    frame.loc[at(frame, 2, 60), "sm_clock_mhz"] *= 0.8
    frame.loc[at(frame, 2, 60), "power_watts"] *= 0.85
    frame.loc[at(frame, 2, 60), "throttle_reasons_bitmask"] = THROTTLE_REASONS["hw_thermal_slowdown"]
    assert "straggler" not in kinds(scan(frame))


# -- de-duplication ------------------------------------------------------------------------------
def test_repeated_events_are_one_finding_with_first_and_last_seen():
    frame = fleet(120)
    for minute, value in ((10, 1), (30, 2), (50, 3)):
        frame.loc[at(frame, 0, minute), "xid_74_total"] = value
    frame.loc[at(frame, 0, 115), "xid_74_total"] = 4  # 65 minutes later: a new episode
    first, second = sorted((f for f in scan(frame) if f.kind == "nvlink-error"), key=lambda f: f.first_seen)
    assert (first.first_seen, first.last_seen) == (START + pd.Timedelta(minutes=10), START + pd.Timedelta(minutes=50))
    assert first.evidence["events"] == 3 and second.evidence["events"] == 1


def test_finding_log_merges_overlapping_scans():
    frame = fleet(120)
    frame.loc[at(frame, 2, 20, 100), "recovery_action"] = 1
    log = FindingLog()
    log.merge(scan(frame[frame["timestamp"] < START + pd.Timedelta(minutes=60)]))
    log.merge(scan(frame[frame["timestamp"] >= START + pd.Timedelta(minutes=40)]))
    [finding] = log.findings()
    assert (finding.first_seen, finding.last_seen) == (START + pd.Timedelta(minutes=20), START + pd.Timedelta(minutes=99))


def test_every_cordon_comes_with_evidence_and_confidence():
    frame = fleet(60)
    frame.loc[at(frame, 1, 30), "xid_48_total"] = 1
    frame.loc[at(frame, 1, 30), "recovery_action"] = 4
    for finding in scan(frame):
        assert finding.recommended_action in CORDONING_ACTIONS
        assert finding.evidence["signal"] and 0.5 <= finding.confidence <= 1.0


# -- detectors: the scikit-learn contract --------------------------------------------------------
@pytest.mark.parametrize("detector", [PeerDeviationDetector(threshold=3.0), CounterBurstDetector(alpha=1e-3)])
def test_detectors_follow_the_estimator_contract(detector):
    copy = clone(detector)
    assert copy.get_params() == detector.get_params()
    X = np.column_stack([np.arange(20.0), np.full(20, 1.0)])
    with pytest.raises(NotFittedError):
        copy.predict(X)
    assert copy.fit(X) is copy
    assert all(name.endswith("_") for name in vars(copy) if name not in copy.get_params())
    assert set(copy.predict(X)) <= {-1, 1}
    assert copy.n_features_in_ == 2


def test_peer_deviation_detector_is_robust_and_per_group():
    rng = np.random.default_rng(0)
    healthy = rng.normal(0.0, 0.01, size=(200, 2))
    groups = np.repeat(["a", "b"], 100)
    healthy[groups == "b"] -= 0.3  # group b runs 26% lower: normal there
    X = np.vstack([healthy, [[-0.3, -0.3]], [[-0.3, 0.0]]])
    labels = np.r_[groups, ["a", "a"]]
    detector = PeerDeviationDetector(threshold=4.0, min_scale=0.025).fit(healthy, groups=groups)
    predicted = detector.predict(X, labels)
    assert (predicted[:200] == 1).all()
    assert predicted[200] == -1  # both features low, in group a
    assert predicted[201] == 1  # only one feature low: require="all"
    assert PeerDeviationDetector(require="any").fit(healthy, groups=groups).predict(X[201:], labels[201:])[0] == -1


def test_counter_burst_detector_uses_the_group_baseline():
    X = np.array([[20.0, 1.0]] * 10 + [[0.0, 1.0]] * 10)
    groups = np.repeat(["noisy", "quiet"], 10)
    detector = CounterBurstDetector(alpha=1e-6, min_rate_per_hour=0.5).fit(X, groups=groups)
    assert detector.rate_.tolist() == [20.0, 0.5]
    assert detector.predict([[25.0, 1.0], [25.0, 1.0]], ["noisy", "quiet"]).tolist() == [1, -1]


def test_peer_deviation_detector_passes_scikit_learn_checks():
    from sklearn.utils.estimator_checks import check_estimator

    reason = "a fixed-threshold detector flags nothing on clean blobs; these checks expect a contamination share"
    check_estimator(PeerDeviationDetector(),
                    expected_failed_checks={"check_outliers_fit_predict": reason, "check_outliers_train": reason})


# -- the registry of finding kinds ---------------------------------------------------------------
def test_a_finding_of_an_unknown_kind_cannot_be_made():
    from gpuwarden.fleet import Finding, FindingKind, FleetValueError

    stamp = pd.Timestamp("2026-03-02T00:00:00Z").to_pydatetime()
    with pytest.raises(FleetValueError, match="Finding.kind: 'xid79_off_bus' is not one of: .*off-the-bus"):
        Finding("xid79_off_bus", Severity.CRITICAL, "n1", "GPU-1", {}, ActionKind.CORDON, 1.0, stamp, stamp)
    named = Finding("off-the-bus", Severity.CRITICAL, "n1", "GPU-1", {}, ActionKind.CORDON, 1.0, stamp, stamp)
    assert named.kind is FindingKind.OFF_THE_BUS and named.kind == "off-the-bus" and f"{named.kind}" == "off-the-bus"


def test_every_health_kind_has_one_rule_in_the_catalogue():
    from gpuwarden.analytics.health.catalogue import EARLY_WARNING_KINDS, NODE_KINDS, NVML_RECOVERY, XID_RULES
    from gpuwarden.fleet import FindingKind

    ruled = ([rule.kind for rule in XID_RULES.values()] + [kind for kind, _ in NVML_RECOVERY.values()] + list(EARLY_WARNING_KINDS)
             + list(NODE_KINDS) + [FindingKind.XID_STORM, FindingKind.DOMAIN_EVENT]  # storm_rules, domain_rules fold into them
             + [FindingKind.DRA_DEVICES_GONE])  # device_taint_rules: from the cluster, not the samples
    assert len(ruled) == len(set(ruled))
    not_health = {FindingKind.XID_OTHER, FindingKind.HOARDED, FindingKind.QUOTA_RECLAIM, FindingKind.QUEUE_ORDER}
    assert set(ruled) == set(FindingKind) - not_health


def test_the_evaluation_scores_only_named_finding_kinds():
    from gpuwarden.analytics.health.evaluation import FINDING_FAULTS
    from gpuwarden.fleet import FindingKind
    from gpuwarden.sim.faults import KINDS

    assert all(isinstance(kind, FindingKind) for kind in FINDING_FAULTS)
    assert {fault for faults in FINDING_FAULTS.values() for fault in faults} <= set(KINDS)
