"""The store owns its folder (issue 35, item 6): a probe by class, several cases each.

1. A file or folder the store did not write, anywhere in its folder, is ignored with one note (a
   warning naming it) and never breaks a read: not read, not counted, not moved, and ``store
   check`` stays healthy while it names it. Its own files are those its naming scheme gives
   (``samples/date=YYYY-MM-DD/part-*.parquet``, regular files); one with that name whose schema is
   not the samples schema is damage: moved to ``quarantine/`` with one warning, reads go on.
2. A leftover of a write that a full disk (ENOSPC) interrupted never fails ``store check``, and a
   failed write leaves no partial file behind.
3. A read-only command (``store info``, ``check``, ``read``, and ``repair``, which has nothing to
   repair there) on a path that is no store says so in one line, exits 2 and creates nothing.
4. No command writes into a store's folder except through the store: an ``--output`` / ``--out``
   inside one is refused in one line (exit 2) and nothing is written.

Commands run in-process through ``gpuwarden.cli.main`` (the console script's entry point).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from builders import make_samples

from gpuwarden.cli import main
from gpuwarden.store import LocalStore, write_samples

DAY = "date=2026-11-01"
NOTE_LOGGER = "gpuwarden.store"


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *words: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and "Traceback" not in err and "this is a bug" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def store(tmp_path) -> LocalStore:
    """A store of two days (23:30 on Nov 1 to 00:29 on Nov 2), three files."""
    store = LocalStore(tmp_path / "s")
    store.append(make_samples("2026-11-01T23:30:00Z", steps=30))
    store.append(make_samples("2026-11-02T00:00:00Z", steps=30))
    return store


def a_part(store: LocalStore) -> Path:
    return sorted((store.samples_dir / DAY).glob("part-*.parquet"))[0]


def snapshot(store: LocalStore) -> tuple[int, tuple, int]:
    frame = store.read(columns=["timestamp", "gpu_uuid", "power_watts"])
    return len(frame), store.time_range(), int(frame["power_watts"].notna().sum())


# -- 1. what the store did not write: ignored with a note, never breaks a read ------------------------

def _stray_csv(store):
    path = store.samples_dir / DAY / "notes.csv"
    path.write_text("timestamp,node\n2026-11-01T23:59:00Z,n\n")
    return path


def _stray_samples_parquet(store):  # a valid samples file, not named by the store: rows would count twice
    path = store.samples_dir / DAY / "export.parquet"
    make_samples("2026-11-01T23:30:00Z", steps=30).to_parquet(path, index=False)  # another tool's copy
    return path


def _stray_other_parquet(store):
    path = store.samples_dir / DAY / "other.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), path)
    return path


def _folder_in_day(store):  # a backup copy in a folder inside a day
    path = store.samples_dir / DAY / "backup"
    path.mkdir()
    shutil.copy(a_part(store), path / a_part(store).name)
    return path


def _folder_beside_days(store):
    path = store.samples_dir / "old"
    path.mkdir()
    shutil.copy(a_part(store), path / a_part(store).name)
    return path


def _day_misnamed(store):  # not a day the store names: never read
    path = store.samples_dir / "date=2026-13-45"
    path.mkdir()
    shutil.copy(a_part(store), path / a_part(store).name)
    return path


def _zero_byte_file(store):
    path = store.samples_dir / DAY / "empty.parquet"
    path.touch()
    return path


def _zero_byte_unnamed(store):
    path = store.samples_dir / DAY / "empty"
    path.touch()
    return path


def _link_to_dev_zero(store):
    path = store.samples_dir / DAY / "zero.parquet"
    path.symlink_to("/dev/zero")
    return path


def _store_named_link_to_dev_zero(store):  # a device is never a part file, whatever its name
    path = store.samples_dir / DAY / "part-20261101T233000-20261101T235900-abcdef.parquet"
    path.symlink_to("/dev/zero")
    return path


def _partial_download(store):  # what rsync or a browser leaves: cut short, with its own suffix
    path = store.samples_dir / DAY / (a_part(store).name + ".part")
    path.write_bytes(a_part(store).read_bytes()[:200])
    return path


def _stray_at_samples_top(store):
    path = store.samples_dir / "README.txt"
    path.write_text("hello\n")
    return path


def _stray_at_store_top(store):
    path = store.root / "notes.txt"
    path.write_text("hello\n")
    return path


def _stray_dot_tmp(store):  # a dot-file ending in .tmp that the store did not write: never deleted
    path = store.samples_dir / DAY / ".notes.tmp"
    path.write_text("mine\n")
    return path


STRAYS = {f.__name__[1:]: f for f in (
    _stray_csv, _stray_samples_parquet, _stray_other_parquet, _folder_in_day, _folder_beside_days, _day_misnamed,
    _zero_byte_file, _zero_byte_unnamed, _link_to_dev_zero, _store_named_link_to_dev_zero, _partial_download,
    _stray_at_samples_top, _stray_at_store_top, _stray_dot_tmp)}


@pytest.mark.parametrize("make", list(STRAYS.values()), ids=list(STRAYS))
def test_a_stray_never_breaks_a_read_nor_a_write(store, make):
    before = snapshot(store)
    stray = make(store)
    after = snapshot(LocalStore(store.root))  # a fresh reader (a dashboard, a report)
    fresh = LocalStore(store.root)
    fresh.append(make_samples("2026-11-02T00:30:00Z", steps=2))  # a write beside it
    fresh.compact(min_files=1)
    assert after == before
    assert os.path.lexists(stray)  # not moved, not deleted: not the store's
    assert not (store.quarantine_dir.exists() and any(p.name == stray.name for p in store.quarantine_dir.rglob("*")))
    assert LocalStore(store.root).row_count() == before[0] + 8


STRAYS_INSIDE = {name: make for name, make in STRAYS.items() if name != "stray_at_store_top"}  # reads never look there


@pytest.mark.parametrize("make", list(STRAYS_INSIDE.values()), ids=list(STRAYS_INSIDE))
def test_a_stray_is_noted_once_by_reads(store, make, caplog):
    stray = make(store)
    with caplog.at_level(logging.WARNING, logger=NOTE_LOGGER):
        for _ in range(2):
            try:
                snapshot(LocalStore(store.root))
            except Exception:  # noqa: BLE001 - what the read does is the other test's; the note is this one's
                pass
    notes = [r.getMessage() for r in caplog.records if stray.name in r.getMessage()]
    assert len(notes) == 1 and "ignored" in notes[0], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("make", list(STRAYS.values()), ids=list(STRAYS))
def test_a_stray_keeps_store_check_healthy_and_is_named(store, make, capsys):
    stray = make(store)
    code, out, err = run(["store", "check", "--store", store.root], capsys)
    assert code == 0 and "healthy" in out and stray.name in out, (code, out, err)
    code, out, _ = run(["store", "info", "--store", store.root, "--format", "json"], capsys)
    assert code == 0 and '"rows": 240' in out, out


def _other_columns(path):
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), path)


def _timestamp_as_text(path):
    frame = make_samples("2026-11-01T23:30:00Z", steps=2)
    frame["timestamp"] = frame["timestamp"].astype(str)
    frame.to_parquet(path, index=False)


def _power_as_text(path):
    frame = make_samples("2026-11-01T23:40:00Z", steps=2)
    frame["power_watts"] = "lots"
    frame.to_parquet(path, index=False)


def _keys_missing(path):
    frame = make_samples("2026-11-01T23:40:00Z", steps=2)
    frame.drop(columns=["gpu_uuid", "mig_instance"]).to_parquet(path, index=False)


OTHER_SCHEMAS = {f.__name__[1:]: f for f in (_other_columns, _timestamp_as_text, _power_as_text, _keys_missing)}


@pytest.mark.parametrize("make", list(OTHER_SCHEMAS.values()), ids=list(OTHER_SCHEMAS))
def test_a_store_named_file_of_another_schema_is_set_aside_and_reads_go_on(store, make, caplog, capsys):
    before = snapshot(store)
    path = store.samples_dir / DAY / "part-20261101T233000-20261101T234100-0123456789abcdef.parquet"
    make(path)
    code, out, _ = run(["store", "check", "--store", store.root], capsys)
    assert code == 1 and path.name in out  # damage in the store's own file: named, repair moves it
    with caplog.at_level(logging.WARNING, logger=NOTE_LOGGER):
        after = snapshot(LocalStore(store.root))
    assert after == before
    assert not path.exists() and (store.quarantine_dir / DAY / path.name).exists()
    assert sum(path.name in r.getMessage() for r in caplog.records) == 1


# -- 2. a full disk ---------------------------------------------------------------------------------

def test_a_truncated_temporary_part_left_by_a_full_disk_keeps_check_healthy(store, capsys):
    before = snapshot(store)
    left = store.samples_dir / DAY / f".{a_part(store).name[:-8]}ffff.parquet.tmp"
    left.write_bytes(a_part(store).read_bytes()[:300])
    code, out, _ = run(["store", "check", "--store", store.root], capsys)
    assert code == 0 and "healthy" in out and left.name in out, out
    assert snapshot(LocalStore(store.root)) == before


def test_a_partial_journal_left_by_a_full_disk_keeps_check_healthy(store, capsys):
    store.ops_dir.mkdir(exist_ok=True)
    (store.ops_dir / ".0123456789abcdef.json.tmp").write_text('{"op": "01')
    code, out, _ = run(["store", "check", "--store", store.root], capsys)
    assert code == 0 and "healthy" in out, out


def _enospc_after(write, budget: int):
    def failing(table, where, *args, **kwargs):
        write(table, where, *args, **kwargs)
        data = Path(where).read_bytes()
        Path(where).write_bytes(data[:budget])
        raise OSError(errno.ENOSPC, "No space left on device", str(where))
    return failing


def test_a_load_that_hits_a_full_disk_leaves_nothing_and_check_stays_healthy(store, monkeypatch, capsys):
    import gpuwarden.store.local as local

    before = snapshot(store)
    monkeypatch.setattr(local.pq, "write_table", _enospc_after(pq.write_table, 300))
    with pytest.raises(OSError):
        LocalStore(store.root).append(make_samples("2026-11-03T00:00:00Z", steps=5))
    monkeypatch.undo()
    assert not [p for p in store.root.rglob("*.tmp")], list(store.root.rglob("*"))
    code, out, _ = run(["store", "check", "--store", store.root], capsys)
    assert code == 0 and "healthy" in out
    assert snapshot(LocalStore(store.root)) == before


def test_store_load_on_a_full_disk_is_one_line_and_check_stays_healthy(store, monkeypatch, tmp_path, capsys):
    import gpuwarden.store.local as local

    source = tmp_path / "more.parquet"
    write_samples(make_samples("2026-11-03T00:00:00Z", steps=5), source)
    monkeypatch.setattr(local.pq, "write_table", _enospc_after(pq.write_table, 100))
    code, _, err = run(["store", "load", source, "--store", store.root], capsys)
    monkeypatch.undo()
    one_line_error(code, err, "No space left on device")
    code, out, _ = run(["store", "check", "--store", store.root], capsys)
    assert code == 0 and "healthy" in out, out


def test_a_journal_that_hits_a_full_disk_leaves_nothing_and_check_stays_healthy(store, monkeypatch, capsys):
    import gpuwarden.store.journal as journal

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal.os, "fsync", full)
    with pytest.raises(OSError):
        LocalStore(store.root).append(make_samples("2026-11-03T00:00:00Z", steps=5))
    monkeypatch.undo()
    code, out, _ = run(["store", "check", "--store", store.root], capsys)
    assert code == 0 and "healthy" in out, out
    assert not [p for p in store.root.rglob("*.tmp")]


# -- 3. a read-only command on a path that is no store ----------------------------------------------

def _absent(tmp_path):
    return tmp_path / "nothing"


def _empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _a_file(tmp_path):
    (tmp_path / "f").write_text("x\n")
    return tmp_path / "f"


def _folder_of_other_things(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("x\n")
    return tmp_path / "home"


def _link_to_dev_null(tmp_path):
    (tmp_path / "null").symlink_to("/dev/null")
    return tmp_path / "null"


NOT_STORES = {f.__name__[1:]: f for f in (_absent, _empty_folder, _a_file, _folder_of_other_things, _link_to_dev_null)}
READ_ONLY = {"info": ["store", "info"], "check": ["store", "check"], "read": ["store", "read", "--out", "x.csv"],
             "repair": ["store", "repair"]}


def listing(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("command", list(READ_ONLY), ids=list(READ_ONLY))
@pytest.mark.parametrize("where", list(NOT_STORES), ids=list(NOT_STORES))
def test_a_read_only_command_on_no_store_says_so_exits_2_and_creates_nothing(where, command, tmp_path, capsys,
                                                                             monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = NOT_STORES[where](tmp_path)
    before = listing(tmp_path)
    code, _, err = run([*READ_ONLY[command], "--store", path], capsys)
    one_line_error(code, err, str(path))
    assert "store" in err
    assert listing(tmp_path) == before


@pytest.mark.parametrize("where", ["_empty_folder", "_a_file", "_folder_of_other_things"])
def test_the_library_read_path_on_no_store_reads_nothing_and_creates_nothing(where, tmp_path):
    """What the dashboards and reports call: an empty read, no file made where there is no store."""
    path = NOT_STORES[where[1:]](tmp_path)
    before = listing(tmp_path)
    reader = LocalStore(path)
    assert reader.read().empty and reader.time_range() is None and reader.row_count() == 0
    reader.check()
    assert listing(tmp_path) == before


# -- 4. no command writes into a store's folder except through the store ------------------------------

INSIDE = {
    "info-output-top": (["store", "info", "--store", "{s}", "--output", "{s}/info.txt"], "{s}/info.txt"),
    "check-output-day": (["store", "check", "--store", "{s}", "--format", "csv", "--output",
                          "{s}/samples/date=2026-11-01/check.csv"], "{s}/samples/date=2026-11-01/check.csv"),
    "read-out-as-part": (["store", "read", "--store", "{s}", "--out",
                          "{s}/samples/date=2026-11-01/part-20261101T000000-20261101T000100-abc123.parquet"],
                         "{s}/samples/date=2026-11-01/part-20261101T000000-20261101T000100-abc123.parquet"),
    "read-out-top": (["store", "read", "--store", "{s}", "--out", "{s}/export.csv"], "{s}/export.csv"),
    "info-of-another-store-into-this": (["store", "info", "--store", "{t}", "--output", "{s}/samples/other.txt"],
                                        "{s}/samples/other.txt"),
    "repair-output-ops": (["store", "repair", "--store", "{s}", "--output", "{s}/ops/repair.json"],
                          "{s}/ops/repair.json"),
    "sim-generate-out": (["sim", "generate", "--nodes", "1", "--days", "0.01", "--out",
                          "{s}/samples/date=2026-11-01/x.parquet"], "{s}/samples/date=2026-11-01/x.parquet"),
    "report-output": (["report", "efficiency", "--store", "{s}", "--until", "2026-11-02T00:30:00Z", "--output",
                       "{s}/report.txt"], "{s}/report.txt"),
}


# Outputs written through gpuwarden.cli.output.emit (every report's --output) are checked where the
# parser checks every output flag (gpuwarden/cli/args.py), which is not the store's to change.
@pytest.mark.parametrize("case", list(INSIDE), ids=list(INSIDE))
def test_an_output_inside_a_store_folder_is_refused(case, store, tmp_path, capsys):
    other = LocalStore(tmp_path / "t")
    other.append(make_samples("2026-11-01T00:00:00Z", steps=2))
    if case == "repair-output-ops":
        store.ops_dir.mkdir(exist_ok=True)
    before = snapshot(store)
    argv, target = INSIDE[case]
    fill = {"{s}": str(store.root), "{t}": str(other.root)}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    code, _, err = run([filled(a) for a in argv], capsys)
    one_line_error(code, err, "store")
    assert not Path(filled(target)).exists()
    assert snapshot(LocalStore(store.root)) == before


def test_an_output_beside_a_store_is_written(store, tmp_path, capsys):
    code, out, err = run(["store", "read", "--store", store.root, "--out", tmp_path / "export.csv"], capsys)
    assert code == 0 and (tmp_path / "export.csv").is_file(), err
    code, _, err = run(["store", "info", "--store", store.root, "--output", tmp_path / "info.txt"], capsys)
    assert code == 0 and "rows" in (tmp_path / "info.txt").read_text(), err
    assert pd.read_csv(tmp_path / "export.csv").shape[0] == 240
