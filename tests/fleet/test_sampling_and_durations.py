"""One sampling-step rule and one duration parser, both in gpuwarden.fleet."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest

from gpuwarden.cli.sources import duration
from gpuwarden.fleet.durations import DurationError, parse_duration_seconds
from gpuwarden.fleet.sampling import NS_PER_SECOND, sampling_step_ns, sampling_step_seconds
from gpuwarden.store.prometheus.client import PrometheusError, duration_seconds

S = NS_PER_SECOND
T0 = np.datetime64("2026-01-05T00:00:00", "ns")


def _times(seconds) -> np.ndarray:
    return T0 + (np.asarray(seconds, dtype=np.float64) * S).astype("timedelta64[ns]")


def test_regular_samples_give_their_interval():
    assert sampling_step_ns(_times(np.arange(0, 600, 15))) == 15 * S
    assert sampling_step_seconds(_times(np.arange(0, 600, 15))) == 15.0


def test_gaps_do_not_move_the_step():
    seconds = np.r_[np.arange(0, 3600, 60), np.arange(7200, 9000, 60)]  # an hour-long hole
    assert sampling_step_ns(_times(seconds)) == 60 * S


def test_jitter_leaves_the_median_at_the_interval():
    rng = np.random.default_rng(7)
    seconds = np.arange(0, 6000, 30) + rng.uniform(-0.4, 0.4, 200)
    step = sampling_step_seconds(_times(seconds))
    assert 29.6 < step < 30.4
    assert step != 30.0  # measured, not a default


def test_series_are_measured_apart_and_need_no_sorting():
    # Two GPUs scraped 60 s apart each, 30 s out of phase: across the fleet times are 30 s apart.
    a = np.arange(0, 3600, 60)
    times = _times(np.r_[a, a + 30])
    gpus = np.r_[np.zeros(a.size, int), np.ones(a.size, int)]
    shuffle = np.random.default_rng(1).permutation(times.size)
    assert sampling_step_ns(times[shuffle], gpus[shuffle]) == 60 * S
    assert sampling_step_ns(times[shuffle]) == 30 * S  # one series: the fleet's distinct times
    labels = np.where(gpus == 0, "GPU-a", "GPU-b")[shuffle]
    assert sampling_step_ns(times[shuffle], labels) == 60 * S


def test_repeated_times_in_a_series_are_not_a_spacing():
    times = _times(np.repeat(np.arange(0, 600, 20), 7))  # a GPU's seven MIG instances share each time
    assert sampling_step_ns(times, np.zeros(times.size, int)) == 20 * S


def test_no_spacing_gives_none_or_the_default():
    assert sampling_step_ns(_times([5])) is None
    assert sampling_step_ns(_times([5, 5, 5])) is None
    assert sampling_step_ns(_times([0, 60]), np.array([0, 1])) is None  # one sample per series
    assert sampling_step_seconds(_times([0]), default_seconds=45.0) == 45.0
    assert sampling_step_ns(np.array([0, 10 * S, 20 * S], dtype=np.int64)) == 10 * S  # integer nanoseconds


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="2 labels for 3 times"):
        sampling_step_ns(_times([0, 1, 2]), np.array([0, 1]))
    with pytest.raises(ValueError, match="expected datetime64 values or integer nanoseconds"):
        sampling_step_ns(np.array([0.5, 1.5]))


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90), ("15m", 900), ("6h", 21600), ("7d", 604800), ("1w", 604800), ("1y", 31536000),
    ("1h30m", 5400), ("2d12h", 216000), ("250ms", 0.25), ("1.5h", 5400), (" 7d ", 604800),
])
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, message", [
    ("week", "'week' is not a duration; expected a number and a unit, one of y, w, d, h, m, s, ms"),
    ("7", "'7' is not a duration"),
    ("7x", "one of y, w, d, h, m, s, ms"),
    ("-5m", "'-5m' is not a duration"),
    ("", "'' is not a duration"),
    ("30m1h", "units must go from the largest to the smallest"),
    ("1h1h", "units must go from the largest to the smallest"),
])
def test_bad_durations_name_the_value_and_the_units(text, message):
    with pytest.raises(DurationError, match=message.replace("(", r"\(")):
        parse_duration_seconds(text)


def test_the_cli_and_the_prometheus_client_share_the_parser():
    assert duration("1h30m") == pd.Timedelta(minutes=90)
    assert duration_seconds("1h30m") == 5400.0
    with pytest.raises(argparse.ArgumentTypeError, match="'soon' is not a duration; expected a number and a unit"):
        duration("soon")
    with pytest.raises(PrometheusError, match="'soon' is not a duration; expected a number and a unit"):
        duration_seconds("soon")
    with pytest.raises(argparse.ArgumentTypeError, match="out of range"):
        duration("0s")
