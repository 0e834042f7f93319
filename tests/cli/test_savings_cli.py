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


TIER_KEYS = ["reserved_gpus", "reserved_gpu_hours", "spot_gpu_hours", "on_demand_gpu_hours",
             "gpu_hours_lost_to_reclaims", "cost", "cost_all_on_demand", "cost_saved_pct"]


def test_tiers_add_a_plan_per_served_policy_and_only_with_the_flag(jobs_csv, capsys):
    base = ["--trace", str(jobs_csv), "--slo-wait", "30m", "--gpus", "16", "--format", "json",
            "--policies", "kueue,gpuwarden"]
    code, out, err = _run(base, capsys)
    assert (code, err) == (0, "") and "tiers" not in json.loads(out)
    code, out, err = _run([*base, "--tiers", "--checkpoint-seconds", "0"], capsys)
    assert (code, err) == (0, "")
    tiers = json.loads(out)["tiers"]
    assert tiers["price_book"]["version"] == "2025-11" and tiers["price_book"]["identity"].startswith("built-in")
    assert tiers["gpu_model"] == "NVIDIA H100 80GB HBM3" and tiers["checkpoint_interval_seconds"] == 0.0
    assert tiers["spot_reclaims_per_hour"] == 0.05 and set(tiers["plans"]) == {"kueue", "gpuwarden"}
    plan = tiers["plans"]["gpuwarden"]
    assert set(TIER_KEYS) <= set(plan) and plan["reserved_gpus"] == 4 and plan["on_demand_gpu_hours"] == 4.0
    assert tiers["cost_saved_pct"] == plan["cost_saved_pct"] and 0 < plan["cost_saved_pct"] < 100
    assert plan["gpu_hours_lost_to_reclaims"] > 0


def test_tiers_in_csv_and_table(jobs_csv, capsys):
    base = ["--trace", str(jobs_csv), "--slo-wait", "30m", "--policies", "gpuwarden", "--tiers"]
    code, out, _ = _run([*base, "--format", "csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and list(rows[0]) == ["policy", *KEYS, "replays", *TIER_KEYS] and rows[0]["reserved_gpus"] == "4"
    code, out, _ = _run(base, capsys)
    assert code == 0 and "note: price book built-in (version 2025-11" in out and "Young/Daly" in out


def test_the_cli_defaults_are_the_tier_models():
    from gpuwarden.analytics.pricebook import PriceBook
    from gpuwarden.cli import savings_cmd
    from gpuwarden.scheduling import tiers

    assert savings_cmd.DEFAULT_RECLAIMS_PER_HOUR == tiers.DEFAULT_RECLAIMS_PER_HOUR
    assert savings_cmd.DEFAULT_CHECKPOINT_SECONDS == tiers.DEFAULT_CHECKPOINT_SECONDS
    assert PriceBook.default().model(savings_cmd.DEFAULT_GPU_MODEL).name == savings_cmd.DEFAULT_GPU_MODEL


@pytest.mark.parametrize(("argv", "names"), [
    (["--spot-reclaims-per-hour", "-0.1"], "--spot-reclaims-per-hour"),
    (["--spot-reclaims-per-hour", "nan"], "--spot-reclaims-per-hour"),
    (["--checkpoint-seconds", "-1"], "--checkpoint-seconds"),
    (["--gpu-model", "no-such-gpu"], "--gpu-model: price book (built-in) has no entry for GPU model 'no-such-gpu'"),
])
def test_bad_tier_flags_are_one_line_and_exit_2(jobs_csv, capsys, argv, names):
    """A checkpoint cost of 0 is allowed (free checkpoints: only restarts are lost); negative is not."""
    code, out, err = _run(["--trace", str(jobs_csv), "--tiers", *argv], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and names in err, err


def test_a_price_book_that_is_not_one(jobs_csv, tmp_path, capsys):
    book = tmp_path / "book.yaml"
    book.write_text("models: [1, 2]\n")
    code, out, err = _run(["--trace", str(jobs_csv), "--tiers", "--price-book", str(book)], capsys)
    assert (code, out) == (2, "") and err.count("\n") == 1 and "book.yaml" in err, err


# -- your own history instead of a trace (--since, a store) ----------------------------------------

HISTORY_END = "2026-11-01T02:00:00Z"  # make_samples' two hours of minutes end at 01:59


@pytest.fixture
def history_store(tmp_path):
    from builders import make_samples

    from gpuwarden.store import LocalStore

    LocalStore(tmp_path / "store").append(make_samples(steps=120))  # pod-1 of team-a holds two GPUs throughout
    return tmp_path / "store"


def test_history_from_a_store_is_the_searchs_figures(history_store, capsys):
    import pandas as pd

    from gpuwarden.scheduling.savings_history import history_savings
    from gpuwarden.store import LocalStore

    code, out, err = _run(["--store", str(history_store), "--since", "3h", "--until", HISTORY_END,
                           "--format", "json", "--policies", "kube-default,gpuwarden"], capsys)
    assert code == 0
    report = json.loads(out)
    expected = history_savings(LocalStore(history_store), pd.Timestamp("2026-11-01T00:00:00Z"),
                               pd.Timestamp(HISTORY_END), ("kube-default", "gpuwarden")).report.to_dict()
    assert report == expected  # the same search, the same figures, keys and replays
    assert report["trace"] == "history" and report["jobs"] == 1 and report["window_start"].startswith("2026-11-01T00:00:00")
    assert report["policies"]["gpuwarden"]["nodes"] == 1 and report["gpu_hours_saved_pct"]["vs_kube_default"] == 0.0
    notes = err.splitlines()  # JSON on stdout stays clean: the notes about the input go to stderr
    assert all(line.startswith("note: ") for line in notes) and any("trimmed to the data held" in n for n in notes)
    assert any("fleet seen in the window: 2 GPUs" in n for n in notes)


def test_history_as_a_table_carries_its_notes(history_store, capsys):
    code, out, err = _run(["--store", str(history_store), "--since", "2h", "--until", HISTORY_END,
                           "--policies", "gpuwarden"], capsys)
    assert (code, err) == (0, "")
    assert "of history: 1 GPU jobs" in out and "note: submission times are not in the samples" in out


@pytest.mark.parametrize(("argv", "names"), [
    (["--since", "30m"], "--since: no savings figure between 2026-11-01 01:30 and 2026-11-01 02:00 UTC: too little "
                         "history: the samples cover 30 min"),
    (["--since", "2h", "--trace", "philly"], "--trace: a trace's flag"),
    (["--since", "2h", "--days", "1"], "--days: a trace's flag"),
])
def test_history_refusals_are_one_line_and_exit_2(history_store, capsys, argv, names):
    code, out, err = _run(["--store", str(history_store), "--until", HISTORY_END, *argv], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and names in err, err
