"""The embedded store: fleet samples in Parquet files partitioned by UTC day, no server.

Why Parquet partitions (pyarrow) rather than DuckDB: pandas already needs pyarrow, so this adds no
dependency; a range read prunes whole days by directory name, then row groups by their timestamp
statistics, and reads only the columns asked for. ``compact`` merges a day's small files (the live
feed writes one per step) into one.

Crash safety, at the level of a whole operation (a load, a compaction):

- every writer takes ``ROOT/.lock`` (``fcntl.flock``), so writes and compactions are serialised
  across processes; readers take no lock;
- an operation first writes its new files under dot-names (``.part-….tmp``, which readers never
  see), then commits a journal ``ops/<op-id>.json`` (written under a temporary name and renamed:
  it is there whole or not at all) that lists the renames and deletions, then applies it and
  deletes the journal;
- after a crash the next writer (or a reader that finds the lock free) replays every journal
  (roll forward: its files were complete before it was committed) and deletes stale ``.tmp``
  files that no journal names (roll back). A load is therefore all or nothing;
- a load drops rows the store already holds (same GPU, MIG instance and timestamp), so loading
  the same rows twice adds nothing; compaction de-duplicates too (two writers racing);
- a file that cannot be read is moved to ``ROOT/quarantine/`` with one warning naming it, and
  the read goes on without it.

Layout::

    ROOT/samples/date=YYYY-MM-DD/part-<first>-<last>-<op-id>.parquet   (first/last: UTC seconds)
    ROOT/ops/<op-id>.json        a committed operation not yet fully applied
    ROOT/quarantine/…            files moved aside because they could not be read
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from gpuwarden.fleet.semantics import to_utc_or_none as _utc

from .schema import KEY_COLUMNS, PANDAS_DTYPES, ValidationReport, coerce, empty_samples

log = logging.getLogger("gpuwarden.store")

_PARTITIONING = ds.partitioning(pa.schema([("date", pa.string())]), flavor="hive")
_ROW_GROUP_ROWS = 256 * 1024
_NAME = re.compile(r"^part-(\d{8}T\d{6})-(\d{8}T\d{6})-[0-9a-f]+\.parquet$")
_STAMP = "%Y%m%dT%H%M%S"
# Test seam: ``GPUWARDEN_STORE_CRASH_AT=<step>`` makes this process SIGKILL itself at that step of
# an operation, so tests can kill -9 a real writer at an exact point (see tests/test_store_crash.py).
_CRASH_ENV = "GPUWARDEN_STORE_CRASH_AT"


def _crash_point(step: str) -> None:
    if os.environ.get(_CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


TimeBound = datetime | str | None  # one end of a read's window (ISO-8601 text allowed); None leaves it open


def _arrow_schema() -> pa.Schema:
    kinds = {
        "datetime64[ns, UTC]": pa.timestamp("ns", tz="UTC"),
        "category": pa.string(),
        "Int64": pa.int64(),
        "float64": pa.float64(),
    }
    return pa.schema([(name, kinds[dtype]) for name, dtype in PANDAS_DTYPES.items()])


ARROW_SCHEMA = _arrow_schema()
_KEY_SCHEMA = pa.schema([ARROW_SCHEMA.field(name) for name in ("gpu_uuid", "mig_instance", "timestamp")])
# Read strings as dictionaries: Parquet stores them dictionary-encoded, so they arrive as pandas
# categoricals without hashing every row again. The file format must be told too: with the schema
# alone the scanner decodes every string and hashes it back into a dictionary (3x the read time).
_STRING_COLUMNS = [f.name for f in ARROW_SCHEMA if f.type == pa.string()]
_READ_SCHEMA = pa.schema(
    [pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.type == pa.string() else f for f in ARROW_SCHEMA]
).append(pa.field("date", pa.string()))
_FORMAT = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=_STRING_COLUMNS))
# What a damaged file raises (bad magic bytes, truncated footer, garbage pages).
_CORRUPT = (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError)


@dataclass
class AppendResult:
    """What one ``append`` did: rows written, rows the store already held (not written again),
    and the validation report of the rows offered (rejected rows, by reason)."""

    written: int = 0
    already_stored: int = 0
    report: ValidationReport | None = None


@dataclass
class CheckResult:
    """What ``check`` found; ``ok`` when nothing needs repair."""

    files: int = 0
    rows: int = 0
    corrupt: list[Path] = field(default_factory=list)
    stale_tmp: list[Path] = field(default_factory=list)
    pending_ops: list[Path] = field(default_factory=list)
    duplicate_rows: int = 0
    quarantined: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.corrupt or self.stale_tmp or self.pending_ops or self.duplicate_rows)


def _key_index(frame: pd.DataFrame) -> pd.MultiIndex:
    """(gpu_uuid, mig_instance or '', timestamp ns): one sample's identity."""
    return pd.MultiIndex.from_arrays([
        frame["gpu_uuid"].astype(str).to_numpy(),
        frame["mig_instance"].astype(object).where(frame["mig_instance"].notna(), "").astype(str).to_numpy(),
        frame["timestamp"].dt.tz_convert(None).to_numpy(dtype="datetime64[ns]").view(np.int64),
    ])


class LocalStore:
    """Append and range-read fleet samples under one directory.

    ``clock`` gives "now" for validation (a future-dated row is rejected); the demo passes its
    simulated clock, everything else the wall clock.
    """

    def __init__(self, root: str | Path, clock: Callable[[], datetime | pd.Timestamp] | None = None) -> None:
        self.root = Path(root)
        self.samples_dir = self.root / "samples"
        self.ops_dir = self.root / "ops"
        self.quarantine_dir = self.root / "quarantine"
        self.lock_path = self.root / ".lock"
        self.clock = clock
        self.last_append = AppendResult()
        self.quarantined: list[Path] = []  # moved aside by this instance, each warned about once

    # -- locking and recovery -------------------------------------------------------------------
    @contextmanager
    def _locked(self, blocking: bool = True) -> Iterator[bool]:
        """Hold the store's writer lock (yields False when ``blocking`` is off and it is taken)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError as error:
                if error.errno in (errno.EAGAIN, errno.EACCES):
                    yield False
                    return
                raise
            try:
                self._recover()
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _recover(self) -> tuple[int, int]:
        """Under the lock: replay committed journals, then delete leftover temporary files.
        Returns (journals replayed, temporary files removed)."""
        replayed = removed = 0
        if self.ops_dir.exists():
            for journal in sorted(self.ops_dir.glob("*.json")):
                try:
                    operation = json.loads(journal.read_text())
                except (OSError, ValueError):
                    journal.unlink(missing_ok=True)  # cannot happen (renamed in whole), but never block
                    continue
                self._apply(operation)
                journal.unlink(missing_ok=True)
                replayed += 1
            for partial in self.ops_dir.glob(".*.tmp"):
                partial.unlink(missing_ok=True)
        if self.samples_dir.exists():
            for stale in self.samples_dir.glob("date=*/.*.tmp"):
                stale.unlink(missing_ok=True)
                removed += 1
        if replayed or removed:
            log.warning("%s: recovered from an interrupted write (%d operation(s) completed, %d temporary file(s) removed)",
                        self.root, replayed, removed)
        return replayed, removed

    def _recover_if_needed(self) -> None:
        """Readers finish an interrupted operation when no writer holds the lock."""
        if self.ops_dir.exists() and any(self.ops_dir.glob("*.json")):
            with self._locked(blocking=False):
                pass

    def _apply(self, operation: dict) -> None:
        for temporary, final in operation.get("add", []):
            source, target = self.root / temporary, self.root / final
            if source.exists():
                os.replace(source, target)
                _crash_point(f"{operation['kind']}-renamed")
        for old in operation.get("remove", []):
            (self.root / old).unlink(missing_ok=True)

    def _commit(self, kind: str, op_id: str, add: list[tuple[Path, Path]], remove: Sequence[Path] = ()) -> None:
        """Journal, then apply, one operation (see the module docstring)."""
        self.ops_dir.mkdir(parents=True, exist_ok=True)
        operation = {
            "op": op_id, "kind": kind, "at": pd.Timestamp.now(tz="UTC").isoformat(),
            "add": [[str(t.relative_to(self.root)), str(f.relative_to(self.root))] for t, f in add],
            "remove": [str(p.relative_to(self.root)) for p in remove],
        }
        partial = self.ops_dir / f".{op_id}.json.tmp"
        with open(partial, "w") as handle:
            json.dump(operation, handle)
            handle.flush()
            os.fsync(handle.fileno())
        journal = self.ops_dir / f"{op_id}.json"
        os.replace(partial, journal)
        _crash_point(f"{kind}-journaled")
        self._apply(operation)
        _crash_point(f"{kind}-applied")
        journal.unlink()

    # -- writing -------------------------------------------------------------------------------
    def append(self, samples: pd.DataFrame, validate: bool = True, source: str = "samples") -> int:
        """Store ``samples`` (the fleet samples columns), all or nothing. Returns the rows written.

        Rows the store already holds are skipped; with ``validate`` rows that fail validation are
        rejected. Both are counted in :attr:`last_append`.
        """
        self.last_append = AppendResult()
        if samples.empty:
            return 0
        report = None
        if validate:
            report = ValidationReport(source)
            frame = coerce(samples, source=source, report=report, now=self._now())
        else:
            frame = samples
        self.last_append.report = report
        if frame.empty:
            return 0
        with self._locked():
            fresh = self._drop_stored(frame)
            self.last_append.already_stored = len(frame) - len(fresh)
            if fresh.empty:
                return 0
            op_id = uuid.uuid4().hex[:16]
            days = fresh["timestamp"].dt.strftime("%Y-%m-%d")
            staged = [self._stage(str(day), part, op_id) for day, part in fresh.groupby(days.to_numpy(), sort=True)]
            _crash_point("load-staged")
            self._commit("load", op_id, staged)
        self.last_append.written = len(fresh)
        return len(fresh)

    def _now(self) -> pd.Timestamp:
        return _utc(self.clock()) if self.clock is not None else pd.Timestamp.now(tz="UTC")

    def _stage(self, day: str, part: pd.DataFrame | pa.Table, op_id: str) -> tuple[Path, Path]:
        """Write one day's rows under a temporary dot-name; return (temporary, final) paths."""
        directory = self.samples_dir / f"date={day}"
        directory.mkdir(parents=True, exist_ok=True)
        table = part if isinstance(part, pa.Table) else pa.Table.from_pandas(part, schema=ARROW_SCHEMA, preserve_index=False)
        stamps = table.column("timestamp")
        first = pd.Timestamp(pc.min(stamps).as_py()).strftime(_STAMP)
        last = pd.Timestamp(pc.max(stamps).as_py()).strftime(_STAMP)
        name = f"part-{first}-{last}-{op_id}{uuid.uuid4().hex[:4]}.parquet"
        temporary = directory / f".{name}.tmp"
        pq.write_table(table, temporary, row_group_size=_ROW_GROUP_ROWS, compression="zstd")
        return temporary, directory / name

    def _drop_stored(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` without the rows whose (GPU, MIG instance, timestamp) a stored file holds.
        Only files whose name's time span overlaps ``frame`` are read (the live feed never does)."""
        first, last = frame["timestamp"].min(), frame["timestamp"].max()
        candidates = []
        for directory in self._day_dirs(first.strftime("%Y-%m-%d"), last.strftime("%Y-%m-%d")):
            for path in directory.glob("part-*.parquet"):
                match = _NAME.match(path.name)
                if match is None:
                    candidates.append(path)  # older naming: no span in the name, read it
                    continue
                file_first = pd.Timestamp(match.group(1), tz="UTC")
                file_last = pd.Timestamp(match.group(2), tz="UTC") + pd.Timedelta(seconds=1)
                if file_first <= last and file_last > first:
                    candidates.append(path)
        if not candidates:
            return frame
        stored = self._read_files(candidates, ["timestamp", *[c for c in KEY_COLUMNS if c != "timestamp"]])
        if stored is None or stored.num_rows == 0:
            return frame
        stored_frame = stored.to_pandas()
        stored_frame["timestamp"] = stored_frame["timestamp"].astype("datetime64[ns, UTC]")
        held = _key_index(frame).isin(_key_index(stored_frame))
        return frame[~held] if held.any() else frame

    def _read_files(self, files: list[Path], columns: list[str]) -> pa.Table | None:
        """Read ``columns`` of ``files``, quarantining any that cannot be read."""
        tables = []
        for path in files:
            try:
                tables.append(pq.read_table(path, columns=columns, schema=ARROW_SCHEMA))
            except FileNotFoundError:
                continue
            except _CORRUPT as error:
                self._quarantine(path, error)
        return pa.concat_tables(tables) if tables else None

    def _day_dirs(self, first_day: str | None = None, last_day: str | None = None) -> list[Path]:
        if not self.samples_dir.exists():
            return []
        return [d for d in sorted(self.samples_dir.glob("date=*"))
                if (first_day is None or d.name[5:] >= first_day) and (last_day is None or d.name[5:] <= last_day)]

    def compact(self, min_files: int = 8, dedupe_only: bool = False) -> int:
        """Merge each day's files into one where a day has at least ``min_files``, dropping
        duplicate samples. Returns days merged. Serialised with every other writer."""
        merged = 0
        with self._locked():
            for directory in self._day_dirs():
                files = sorted(directory.glob("part-*.parquet"))
                if not files or len(files) < min_files:
                    continue
                table = self._read_files(files, list(ARROW_SCHEMA.names))
                files = [f for f in files if f.exists()]  # minus any just quarantined
                if table is None:
                    continue
                unique = self._unique(table)
                if dedupe_only and unique.num_rows == table.num_rows:
                    continue
                op_id = uuid.uuid4().hex[:16]
                staged = self._stage(directory.name[5:], unique.sort_by("timestamp"), op_id)
                self._commit("compact", op_id, [staged], remove=files)
                merged += 1
        return merged

    @staticmethod
    def _unique(table: pa.Table) -> pa.Table:
        """Rows with a distinct (GPU, MIG instance, timestamp), first one kept."""
        frame = table.select(list(KEY_COLUMNS)).to_pandas()
        frame["timestamp"] = frame["timestamp"].astype("datetime64[ns, UTC]")
        duplicated = _key_index(frame).duplicated()
        return table.filter(pa.array(~duplicated)) if duplicated.any() else table

    def clear(self) -> None:
        with self._locked():
            shutil.rmtree(self.samples_dir, ignore_errors=True)

    # -- damage: check, quarantine, repair --------------------------------------------------------
    def _quarantine(self, path: Path, error: BaseException) -> None:
        """Move an unreadable file aside (one warning naming it) so that reads go on."""
        target = self.quarantine_dir / path.parent.name / path.name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
        except FileNotFoundError:
            return
        self.quarantined.append(target)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        log.warning("%s: unreadable Parquet file (%s); moved to %s, reads go on without it", path, reason[:200], target)

    def _corrupt_files(self) -> list[tuple[Path, BaseException]]:
        bad = []
        if not self.samples_dir.exists():
            return bad
        for path in sorted(self.samples_dir.glob("date=*/part-*.parquet")):
            try:
                metadata = pq.read_metadata(path)
                pq.read_table(path, columns=["timestamp"]) if metadata.num_rows else None
                missing = set(KEY_COLUMNS) - set(metadata.schema.names)
                if missing:
                    raise ValueError(f"missing column(s) {', '.join(sorted(missing))}")
            except FileNotFoundError:
                continue
            except _CORRUPT as error:
                bad.append((path, error))
        return bad

    def quarantine_corrupt(self) -> list[Path]:
        """Find unreadable files and move them aside. Returns where they went."""
        before = len(self.quarantined)
        with self._locked():
            for path, error in self._corrupt_files():
                self._quarantine(path, error)
        return self.quarantined[before:]

    def check(self) -> CheckResult:
        """Read-only health check: unreadable files, leftovers of an interrupted write, duplicates."""
        result = CheckResult()
        result.pending_ops = sorted(self.ops_dir.glob("*.json")) if self.ops_dir.exists() else []
        if self.samples_dir.exists():
            result.stale_tmp = sorted(self.samples_dir.glob("date=*/.*.tmp"))
        if self.quarantine_dir.exists():
            result.quarantined = sorted(p for p in self.quarantine_dir.rglob("*") if p.is_file())
        bad = self._corrupt_files()
        result.corrupt = [path for path, _ in bad]
        for directory in self._day_dirs():
            files = [f for f in sorted(directory.glob("part-*.parquet")) if f not in result.corrupt]
            tables = []
            for path in files:
                try:
                    tables.append(pq.read_table(path, columns=list(KEY_COLUMNS), schema=_KEY_SCHEMA))
                except FileNotFoundError:
                    continue
                except _CORRUPT:
                    result.corrupt.append(path)
            result.files += len(tables)
            if not tables:
                continue
            table = pa.concat_tables(tables)
            result.rows += table.num_rows
            result.duplicate_rows += table.num_rows - self._unique(table).num_rows
        return result

    def repair(self) -> dict[str, int]:
        """Finish or undo interrupted operations, quarantine unreadable files, drop duplicates."""
        with self._locked(blocking=True):
            pass  # taking the lock replays journals and removes stale temporary files
        quarantined = self.quarantine_corrupt()
        before = self.row_count()
        days = self.compact(min_files=1, dedupe_only=True)
        return {"quarantined": len(quarantined), "days_deduplicated": days, "duplicates_removed": before - self.row_count()}

    # -- reading -------------------------------------------------------------------------------
    def _dataset(self) -> ds.Dataset | None:
        if not self.samples_dir.exists():
            return None
        return ds.dataset(self.samples_dir, format=_FORMAT, partitioning=_PARTITIONING, schema=_READ_SCHEMA)

    def _scan(self, work: Callable[[ds.Dataset], object]):
        """Run ``work`` on the dataset; a concurrent compaction can delete a file between listing
        and reading (list again); an unreadable file is quarantined (then read again without it)."""
        self._recover_if_needed()
        quarantined_here = 0
        for attempt in range(5):
            dataset = self._dataset()
            if dataset is None:
                return None
            try:
                return work(dataset)
            except FileNotFoundError:
                if attempt == 4:
                    raise
                time.sleep(0.05)
            except _CORRUPT:
                moved = self.quarantine_corrupt()
                if not moved or quarantined_here > 100:
                    raise
                quarantined_here += len(moved)
        return None

    def read(self, start: TimeBound = None, end: TimeBound = None, columns: Sequence[str] | None = None,
             nodes: Iterable[str] | None = None) -> pd.DataFrame:
        """Samples with ``start <= timestamp < end`` (UTC; either bound may be open), sorted by time.

        ``columns`` limits what is read (the idle report needs a handful of the 40 columns).
        """
        wanted = self._columns(columns)
        table = self.read_arrow(start, end, wanted, nodes)
        if table is None:
            return empty_samples()[wanted]
        # Nullable ints straight to pandas' Int64 (no float detour).
        frame = table.to_pandas(ignore_metadata=True, self_destruct=True, types_mapper={pa.int64(): pd.Int64Dtype()}.get)
        del table
        if "timestamp" in frame.columns and str(frame["timestamp"].dtype) != "datetime64[ns, UTC]":
            frame["timestamp"] = frame["timestamp"].astype("datetime64[ns, UTC]")
        return frame

    def read_arrow(self, start: TimeBound = None, end: TimeBound = None, columns: Sequence[str] | None = None,
                   nodes: Iterable[str] | None = None) -> pa.Table | None:
        """What :meth:`read` returns, as an Arrow table before the pandas conversion (the fast path
        for readers that work on arrays): the same rows in the same order, string columns as
        ``dictionary<int32, string>`` with one dictionary per column, ints as nullable ``int64``,
        timestamps as ``timestamp[ns, UTC]``. None for a store that holds nothing yet."""
        start_ts, end_ts = _utc(start), _utc(end)
        wanted = self._columns(columns)
        table = self._scan(lambda dataset: dataset.to_table(columns=wanted, filter=self._filter(start_ts, end_ts, nodes)))
        if table is None:
            return None
        table = table.unify_dictionaries()
        if "timestamp" in wanted and table.num_rows > 1:
            # Day partitions and part files are read in name order, so rows usually arrive sorted.
            stamps = table.column("timestamp").to_numpy().view(np.int64)
            if table.column("timestamp").null_count or not (stamps[1:] >= stamps[:-1]).all():
                table = table.take(pc.sort_indices(table, [("timestamp", "ascending")], null_placement="at_end"))  # stable
        return table

    @staticmethod
    def _columns(columns: Sequence[str] | None) -> list[str]:
        wanted = list(columns) if columns is not None else list(PANDAS_DTYPES)
        unknown = [c for c in wanted if c not in PANDAS_DTYPES]
        if unknown:
            raise KeyError(f"unknown samples column(s) {', '.join(unknown)}; allowed: {', '.join(PANDAS_DTYPES)}")
        return wanted

    @staticmethod
    def _filter(start: pd.Timestamp | None, end: pd.Timestamp | None, nodes: Iterable[str] | None):
        """Partitions by name, then timestamps. A ``date=D`` partition holds only timestamps of day
        D (``append`` splits by UTC day), so a bound at midnight needs no per-row timestamp test."""
        expression = None

        def both(left, right):
            return right if left is None else left & right

        if start is not None:
            expression = both(expression, ds.field("date") >= start.strftime("%Y-%m-%d"))
            if start != start.normalize():
                expression = both(expression, ds.field("timestamp") >= pa.scalar(start.to_pydatetime(), pa.timestamp("ns", tz="UTC")))
        if end is not None:
            if end == end.normalize():
                expression = both(expression, ds.field("date") < end.strftime("%Y-%m-%d"))
            else:
                expression = both(expression, ds.field("date") <= end.strftime("%Y-%m-%d"))
                expression = both(expression, ds.field("timestamp") < pa.scalar(end.to_pydatetime(), pa.timestamp("ns", tz="UTC")))
        if nodes is not None:
            expression = both(expression, ds.field("node").isin(list(nodes)))
        return expression

    def time_range(self) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        """First and last sample timestamps, or None for an empty store."""
        days = [d for d in self._day_dirs() if any(d.glob("part-*.parquet"))]
        if not days:
            return None

        def bounds(dataset: ds.Dataset):
            first = dataset.to_table(columns=["timestamp"], filter=ds.field("date") == days[0].name[5:])["timestamp"]
            last = dataset.to_table(columns=["timestamp"], filter=ds.field("date") == days[-1].name[5:])["timestamp"]
            return pc.min(first).as_py(), pc.max(last).as_py()

        found = self._scan(bounds)
        if found is not None and (found[0] is None or found[1] is None):  # an edge day held no rows
            found = self._scan(lambda dataset: (pc.min(dataset.to_table(columns=["timestamp"])["timestamp"]).as_py(),
                                                pc.max(dataset.to_table(columns=["timestamp"])["timestamp"]).as_py()))
        if found is None or found[0] is None:
            return None
        return pd.Timestamp(found[0]).tz_convert("UTC"), pd.Timestamp(found[1]).tz_convert("UTC")

    def row_count(self) -> int:
        counted = self._scan(lambda dataset: dataset.count_rows())
        return int(counted or 0)

    def file_count(self) -> int:
        return sum(1 for _ in self.samples_dir.glob("date=*/part-*.parquet")) if self.samples_dir.exists() else 0

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.samples_dir.glob("date=*/part-*.parquet")) if self.samples_dir.exists() else 0
