"""What every dashboard page needs: where the store is, a friendly stop when it is empty, and
cached reads of a window that ends at the newest sample.

The store is the directory named by the ``GPUWARDEN_STORE`` environment variable (an embedded
:class:`gpuwarden.store.LocalStore`). Reads are cached with ``st.cache_data`` for
:data:`CACHE_TTL_S` seconds, keyed on the store path, the window and the columns, so switching
pages or widgets does not re-read Parquet while a live demo keeps appending.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import streamlit as st

from gpuwarden.dashboards import STORE_ENV
from gpuwarden.store import LocalStore

CACHE_TTL_S = 30

HOW_TO_FILL = (
    "Run `gpuwarden demo` to fill a store with a simulated fleet and open this dashboard on it, "
    f"or set `{STORE_ENV}` to the directory of a store that gpuwarden is writing to."
)


def store_path() -> str | None:
    """The store directory from ``GPUWARDEN_STORE``, or None when unset or blank."""
    value = os.environ.get(STORE_ENV, "").strip()
    return value or None


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False)
def store_time_range(path: str) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """First and newest sample time in the store, or None when it holds no samples."""
    if not Path(path).is_dir():
        return None
    return LocalStore(path).time_range()


def require_store() -> tuple[str, tuple[pd.Timestamp, pd.Timestamp]]:
    """The store path and its time range; otherwise explain how to fill it and stop the page."""
    path = store_path()
    if path is None:
        st.info(f"No store configured: `{STORE_ENV}` is not set.\n\n{HOW_TO_FILL}", icon=":material/info:")
        st.stop()
    span = store_time_range(path)
    if span is None:
        st.info(f"The store at `{path}` holds no samples yet.\n\n{HOW_TO_FILL}", icon=":material/info:")
        st.stop()
    return path, span


@st.cache_data(ttl=CACHE_TTL_S, show_spinner="Reading fleet samples…")
def read_window(path: str, window: pd.Timedelta, columns: tuple[str, ...]) -> pd.DataFrame:
    """Samples of the last ``window`` before (and including) the store's newest sample."""
    span = store_time_range(path)
    if span is None:
        return LocalStore(path).read(columns=list(columns)).iloc[0:0]
    newest = span[1]
    return LocalStore(path).read(start=newest - window, end=newest + pd.Timedelta(seconds=1), columns=list(columns))
