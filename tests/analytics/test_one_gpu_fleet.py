"""Peer detectors on fleets too small to have peers (issue 35's known gap): a one-GPU fleet, or a
model's only card, is judged against its own history instead of not at all, and a steady GPU alone
raises nothing. Fleets are fleet samples read by the production ``scan``."""

from __future__ import annotations

import pandas as pd
import pytest
from builders import HEALTH_START, busy_fleet

from gpuwarden.analytics.health import scan
from gpuwarden.fleet import ActionKind, FindingKind


def alone(gpus: int = 1, hours: int = 12) -> pd.DataFrame:
    frame = busy_fleet(1, ["job"], minutes=hours * 60)
    return frame[frame["gpu_uuid"].str[-1].astype(int) < gpus].reset_index(drop=True)


def minutes(frame: pd.DataFrame) -> pd.Series:
    return (frame["timestamp"] - HEALTH_START).dt.total_seconds() / 60


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_lone_gpu_slowing_down_is_a_straggler_against_its_own_history(gpus):
    frame = alone(gpus)
    frame.loc[(frame["gpu_uuid"] == "GPU-0-0") & (minutes(frame) >= 600), "sm_clock_mhz"] *= 0.8
    findings = scan(frame)
    assert [(f.kind, f.gpu_uuid) for f in findings] == [(FindingKind.STRAGGLER, "GPU-0-0")]
    assert findings[0].evidence["clock_vs_own_history_60m"] == pytest.approx(0.8, abs=0.03)
    assert findings[0].recommended_action == ActionKind.CORDON  # sustained past straggler_cordon_after_s


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_lone_gpu_warming_is_cooling_degrading(gpus):
    frame = alone(gpus)
    frame.loc[(frame["gpu_uuid"] == "GPU-0-0") & (minutes(frame) >= 540), "temperature_celsius"] += 15
    assert [(f.kind, f.gpu_uuid) for f in scan(frame)] == [(FindingKind.COOLING_DEGRADING, "GPU-0-0")]


def test_a_steady_lone_gpu_and_one_slowed_by_heavier_power_raise_nothing():
    assert scan(alone()) == []
    frame = alone()
    later = minutes(frame) >= 600
    frame.loc[later, "sm_clock_mhz"] *= 0.85  # a heavier phase: lower clock at more power is load
    frame.loc[later, "power_watts"] *= 1.15
    assert scan(frame) == []
