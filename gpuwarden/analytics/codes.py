"""Dense integer codes for the strings of fleet samples (stable across chunks), and the Arrow
columns the ledger reads as numpy arrays."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


K = TypeVar("K", bound=Hashable)


class Registry(Generic[K]):
    """Strings (or tuples) to dense integer codes, stable across chunks."""

    def __init__(self) -> None:
        self.index: dict[K, int] = {}
        self.values: list[K] = []

    def code(self, value: K) -> int:
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.values)
            self.values.append(value)
        return found

    def local(self: Registry[str], frame: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A column's chunk-local codes (-1 for null; any integer width) and the global code of each
        local code."""
        if name not in frame.columns:
            return np.full(len(frame), -1, np.int8), np.empty(0, np.int64)
        series = frame[name]
        if not isinstance(series.dtype, pd.CategoricalDtype):
            series = series.astype("category")
        return series.cat.codes.to_numpy(), self.mapping(series.cat.categories)

    def local_arrow(self: Registry[str], table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`local` for an Arrow column (dictionary-encoded or not)."""
        if name not in table.column_names:
            return np.full(table.num_rows, -1, np.int8), np.empty(0, np.int64)
        column = table.column(name)
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()  # unifies dictionaries
        indices = array.indices
        codes = pc.fill_null(indices, -1).to_numpy() if indices.null_count else indices.to_numpy()
        return codes, self.mapping(array.dictionary.to_pylist())

    def mapping(self: Registry[str], categories: Iterable[object]) -> np.ndarray:
        return np.array([self.code(str(c)) for c in categories], dtype=np.int64)


def arrow_ns(column: pa.ChunkedArray) -> np.ndarray:
    """Timestamps as int64 ns since the epoch (UTC; naive counts as UTC), int64 min for null."""
    if not pa.types.is_timestamp(column.type):
        stamps = pd.to_datetime(column.to_pandas(), utc=True, errors="coerce")
        return np.asarray(pd.DatetimeIndex(stamps).as_unit("ns").asi8, dtype=np.int64)
    if column.type.unit != "ns":
        column = column.cast(pa.timestamp("ns", tz=column.type.tz))
    return np.asarray(column.to_numpy()).view(np.int64)  # a null is NaT, int64 min


def arrow_floats(table: pa.Table, name: str) -> np.ndarray:
    """A gauge as float64 with NaN for null (``pd.to_numeric(errors="coerce")`` for other types)."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    column = table.column(name)
    if pa.types.is_floating(column.type) or pa.types.is_integer(column.type):
        if column.type != pa.float64():
            column = column.cast(pa.float64())
        return np.asarray(column.to_numpy(), dtype=np.float64)
    return np.asarray(pd.to_numeric(column.to_pandas(), errors="coerce").to_numpy(dtype="float64", na_value=np.nan))


def dense_factorize(packed: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Like :func:`_factorize` for values in ``[0, size)``, by a lookup table when ``size`` is small."""
    if size > max(4 * len(packed), 1 << 22):
        return _factorize(packed)
    first = np.full(size, -1, np.int64)
    first[packed[::-1]] = np.arange(len(packed) - 1, -1, -1)
    uniques = np.flatnonzero(first >= 0)
    remap = np.empty(size, np.int64)
    remap[uniques] = np.arange(len(uniques))
    return remap[packed], uniques, first[uniques]


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, unique values (in order of appearance) and the first row of each, by hashing."""
    codes, uniques = pd.factorize(values)
    first = np.empty(len(uniques), np.int64)
    first[codes[::-1]] = np.arange(len(values) - 1, -1, -1)
    return codes.astype(np.int64), np.asarray(uniques, dtype=np.int64), first
