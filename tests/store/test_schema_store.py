"""Fleet samples schema: round trips through CSV and Parquet, clear errors for bad files, and the
embedded store's appends, range reads, column reads and compaction."""

from __future__ import annotations

from builders import make_samples

import gzip

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from gpuwarden.fleet import SAMPLE_COLUMN_NAMES
from gpuwarden.store import (
    LocalStore,
    SamplesError,
    ValidationReport,
    coerce,
    load_samples,
    schema_markdown,
    write_samples,
)


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_round_trip_keeps_every_value(tmp_path, suffix):
    samples = make_samples()
    path = tmp_path / f"samples{suffix}"
    write_samples(samples, path)
    loaded = load_samples(path)
    assert list(loaded.columns) == list(SAMPLE_COLUMN_NAMES)
    pd.testing.assert_frame_equal(
        loaded.astype({c: "object" for c in loaded.select_dtypes("category")}),
        samples.astype({c: "object" for c in samples.select_dtypes("category")}),
        check_exact=False, rtol=1e-12,
    )
    # Missing measurements stay missing (never a fake 0).
    assert loaded.loc[loaded["gpu_uuid"] == "GPU-0003", "sm_active_ratio"].isna().all()
    assert loaded.loc[loaded["gpu_uuid"] == "GPU-0002", "recovery_action"].isna().all()


def test_csv_missing_required_column_names_file_and_expected_columns(tmp_path):
    path = tmp_path / "bad.csv"
    make_samples().drop(columns=["mem_total_bytes"]).to_csv(path, index=False)
    with pytest.raises(SamplesError) as error:
        load_samples(path)
    message = str(error.value)
    assert str(path) in message and "mem_total_bytes" in message and "expected" in message


def test_csv_without_a_nullable_column_reads_it_as_not_measured(tmp_path):
    path = tmp_path / "partial.csv"
    make_samples().drop(columns=["power_watts", "nvlink_replay_errors_total"]).to_csv(path, index=False)
    loaded = load_samples(path)
    assert list(loaded.columns) == list(SAMPLE_COLUMN_NAMES)
    assert loaded["power_watts"].isna().all() and loaded["nvlink_replay_errors_total"].isna().all()
    assert str(loaded["nvlink_replay_errors_total"].dtype) == "Int64"


def test_csv_bad_value_names_line_and_column(tmp_path):
    path = tmp_path / "bad.csv"
    samples = make_samples()
    write_samples(samples, path)
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[5].split(",")
    fields[header.index("power_watts")] = "lots"
    lines[5] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SamplesError, match=r"bad\.csv:6: column 'power_watts': 'lots' is not a number"):
        load_samples(path)


def test_gzip_csv_negative_counter_row_is_rejected_and_reported_with_line(tmp_path):
    frame = make_samples()
    frame.loc[9, "ecc_sbe_volatile_total"] = -1
    path = tmp_path / "neg.csv.gz"
    with gzip.open(path, "wt") as handle:
        frame.to_csv(handle, index=False)
    report = ValidationReport(str(path))
    loaded = load_samples(path, report=report)
    assert len(loaded) == len(frame) - 1 and report.rejected == {"ecc_sbe_volatile_total is negative": 1}
    assert report.first_at["ecc_sbe_volatile_total is negative"].endswith("neg.csv.gz:11")
    assert "1 of 120 row(s) rejected" in report.summary()


def test_parquet_rejections_name_the_row(tmp_path):
    frame = make_samples()
    frame["gpu_util_ratio"] = frame["gpu_util_ratio"].astype(float)
    frame.loc[3, "gpu_util_ratio"] = 1.7
    path = tmp_path / "ratio.parquet"
    frame.to_parquet(path, index=False)
    report = ValidationReport(str(path))
    assert len(load_samples(path, report=report)) == len(frame) - 1
    assert report.first_at == {"gpu_util_ratio is not a ratio in 0..1": f"{path}: row 3"}


def test_implausible_rows_are_rejected_by_reason_and_counted():
    """Units and ranges: mW power, kelvin, memory used above total, inf, duplicates, the future."""
    frame = make_samples(start="2026-11-01T00:00:00Z").astype({"timestamp": "object"})
    frame["power_watts"] = 300.0
    frame.loc[0, "power_watts"] = 300_000.0  # milliwatts
    frame.loc[1, "temperature_celsius"] = 340.0  # kelvin
    frame.loc[2, "mem_used_bytes"] = 90.0 * 2**30  # above the 80 GiB total
    frame.loc[3, "sm_clock_mhz"] = float("inf")
    frame.loc[4, "timestamp"] = pd.Timestamp("2199-01-01T00:00:00Z")
    frame.loc[5, "timestamp"] = "2300-01-01T00:00:00Z"  # beyond pandas' range: still one reason
    duplicate = frame.iloc[[6]]
    frame = pd.concat([frame, duplicate], ignore_index=True)
    report = ValidationReport("probe")
    kept = coerce(frame, report=report, now=pd.Timestamp("2026-11-30T00:00:00Z"))
    assert report.rows_in == len(frame) and report.rejected_total == 7 and len(kept) == len(frame) - 7
    assert report.rejected["timestamp in the future (after now + 5 min)"] == 2
    assert set(report.rejected) == {
        "timestamp in the future (after now + 5 min)", "sm_clock_mhz is infinite",
        "power_watts above twice the model's maximum (milliwatts?)", "temperature_celsius above 130 C (kelvin?)",
        "mem_used_bytes above mem_total_bytes", "duplicate of an earlier row (same GPU, MIG instance and timestamp)"}
    assert kept["timestamp"].max() < pd.Timestamp("2026-11-02T00:00:00Z")


def test_rejections_without_a_report_are_one_warning(caplog):
    frame = make_samples()
    frame.loc[[1, 2], "temperature_celsius"] = 300.0
    with caplog.at_level("WARNING", logger="gpuwarden.store"):
        kept = coerce(frame)
    assert len(kept) == len(frame) - 2
    assert len(caplog.records) == 1 and "2 of 120 row(s) rejected" in caplog.records[0].getMessage()


@pytest.mark.parametrize("name, content, expected", [
    ("empty.csv", b"", "the file is empty"),
    ("binary.csv", bytes(range(256)) * 4, "not a (text|readable) CSV file"),
    ("latin1.csv", b"timestamp,node\n\xff\xfe\xfd,x\n", "not a text CSV file"),
    ("fake.csv.gz", b"timestamp,node\n1,2\n", "not a readable gzip file"),
    ("fake.parquet", b"PAR1 not really", "not a readable Parquet file"),
    ("folder.csv", None, "is a directory"),
])
def test_unreadable_files_are_one_samples_error(tmp_path, name, content, expected):
    path = tmp_path / name
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(SamplesError, match=expected) as error:
        load_samples(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_required_column_empty_and_unknown_suffix(tmp_path):
    frame = make_samples().astype({"node": "object"})
    frame.loc[0, "node"] = None
    with pytest.raises(SamplesError, match="row 0: column 'node' is empty"):
        coerce(frame)
    other = tmp_path / "x.json"
    other.write_text("{}")
    with pytest.raises(SamplesError, match="unknown file type"):
        load_samples(other)


def test_schema_markdown_documents_every_column():
    text = schema_markdown()
    for name in SAMPLE_COLUMN_NAMES:
        assert f"`{name}`" in text


def test_docs_schema_md_is_current():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs" / "schema.md"
    assert docs.read_text() == schema_markdown(), "regenerate: gpuwarden store schema > docs/schema.md"


# -- the embedded store ----------------------------------------------------------------------------


def test_store_appends_and_reads_ranges_across_days(tmp_path):
    store = LocalStore(tmp_path / "store")
    first = make_samples("2026-11-01T23:00:00Z", steps=120)  # crosses midnight: two partitions
    second = make_samples("2026-11-02T01:00:00Z", steps=60)
    assert store.append(first) == len(first)
    assert store.append(second) == len(second)
    assert store.row_count() == len(first) + len(second)
    assert sorted(p.name for p in store.samples_dir.iterdir()) == ["date=2026-11-01", "date=2026-11-02"]

    window = store.read("2026-11-01T23:30:00Z", "2026-11-02T00:30:00Z")
    assert window["timestamp"].min() == pd.Timestamp("2026-11-01T23:30:00Z")
    assert window["timestamp"].max() == pd.Timestamp("2026-11-02T00:29:00Z")
    assert len(window) == 60 * 4
    assert window["timestamp"].is_monotonic_increasing
    assert list(window.columns) == list(SAMPLE_COLUMN_NAMES)

    start, end = store.time_range()
    assert start == pd.Timestamp("2026-11-01T23:00:00Z") and end == pd.Timestamp("2026-11-02T01:59:00Z")


def test_store_reads_selected_columns_and_nodes_with_schema_dtypes(tmp_path):
    store = LocalStore(tmp_path)
    samples = make_samples()
    store.append(samples)
    part = store.read(columns=["timestamp", "node", "gpu_util_ratio", "recovery_action"], nodes=["node-1"])
    assert list(part.columns) == ["timestamp", "node", "gpu_util_ratio", "recovery_action"]
    assert set(part["node"]) == {"node-1"}
    assert len(part) == len(samples) / 2
    assert str(part["recovery_action"].dtype) == "Int64"
    assert isinstance(part["node"].dtype, pd.CategoricalDtype)
    with pytest.raises(KeyError, match="unknown samples column"):
        store.read(columns=["watts"])


def test_store_round_trip_is_exact_and_compaction_keeps_rows(tmp_path):
    store = LocalStore(tmp_path)
    samples = make_samples(steps=40)
    for chunk in np.array_split(np.arange(len(samples)), 10):
        store.append(samples.iloc[chunk])
    assert store.file_count() == 10
    assert store.compact(min_files=2) == 1
    assert store.file_count() == 1
    back = store.read()
    pd.testing.assert_frame_equal(
        back.astype({c: "object" for c in back.select_dtypes("category")}),
        samples.astype({c: "object" for c in samples.select_dtypes("category")}),
    )


def test_empty_store_reads_empty_frame_with_schema(tmp_path):
    store = LocalStore(tmp_path / "nothing")
    frame = store.read("2026-01-01", "2026-01-02")
    assert frame.empty and list(frame.columns) == list(SAMPLE_COLUMN_NAMES)
    assert store.time_range() is None and store.row_count() == 0


def test_store_rejects_bad_samples_and_writes_nothing(tmp_path):
    store = LocalStore(tmp_path)
    bad = make_samples().drop(columns=["model"])
    with pytest.raises(SamplesError, match="missing column"):
        store.append(bad)
    assert store.row_count() == 0


def test_store_read_arrow_is_read_before_pandas(tmp_path):
    store = LocalStore(tmp_path / "store")
    assert store.read_arrow("2026-11-01", "2026-11-02") is None  # nothing stored yet
    store.append(make_samples("2026-11-01T23:00:00Z", steps=120))  # two day partitions
    columns = ["timestamp", "node", "gpu_uuid", "pod", "gpu_util_ratio", "recovery_action"]
    # Bounds at midnight prune by partition alone; others also filter timestamps: both as read().
    for start, end in [("2026-11-01", "2026-11-02"), ("2026-11-02", "2026-11-03"), ("2026-11-01T23:30:00Z", "2026-11-02T00:30:00Z"),
                       (None, None), ("2026-11-02T00:00:00Z", None), (None, "2026-11-02T00:00:00Z")]:
        table = store.read_arrow(start, end, columns=columns, nodes=["node-1"])
        frame = store.read(start, end, columns=columns, nodes=["node-1"])
        assert table.column_names == columns
        assert pa.types.is_dictionary(table.schema.field("node").type)
        assert table.schema.field("recovery_action").type == pa.int64()
        back = table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        pd.testing.assert_frame_equal(back, frame)
    day = store.read("2026-11-02", "2026-11-03")
    assert day["timestamp"].min() == pd.Timestamp("2026-11-02T00:00:00Z") and len(day) == 60 * 4
    before = store.read(None, "2026-11-02")
    assert before["timestamp"].max() == pd.Timestamp("2026-11-01T23:59:00Z") and len(before) == 60 * 4


def test_a_reader_mixin_validates_rows_it_did_not_coerce():
    """Prometheus rows never pass coerce; the mixin drops the implausible ones and counts them."""
    from gpuwarden.store.sources import ValidatedReads

    class Raw:
        def read(self, start=None, end=None, columns=None):
            frame = make_samples(steps=3)[["timestamp", "gpu_uuid", "model", "power_watts", "temperature_celsius"]].copy()
            frame.loc[0, "temperature_celsius"] = 310.0
            frame.loc[1, "power_watts"] = 450_000.0
            return frame

    class Checked(ValidatedReads, Raw):
        validation_name = "probe"

    source = Checked()
    assert len(source.read()) == 3 * 4 - 2
    assert source.validation.rejected_total == 2 and isinstance(source, Raw)


def test_a_scrape_with_two_ratios_just_above_one_keeps_its_other_rows(tmp_path):
    """The percent-column refusal is for a user's whole file: a scrape's few rows (two GPUs reading
    1.02) are too few to tell, so those two rows are rejected and the rest are stored, as before."""
    scrape = make_samples(steps=1, gpus=8, start="2026-11-30T00:00:00Z")
    scrape.loc[[0, 1], "gpu_util_ratio"] = 1.02
    store = LocalStore(tmp_path / "s")
    store.append(scrape)
    assert len(store.read()) == 6
    path = tmp_path / "many.csv"
    many = make_samples(steps=10, gpus=4)
    many["gpu_util_ratio"] = many["gpu_util_ratio"] * 100  # a whole file in percent: refused
    many.to_csv(path, index=False)
    with pytest.raises(SamplesError, match="looks like percent"):
        load_samples(path)
