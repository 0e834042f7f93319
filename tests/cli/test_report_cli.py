"""``gpuwarden report``: every report in every format over a small simulated store, the stable JSON
keys, and the errors a user can cause."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from gpuwarden.analytics.report_schema import REPORT_KINDS, SUMMARY_KEYS, TABLE_NAMES, TOP_LEVEL_KEYS
from gpuwarden.cli import main
from gpuwarden.store import LocalStore

REPORTS_DOC = Path(__file__).resolve().parents[2] / "gpuwarden" / "analytics" / "REPORTS.md"


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> str:
    from gpuwarden.cli.simfleet import simulated_fleet
    from gpuwarden.sim import SimConfig

    root = tmp_path_factory.mktemp("report-store")
    store = LocalStore(root)
    for chunk in simulated_fleet(SimConfig(nodes=8, seed=11)).iter_chunks(240, chunk_steps=120):
        store.append(chunk)
    return str(root)


# The simulated fleet's default clock: 240 one-minute steps from 2026-11-23. Windows end at now
# unless --until says otherwise, so these tests name the end of the data they made.
DATA_END = "2026-11-23T04:00:00Z"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    argv = [*argv, "--until", DATA_END] if "--until" not in argv else list(argv)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("kind", REPORT_KINDS)
def test_json_keys_are_stable_and_documented(capsys, store_dir, kind):
    code, out, err = run(capsys, "report", kind, "--store", store_dir, "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert tuple(data) == TOP_LEVEL_KEYS
    assert data["report"] == kind and data["schema_version"] == 1
    assert tuple(data["summary"]) == SUMMARY_KEYS[kind]
    assert tuple(data["tables"]) == TABLE_NAMES[kind]
    assert set(data["window"]) == {"start", "end", "hours", "step_seconds"}
    doc = REPORTS_DOC.read_text()
    for key in (*SUMMARY_KEYS[kind], *TABLE_NAMES[kind]):
        assert f"`{key}`" in doc, f"{key} is not documented in REPORTS.md"
    for name, rows in data["tables"].items():
        for row in rows[:3]:
            for column in row:
                assert f"`{column}`" in doc, f"{kind}.{name}.{column} is not documented in REPORTS.md"


def test_chargeback_csv_reconciles(capsys, store_dir):
    code, out, _ = run(capsys, "report", "chargeback", "--store", store_dir, "--format", "csv")
    assert code == 0
    table = pd.read_csv(io.StringIO(out))
    assert list(table.columns[:3]) == ["team", "project", "gpu_hours"]
    code, out, _ = run(capsys, "report", "chargeback", "--store", store_dir, "--format", "json")
    summary = json.loads(out)["summary"]
    assert summary["reconciles"] is True
    assert table["cost"].sum() == pytest.approx(summary["fleet_cost"], rel=1e-6)


def test_table_and_markdown_formats(capsys, store_dir):
    code, out, _ = run(capsys, "report", "idle", "--store", store_dir)
    assert code == 0
    assert out.startswith("idle report, ") and "[states]" in out and "hoarded" in out
    code, out, _ = run(capsys, "report", "cost", "--store", store_dir, "--format", "markdown", "--limit", "3")
    assert code == 0
    assert out.startswith("# cost report") and "## reclaim" in out and "## buy_vs_rent" in out
    assert "| `fleet_cost` |" in out
    code, out, _ = run(capsys, "report", "efficiency", "--store", store_dir, "--format", "csv", "--table", "by_pool")
    assert code == 0 and out.startswith("pool,gpus,")


def test_since_limits_the_window(capsys, store_dir):
    _, out, _ = run(capsys, "report", "idle", "--store", store_dir, "--format", "json", "--since", "1h")
    data = json.loads(out)
    assert data["window"]["hours"] == pytest.approx(1.0)
    assert data["summary"]["gpu_hours"] == pytest.approx(64.0)  # 8 nodes x 8 GPUs x 1 h


def test_over_time_buckets_follow_the_window_unless_asked(capsys, store_dir):
    from gpuwarden.analytics.windows import report_bucket_for

    assert [report_bucket_for(pd.Timedelta(days=d)) for d in (1, 7, 30)] == \
        [pd.Timedelta(hours=1), pd.Timedelta(hours=6), pd.Timedelta(days=1)]
    buckets = {}
    for extra in ((), ("--bucket", "30m")):
        code, out, err = run(capsys, "report", "efficiency", "--store", store_dir, "--format", "json", *extra)
        assert code == 0, err
        data = json.loads(out)
        over_time = data["tables"]["over_time"]
        buckets[extra] = [row["bucket"] for row in over_time]
        assert sum(row["gpu_hours"] for row in over_time) == pytest.approx(data["summary"]["gpu_hours"])  # any bucket
    assert len(buckets[()]) == 4 and len(buckets[("--bucket", "30m")]) == 8  # 4 h of data
    with pytest.raises(SystemExit) as exit_info:
        run(capsys, "report", "idle", "--store", store_dir, "--bucket", "7m")
    assert exit_info.value.code == 2 and "multiple of 5m" in capsys.readouterr().err


def test_a_price_book_missing_a_model_is_one_line_naming_it(capsys, store_dir, tmp_path):
    book = tmp_path / "prices.yaml"
    book.write_text("models:\n  NVIDIA H100 80GB HBM3: {on-demand: 6, reserved: 4, spot: 2, owned: {capex: 30000}}\n")
    code, out, err = run(capsys, "report", "cost", "--store", store_dir, "--price-book", str(book))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "gpuwarden: error:" in err
    assert "'NVIDIA H200'" in err  # the first model it met that the book lacks


def test_user_errors(capsys, store_dir, tmp_path):
    code, _, err = run(capsys, "report", "idle", "--store", str(tmp_path / "nothing"))
    assert code == 2 and "store is empty" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "cost", "--store", store_dir, "--reclaim", "2"])
    assert exit_info.value.code == 2 and "fractions must be in 0..1" in capsys.readouterr().err
    code, _, err = run(capsys, "report", "idle", "--store", store_dir, "--format", "csv", "--table", "nope")
    assert code == 2 and "no table 'nope'" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "waste", "--store", store_dir])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("kind", REPORT_KINDS)
def test_terminal_tables_fit_120_columns_and_show_shares_as_percent(capsys, store_dir, kind):
    code, out, err = run(capsys, "report", kind, "--store", store_dir)
    assert code == 0, err
    assert max(map(len, out.splitlines())) <= 120
    if kind == "idle":
        idle_share = next(line for line in out.splitlines() if line.startswith("idle_share "))
        assert idle_share.rstrip().endswith("%")
        assert "more column(s) not shown" in out  # by_pool and by_team are wider than a terminal
        code, wide, _ = run(capsys, "report", kind, "--store", store_dir, "--wide")
        assert code == 0 and "more column(s) not shown" not in wide
        assert max(map(len, wide.splitlines())) > 120
    # JSON keeps the raw 0..1 ratios
    code, out, _ = run(capsys, "report", kind, "--store", store_dir, "--format", "json")
    shares = [value for key, value in json.loads(out)["summary"].items() if key.endswith("_share") and value is not None]
    assert all(0 <= value <= 1 for value in shares)
