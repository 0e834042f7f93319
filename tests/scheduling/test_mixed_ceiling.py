"""The mixed replay's ceiling (issue 32 item 4): the most a schedule serving every service from its
submission could reach. It must bound what both policies measure, through the production replay,
and equal a hand-computed figure where the stream is small enough to add up by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.cli.simulate_cmd import mixed_rows
from gpuwarden.fleet import WorkloadKind
from gpuwarden.scheduling.engine import Job
from gpuwarden.scheduling.replay_mixed import SERVICE_BUSY_RATIO, TRAINING_BUSY_RATIO, MixedSpec, ceiling


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), training_per_hour=st.sampled_from([2.0, 7.0, 12.0]))
def test_no_policy_beats_the_ceiling(seed: int, training_per_hour: float) -> None:
    spec = MixedSpec(seed=seed, hours=18.0, training_per_hour=training_per_hour)
    for row in mixed_rows(spec):
        assert row["useful_utilisation"] <= row["useful_ceiling"] + 1e-9, row
        assert row["training_gpu_hours_per_hour"] <= row["training_gpu_hours_per_hour_ceiling"] + 1e-9, row


def test_ceiling_by_hand() -> None:
    """128 GPUs, measured from 8 h to 24 h. One 1g.10gb service on an H100 (1/7 of a GPU) lives
    10-14 h; a 64-GPU job submitted at 9 h runs at most its 2 h; a 100-GPU job submitted at 20 h runs
    at most the 4 h left in the window."""
    spec = MixedSpec(hours=24.0)
    hour = 3600.0
    jobs = [
        Job(name="svc", team="inference", kind=WorkloadKind.INFERENCE, priority=3, mig_profile="1g.10gb",
            gpu_model="H100", submitted=10 * hour, duration=4 * hour),
        Job(name="a", team="research", kind=WorkloadKind.TRAINING, gpus_per_pod=8, pods=8, submitted=9 * hour,
            duration=2 * hour),
        Job(name="b", team="research", kind=WorkloadKind.TRAINING, gpus_per_pod=4, pods=25, submitted=20 * hour,
            duration=10 * hour),
    ]
    bound = ceiling(jobs, spec)
    window = 16 * hour
    training = 64 * 2 * hour + 100 * 4 * hour
    useful = SERVICE_BUSY_RATIO * (1 / 7) * 4 * hour + TRAINING_BUSY_RATIO * training
    assert bound.training_gpus == pytest.approx(training / window)
    assert bound.useful_ratio == pytest.approx(useful / (128 * window))


def test_the_fleet_caps_training() -> None:
    """More training asked for than the fleet holds: the ceiling is the fleet less the services."""
    spec = MixedSpec(hours=24.0)
    hour = 3600.0
    jobs = [Job(name=f"t{i}", team="research", kind=WorkloadKind.TRAINING, gpus_per_pod=8, pods=1, submitted=0.0,
                duration=100 * hour) for i in range(40)]
    jobs.append(Job(name="svc", team="inference", kind=WorkloadKind.INFERENCE, priority=3, mig_profile="3g.40gb",
                    gpu_model="H100", submitted=0.0, duration=100 * hour))
    bound = ceiling(jobs, replace(spec))
    assert bound.training_gpus == pytest.approx(128 - 3 / 7)
