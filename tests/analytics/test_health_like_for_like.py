"""Health detectors on fleets without pods, with noise and confounders: like-for-like peers (idle
GPUs are not judged against busy ones), clock-only stragglers, cooling failing on one GPU vs a whole
node running warm, NVLink degrading vs a steadily noisy link and counter resets, application XIDs
that never cordon; the simulator's noise and attribution knobs; and a CLI round trip of the scan
JSON on a file from the independent scenario generator (tests/scenarios_independent.py)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from gpuwarden.analytics.health import scan
from gpuwarden.cli import main
from gpuwarden.fleet import SAMPLE_COLUMN_NAMES, ActionKind

from scenarios_independent import generate, score  # tests/ is on sys.path (rootdir-less test modules)

START = pd.Timestamp("2026-02-02T00:00:00Z")
H100 = "NVIDIA H100 80GB HBM3"


def bare_fleet(minutes: int = 360, nodes: int = 2, busy_gpus: tuple[int, ...] = (0, 1, 2, 3, 4, 5), seed: int = 0) -> pd.DataFrame:
    """8 GPUs per node, no pod labels; ``busy_gpus`` (per node) run at 1980 MHz / ~650 W, the rest
    idle at 345 MHz / ~95 W. Counters carry a small drizzle."""
    rng = np.random.default_rng(seed)
    gpus = nodes * 8
    stamps = START + pd.to_timedelta(np.arange(minutes), unit="min")
    busy = np.isin(np.arange(gpus) % 8, busy_gpus)
    frame = pd.DataFrame({
        "timestamp": np.repeat(stamps, gpus), "cluster": "t", "node": np.tile([f"h100-{g // 8:03d}" for g in range(gpus)], minutes),
        "gpu_uuid": np.tile([f"GPU-{g:08d}-aaaa-bbbb-cccc-000000000000" for g in range(gpus)], minutes),
        "gpu_index": np.tile(np.arange(gpus) % 8, minutes), "model": H100, "mem_total_bytes": 8e10,
        "gpu_util_ratio": np.tile(np.where(busy, 0.97, 0.0), minutes),
        "sm_active_ratio": np.tile(np.where(busy, 0.85, 0.0), minutes),
        "power_watts": np.tile(np.where(busy, 650.0, 95.0), minutes) + rng.normal(0, 8, minutes * gpus),
        "sm_clock_mhz": np.tile(np.where(busy, 1980.0, 345.0), minutes) + rng.normal(0, 5, minutes * gpus),
        "throttle_reasons_bitmask": np.tile(np.where(busy, 0, 1), minutes),
    })
    slot = np.tile(rng.normal(0, 3, gpus), minutes)
    frame["temperature_celsius"] = 30 + 0.055 * frame["power_watts"] + slot + rng.normal(0, 0.7, len(frame))
    for name in ("ecc_sbe_volatile_total", "pcie_replay_total", "nvlink_crc_flit_errors_total"):
        drizzle = rng.poisson(0.002, (minutes, gpus)).cumsum(axis=0)
        frame[name] = drizzle.ravel()
    return frame.reindex(columns=list(SAMPLE_COLUMN_NAMES))


def gpu_rows(frame: pd.DataFrame, gpu: int, from_minute: int = 0) -> pd.Series:
    return frame["gpu_uuid"].str.startswith(f"GPU-{gpu:08d}") & (frame["timestamp"] >= START + pd.Timedelta(minutes=from_minute))


def test_idle_and_busy_gpus_without_pods_are_not_stragglers():
    findings = scan(bare_fleet())
    assert findings == [], [(f.kind, f.gpu_uuid) for f in findings]


def test_clock_only_straggler_at_unchanged_power_is_found():
    frame = bare_fleet()
    frame.loc[gpu_rows(frame, 3, 60), "sm_clock_mhz"] *= 0.78  # power unchanged
    findings = scan(frame)
    assert [(f.kind, f.gpu_uuid[:12]) for f in findings] == [("straggler", "GPU-00000003")]
    assert findings[0].evidence["clock_vs_peers_60m"] == pytest.approx(0.78, abs=0.03)


def test_a_whole_node_running_warm_is_not_a_gpu_fault_but_one_gpu_warming_is():
    frame = bare_fleet(minutes=600)
    minutes = (frame["timestamp"] - START).dt.total_seconds() / 60
    node1 = frame["node"] == "h100-001"
    frame.loc[node1, "temperature_celsius"] += np.clip((minutes[node1] - 300) / 60, 0, 1) * 15  # hot node
    ramp = gpu_rows(frame, 2, 240)
    frame.loc[ramp, "temperature_celsius"] += (minutes[ramp] - 240) / 240 * 25  # +25 C over 4 h
    findings = scan(frame)
    assert [(f.kind, f.gpu_uuid[:12]) for f in findings] == [("cooling-degrading", "GPU-00000002")]
    assert findings[0].first_seen <= START + pd.Timedelta(minutes=400)  # >= 80 min before the ramp ends
    assert findings[0].recommended_action == ActionKind.TAINT


def test_nvlink_degrading_is_found_before_xid_74_but_a_noisy_link_and_a_counter_reset_are_not():
    frame = bare_fleet(minutes=600)
    minutes = ((frame["timestamp"] - START).dt.total_seconds() // 60).astype(int)
    rng = np.random.default_rng(3)
    noisy = gpu_rows(frame, 9)
    frame.loc[noisy, "nvlink_crc_flit_errors_total"] = rng.poisson(0.05, noisy.sum()).cumsum()  # steady, 3/h
    reset = gpu_rows(frame, 12)
    frame.loc[reset, "nvlink_crc_flit_errors_total"] = np.where(minutes[reset] < 300, 50_000, 0)
    frame.loc[reset, "ecc_sbe_volatile_total"] = np.where(minutes[reset] < 300, 9_000, 0)
    bad = gpu_rows(frame, 5, 240)
    progress = (minutes[bad] - 240) / 300.0
    frame.loc[bad, "nvlink_crc_flit_errors_total"] += rng.poisson(0.05 + 6 * progress**2).cumsum()
    frame["xid_74_total"] = 0
    frame.loc[gpu_rows(frame, 5, 540), "xid_74_total"] = 1
    findings = scan(frame)
    by_gpu = {(f.kind, f.gpu_uuid[:12]) for f in findings}
    assert by_gpu == {("nvlink-degrading", "GPU-00000005"), ("nvlink-error", "GPU-00000005")}, by_gpu
    warning = next(f for f in findings if f.kind == "nvlink-degrading")
    assert warning.first_seen <= START + pd.Timedelta(minutes=510) and warning.recommended_action == ActionKind.CORDON


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68])
def test_application_xids_never_cordon_without_pods(code):
    frame = bare_fleet(minutes=120)
    frame[f"xid_{code}_total"] = 0
    frame.loc[gpu_rows(frame, 4, 30), f"xid_{code}_total"] = 1
    findings = scan(frame)
    assert [f.kind for f in findings] == [f"app-xid-{code}"]
    assert findings[0].recommended_action is None


def test_normal_input_raises_no_warning_and_row_remap_evidence_is_measured():
    frame = bare_fleet(minutes=120)
    frame["remapped_rows_uncorrectable_total"] = 0
    frame["remapped_rows_failure"] = 0
    rows = gpu_rows(frame, 1, 60)
    frame.loc[rows, "remapped_rows_failure"] = 1
    frame.loc[rows, "remapped_rows_uncorrectable_total"] = 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        findings = scan(frame)
    failure = next(f for f in findings if f.kind == "row-remap-failure")
    assert failure.evidence["remapped_rows_uncorrectable_total"] == 3


def test_sim_noise_and_attribution_knobs(data_dir):
    from gpuwarden.cli.simfleet import simulated_fleet
    from gpuwarden.sim import SimConfig
    from gpuwarden.sim.config import ConfigError

    base = dict(seed=5, nodes=2, warmup_days=0.0, data_dir=data_dir, fault_rate_scale=0.0)
    quiet = simulated_fleet(SimConfig(**base)).run(120)
    noisy = simulated_fleet(SimConfig(**base, background_noise=True, attribution="off")).run(120)
    assert quiet["nvlink_crc_flit_errors_total"].max() == 0
    assert noisy["nvlink_crc_flit_errors_total"].max() > 0 and noisy["pcie_replay_total"].max() > 0
    assert noisy["pod"].isna().all() and set(noisy["attribution"].astype(str)) == {"off"}
    assert quiet["pod"].notna().any() and set(quiet["attribution"].astype(str)) == {"known"}
    # Noise draws from its own stream (seeded by the seed): the jobs are the same.
    assert (quiet["gpu_util_ratio"].to_numpy() == noisy["gpu_util_ratio"].to_numpy()).all()
    with pytest.raises(ConfigError, match="attribution"):
        SimConfig(attribution="sometimes")


def test_scan_json_round_trip_on_an_independent_scenario(tmp_path, capsys):
    frame, truth, healthy, all_gpus = generate(seed=7, nodes=4, days=1.0, faults_per_kind=1)
    path = tmp_path / "independent.csv"
    frame.to_csv(path, index=False)
    out = tmp_path / "scan.json"
    assert main(["health", "scan", "--source", "file", "--file", str(path), "--all", "--format", "json", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["schema_version"] == 2 and report["report"] == "health_scan"
    assert set(report["window"]) == {"start", "end", "hours"} and report["window"]["hours"] >= 23.9
    first = report["findings"][0]
    assert {"gpu_uuid", "node", "kind", "severity", "recommended_action", "first_seen", "last_seen", "evidence"} <= set(first)
    # full UUIDs; the scenario's whole node running hot is one node finding (no GPU named)
    assert all(f["gpu_uuid"] in all_gpus or (f["gpu_uuid"] is None and f["kind"].startswith("node-wide-"))
               for f in report["findings"])
    assert all(not f["kind"].startswith("app-xid") for f in report["findings"])
    result = score(report["findings"], truth, healthy, all_gpus)
    assert result["missed_fatal"] == 0 and result["cordon_on_healthy"] == 0, result
    assert result["f1"] >= 0.85, result
    assert main(["health", "scan", "--source", "file", "--file", str(path), "--all", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gpu_uuid,node,kind") and len(lines) == len(report["findings"]) + 1
