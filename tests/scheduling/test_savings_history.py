"""GPU-hours saved on your own history (gpuwarden/scheduling/savings_history.py): fleet samples of
known pods give the same figures as the savings search on the jobs CSV of those pods, written by
hand; the shares, the rounding of MIG slices, the dashboard's bundle, and why it cannot say."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
from builders import make_samples

from gpuwarden.analytics.windows import Window
from gpuwarden.scheduling.savings import find_savings, savings_policies
from gpuwarden.scheduling.savings_history import (
    history_savings,
    history_workload,
    savings_bundle,
)
from gpuwarden.scheduling.savings_jobs import file_workload
from gpuwarden.scheduling.whatif_history import History
from gpuwarden.scheduling.whatif_history import Workload as Rebuilt
from gpuwarden.store import LocalStore, coerce

START = pd.Timestamp("2026-11-01T00:00:00Z")
STEPS = 240  # four hours of 60 s samples
H100 = "NVIDIA H100 80GB HBM3"
# (team, pod, GPUs held, first step, step after the last): 16 GPUs, two to a node; at steps 90-120
# all 16 are held, so a fleet of one 8-GPU node makes work wait and two start everything on time.
PODS = [("vision", "v1", (0, 1), 0, 180), ("vision", "v2", (2, 3), 0, 180), ("vision", "v3", (4, 5), 30, 150),
        ("vision", "v4", (6, 7), 30, 150), ("speech", "s1", (8, 9), 0, 120), ("speech", "s2", (10, 11), 60, 240),
        ("speech", "s3", (12, 13), 60, 240), ("speech", "s4", (14, 15), 90, 200), ("speech", "s5", (4, 5), 160, 240),
        ("vision", "v5", (0, 1), 190, 240)]
GPU_MINUTES = {"vision": 2 * (180 + 180 + 120 + 120 + 50), "speech": 2 * (120 + 180 + 180 + 110 + 80)}


def samples(pods=PODS, steps: int = STEPS) -> pd.DataFrame:
    """``make_samples``' schema on 16 GPUs, every GPU's owner known; ``pods`` hold their GPUs."""
    frame = make_samples(start=START.isoformat(), steps=steps, gpus=16)
    step = ((frame["timestamp"] - START).dt.total_seconds() // 60).astype(int).to_numpy()
    index = frame["gpu_index"].to_numpy() + 2 * frame["node"].str.removeprefix("node-").astype(int).to_numpy()
    columns = {c: [None] * len(frame) for c in ("namespace", "pod", "team", "project")}
    for team, pod, gpus, first, after in PODS if pods is PODS else pods:
        for row in ((step >= first) & (step < after) & pd.Series(index).isin(gpus).to_numpy()).nonzero()[0]:
            columns["namespace"][row], columns["pod"][row], columns["team"][row] = team, pod, team
            columns["project"][row] = team
    frame = frame.assign(**columns, attribution="known")
    return coerce(frame)


def jobs_csv(tmp_path: Path) -> Path:
    """The same pods as a jobs CSV, in the rebuild's order (first sample, then name)."""
    rows = sorted(PODS, key=lambda p: (p[3], f"{p[0]}/{p[1]}"))
    lines = ["submitted,duration_seconds,gpus,team,checkpointable"]
    lines += [f"{(START + pd.Timedelta(minutes=first)).strftime('%Y-%m-%d %H:%M:%S')},{(after - first) * 60},"
              f"{len(gpus)},{team},true" for team, _, gpus, first, after in rows]
    path = tmp_path / "jobs.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_rebuilt_workload_is_the_jobs_csv_with_shares_by_gpu_hours(tmp_path):
    found = history_savings(samples(), START, START + pd.Timedelta(minutes=STEPS), ("fifo",))
    workload = found.report.workload
    by_hand = file_workload(jobs_csv(tmp_path), "2026-11-01 00:00:00", STEPS * 60 / 86400)
    assert [(j.submitted, j.duration, j.pods * j.gpus_per_pod, j.team) for j in workload.jobs] == \
        [(j.submitted, j.duration, j.pods * j.gpus_per_pod, j.team) for j in by_hand.jobs]
    assert workload.window_seconds == pytest.approx(by_hand.window_seconds) and workload.start == by_hand.start
    assert workload.useful_gpu_seconds == by_hand.useful_gpu_seconds == 60 * sum(GPU_MINUTES.values())
    total = sum(GPU_MINUTES.values())
    assert workload.shares == pytest.approx({team: minutes / total for team, minutes in GPU_MINUTES.items()})
    assert found.fleet_gpus == 16 and found.notes == ()


@pytest.mark.parametrize(("slo_hours", "nodes"), [(1, (2, 2)), (2, (2, 1)), (4, (1, 1))])
def test_the_figure_is_the_searchs_on_the_equivalent_workload(tmp_path, slo_hours, nodes):
    """Every policy, three SLOs: with 1 h every policy needs two nodes; with 2 h kube-default and fifo
    make do with one (their waits, 6,660 s at p95, fit) and gpuwarden does not; with 4 h all do."""
    found = history_savings(samples(), START, START + pd.Timedelta(minutes=STEPS), savings_policies(), slo_hours * 3600.0)
    total = sum(GPU_MINUTES.values())
    by_hand = dataclasses.replace(file_workload(jobs_csv(tmp_path), "2026-11-01 00:00:00", STEPS * 60 / 86400),
                                  shares={team: minutes / total for team, minutes in GPU_MINUTES.items()})
    expected = find_savings(by_hand, savings_policies(), 16, slo_hours * 3600.0).to_dict()  # from the fleet's 16 GPUs
    got = found.report.to_dict()
    for key in ("policies", "gpu_hours_saved_pct", "replays_by_policy", "node_bounds", "jobs", "deadline_seconds"):
        assert got[key] == expected[key], key
    figure = found.figure()
    policies = expected["policies"]
    assert figure["ok"] and figure["baseline"] == "kube-default"
    assert (figure["nodes"], figure["baseline_nodes"]) == (policies["gpuwarden"]["nodes"], policies["kube-default"]["nodes"])
    assert (figure["nodes"], figure["baseline_nodes"]) == nodes
    assert figure["saved_pct"] == pytest.approx(expected["gpu_hours_saved_pct"]["vs_kube_default"])
    saved = figure["saved_pct"]
    assert figure["headline"] == (
        f"gpuwarden would have served this window's work on {figure['nodes']} nodes against kube-default's "
        f"{figure['baseline_nodes']}: {abs(saved):.0f}% {'fewer' if saved >= 0 else 'more'} GPU-hours")


def test_mig_slices_and_shares_count_as_whole_gpus():
    def rebuilt(name: str, gpus: int, profile: str | None, fraction: float) -> Rebuilt:
        return Rebuilt(name, "t", H100, gpus, profile, fraction, 0.0, ((0.0, 3600.0),))

    history = History(START, START + pd.Timedelta(hours=2), 60.0,
                      (rebuilt("a", 3, "3g.40gb", 1.0), rebuilt("b", 1, "1g.10gb", 1.0), rebuilt("c", 1, None, 0.5),
                       rebuilt("d", 4, None, 1.0)), ())
    workload, notes = history_workload(history)
    equivalents = [w.gpu_equivalents for w in history.workloads]
    assert equivalents[0] > 1 and equivalents[1] < 1  # three 3g slices are more than a GPU, one 1g less
    assert [j.pods * j.gpus_per_pod for j in workload.jobs] == [2, 1, 1, 4]
    assert notes == ["3 MIG or time-sliced workload(s) counted as whole GPUs (the search places whole GPUs)"]


@pytest.mark.parametrize(("pods", "steps", "why"), [
    (PODS, 50, "too little history: the samples cover 50 min, the figure needs at least 60 min"),
    ([], STEPS, "no pod held a GPU in this window"),
])
def test_why_it_cannot_say(pods, steps, why):
    found = history_savings(samples(pods, steps), START, START + pd.Timedelta(minutes=STEPS))
    figure = found.figure()
    assert found.report is None and not figure["ok"] and figure["why"].startswith(why)
    assert figure["headline"] == f"No savings figure for this window: {figure['why']}."


def test_a_younger_store_starts_the_window_at_its_first_sample():
    later = START - pd.Timedelta(days=1)  # asked from a day before the first sample
    found = history_savings(samples(), later, START + pd.Timedelta(minutes=STEPS), ("fifo",))
    assert found.start == START and found.report.workload.window_seconds == STEPS * 60


def test_the_dashboard_bundle_reads_the_store(tmp_path):
    LocalStore(tmp_path).append(samples())
    end = START + pd.Timedelta(minutes=STEPS)
    bundle = savings_bundle(LocalStore(tmp_path), Window(START, end, "test", "24h"), 7.0)
    assert (bundle.start, bundle.end, bundle.version) == (START, end, 7.0)
    assert bundle["figure"] == history_savings(samples(), START, end).figure()
