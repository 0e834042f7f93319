"""The embedded store survives what a careless user and a faulty machine do to it: a writer killed
with SIGKILL at every step of a load and of a compaction, two writers and two compactions at
once, a load repeated, a corrupt file. Real processes, real signals, real files (no mocks): the
writer kills itself with SIGKILL at the named step (``GPUWARDEN_STORE_CRASH_AT``), or is killed
from outside at an arbitrary moment."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from builders import make_samples

from gpuwarden.store import LocalStore, write_samples

ROOT = Path(__file__).resolve().parents[2]
WRITER = """
import sys
from gpuwarden.store import LocalStore, load_samples
store = LocalStore(sys.argv[1])
if sys.argv[2] == "compact":
    print("merged", store.compact(min_files=2), flush=True)
else:
    frame = load_samples(sys.argv[2])
    print("ready", flush=True)
    print("written", store.append(frame, validate=False), flush=True)
"""


def writer(store: Path, what: str, crash_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUWARDEN_STORE_CRASH_AT", None)
    if crash_at:
        env["GPUWARDEN_STORE_CRASH_AT"] = crash_at
    return subprocess.Popen([sys.executable, "-c", WRITER, str(store), what], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def samples_file(tmp_path_factory) -> tuple[Path, int]:
    """Three days of samples (a load writes three files)."""
    path = tmp_path_factory.mktemp("data") / "three-days.parquet"
    frame = make_samples("2026-11-01T22:00:00Z", steps=60 * 50, gpus=4)
    write_samples(frame, path)
    return path, len(frame)


def unique_rows(store: LocalStore) -> int:
    frame = store.read(columns=["gpu_uuid", "timestamp"])
    return len(frame.drop_duplicates())


@pytest.mark.parametrize("step, expected", [
    ("load-staged", "none"),       # files written under temporary names, nothing committed
    ("load-journaled", "all"),     # committed, nothing renamed yet: recovery rolls forward
    ("load-renamed", "all"),       # killed after the first of three renames
    ("load-applied", "all"),       # renamed, journal not yet deleted
])
def test_load_killed_at_each_step_is_all_or_nothing(tmp_path, samples_file, step, expected):
    path, rows = samples_file
    store = LocalStore(tmp_path / "store")
    process = writer(store.root, str(path), crash_at=step)
    process.communicate(timeout=120)
    assert process.returncode == -signal.SIGKILL
    # Whatever the next process is (a reader here), it sees all of the load or none of it.
    assert store.row_count() == (rows if expected == "all" else 0)
    check = store.check()
    assert check.pending_ops == [] and check.duplicate_rows == 0  # the reader finished a committed load
    assert bool(check.stale_tmp) == (expected == "none")  # an uncommitted one left files: check says so
    # Loading again completes the load, cleans up, and adds nothing twice.
    store.append(pd.read_parquet(path))
    assert store.row_count() == rows == unique_rows(store)
    assert store.last_append.already_stored == (rows if expected == "all" else 0)
    assert not list(store.root.rglob("*.tmp")) and store.check().ok  # no temporary file is left for good


@pytest.mark.parametrize("step", ["compact-journaled", "compact-renamed", "compact-applied"])
def test_compaction_killed_at_each_step_never_doubles_a_day(tmp_path, step):
    store = LocalStore(tmp_path / "store")
    for hour in range(4):  # four files in one day
        store.append(make_samples(f"2026-11-01T0{hour}:00:00Z", steps=30))
    rows = store.row_count()
    process = writer(store.root, "compact", crash_at=step)
    process.communicate(timeout=120)
    assert process.returncode == -signal.SIGKILL
    assert store.row_count() == rows == unique_rows(store)
    assert store.file_count() == 1  # the merge was committed before the kill: rolled forward
    assert store.check().ok


def test_load_killed_from_outside_at_any_moment_leaves_all_or_nothing(tmp_path, samples_file):
    """kill -9 from another process at a moment the writer does not choose."""
    path, rows = samples_file
    for delay in (0.05, 0.3):
        store = LocalStore(tmp_path / f"store-{delay}")
        process = writer(store.root, str(path))
        assert process.stdout.readline().strip() == "ready"  # the file is read; the append starts now
        time.sleep(delay)
        process.kill()
        process.communicate(timeout=60)
        assert store.row_count() in (0, rows)
        store.append(pd.read_parquet(path))
        assert store.row_count() == rows == unique_rows(store) and store.check().ok


def test_two_writers_and_two_compactions_at_once(tmp_path, samples_file):
    path, rows = samples_file
    store = LocalStore(tmp_path / "store")
    loads = [writer(store.root, str(path)) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in loads]
    assert [p.returncode for p in loads] == [0, 0], outputs
    written = sorted(int(out.split("written")[1]) for out, _ in outputs)
    assert written == [0, rows]  # serialised: the second found every row already stored
    assert store.row_count() == rows
    for day in range(3):  # more files per day, for the compactions to merge
        store.append(make_samples(f"2026-11-0{day + 1}T00:00:00Z", steps=5).assign(
            timestamp=lambda f: f["timestamp"] + pd.Timedelta(days=10)))
    total = store.row_count()
    compactions = [writer(store.root, "compact") for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in compactions]
    assert [p.returncode for p in compactions] == [0, 0], outputs  # no FileNotFoundError
    assert store.row_count() == total == unique_rows(store)
    assert store.check().ok


def test_loading_the_same_rows_twice_adds_nothing(tmp_path):
    store = LocalStore(tmp_path / "store")
    frame = make_samples(steps=40)
    assert store.append(frame) == len(frame)
    assert store.append(frame) == 0 and store.last_append.already_stored == len(frame)
    overlapping = make_samples("2026-11-01T00:20:00Z", steps=40)  # half old, half new
    assert store.append(overlapping) == 20 * 4
    assert store.row_count() == 60 * 4 == unique_rows(store)


def test_a_corrupt_file_is_quarantined_with_one_warning_and_reads_go_on(tmp_path, caplog):
    store = LocalStore(tmp_path / "store")
    store.append(make_samples("2026-11-01T00:00:00Z", steps=30))
    store.append(make_samples("2026-11-02T00:00:00Z", steps=30))
    victim = min(store.samples_dir.glob("date=2026-11-02/part-*.parquet"))
    victim.write_bytes(b"this is not parquet at all")
    check = store.check()
    assert check.corrupt == [victim] and not check.ok
    with caplog.at_level(logging.WARNING, logger="gpuwarden.store"):
        assert store.row_count() == 30 * 4
        assert len(store.read()) == 30 * 4
        assert store.time_range()[1] < pd.Timestamp("2026-11-02T00:00:00Z")
    warnings = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(warnings) == 1 and str(victim) in warnings[0]
    assert (store.quarantine_dir / "date=2026-11-02" / victim.name).exists()
    assert store.check().ok


def test_repair_finishes_operations_removes_leftovers_and_duplicates(tmp_path):
    store = LocalStore(tmp_path / "store")
    frame = make_samples(steps=20)
    store.append(frame)
    # A writer that bypassed the store's de-duplication (an older version), and a stray temporary.
    directory = next(store.samples_dir.glob("date=*"))
    frame.to_parquet(directory / "part-legacy-copy.parquet", index=False)
    (directory / ".part-x.parquet.tmp").write_bytes(b"half a file")
    check = store.check()
    assert check.duplicate_rows == len(frame) and len(check.stale_tmp) == 1 and not check.ok
    result = store.repair()
    assert result["duplicates_removed"] == len(frame)
    assert store.row_count() == len(frame) and store.check().ok
