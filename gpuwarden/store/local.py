"""The embedded store: fleet samples in Parquet files partitioned by UTC day, no server.

Why Parquet partitions (pyarrow) rather than DuckDB: pandas already needs pyarrow, so this adds no
dependency; every append is a new immutable file (written under a dot-name, then renamed, so a
reader never sees half a file); a range read prunes whole days by directory name, then row groups
by their timestamp statistics, and reads only the columns asked for. ``compact`` merges a day's
small files (the live feed writes one per step) into one.

Layout::

    ROOT/samples/date=YYYY-MM-DD/part-<first-timestamp>-<random>.parquet
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .schema import PANDAS_DTYPES, coerce, empty_samples

_PARTITIONING = ds.partitioning(pa.schema([("date", pa.string())]), flavor="hive")
_ROW_GROUP_ROWS = 256 * 1024


def _utc(value: datetime | pd.Timestamp | str | None) -> pd.Timestamp | None:
    if value is None:
        return None
    stamp = pd.Timestamp(value)
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def _arrow_schema() -> pa.Schema:
    kinds = {
        "datetime64[ns, UTC]": pa.timestamp("ns", tz="UTC"),
        "category": pa.string(),
        "Int64": pa.int64(),
        "float64": pa.float64(),
    }
    return pa.schema([(name, kinds[dtype]) for name, dtype in PANDAS_DTYPES.items()])


ARROW_SCHEMA = _arrow_schema()
# Read strings as dictionaries: Parquet stores them dictionary-encoded, so they arrive as pandas
# categoricals without hashing every row again. The file format must be told too: with the schema
# alone the scanner decodes every string and hashes it back into a dictionary (3x the read time).
_STRING_COLUMNS = [f.name for f in ARROW_SCHEMA if f.type == pa.string()]
_READ_SCHEMA = pa.schema(
    [pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.type == pa.string() else f for f in ARROW_SCHEMA]
).append(pa.field("date", pa.string()))
_FORMAT = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=_STRING_COLUMNS))


class LocalStore:
    """Append and range-read fleet samples under one directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.samples_dir = self.root / "samples"

    # -- writing -------------------------------------------------------------------------------
    def append(self, samples: pd.DataFrame, validate: bool = True) -> int:
        """Store ``samples`` (the fleet samples columns). Returns the number of rows written."""
        if samples.empty:
            return 0
        frame = coerce(samples) if validate else samples
        days = frame["timestamp"].dt.strftime("%Y-%m-%d")
        written = 0
        for day, part in frame.groupby(days.to_numpy(), sort=True):
            self._write_file(str(day), part)
            written += len(part)
        return written

    def _write_file(self, day: str, part: pd.DataFrame) -> Path:
        directory = self.samples_dir / f"date={day}"
        directory.mkdir(parents=True, exist_ok=True)
        first = pd.Timestamp(part["timestamp"].iloc[0]).strftime("%Y%m%dT%H%M%S")
        name = f"part-{first}-{uuid.uuid4().hex[:12]}.parquet"
        table = pa.Table.from_pandas(part, schema=ARROW_SCHEMA, preserve_index=False)
        temporary = directory / f".{name}.tmp"
        pq.write_table(table, temporary, row_group_size=_ROW_GROUP_ROWS, compression="zstd")
        final = directory / name
        os.replace(temporary, final)
        return final

    def compact(self, min_files: int = 8) -> int:
        """Merge each day's files into one where a day has at least ``min_files``. Returns days merged."""
        merged = 0
        for directory in sorted(self.samples_dir.glob("date=*")):
            files = sorted(directory.glob("part-*.parquet"))
            if len(files) < min_files:
                continue
            table = pq.read_table(files, schema=ARROW_SCHEMA).sort_by("timestamp")
            name = f"part-{files[0].name[5:20]}-{uuid.uuid4().hex[:12]}.parquet"
            temporary = directory / f".{name}.tmp"
            pq.write_table(table, temporary, row_group_size=_ROW_GROUP_ROWS, compression="zstd")
            os.replace(temporary, directory / name)
            for old in files:
                old.unlink()
            merged += 1
        return merged

    def clear(self) -> None:
        shutil.rmtree(self.samples_dir, ignore_errors=True)

    # -- reading -------------------------------------------------------------------------------
    def _dataset(self) -> ds.Dataset | None:
        if not self.samples_dir.exists():
            return None
        return ds.dataset(self.samples_dir, format=_FORMAT, partitioning=_PARTITIONING, schema=_READ_SCHEMA)

    def read(
        self,
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        columns: Sequence[str] | None = None,
        nodes: Iterable[str] | None = None,
    ) -> pd.DataFrame:
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

    def read_arrow(
        self,
        start: datetime | str | None = None,
        end: datetime | str | None = None,
        columns: Sequence[str] | None = None,
        nodes: Iterable[str] | None = None,
    ) -> pa.Table | None:
        """What :meth:`read` returns, as an Arrow table before the pandas conversion (the fast path
        for readers that work on arrays): the same rows in the same order, string columns as
        ``dictionary<int32, string>`` with one dictionary per column, ints as nullable ``int64``,
        timestamps as ``timestamp[ns, UTC]``. None for a store that holds nothing yet."""
        start_ts, end_ts = _utc(start), _utc(end)
        wanted = self._columns(columns)
        # A concurrent compaction can delete a file between listing and reading: list again.
        for attempt in range(3):
            dataset = self._dataset()
            if dataset is None:
                return None
            try:
                table = dataset.to_table(columns=wanted, filter=self._filter(start_ts, end_ts, nodes))
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
                time.sleep(0.05)
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
        dataset = self._dataset()
        if dataset is None:
            return None
        days = sorted(p.name[5:] for p in self.samples_dir.glob("date=*") if any(p.glob("part-*.parquet")))
        if not days:
            return None
        first = dataset.to_table(columns=["timestamp"], filter=ds.field("date") == days[0])["timestamp"]
        last = dataset.to_table(columns=["timestamp"], filter=ds.field("date") == days[-1])["timestamp"]
        import pyarrow.compute as pc

        return (
            pd.Timestamp(pc.min(first).as_py()).tz_convert("UTC"),
            pd.Timestamp(pc.max(last).as_py()).tz_convert("UTC"),
        )

    def row_count(self) -> int:
        dataset = self._dataset()
        return 0 if dataset is None else dataset.count_rows()

    def file_count(self) -> int:
        return sum(1 for _ in self.samples_dir.glob("date=*/part-*.parquet")) if self.samples_dir.exists() else 0

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.samples_dir.glob("date=*/part-*.parquet")) if self.samples_dir.exists() else 0




