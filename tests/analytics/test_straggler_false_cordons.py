"""No straggler cordon for a node condition on a node with too few busy GPUs to be a node-wide one.

The shape comes from simulator seed 403 (bench_health_harder's old reporting seed): a clock policy on
``train-h100-000`` while only one job of three GPUs ran there (then two, when one went idle). All of
them ran at about 0.85x their peers' clock on other nodes, together; with fewer than
``node_wide_min_gpus`` busy GPUs neither the node-wide rule nor the node-mates' median applied, so
each was judged against other nodes' peers alone and two of them were cordoned as stragglers
(clock_vs_peers 0.85, power_vs_peers 0.86, clock_vs_node_mates None, 67 minutes). Every busy GPU of
a node slow at once, none well below the others, at lower power as a lower clock target makes them,
is the node's: nothing singles one out. The real stragglers of the same fleet are still cordoned:
one slow GPU beside a normal busy one, one of eight, and (the shape of independent seed 48's
h100-014) two clock stragglers at their peers' power that are their node's only busy GPUs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwarden.analytics.health import scan
from gpuwarden.fleet import ActionKind, FindingKind

START = pd.Timestamp("2026-02-02T00:00:00Z")


def fleet(minutes: int = 300, step_s: int = 30, seed: int = 0) -> pd.DataFrame:
    """Five H100 nodes of 8 busy GPUs (no pods) at ``step_s``; ``GPU-000000NN`` is GPU NN."""
    rng = np.random.default_rng(seed)
    steps, gpus = minutes * 60 // step_s, 40
    stamps = START + pd.to_timedelta(np.arange(steps) * step_s, unit="s")
    frame = pd.DataFrame({
        "timestamp": np.repeat(stamps, gpus), "node": np.tile([f"h100-{g // 8:03d}" for g in range(gpus)], steps),
        "gpu_uuid": np.tile([f"GPU-{g:08d}" for g in range(gpus)], steps), "model": "NVIDIA H100 80GB HBM3",
        "gpu_util_ratio": 0.97, "sm_active_ratio": 0.85,
        "power_watts": 650.0 + rng.normal(0, 8, steps * gpus), "sm_clock_mhz": 1980.0 + rng.normal(0, 5, steps * gpus),
        "throttle_reasons_bitmask": 0})
    frame["temperature_celsius"] = 30 + 0.055 * frame["power_watts"] + rng.normal(0, 0.7, len(frame))
    return frame


def idle(frame: pd.DataFrame, rows: pd.Series) -> None:
    frame.loc[rows, ["gpu_util_ratio", "sm_active_ratio"]] = 0.0
    frame.loc[rows, "power_watts"], frame.loc[rows, "sm_clock_mhz"] = 80.0, 345.0


def the_shape() -> pd.DataFrame:
    frame = fleet()
    minute = (frame["timestamp"] - START).dt.total_seconds() / 60
    gpu = frame["gpu_uuid"].str[-2:].astype(int)
    # h100-001: one job of three GPUs (8-10), the rest idle; a clock policy on the node from minute 60
    # (clock 0.85x, power 0.88x), and GPU 10's work ends at minute 180 while the policy goes on
    idle(frame, (gpu >= 11) & (gpu < 16))
    idle(frame, (gpu == 10) & (minute >= 180))
    policy = (gpu >= 8) & (gpu < 16) & (minute >= 60) & (frame["gpu_util_ratio"] > 0)
    frame.loc[policy, "sm_clock_mhz"] *= 0.85
    frame.loc[policy, "power_watts"] *= 0.88
    # h100-002: two busy GPUs, one a real straggler beside a normal one (16 at 0.8x from minute 60)
    idle(frame, (gpu >= 18) & (gpu < 24))
    frame.loc[(gpu == 16) & (minute >= 60), "sm_clock_mhz"] *= 0.8
    # h100-003: eight busy GPUs, one a real straggler (24 at 0.8x from minute 60)
    frame.loc[(gpu == 24) & (minute >= 60), "sm_clock_mhz"] *= 0.8
    # h100-004: two busy GPUs (32, 33), both real clock stragglers at 0.8x from minute 60, power unchanged
    idle(frame, gpu >= 34)
    frame.loc[(gpu >= 32) & (gpu < 34) & (minute >= 60), "sm_clock_mhz"] *= 0.8
    return frame


def test_a_clock_policy_on_a_node_with_two_or_three_busy_gpus_is_no_straggler_cordon():
    findings = scan(the_shape())
    on_policy_node = [(f.kind, f.gpu_uuid, f.recommended_action) for f in findings if f.node == "h100-001"]
    assert not [f for f in on_policy_node if f[2] in (ActionKind.CORDON, ActionKind.DRAIN)], on_policy_node
    assert not [f for f in on_policy_node if f[0] == FindingKind.STRAGGLER], on_policy_node
    assert {f.kind for f in findings if f.node == "h100-001"} <= {FindingKind.NODE_WIDE_SLOWDOWN}
    assert all(f.gpu_uuid is None for f in findings if f.node == "h100-001")


def test_the_real_stragglers_of_the_same_fleet_are_still_cordoned():
    cordoned = sorted(f.gpu_uuid for f in scan(the_shape()) if f.kind == FindingKind.STRAGGLER
                      and f.recommended_action == ActionKind.CORDON)
    assert cordoned == ["GPU-00000016", "GPU-00000024", "GPU-00000032", "GPU-00000033"]


def _lone(power_factor: float) -> pd.DataFrame:
    """h100-001 runs one busy GPU (8), the rest of it idle; from minute 60 it runs at 0.85x its peers'
    clock and ``power_factor`` their power (simulator seed 428's train-h100-005 under a clock policy)."""
    frame = fleet()
    minute = (frame["timestamp"] - START).dt.total_seconds() / 60
    gpu = frame["gpu_uuid"].str[-2:].astype(int)
    idle(frame, (gpu >= 9) & (gpu < 16))
    slow = (gpu == 8) & (minute >= 60)
    frame.loc[slow, "sm_clock_mhz"] *= 0.85
    frame.loc[slow, "power_watts"] *= power_factor
    return frame


def test_a_nodes_only_busy_gpu_slow_at_lower_power_is_a_warning_not_a_cordon():
    """A clock policy on its node and a slow GPU look the same with no node-mate busy: it is found and
    tainted, never cordoned on that alone. The same slowdown at its peers' power is still cordoned."""
    actions = {power: [(f.kind, f.recommended_action) for f in scan(_lone(power)) if f.gpu_uuid == "GPU-00000008"]
               for power in (0.85, 1.0)}
    assert actions[0.85] and all(action not in (ActionKind.CORDON, ActionKind.DRAIN) for _, action in actions[0.85])
    assert (FindingKind.STRAGGLER, ActionKind.CORDON) in actions[1.0]
