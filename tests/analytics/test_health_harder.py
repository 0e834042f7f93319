"""Health findings on harder fleets (tests/scenarios_harder.py, independent of the simulator):
mixed GPU models, 15 s and 30 s steps, scrape gaps, idle dips, lifetime counters, and conditions
every GPU of a node shares (a power cap, a clock policy, hot inlet air, a driver reload), each
reported once as a node condition with no cordon and no per-GPU finding; faults still found, gentle
NVLink and PCIe ramps before their XID."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuwarden.analytics.health import scan
from gpuwarden.cli.health_cmd import finding_dict
from gpuwarden.fleet import ActionKind, FindingKind

from scenarios_harder import generate_harder, score_harder  # tests/ is on sys.path

NODE_KIND = {"power_cap": "node-wide-slowdown", "clock_policy": "node-wide-slowdown", "hot_inlet": "node-wide-thermal",
             "driver_reload": "node-wide-counter-reset"}


@pytest.fixture(scope="module", params=[30, 15], ids=["30s", "15s"])
def harder(request):
    step_s = request.param
    frame, truth, healthy, all_gpus, conditions = generate_harder(seed=5, nodes=10, days=0.9, step_s=step_s,
                                                                  faults_per_kind=1)
    findings = [f for f in scan(frame) if not f.kind.startswith("app-xid")]
    return step_s, frame, truth, healthy, all_gpus, conditions, findings


def test_the_scenario_is_as_hard_as_it_says(harder):
    step_s, frame, truth, healthy, all_gpus, conditions, _ = harder
    assert frame["model"].nunique() == 4
    spacing = frame.groupby("gpu_uuid")["timestamp"].diff().dt.total_seconds()
    assert spacing.median() == step_s and spacing.max() >= 300  # scrape gaps of minutes
    reloaded = frame["node"].isin(conditions.loc[conditions["kind"] == "driver_reload", "node"])
    assert frame.loc[~reloaded, "ecc_sbe_volatile_total"].min() >= 10_000  # lifetime counters
    assert frame.loc[reloaded, "ecc_sbe_volatile_total"].min() < 10_000  # ...reset at once on one node
    assert frame.loc[frame["model"] == "NVIDIA L40S", "nvlink_crc_flit_errors_total"].isna().all()
    assert set(conditions["kind"]) == set(NODE_KIND)


def test_node_wide_conditions_are_one_node_finding_with_no_cordon_and_no_gpu_finding(harder):
    *_, conditions, findings = harder
    for row in conditions.itertuples():
        on_node = [f for f in findings if f.node == row.node]
        assert on_node and all(f.gpu_uuid is None for f in on_node), (row.kind, [(f.kind, f.gpu_uuid) for f in on_node])
        assert {f.kind for f in on_node} == {NODE_KIND[row.kind]}, (row.kind, [f.kind for f in on_node])
        assert len(on_node) <= 2  # one episode, or two where a scrape gap cut it
        assert all(f.recommended_action is None for f in on_node)
        assert all(f.evidence["gpus_affected"] >= 6 for f in on_node)


def test_mixed_models_steps_and_gaps_give_no_false_finding_and_find_every_fault(harder):
    _, _, truth, healthy, all_gpus, conditions, findings = harder
    result = score_harder([finding_dict(f) for f in findings], truth, healthy, all_gpus, conditions)
    assert result["fp"] == 0 and result["cordon_on_healthy"] == 0, result
    assert result["per_gpu_on_node_conditions"] == 0 and result["false_node_findings"] == 0, result
    assert result["recall"] == 1.0 and result["missed_fatal"] == 0, result


@pytest.mark.parametrize("kind, warning", [("nvlink_degrading", "nvlink-degrading"), ("pcie_degrading", "pcie-degrading")])
def test_gentle_nvlink_and_pcie_ramps_are_found_before_their_xid(harder, kind, warning):
    *_, truth, _, _, _, findings = harder
    fault = truth[truth["kind"] == kind].iloc[0]
    early = [f for f in findings if f.gpu_uuid == fault["gpu_uuid"] and f.kind == warning]
    assert early, [(f.kind, f.first_seen) for f in findings if f.gpu_uuid == fault["gpu_uuid"]]
    assert pd.Timestamp(early[0].first_seen) <= fault["fatal_at"] - pd.Timedelta(minutes=30)


def _fleet(nodes: int = 4, minutes: int = 240, step_s: int = 30, seed: int = 0) -> pd.DataFrame:
    """``nodes`` H100 nodes of 8 busy GPUs (no pods) at ``step_s``."""
    rng = np.random.default_rng(seed)
    steps, gpus = minutes * 60 // step_s, nodes * 8
    stamps = pd.Timestamp("2026-02-02T00:00:00Z") + pd.to_timedelta(np.arange(steps) * step_s, unit="s")
    frame = pd.DataFrame({
        "timestamp": np.repeat(stamps, gpus), "node": np.tile([f"h100-{g // 8:03d}" for g in range(gpus)], steps),
        "gpu_uuid": np.tile([f"GPU-{g:08d}" for g in range(gpus)], steps), "model": "NVIDIA H100 80GB HBM3",
        "gpu_util_ratio": 0.97, "sm_active_ratio": 0.85,
        "power_watts": 650.0 + rng.normal(0, 8, steps * gpus), "sm_clock_mhz": 1980.0 + rng.normal(0, 5, steps * gpus),
        "throttle_reasons_bitmask": 0})
    frame["temperature_celsius"] = 30 + 0.055 * frame["power_watts"] + rng.normal(0, 0.7, len(frame))
    return frame


def test_a_straggler_on_a_node_under_a_clock_policy_is_still_a_straggler():
    frame = _fleet()
    minute = (frame["timestamp"] - frame["timestamp"].min()).dt.total_seconds() / 60
    node = (frame["node"] == "h100-001") & (minute >= 30)
    frame.loc[node, "sm_clock_mhz"] *= 0.85  # the node's clock policy
    frame.loc[node & (frame["gpu_uuid"] == "GPU-00000011"), "sm_clock_mhz"] *= 0.8  # and one slow GPU on it
    findings = scan(frame)
    assert sorted((f.kind, f.gpu_uuid) for f in findings) == [
        (FindingKind.NODE_WIDE_SLOWDOWN, None), (FindingKind.STRAGGLER, "GPU-00000011")], findings
    straggler = next(f for f in findings if f.kind == FindingKind.STRAGGLER)
    assert straggler.evidence["clock_vs_node_mates"] == pytest.approx(0.8, abs=0.03)


@pytest.mark.parametrize("busy", [3, 4])
def test_two_slow_gpus_of_a_small_busy_set_are_two_stragglers(busy):
    """Two faulty GPUs among 3 or 4 busy ones (the rest idle): too few node-mates to call it the
    node's, and two slow GPUs of three must not set the node-mates' median themselves."""
    frame = _fleet()
    minute = (frame["timestamp"] - frame["timestamp"].min()).dt.total_seconds() / 60
    node = frame["node"] == "h100-001"
    index = frame["gpu_uuid"].str[-2:].astype(int) - 8
    idle = node & (index >= busy)
    frame.loc[idle, ["gpu_util_ratio", "sm_active_ratio"]] = 0.0
    frame.loc[idle, "power_watts"], frame.loc[idle, "sm_clock_mhz"] = 90.0, 345.0
    frame.loc[node & (index < 2) & (minute >= 30), "sm_clock_mhz"] *= 0.8
    stragglers = sorted(f.gpu_uuid for f in scan(frame) if f.kind == FindingKind.STRAGGLER
                        and f.recommended_action == ActionKind.CORDON)
    assert stragglers == ["GPU-00000008", "GPU-00000009"]


def test_a_node_power_cap_is_a_node_condition_not_eight_stragglers():
    frame = _fleet(step_s=15)
    minute = (frame["timestamp"] - frame["timestamp"].min()).dt.total_seconds() / 60
    node = (frame["node"] == "h100-002") & (minute >= 60)
    frame.loc[node, "power_watts"] = 420.0  # every GPU capped: less power, lower clock, sw power cap
    frame.loc[node, "sm_clock_mhz"] *= 0.82
    frame.loc[node, "throttle_reasons_bitmask"] = 0x4
    findings = scan(frame)
    assert [(f.kind, f.node, f.gpu_uuid, f.recommended_action) for f in findings] == [
        (FindingKind.NODE_WIDE_SLOWDOWN, "h100-002", None, None)]
    assert findings[0].evidence["gpus_affected"] == 8


def test_the_simulator_draws_node_conditions_apart_and_renders_them(data_dir):
    from gpuwarden.cli.simfleet import simulated_fleet
    from gpuwarden.sim import SimConfig
    from gpuwarden.sim.config import ConfigError

    base = dict(seed=5, nodes=2, warmup_days=0.0, data_dir=data_dir, fault_rate_scale=0.0)
    plain = simulated_fleet(SimConfig(**base))
    conditioned = simulated_fleet(SimConfig(**base, node_conditions_per_node_day=40.0))
    quiet, busy = plain.run(90), conditioned.run(90)
    truth = conditioned.node_condition_truth()
    assert plain.node_condition_truth().empty and not truth.empty
    assert set(truth["kind"]) <= {"power_cap", "clock_policy", "hot_inlet", "driver_reload"}
    # Their own random stream: the jobs are the same.
    assert (quiet["gpu_util_ratio"].to_numpy() == busy["gpu_util_ratio"].to_numpy()).all()
    # A power cap or clock policy slows every GPU of its node against the same GPU without it.
    slowing = truth[truth["kind"].isin(["power_cap", "clock_policy"])]
    assert len(slowing), truth
    row = slowing.iloc[0]
    at = ((busy["node"] == row["node"]) & (busy["timestamp"] > row["start"]) & (busy["timestamp"] < row["end"])).to_numpy()
    assert at.any() and (busy.loc[at, "sm_clock_mhz"] < quiet.loc[at, "sm_clock_mhz"]).all()
    with pytest.raises(ConfigError, match="node_conditions_per_node_day"):
        SimConfig(node_conditions_per_node_day=-1)


def test_hot_inlet_counts_only_the_gpus_that_run_hot_and_unequal_timestamps_still_make_one_node():
    """Issue 35's known gaps: a node finding's gpus_affected counted idle GPUs; node-wide rules needed
    every GPU of a node stamped at the same instant. Six busy GPUs of a node run 12 C hot (inlet air),
    two idle ones do not, and each GPU's samples are stamped up to 3 s apart."""
    frame = _fleet(step_s=30)
    minute = (frame["timestamp"] - frame["timestamp"].min()).dt.total_seconds() / 60
    node = frame["node"] == "h100-003"
    index = frame["gpu_uuid"].str[-2:].astype(int) - 24
    idle = node & (index >= 6)
    frame.loc[idle, ["gpu_util_ratio", "sm_active_ratio"]] = 0.0
    frame.loc[idle, "power_watts"], frame.loc[idle, "sm_clock_mhz"] = 90.0, 345.0
    frame.loc[idle, "temperature_celsius"] = 30 + 0.055 * 90.0
    frame.loc[node & ~idle & (minute >= 60), "temperature_celsius"] += 12.0
    jitter = pd.to_timedelta(frame["gpu_uuid"].str[-1].astype(int) % 4, unit="s")  # 0-3 s per GPU
    frame["timestamp"] = frame["timestamp"] + jitter
    findings = scan(frame)
    assert [(f.kind, f.node, f.gpu_uuid) for f in findings] == [(FindingKind.NODE_WIDE_THERMAL, "h100-003", None)], \
        [(f.kind, f.node, f.gpu_uuid) for f in findings]
    assert findings[0].evidence["gpus_affected"] == 6 and findings[0].evidence["gpus_on_node"] == 8
