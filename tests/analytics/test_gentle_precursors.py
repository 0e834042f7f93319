"""Gentle precursors (issue 35 item 4): a slow NVLink CRC ramp, a slow PCIe replay ramp and a mild
straggler are found before their fatal event as a warning that taints, never cordons; the same
shapes' healthy look-alikes (counter resets, scrape gaps, idle spells, steadily noisy links, a node
whose GPUs are replaced by another model) raise nothing. The fleet here is built in this file, apart
from the scenario generators the thresholds were looked at on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.analytics.health import HealthConfig, scan
from gpuwarden.analytics.health.features import gpu_series
from gpuwarden.analytics.health.finding_builder import FindingBuilder
from gpuwarden.analytics.health.trend_rules import emit_precursor
from gpuwarden.fleet import ActionKind, FindingKind, Severity

T0 = pd.Timestamp("2026-05-04T00:00:00Z")
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
SPEC = {H100: (1980.0, 345.0, 700.0, 95.0), A100: (1410.0, 210.0, 400.0, 60.0)}  # busy, idle MHz; TDP, idle W
PRECURSORS = (FindingKind.NVLINK_DEGRADING, FindingKind.PCIE_DEGRADING, FindingKind.STRAGGLER)
COUNTERS = ("pcie_replay_total", "nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total",
            "nvlink_replay_errors_total", "ecc_sbe_volatile_total")


class Fleet:
    """Six nodes (h100-000..003, a100-000..001) of 8 GPUs, ``hours`` at ``step_s``: whole-node jobs
    with idle spells between them and data-loading pauses inside, power-capped clocks, lifetime
    counters with per-GPU background noise (some links steadily noisy), scrape gaps."""

    def __init__(self, seed: int, hours: float = 20.0, step_s: int = 30, busy_nodes: tuple[str, ...] = ()) -> None:
        rng = self.rng = np.random.default_rng(seed)
        self.step_s = step_s
        self.steps = steps = int(hours * 3600 / step_s)
        self.nodes = [f"h100-{n:03d}" for n in range(4)] + [f"a100-{n:03d}" for n in range(2)]
        self.models = [H100] * 4 + [A100] * 2
        gpus = 8 * len(self.nodes)
        self.uuids = [f"GPU-{seed:04x}{g:04x}-aaaa-4bbb-8ccc-{g:012x}" for g in range(gpus)]
        spec = np.array([SPEC[self.models[g // 8]] for g in range(gpus)])
        busy_clk, idle_clk, tdp, idle_w = (spec[:, i:i + 1] for i in range(4))
        busy = np.zeros((gpus, steps), dtype=bool)
        load = np.ones((gpus, steps))
        for n, node in enumerate(self.nodes):
            t = int(rng.uniform(0, 1) * 3600 / step_s)
            while t < steps:
                length = int(rng.uniform(2, 7) * 3600 / step_s)
                busy[n * 8:n * 8 + 8, t:t + length] = True
                load[n * 8:n * 8 + 8, t:t + length] = rng.uniform(0.85, 1.0)
                t += length + (0 if node in busy_nodes else int(rng.uniform(0.5, 2) * 3600 / step_s))
        busy &= ~(rng.random((gpus, steps)) < 0.02)  # data-loading pauses
        self.busy = busy
        self.util = np.where(busy, np.clip(rng.normal(0.96, 0.02, busy.shape), 0, 1), 0.0)
        self.power = np.where(busy, tdp * 0.97 * load + rng.normal(0, 0.015, busy.shape) * tdp,
                              idle_w + rng.normal(0, 3, busy.shape))
        capped = busy & (load > 0.97)
        self.clock = np.where(busy, busy_clk, idle_clk) * (1 - np.where(capped, rng.uniform(0.02, 0.05, busy.shape), 0))
        self.temp = 30 + 0.06 * self.power + rng.normal(0, 2, (gpus, 1)) + rng.normal(0, 0.7, busy.shape)
        noisy = rng.lognormal(np.log(6), 1.0, gpus) / 1440 * step_s / 60  # CRC errors per step, some links noisier
        self.inc = {name: np.zeros((gpus, steps)) for name in COUNTERS}
        self.inc["nvlink_crc_flit_errors_total"] += rng.poisson(noisy[:, None] * np.ones(steps))
        self.inc["pcie_replay_total"] += (rng.random((gpus, steps)) < 2 / 1440 * step_s / 60) * rng.integers(1, 20, (gpus, steps))
        self.inc["ecc_sbe_volatile_total"] += rng.poisson(0.3 / 1440 * step_s / 60, (gpus, steps))
        self.lifetime = {name: rng.integers(1_000, 10_000_000, gpus).astype(float) for name in COUNTERS}
        self.xid = {74: np.zeros((gpus, steps)), 79: np.zeros((gpus, steps))}
        self.resets: list[tuple[int, int]] = []  # (gpu, step): its counters start again from 0
        self.keep = np.ones((gpus, steps), dtype=bool)
        start = int(rng.uniform(0.3, 0.7) * steps)
        self.keep[:, start:start + int(25 * 60 / step_s)] = False  # a whole-fleet scrape gap
        self.lost = np.zeros((gpus, steps), dtype=bool)
        self.replaced: tuple[int, int] | None = None  # (node, step): its GPUs swapped for H100s

    def at(self, hours: float) -> int:
        return int(hours * 3600 / self.step_s)

    def gpu(self, node: str, index: int) -> int:
        return self.nodes.index(node) * 8 + index

    def ramp(self, g: int, column: str, onset_h: float, fatal_h: float, end_per_min: float, xid: int,
             power: float = 2.0) -> None:
        """Errors climbing from nothing to ``end_per_min`` (progress ** ``power``), then the fatal XID."""
        onset, fatal = self.at(onset_h), self.at(fatal_h)
        progress = np.clip((np.arange(self.steps) - onset) / (fatal - onset), 0, 1) * (np.arange(self.steps) < fatal)
        self.inc[column][g] += self.rng.poisson(end_per_min * self.step_s / 60 * progress ** power)
        self.xid[xid][g, fatal:] += 1
        if xid == 79:
            self.lost[g, fatal + 1:] = True

    def straggler(self, g: int, onset_h: float, factor: float) -> None:
        on = np.arange(self.steps) >= self.at(onset_h)
        self.clock[g] = np.where(on & self.busy[g], self.clock[g] * factor, self.clock[g])

    def frame(self) -> pd.DataFrame:
        gpus, steps = self.busy.shape
        g_index, s_index = np.meshgrid(np.arange(gpus), np.arange(steps), indexing="ij")
        uuids = np.array(self.uuids)[g_index]
        models = np.array(self.models)[g_index // 8]
        if self.replaced is not None:  # new GPUs (new serials, another model) from that step on
            n, at = self.replaced
            rows = (g_index // 8 == n) & (s_index >= at)
            uuids = np.where(rows, np.char.add(uuids, "-new"), uuids)
            models = np.where(rows, H100, models)
        columns: dict[str, object] = {
            "timestamp": T0 + pd.to_timedelta(s_index.ravel() * self.step_s, unit="s"),
            "node": np.array(self.nodes)[g_index.ravel() // 8], "gpu_uuid": uuids.ravel(), "model": models.ravel(),
            "gpu_util_ratio": self.util.ravel(), "sm_active_ratio": (self.util * 0.85).ravel(),
            "power_watts": self.power.ravel(), "temperature_celsius": self.temp.ravel(),
            "sm_clock_mhz": self.clock.ravel(), "throttle_reasons_bitmask": np.where(self.busy, 0, 1).ravel()}
        for name in COUNTERS:
            readings = np.cumsum(self.inc[name], axis=1) + self.lifetime[name][:, None]
            for g, at in self.resets:
                readings[g, at:] -= readings[g, at] - self.inc[name][g, at]
            if self.replaced is not None:
                n, at = self.replaced
                readings[n * 8:n * 8 + 8, at:] -= readings[n * 8:n * 8 + 8, at:at + 1]
            columns[name] = readings.ravel()
        for code, values in self.xid.items():
            columns[f"xid_{code}_total"] = np.cumsum(values, axis=1).clip(0, 1).ravel()
        frame = pd.DataFrame(columns)
        device = ["gpu_util_ratio", "sm_active_ratio", "power_watts", "temperature_celsius", "sm_clock_mhz",
                  "throttle_reasons_bitmask"]
        frame.loc[self.lost.ravel(), device] = np.nan
        return frame[self.keep.ravel()].sort_values(["timestamp", "gpu_uuid"], kind="stable", ignore_index=True)


def _of(findings, uuid: str, kinds=PRECURSORS):
    return sorted((f for f in findings if f.gpu_uuid == uuid and f.kind in kinds), key=lambda f: f.first_seen)


def _first_warning(fleet: Fleet, g: int, kind: FindingKind, fatal_h: float):
    """The GPU's earliest finding of ``kind`` as a live scan saw it when it was first raised (a scan
    up to a minute before the fatal event finds it; a scan 5 minutes after its first_seen gives the
    action recommended then). Later, the burst rule's own sustained evidence may cordon: only that."""
    frame = fleet.frame()
    fatal = T0 + pd.Timedelta(hours=fatal_h)
    found = _of(scan(frame, now=fatal - pd.Timedelta(minutes=1)), fleet.uuids[g], (kind,))
    assert found, f"no {kind.value} before the fatal event"
    for finding in found:
        if finding.recommended_action == ActionKind.CORDON:
            assert "burst" in finding.evidence["basis"] and finding.evidence["sustained_minutes"] >= 30
    first = pd.Timestamp(found[0].first_seen)
    then = _of(scan(frame, now=first + pd.Timedelta(minutes=5)), fleet.uuids[g], (kind,))
    assert then and pd.Timestamp(then[0].first_seen) == first
    return then[0]


def _is_gentle_warning(finding, fatal_h: float) -> None:
    assert finding.severity == Severity.WARNING
    assert finding.recommended_action == ActionKind.TAINT
    assert finding.first_seen < (T0 + pd.Timedelta(hours=fatal_h)).to_pydatetime()


def test_slow_nvlink_crc_ramp_is_found_before_its_xid_as_a_taint():
    # CRC errors climbing over 9 h to 0.4 a minute (a quarter of the harder scenario's ramp), 30 s steps; a
    # driver reload half-way resets every counter of the GPU
    fleet = Fleet(seed=11)
    g = fleet.gpu("h100-001", 3)
    fleet.ramp(g, "nvlink_crc_flit_errors_total", onset_h=8.0, fatal_h=17.0, end_per_min=0.4, xid=74)
    fleet.resets.append((g, fleet.at(12.5)))
    finding = _first_warning(fleet, g, FindingKind.NVLINK_DEGRADING, 17.0)
    _is_gentle_warning(finding, 17.0)
    assert finding.evidence["basis"] == "rise" and finding.evidence["rise_vs_own_history"] >= 3
    lead_h = (T0 + pd.Timedelta(hours=17.0) - pd.Timestamp(finding.first_seen)).total_seconds() / 3600
    assert lead_h >= 0.5


def test_slow_pcie_replay_ramp_is_found_before_the_gpu_falls_off_the_bus():
    # replays climbing over 6 h to 0.2 a minute at 15 s steps, on an A100 among H100 nodes
    fleet = Fleet(seed=12, step_s=15)
    g = fleet.gpu("a100-001", 5)
    fleet.ramp(g, "pcie_replay_total", onset_h=9.0, fatal_h=15.0, end_per_min=0.2, xid=79)
    finding = _first_warning(fleet, g, FindingKind.PCIE_DEGRADING, 15.0)
    _is_gentle_warning(finding, 15.0)
    assert finding.evidence["basis"] == "rise"


def test_mild_straggler_is_found_as_a_taint():
    # 7% slower clock than the node-mates of its job at the same power: below the peer-outlier bar
    # (4 robust scales of at least 2.5%), above the persistent one
    fleet = Fleet(seed=13, busy_nodes=("h100-002",))
    g = fleet.gpu("h100-002", 6)
    fleet.straggler(g, onset_h=6.0, factor=0.93)
    findings = scan(fleet.frame())
    found = _of(findings, fleet.uuids[g], (FindingKind.STRAGGLER,))
    assert found, [(f.kind.value, f.gpu_uuid) for f in findings]
    assert found[0].evidence["basis"] == "persistent"
    assert found[0].recommended_action == ActionKind.TAINT and found[0].severity == Severity.WARNING
    assert 0.9 < found[0].evidence["persistent_clock_vs_node_mates"] < 0.95
    assert pd.Timestamp(found[0].first_seen) > T0 + pd.Timedelta(hours=6)


@pytest.mark.parametrize("seed,step_s", [(11, 30), (12, 15)])
def test_healthy_lookalikes_raise_nothing(seed, step_s):
    """Counter resets (a driver reload of one node, one GPU reset), a scrape gap, idle spells, links
    steadily noisier than their peers, a node whose GPUs are replaced by another model mid-window:
    no precursor finding on any GPU."""
    fleet = Fleet(seed=seed, step_s=step_s)
    fleet.resets += [(fleet.gpu("h100-003", i), fleet.at(9.0)) for i in range(8)] + [(fleet.gpu("h100-000", 2), fleet.at(4.0))]
    noisy = fleet.gpu("h100-001", 1)  # a link that always errs ten times as often as its peers: its own baseline
    fleet.inc["nvlink_crc_flit_errors_total"][noisy] += fleet.rng.poisson(1.0 / 60 * step_s / 60, fleet.steps)
    fleet.replaced = (fleet.nodes.index("a100-000"), fleet.at(11.0))
    findings = scan(fleet.frame())
    per_gpu = [(f.kind.value, f.node, f.gpu_uuid) for f in findings if f.gpu_uuid is not None]
    assert not [f for f in findings if f.kind in PRECURSORS], per_gpu


# -- a rule that must always hold: no cordon from a precursor rule alone --------------------------

def _builder(rows_per_gpu: int = 120) -> FindingBuilder:
    stamps = T0 + pd.to_timedelta(np.arange(rows_per_gpu) * 60, unit="s")
    frame = pd.DataFrame({"timestamp": np.tile(stamps, 2), "node": "h100-000",
                          "gpu_uuid": np.repeat(["GPU-a", "GPU-b"], rows_per_gpu), "model": H100})
    series = gpu_series(frame)
    return FindingBuilder(series, HealthConfig(episode_gap_s=600.0), int(series["ts"].max()))


_flags = st.lists(st.booleans(), min_size=240, max_size=240).map(lambda v: np.array(v, dtype=bool))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gentle=_flags, kind=st.sampled_from(PRECURSORS))
def test_a_precursor_alone_never_cordons(gentle, kind):
    b = _builder()
    emit_precursor(b, kind, np.zeros(len(b.s), dtype=bool), gentle, Severity.WARNING, lambda rows: {},
                   lambda rows: 0.5, sustain_s=1800.0)
    assert all(f.recommended_action == ActionKind.TAINT for f in b.findings)
    assert len(b.findings) == len(b.episodes(gentle)[1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strong=_flags, gentle=_flags, kind=st.sampled_from(PRECURSORS))
def test_a_cordon_needs_the_strong_rules_own_sustained_episode(strong, gentle, kind):
    """With the gentle rule added, a finding cordons only where the strong rule alone did (same
    episodes, same actions), whatever the gentle rule holds around it."""
    alone = _builder()
    alone.emit(kind, strong, Severity.WARNING, lambda rows: {}, lambda rows: 0.5, sustain_s=1800.0)
    cordoned_alone = [(f.gpu_uuid, f.first_seen, f.last_seen) for f in alone.findings
                      if f.recommended_action == ActionKind.CORDON]
    both = _builder()
    emit_precursor(both, kind, strong, gentle, Severity.WARNING, lambda rows: {}, lambda rows: 0.5, sustain_s=1800.0)
    for finding in both.findings:
        if finding.recommended_action == ActionKind.CORDON:
            assert any(g == finding.gpu_uuid and finding.first_seen <= a and b <= finding.last_seen
                       for g, a, b in cordoned_alone)
    if not gentle.any():  # the strong rule alone: exactly as before
        assert [(f.first_seen, f.recommended_action) for f in both.findings] == \
               [(f.first_seen, f.recommended_action) for f in alone.findings]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), end=st.floats(0.02, 0.6), factor=st.floats(0.85, 0.97),
       power=st.sampled_from([1.0, 2.0, 3.0]))
def test_gentle_shapes_never_cordon_on_their_own(seed, end, factor, power):
    """Random gentle ramps and a mild straggler through the whole scan: every precursor finding whose
    only basis is the gentle rule taints at most."""
    fleet = Fleet(seed=seed, hours=14.0, busy_nodes=("h100-002",))
    fleet.ramp(fleet.gpu("h100-001", 0), "nvlink_crc_flit_errors_total", 4.0, 12.0, end, 74, power)
    fleet.ramp(fleet.gpu("a100-001", 1), "pcie_replay_total", 5.0, 11.0, end, 79, power)
    fleet.straggler(fleet.gpu("h100-002", 2), 3.0, factor)
    for finding in scan(fleet.frame()):
        if finding.kind in PRECURSORS and finding.evidence.get("basis") in ("rise", "persistent"):
            assert finding.recommended_action == ActionKind.TAINT, finding
