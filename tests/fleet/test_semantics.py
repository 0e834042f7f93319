"""fleet.semantics: the one MIG-share rule (scalar and frame forms agree), reset-aware counter
increase, UTC normalising and the default pool of a node."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.fleet.semantics import (
    counter_increase,
    counter_increments,
    counter_resets,
    default_pool,
    gpu_compute_slices,
    group_first_rows,
    iso_utc,
    mig_share,
    mig_shares,
    profile_slices,
    request_gpu_equivalents,
    to_utc,
    to_utc_or_none,
    utc_times,
)

T0 = pd.Timestamp("2026-03-02T00:00:00Z")
H100 = "NVIDIA H100 80GB HBM3"


def test_profile_slices_read_every_spelling_and_refuse_what_names_none():
    assert profile_slices("3g.40gb") == 3
    assert profile_slices("1:3g.40gb") == 3
    assert profile_slices("mig-2g.20gb") == 2
    assert profile_slices("MIG 1g.10gb") == 1
    assert profile_slices("weird") is None
    assert profile_slices("0g.0gb") is None
    assert profile_slices(None) is None


def test_compute_slices_follow_the_model():
    assert gpu_compute_slices(H100) == 7
    assert gpu_compute_slices("NVIDIA A30") == 4
    assert gpu_compute_slices(None) == 7


def test_mig_share_scalar_rule():
    assert mig_share(None) == 1.0
    assert mig_share("3g.40gb") == pytest.approx(3 / 7)
    assert mig_share("2g.12gb", "NVIDIA A30") == pytest.approx(0.5)
    assert mig_share("7g.80gb") == 1.0
    # Unreadable: one slice only when nothing is known about the siblings...
    assert mig_share("odd") == pytest.approx(1 / 7)
    # ...alone on its GPU it holds all of it...
    assert mig_share("odd", siblings=()) == 1.0
    # ...else what the readable siblings leave, split among the unreadable ones.
    assert mig_share("odd", siblings=("3g.40gb", "strange")) == pytest.approx((1 - 3 / 7) / 2)
    assert mig_share("odd", siblings=("4g.40gb", "3g.40gb")) == 0.0


def test_request_gpu_equivalents():
    assert request_gpu_equivalents("1g.10gb") == pytest.approx(1 / 7)
    assert request_gpu_equivalents(None, count=2, fraction_milli=500) == 1.0


def test_mig_shares_on_a_frame_splits_the_leftover_among_unreadable_siblings():
    frame = pd.DataFrame({
        "timestamp": [T0] * 4 + [T0 + pd.Timedelta(minutes=1)] * 2,
        "gpu_uuid": ["g1", "g1", "g1", "g2", "g1", "g1"],
        "mig_instance": ["1:3g.40gb", "2:x", "3:y", None, "1:3g.40gb", "2:x"],
        "model": [H100] * 6,
    })
    shares = mig_shares(frame).tolist()
    assert shares[0] == pytest.approx(3 / 7)
    assert shares[1] == shares[2] == pytest.approx(2 / 7)  # (1 - 3/7) / 2
    assert shares[3] == 1.0
    assert shares[5] == pytest.approx(4 / 7)  # one unreadable sibling at the second minute
    # Without a GPU column nothing is known about siblings: one slice.
    assert mig_shares(frame.drop(columns="gpu_uuid")).tolist()[1] == pytest.approx(1 / 7)


profiles = st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "odd", "weird"])


@settings(max_examples=60, deadline=None)
@given(st.lists(profiles, min_size=1, max_size=7))
def test_scalar_and_frame_forms_agree_and_a_gpu_never_exceeds_one(layout):
    frame = pd.DataFrame({"timestamp": [T0] * len(layout), "gpu_uuid": ["g"] * len(layout),
                          "mig_instance": [f"{i}:{p}" for i, p in enumerate(layout)]})
    vector = mig_shares(frame).tolist()
    for i, profile in enumerate(layout):
        siblings = [f"{j}:{p}" for j, p in enumerate(layout) if j != i]
        assert vector[i] == pytest.approx(mig_share(f"{i}:{profile}", siblings=siblings))
    if any(profile_slices(p) is None for p in layout):
        assert sum(vector) == pytest.approx(max(1.0, sum(min(1.0, (profile_slices(p) or 0) / 7) for p in layout)))


def test_counter_increments_treat_a_drop_as_a_reset_and_skip_nulls():
    values = np.array([3, 3, np.nan, 0, 0, 1, 1, 5, 2], dtype=float)
    first = np.array([0] * 7 + [7, 7])
    inc, reset = counter_increments(values, first)
    assert inc.tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 2]
    assert reset.tolist() == [False, False, False, True, False, False, False, False, True]
    assert group_first_rows(np.array(["a", "a", "b", "b", "b"])).tolist() == [0, 0, 2, 2, 2]


def test_counter_increase_per_gpu_counts_mig_rows_once():
    stamps = [T0 + pd.Timedelta(minutes=m) for m in range(5)]
    frame = pd.DataFrame({
        "gpu_uuid": ["c"] * 5 + ["c"] * 5 + ["d"] * 2,
        "timestamp": stamps + stamps + stamps[:2],
        # the second copy repeats the counter (a MIG sibling), a reset at minute 2, a null for d
        "x": [1, 2, 0, 1, 2] * 2 + [np.nan, np.nan],
    })
    assert counter_increase(frame, "x").to_dict() == {"c": 3.0}  # +1, reset (0), +1, +1
    assert counter_resets(frame, ["x"]) == {"x": 1}
    assert counter_increase(frame.iloc[0:0], "x").empty


def test_utc_normalising():
    assert to_utc("2026-03-02T01:00:00") == pd.Timestamp("2026-03-02T01:00:00Z")
    assert to_utc(pd.Timestamp("2026-03-02T02:00:00+01:00")) == pd.Timestamp("2026-03-02T01:00:00Z")
    assert str(to_utc("2026-03-02").tz) == "UTC"
    assert to_utc_or_none(None) is None
    with pytest.raises(ValueError):
        to_utc(None)
    times = utc_times(["2026-03-02T01:00:00Z", "not a time", None])
    assert str(times.dt.tz) == "UTC" and times.isna().tolist() == [False, True, True]
    assert utc_times(pd.Series(pd.to_datetime(["2026-03-02 01:00"]))).iloc[0] == pd.Timestamp("2026-03-02T01:00Z")
    assert iso_utc("2026-03-02T01:00:00.5+00:00") == "2026-03-02T01:00:00Z"
    assert iso_utc("2026-03-02T01:00:00.5+00:00", fraction=True) == "2026-03-02T01:00:00.500000Z"


def test_default_pool():
    assert default_pool("train-h100-007") == "train-h100"
    assert default_pool("dgx-special") == "dgx-special"
    assert default_pool("-12") == "-12"


def test_the_scalar_rules_load_without_pandas():
    """The exporter imports fleet (whose GpuRequest counts MIG shares) and must never load pandas."""
    import subprocess
    import sys

    code = ("import sys, gpuwarden.fleet as f; print(f.GpuRequest(mig_profile='3g.40gb').gpu_equivalents > 0.4, "
            "'pandas' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["True", "False"]
