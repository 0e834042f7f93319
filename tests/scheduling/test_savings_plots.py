"""scripts/savings_plots.py: the PNGs it writes, and that what it draws is the savings report's own
figures: worked out by hand on three jobs, and as identities on random small windows."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from system_needs import load_script

from gpuwarden.cli.savings_cmd import savings_report
from gpuwarden.scheduling.savings import Outcome
from gpuwarden.scheduling.savings_jobs import GPUS_PER_NODE

plots = load_script("scripts/savings_plots.py")

HEADER = "submitted,duration_seconds,gpus,team,checkpointable\n"
# Two whole-node jobs at once, then a half-node job after both would have finished. On one node
# one of the first two waits an hour; with a 2 h SLO one node serves: waits 0, 0 and 3600 s, and
# the node is held full for 2 h, then half for 1 h (tests/scheduling/test_savings.py's jobs).
THREE_JOBS = HEADER + ("2017-10-09 00:00:00,3600,8,vision,true\n"
                       "2017-10-09 00:00:00,3600,8,speech,false\n"
                       "2017-10-09 02:00:00,3600,4,vision,yes\n")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _report(path: Path, *argv: str):
    return savings_report(plots.parse(["--trace", str(path), *argv]))[0]


@pytest.fixture
def three_jobs(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text(THREE_JOBS)
    return path


def _lines(figure, policy: str):
    """The artists of ``policy`` on each axes of ``figure``, by their legend label."""
    return [a for ax in figure.axes for a in [*ax.get_lines(), *ax.patches]
            if str(a.get_label()).startswith(f"{policy}:")]


def test_the_script_writes_two_pngs(three_jobs, tmp_path, capsys):
    out = tmp_path / "img"
    argv = ["--trace", str(three_jobs), "--slo-wait", "2h", "--gpus", "8", "--policies", "kueue,gpuwarden",
            "--out-dir", str(out)]
    assert plots.main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    for name in (plots.WAIT_CDF_PNG, plots.UTILISATION_PNG):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC)
        with Image.open(out / name) as image:
            image.verify()
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.size[0] >= 800 and image.size[1] >= 500


def test_a_bad_trace_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + "2017-10-09,60,-2,a,true\n")
    assert plots.main(["--trace", str(path), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gpus '-2' is negative" in err
    assert not list(tmp_path.glob("*.png"))


def test_the_wait_cdf_is_the_jobs_waits_worked_out_by_hand(three_jobs):
    report = _report(three_jobs, "--slo-wait", "2h", "--gpus", "8", "--policies", "kueue,gpuwarden")
    figure = plots.wait_cdf_figure(report)
    for policy in ("kueue", "gpuwarden"):
        figures = report.policy_figures(policy)
        assert figures["nodes"] == 1
        [line] = _lines(figure, policy)
        assert list(line.get_xdata()) == [0.0, 0.0, 3600.0]  # the last point: the longest wait
        assert list(line.get_ydata()) == pytest.approx([1 / 3, 2 / 3, 1.0])
        assert figures["wait_p95"] == pytest.approx(3240.0)  # numpy's p95 of 0, 0, 3600, between the last two
    [slo] = [a for a in figure.axes[0].get_lines() if str(a.get_label()).startswith("SLO")]
    assert list(slo.get_xdata()) == [7200.0, 7200.0]


def test_the_utilisation_is_the_load_over_the_fleet_worked_out_by_hand(three_jobs):
    report = _report(three_jobs, "--slo-wait", "2h", "--gpus", "8", "--policies", "kueue")
    figure = plots.utilisation_figure(report)
    whole, window = _lines(figure, "kueue")
    held, edges, _ = whole.get_data()
    assert list(edges) == [0.0, 1.0, 2.0, 3.0] and list(held) == [1.0, 1.0, 0.5]  # hours; GPUs held / 8
    assert np.average(held, weights=np.diff(edges)) == pytest.approx(report.policy_figures("kueue")["utilisation"])
    assert window.get_data()[0].tolist() == held.tolist()  # the window's panel draws the same series
    assert figure.axes[1].get_xlim() == (0.0, pytest.approx(report.workload.window_seconds / 3600.0))


def test_a_policy_that_never_served_has_no_series(three_jobs):
    report = _report(three_jobs, "--slo-wait", "30m", "--gpus", "8", "--policies", "kueue")
    report.outcomes["gone"] = Outcome("gone", 2, False, "stand-in: no fleet served")
    assert plots.served(report) == ["kueue"]
    assert _lines(plots.wait_cdf_figure(report), "gone") == []


jobs = st.lists(st.tuples(st.integers(0, 7200), st.integers(1, 7200), st.sampled_from([1, 2, 4, 8, 16]),
                          st.sampled_from(["a", "b"]), st.booleans()), min_size=1, max_size=8)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=jobs, policy=st.sampled_from(["kube-default", "kueue", "gpuwarden"]))
def test_the_plotted_series_are_the_reports_figures(rows, policy):
    """On any small window: the CDF has one point per job and ends at the longest wait, the report's
    p95 lies between the two jobs numpy's p95 interpolates; the utilisation curve spans the horizon
    GPU-hours provisioned count, and its time-mean is the replay's held GPU-hours over provisioned:
    at least useful / provisioned (held GPUs do the useful work, and resumes on top)."""
    text = HEADER + "".join(f"2017-10-09 {s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d},{d},{g},{t},{str(c).lower()}\n"
                            for s, d, g, t, c in rows)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "jobs.csv"
        path.write_text(text)
        report = _report(path, "--slo-wait", "1h", "--gpus", "16", "--policies", policy)
    if policy not in plots.served(report):
        return
    figures = report.policy_figures(policy)
    outcome = report.outcomes[policy]
    [line] = _lines(plots.wait_cdf_figure(report), policy)
    waits = np.asarray(line.get_xdata(), dtype=float)
    n = len(report.workload.jobs)
    assert len(waits) == n and np.all(np.diff(waits) >= 0) and waits[-1] == pytest.approx(max(outcome.waits))
    assert line.get_ydata()[-1] == 1.0
    rank = 0.95 * (n - 1)
    assert waits[math.floor(rank)] - 1e-6 <= figures["wait_p95"] <= waits[math.ceil(rank)] + 1e-6
    whole, _ = _lines(plots.utilisation_figure(report), policy)
    share, edges, _ = whole.get_data()
    fleet_gpus = figures["nodes"] * GPUS_PER_NODE
    assert edges[0] == 0.0 and edges[-1] * fleet_gpus == pytest.approx(figures["gpu_hours_provisioned"])
    assert np.all(share >= 0) and np.all(share <= 1 + 1e-9)
    mean = float(np.average(share, weights=np.diff(edges)))
    assert mean == pytest.approx(outcome.load.gpu_hours / figures["gpu_hours_provisioned"])
    assert mean >= figures["utilisation"] - 1e-9
