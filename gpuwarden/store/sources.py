"""Where fleet samples can be read from, behind one small protocol.

Analytics reads a ``SamplesSource``; it never knows whether the rows came from the embedded
store, a user's file, or Prometheus. Every source answers ``read(start, end, columns)`` with the
fleet samples table (``start <= timestamp < end``) and ``time_range()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from gpuwarden.fleet.semantics import to_utc_or_none

from .local import LocalStore, TimeBound
from .samples_files import load_samples
from .schema import ValidationReport, validate_rows


@runtime_checkable
class SamplesSource(Protocol):
    def read(self, start: TimeBound = None, end: TimeBound = None,
             columns: Sequence[str] | None = None) -> pd.DataFrame: ...

    def time_range(self) -> tuple[pd.Timestamp, pd.Timestamp] | None: ...


class FileSource:
    """Fleet samples from one CSV / Parquet file, validated once when opened; ``validation``
    counts the rows rejected, by reason (every report says them: ``cli.source_notes``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.validation = ValidationReport(str(self.path))
        self._frame = load_samples(self.path, report=self.validation)

    def read(self, start=None, end=None, columns=None) -> pd.DataFrame:
        frame = self._frame
        start_ts, end_ts = to_utc_or_none(start), to_utc_or_none(end)
        mask = pd.Series(True, index=frame.index)
        if start_ts is not None:
            mask &= frame["timestamp"] >= start_ts
        if end_ts is not None:
            mask &= frame["timestamp"] < end_ts
        out = frame.loc[mask, list(columns) if columns is not None else frame.columns]
        return out.sort_values("timestamp", kind="stable", ignore_index=True) if "timestamp" in out else out.reset_index(drop=True)

    def time_range(self) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        if self._frame.empty:
            return None
        return self._frame["timestamp"].min(), self._frame["timestamp"].max()


class ValidatedReads:
    """A mixin for a source whose rows did not pass :func:`~gpuwarden.store.schema.coerce` on the
    way in (Prometheus): ``read`` drops implausible rows, counts them in ``validation`` and logs one
    warning per read that rejected any. Mixed in (not wrapped) so the source keeps its type and
    its other methods."""

    def read(self, start=None, end=None, columns=None) -> pd.DataFrame:
        frame = super().read(start, end, columns)
        name = getattr(self, "validation_name", type(self).__name__)
        report = ValidationReport(name)
        kept = validate_rows(frame, name, report)
        if report.rejected:
            import logging

            logging.getLogger("gpuwarden.store").warning("%s", report.summary())
        if not hasattr(self, "validation"):
            self.validation = ValidationReport(name)
        self.validation.merge(report)
        return kept


def open_prometheus(url: str, **options: Any) -> SamplesSource:
    """A :class:`~gpuwarden.store.prometheus.PrometheusSource` on ``url`` (``options``: its keyword
    arguments) whose reads drop implausible rows (:class:`ValidatedReads`). The one way the CLI's
    ``--source prometheus`` and the dashboard's ``GPUWARDEN_SOURCE=prometheus`` open Prometheus;
    bad settings raise :class:`~gpuwarden.store.prometheus.PrometheusError` (a SamplesError)."""
    from .prometheus import PrometheusSource

    class ValidatedPrometheusSource(ValidatedReads, PrometheusSource):
        validation_name = f"Prometheus {url}"

    return ValidatedPrometheusSource(url, **options)


__all__ = ["FileSource", "LocalStore", "SamplesSource", "ValidatedReads", "open_prometheus"]
