"""How the embedded store lays samples out in Parquet: the Arrow schema it writes and reads, the
part-file names (their first and last sample time), a sample's identity, and the read filter that
prunes day partitions by name before row groups by timestamp."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .schema import KEY_COLUMNS, PANDAS_DTYPES

PARTITIONING = ds.partitioning(pa.schema([("date", pa.string())]), flavor="hive")
ROW_GROUP_ROWS = 256 * 1024
PART_NAME = re.compile(r"^part-(\d{8}T\d{6})-(\d{8}T\d{6})-[0-9a-f]+\.parquet$")
NAME_STAMP = "%Y%m%dT%H%M%S"


def _arrow_schema() -> pa.Schema:
    kinds = {
        "datetime64[ns, UTC]": pa.timestamp("ns", tz="UTC"),
        "category": pa.string(),
        "Int64": pa.int64(),
        "float64": pa.float64(),
    }
    return pa.schema([(name, kinds[dtype]) for name, dtype in PANDAS_DTYPES.items()])


ARROW_SCHEMA = _arrow_schema()
KEY_SCHEMA = pa.schema([ARROW_SCHEMA.field(name) for name in ("gpu_uuid", "mig_instance", "timestamp")])
# Read strings as dictionaries: Parquet stores them dictionary-encoded, so they arrive as pandas
# categoricals without hashing every row again. The file format must be told too: with the schema
# alone the scanner decodes every string and hashes it back into a dictionary (3x the read time).
_STRING_COLUMNS = [f.name for f in ARROW_SCHEMA if f.type == pa.string()]
READ_SCHEMA = pa.schema(
    [pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.type == pa.string() else f for f in ARROW_SCHEMA]
).append(pa.field("date", pa.string()))
READ_FORMAT = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=_STRING_COLUMNS))
# What a damaged file raises (bad magic bytes, truncated footer, garbage pages).
CORRUPT_ERRORS = (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError)


def key_index(frame: pd.DataFrame) -> pd.MultiIndex:
    """(gpu_uuid, mig_instance or '', timestamp ns): one sample's identity."""
    return pd.MultiIndex.from_arrays([
        frame["gpu_uuid"].astype(str).to_numpy(),
        frame["mig_instance"].astype(object).where(frame["mig_instance"].notna(), "").astype(str).to_numpy(),
        frame["timestamp"].dt.tz_convert(None).to_numpy(dtype="datetime64[ns]").view(np.int64),
    ])



def unique_rows(table: pa.Table) -> pa.Table:
    """Rows with a distinct (GPU, MIG instance, timestamp), first one kept."""
    frame = table.select(list(KEY_COLUMNS)).to_pandas()
    frame["timestamp"] = frame["timestamp"].astype("datetime64[ns, UTC]")
    duplicated = key_index(frame).duplicated()
    return table.filter(pa.array(~duplicated)) if duplicated.any() else table



def read_filter(start: pd.Timestamp | None, end: pd.Timestamp | None, nodes: Iterable[str] | None):
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


def _fits(expected: pa.DataType, actual: pa.DataType) -> bool:
    """Whether a column stored as ``actual`` reads as the samples column of type ``expected``."""
    if pa.types.is_null(actual):
        return True
    if pa.types.is_dictionary(actual):
        actual = actual.value_type
    if pa.types.is_timestamp(expected):
        return pa.types.is_timestamp(actual)
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(actual)
    return pa.types.is_floating(actual) or pa.types.is_integer(actual)


def schema_problem(schema: pa.Schema) -> str | None:
    """Why a file of ``schema`` is not samples (a key column missing, a column of another type), or
    None. A samples column it lacks reads as not measured (files written before it was added)."""
    missing = [name for name in KEY_COLUMNS if name not in schema.names]
    if missing:
        return f"missing column(s) {', '.join(missing)}"
    wrong = [f"{name} is {schema.field(name).type}" for name in schema.names
             if name in ARROW_SCHEMA.names and schema.get_field_index(name) >= 0
             and not _fits(ARROW_SCHEMA.field(name).type, schema.field(name).type)]
    return f"not the samples schema ({', '.join(wrong[:3])})" if wrong else None


_verdicts: dict[tuple[str, int, int, int], str | None] = {}  # (path, inode, size, mtime) -> part_problem


def part_problem(path: Path) -> str | None:
    """Why the part file at ``path`` cannot be read as samples, from its footer (not Parquet, cut
    short, not the samples schema), or None. Remembered per file version (path, inode, size, time),
    so a reader looks at each footer once."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None  # gone (a compaction): the read lists again
    key = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
    if key in _verdicts:
        return _verdicts[key]
    try:
        verdict = schema_problem(pq.read_schema(path))
    except FileNotFoundError:
        return None
    except CORRUPT_ERRORS as error:
        verdict = (str(error).splitlines() or [type(error).__name__])[0][:200]
    if len(_verdicts) > 200_000:
        _verdicts.clear()
    _verdicts[key] = verdict
    return verdict


def unreadable_files(parts: Iterable[Path]) -> list[tuple[Path, BaseException]]:
    """The part files of ``parts`` that cannot be read (their footer, schema and timestamps), each
    with the error it raised."""
    bad: list[tuple[Path, BaseException]] = []
    for path in parts:
        try:
            problem = part_problem(path)
            if problem:
                raise ValueError(problem)
            if pq.read_metadata(path).num_rows:
                pq.read_table(path, columns=["timestamp"])
        except FileNotFoundError:
            continue
        except CORRUPT_ERRORS as error:
            bad.append((path, error))
    return bad
