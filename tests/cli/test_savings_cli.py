"""``gpuwarden simulate savings``: every output format on a tiny jobs CSV, the JSON keys, each bad
input as one line and exit 2, and one short run on the Philly trace."""

from __future__ import annotations

import csv
import io
import json

import pytest

from gpuwarden.cli import main

HEADER = "submitted,duration_seconds,gpus,team,checkpointable\n"
JOBS = HEADER + ("2017-10-09 00:00:00,3600,8,vision,true\n"
                 "2017-10-09 00:00:00,3600,8,speech,false\n"
                 "2017-10-09 02:00:00,3600,4,vision,yes\n")
KEYS = ["nodes", "gpu_hours_provisioned", "useful_gpu_hours", "utilisation", "jct_mean", "wait_p95",
        "worst_team_guarantee_met"]


@pytest.fixture
def jobs_csv(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text(JOBS)
    return path


def _run(argv, capsys):
    """Exit code, standard output and error of ``gpuwarden simulate savings ARGV`` (argparse's refusals too)."""
    try:
        code = main(["simulate", "savings", *argv])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_each_policys_figures_and_the_savings(jobs_csv, capsys):
    code, out, err = _run(["--trace", str(jobs_csv), "--slo-wait", "30m", "--gpus", "8", "--format", "json",
                           "--policies", "kueue,gpuwarden"], capsys)
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert list(report["policies"]) == ["kueue", "gpuwarden"]
    assert all(list(figures) == KEYS for figures in report["policies"].values())
    assert report["policies"]["gpuwarden"]["nodes"] == 2  # worked out by hand in tests/scheduling/test_savings.py
    assert report["gpu_hours_saved_pct"] == {"vs_kube_default": None, "vs_kueue": 0.0}
    assert report["replays"] == 4 and report["tail_seconds"] == 3600.0 and report["slo_wait_seconds"] == 1800.0


def test_table_csv_and_markdown(jobs_csv, tmp_path, capsys):
    base = ["--trace", str(jobs_csv), "--slo-wait", "30m", "--policies", "fifo"]
    code, out, _ = _run([*base, "--format", "csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["policy"] for r in rows] == ["fifo"] and rows[0]["nodes"] == "2"
    assert list(rows[0]) == ["policy", *KEYS, "replays"]
    code, out, _ = _run(base, capsys)
    assert code == 0 and out.startswith("policy ") and "note: 2 replays in" in out and "tail 1.0 h" in out
    code, out, _ = _run([*base, "--format", "markdown", "--output", str(tmp_path / "out.md")], capsys)
    assert code == 0 and out == "" and (tmp_path / "out.md").read_text().startswith("| policy | nodes |")


@pytest.mark.parametrize(("text", "argv", "names"), [
    ("submitted,duration_seconds,gpus\n2017-10-09,60,1\n", [], "missing column(s) team"),
    (HEADER + "2017-10-09,60,1,a,true\n2017-10-09,-5,1,a,true\n", [], "jobs.csv:3: duration_seconds '-5' is negative"),
    (HEADER + "2017-10-09,60,-2,a,true\n", [], "jobs.csv:2: gpus '-2' is negative"),
    (HEADER + "2017-10-09,60,1,,true\n", [], "jobs.csv:2: team '' is empty"),
    (JOBS, ["--start", "2018-01-01"], "--start 2018-01-01 00:00 --days"),
    (JOBS, ["--start", "2017-10-09", "--days", "0.01", "--max-jobs", "1", "--policies", "fifo,nope"],
     "--policies: 'nope' is not a queue policy"),
    (JOBS, ["--start", "not-a-date"], "--start"),
    (JOBS, ["--gpus", "-8"], "--gpus"),
    (JOBS, ["--slo-wait", "0s"], "--slo-wait"),
    (JOBS, ["--days", "0"], "--days"),
])
def test_bad_input_is_one_line_naming_the_row_or_flag_and_exit_2(tmp_path, capsys, text, argv, names):
    path = tmp_path / "jobs.csv"
    path.write_text(text)
    code, out, err = _run(["--trace", str(path), *argv], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and names in err, err


def test_a_trace_that_is_not_a_file(tmp_path, capsys):
    code, _, err = _run(["--trace", str(tmp_path / "missing.csv")], capsys)
    assert code == 2 and err.count("\n") == 1 and "--trace" in err


def test_a_short_philly_window(data_dir, capsys):
    code, out, err = _run(["--data-dir", str(data_dir), "--max-jobs", "150", "--policies", "kueue,gpuwarden",
                           "--gpus", "64", "--format", "json"], capsys)
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["trace"] == "philly" and report["jobs"] == 150
    assert report["window_start"].startswith("2017-10-09T00:00:00")
    for figures in report["policies"].values():
        assert figures["nodes"] >= report["node_bounds"][0] and 0 < figures["utilisation"] <= 1
        assert figures["wait_p95"] <= 3600.0
    assert report["replays"] >= 4 and isinstance(report["gpu_hours_saved_pct"]["vs_kueue"], float)
