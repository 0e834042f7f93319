"""The embedded store: fleet samples in Parquet files partitioned by UTC day, no server.

Why Parquet partitions (pyarrow) rather than DuckDB: pandas already needs pyarrow, so this adds no
dependency; a range read prunes whole days by directory name, then row groups by their timestamp
statistics, and reads only the columns asked for. ``compact`` merges a day's small files (the live
feed writes one per step) into one.

Crash safety, at the level of a whole operation (a load, a compaction):

- every writer takes ``ROOT/.lock`` (``fcntl.flock``), so writes and compactions are serialised
  across processes; readers hold ``ROOT/.readlock`` shared while they list and read, and an
  operation's swap (its renames and deletions) holds it exclusively, so a read never sees a
  compaction's new file beside the files it replaces (:meth:`.journal.Journal.reading`);
- an operation is journalled, and replayed or undone after a crash (:mod:`.journal`), so a load
  is all or nothing;
- a load drops rows the store already holds (same GPU, MIG instance and timestamp), so loading
  the same rows twice adds nothing; compaction de-duplicates too (two writers racing);
- a part file that cannot be read is moved to ``ROOT/quarantine/`` with one warning naming it,
  and the read goes on without it;
- a write that fails (a full disk) removes what it had staged, so it leaves nothing behind.

The store owns its folder (:mod:`.folder`): it reads, moves and deletes only what its naming
scheme names; anything else there is ignored with one note and never breaks a read.

Layout::

    ROOT/samples/date=YYYY-MM-DD/part-<first>-<last>-<op-id>.parquet   (first/last: UTC seconds)
    ROOT/ops/<op-id>.json        a committed operation not yet fully applied
    ROOT/quarantine/…            files moved aside because they could not be read
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock
from gpuwarden.fleet.semantics import to_utc_or_none as _utc

from .folder import Listing, list_samples, note_foreign, survey
from .journal import Journal, crash_point
from .upkeep import StoreUpkeep
from .parquet_layout import (
    ARROW_SCHEMA,
    CORRUPT_ERRORS,
    NAME_STAMP,
    PART_NAME,
    PARTITIONING,
    READ_FORMAT,
    READ_SCHEMA,
    ROW_GROUP_ROWS,
    key_index,
    part_problem,
    read_filter,
    unique_rows,
)
from .schema import KEY_COLUMNS, PANDAS_DTYPES, ValidationReport, coerce, empty_samples

log = logging.getLogger("gpuwarden.store")

TimeBound = datetime | str | None  # one end of a read's window (ISO-8601 text allowed); None leaves it open


@dataclass
class AppendResult:
    """What one ``append`` did: rows written, rows the store already held (not written again),
    and the validation report of the rows offered (rejected rows, by reason)."""

    written: int = 0
    already_stored: int = 0
    report: ValidationReport | None = None


class LocalStore(StoreUpkeep):
    """Append and range-read fleet samples under one directory.

    ``clock`` gives "now" for validation (a future-dated row is rejected); the demo passes the
    simulated fleet's clock (``fleet.clock.ModelClock``), everything else the system clock.
    """

    def __init__(self, root: str | Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.root = Path(root)
        self.journal = Journal(self.root)
        self.samples_dir = self.journal.samples_dir
        self.ops_dir = self.journal.ops_dir
        self.quarantine_dir = self.root / "quarantine"
        self.lock_path = self.journal.lock_path
        self.clock = clock
        self.last_append = AppendResult()
        self.quarantined: list[Path] = []  # moved aside by this instance, each warned about once

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
        with self.journal.locked():
            fresh = self._drop_stored(frame)
            self.last_append.already_stored = len(frame) - len(fresh)
            if fresh.empty:
                return 0
            op_id = uuid.uuid4().hex[:16]
            days = fresh["timestamp"].dt.strftime("%Y-%m-%d")
            staged: list[tuple[Path, Path]] = []
            try:
                for day, part in fresh.groupby(days.to_numpy(), sort=True):
                    staged.append(self._stage(str(day), part, op_id))
            except BaseException:
                _discard(staged)  # a full disk halfway: nothing of this load stays behind
                raise
            crash_point("load-staged")
            self.journal.commit("load", op_id, staged)
        self.last_append.written = len(fresh)
        return len(fresh)

    def _now(self) -> pd.Timestamp:
        return _utc(self.clock.now())

    def _stage(self, day: str, part: pd.DataFrame | pa.Table, op_id: str) -> tuple[Path, Path]:
        """Write one day's rows under a temporary dot-name; return (temporary, final) paths."""
        directory = self.samples_dir / f"date={day}"
        directory.mkdir(parents=True, exist_ok=True)
        table = part if isinstance(part, pa.Table) else pa.Table.from_pandas(part, schema=ARROW_SCHEMA, preserve_index=False)
        stamps = table.column("timestamp")
        first = pd.Timestamp(pc.min(stamps).as_py()).strftime(NAME_STAMP)
        last = pd.Timestamp(pc.max(stamps).as_py()).strftime(NAME_STAMP)
        name = f"part-{first}-{last}-{op_id}{uuid.uuid4().hex[:4]}.parquet"
        temporary = directory / f".{name}.tmp"
        try:
            pq.write_table(table, temporary, row_group_size=ROW_GROUP_ROWS, compression="zstd")
        except BaseException:
            temporary.unlink(missing_ok=True)  # cut short (a full disk): never left behind
            raise
        return temporary, directory / name

    def _drop_stored(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` without the rows whose (GPU, MIG instance, timestamp) a stored file holds.
        Only files whose name's time span overlaps ``frame`` are read (the live feed never does)."""
        first, last = frame["timestamp"].min(), frame["timestamp"].max()
        candidates = []
        for path in self._listing(first.strftime("%Y-%m-%d"), last.strftime("%Y-%m-%d")).parts:
            match = PART_NAME.match(path.name)
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
        held = key_index(frame).isin(key_index(stored_frame))
        return frame[~held] if held.any() else frame

    def _read_files(self, files: list[Path], columns: list[str]) -> pa.Table | None:
        """Read ``columns`` of ``files``, quarantining any that cannot be read."""
        tables = []
        for path in files:
            problem = part_problem(path)
            if problem:
                self._quarantine(path, problem)
                continue
            try:
                tables.append(pq.read_table(path, columns=columns, schema=ARROW_SCHEMA))
            except FileNotFoundError:
                continue
            except CORRUPT_ERRORS as error:
                self._quarantine(path, error)
        return pa.concat_tables(tables) if tables else None

    def _listing(self, first_day: str | None = None, last_day: str | None = None) -> Listing:
        """The store's files of those days (either open), by its naming scheme; what is foreign
        there is noted once (:func:`.folder.note_foreign`) and otherwise ignored."""
        listing = list_samples(self.samples_dir, first_day, last_day)
        note_foreign(self.root, listing.foreign)
        return listing

    def _by_day(self) -> dict[str, list[Path]]:
        days: dict[str, list[Path]] = {}
        for path in self._listing().parts:
            days.setdefault(path.parent.name[5:], []).append(path)
        return days

    def compact(self, min_files: int = 8, dedupe_only: bool = False) -> int:
        """Merge each day's files into one where a day has at least ``min_files``, dropping
        duplicate samples. Returns days merged. Serialised with every other writer."""
        merged = 0
        with self.journal.locked():
            for day, files in self._by_day().items():
                if not files or len(files) < min_files:
                    continue
                table = self._read_files(files, list(ARROW_SCHEMA.names))
                files = [f for f in files if f.exists()]  # minus any just quarantined
                if table is None:
                    continue
                unique = unique_rows(table)
                if dedupe_only and unique.num_rows == table.num_rows:
                    continue
                op_id = uuid.uuid4().hex[:16]
                staged = self._stage(day, unique.sort_by("timestamp"), op_id)
                self.journal.commit("compact", op_id, [staged], remove=files)
                merged += 1
        return merged

    # -- reading -------------------------------------------------------------------------------
    def _dataset(self, parts: list[Path]) -> ds.Dataset:
        """The part files ``parts`` as one dataset (only these: what else is in the folder is never read)."""
        return ds.dataset([str(path) for path in parts], format=READ_FORMAT, partitioning=PARTITIONING,
                          partition_base_dir=str(self.samples_dir), schema=READ_SCHEMA)

    def _scan(self, work: Callable[[ds.Dataset], object], first_day: str | None = None, last_day: str | None = None):
        """Run ``work`` on the dataset of the days ``first_day..last_day`` (None when they hold no
        part file). A concurrent compaction can delete a file between listing and reading (list
        again); a part file that is not samples is skipped and quarantined; one whose pages cannot
        be read is quarantined, then the read runs again without it."""
        self.journal.recover_if_needed()
        quarantined_here = 0
        for attempt in range(5):
            if not self.samples_dir.is_dir():
                return None
            try:
                with self.journal.reading():  # no operation swaps files between listing and reading
                    parts: list[Path] = []
                    damaged: list[tuple[Path, str]] = []
                    for path in self._listing(first_day, last_day).parts:
                        problem = part_problem(path)
                        if problem:
                            damaged.append((path, problem))
                        else:
                            parts.append(path)
                    result = work(self._dataset(parts)) if parts else None
                if damaged:
                    self._set_aside(damaged)
                return result
            except FileNotFoundError:
                if attempt == 4:
                    raise
                time.sleep(0.05)
            except CORRUPT_ERRORS:
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
        first_day = start_ts.strftime("%Y-%m-%d") if start_ts is not None else None
        last_day = (end_ts - pd.Timedelta(1, "ns")).strftime("%Y-%m-%d") if end_ts is not None else None
        table = self._scan(lambda dataset: dataset.to_table(columns=wanted, filter=read_filter(start_ts, end_ts, nodes)),
                           first_day, last_day)
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

    def time_range(self) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        """First and last sample timestamps, or None for an empty store."""
        days = self._listing().days()
        if not days:
            return None

        def stamps(dataset: ds.Dataset) -> pa.ChunkedArray:
            return dataset.to_table(columns=["timestamp"])["timestamp"]

        first = self._scan(lambda dataset: pc.min(stamps(dataset)).as_py(), days[0], days[0])
        last = self._scan(lambda dataset: pc.max(stamps(dataset)).as_py(), days[-1], days[-1])
        found = (first, last)
        if first is None or last is None:  # an edge day held no rows (or nothing readable)
            found = self._scan(lambda dataset: (pc.min(stamps(dataset)).as_py(), pc.max(stamps(dataset)).as_py()))
        if found is None or found[0] is None:
            return None
        return pd.Timestamp(found[0]).tz_convert("UTC"), pd.Timestamp(found[1]).tz_convert("UTC")

    def row_count(self) -> int:
        counted = self._scan(lambda dataset: dataset.count_rows())
        return int(counted or 0)

    def file_count(self) -> int:
        return len(self._listing().parts)

    def size_bytes(self) -> int:
        total = 0
        for path in self._listing().parts:
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def survey(self) -> Listing:
        """Everything in the store's folder, sorted into its own files, leftovers and foreign ones."""
        return survey(self.root)


def _discard(staged: list[tuple[Path, Path]]) -> None:
    """Remove the temporary files of an operation that will not be committed."""
    for temporary, _ in staged:
        temporary.unlink(missing_ok=True)
