"""Fleet-samples files: ``load_samples`` reads a user's CSV (optionally gzip) or Parquet file,
checked before it is read (a regular file of bounded size, :mod:`gpuwarden.fleet.inputs`) and
refused whole, naming the file and line, where it is malformed (a column named twice, a value that
does not parse, a ratio column in percent); ``write_samples`` writes one. Rows and dtypes:
:mod:`.schema`."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pandas as pd

from gpuwarden.fleet.inputs import checked_input, samples_bound_bytes

from .folder import store_holding
from .schema import SamplesError, ValidationReport, coerce


def load_samples(path: str | Path, report: ValidationReport | None = None, now: pd.Timestamp | None = None) -> pd.DataFrame:
    """Read fleet samples from a ``.csv`` (optionally ``.gz``) or ``.parquet`` file.

    Every way a file can be unreadable (missing, a directory, a FIFO or device, too large, empty, binary, not
    really gzip, not really Parquet) is one :class:`SamplesError` naming the file. Rows that fail validation are
    counted in ``report`` (see :func:`coerce`)."""
    path = Path(path)
    checked_input(path, "", samples_bound_bytes(), raising=SamplesError)  # a link to /dev/zero, a FIFO: refused unread
    suffixes = "".join(path.suffixes[-2:]).lower()
    report = ValidationReport(str(path)) if report is None else report
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq

            _refuse_duplicate_columns(f"{path}", "schema", pq.read_schema(path).names)
            frame = pd.read_parquet(path)
        except SamplesError:
            raise
        except Exception as error:  # noqa: BLE001 pyarrow raises several types for a corrupt file
            raise SamplesError(f"{path}: not a readable Parquet file ({_first_line(error)})") from None
        return _checked(coerce(frame, source=str(path), report=report, now=now, whole_file=True), report)
    if suffixes.endswith(".csv") or suffixes.endswith(".csv.gz"):
        try:
            header = pd.read_csv(path, header=None, nrows=1, dtype=str, encoding="utf-8")
            _refuse_duplicate_columns(f"{path}:1", "header", [] if header.empty else header.iloc[0].tolist())
            frame = pd.read_csv(path, dtype=str, keep_default_na=True, encoding="utf-8")
        except SamplesError:
            raise
        except pd.errors.EmptyDataError:
            raise SamplesError(f"{path}: the file is empty; expected a header line and fleet samples rows") from None
        except UnicodeDecodeError as error:
            raise SamplesError(f"{path}: not a text CSV file (byte {error.start} is not UTF-8)") from None
        except (gzip.BadGzipFile, zlib.error, EOFError) as error:
            raise SamplesError(f"{path}: not a readable gzip file ({_first_line(error)})") from None
        except (pd.errors.ParserError, ValueError) as error:
            raise SamplesError(f"{path}: not a readable CSV file ({_first_line(error)})") from None
        except OSError as error:
            raise SamplesError(f"{path}: cannot read ({error.strerror or _first_line(error)})") from None
        return _checked(coerce(frame, source=str(path), line_offset=2, report=report, now=now, whole_file=True), report)
    raise SamplesError(f"{path}: unknown file type {path.suffix!r}; expected .csv, .csv.gz or .parquet")


def _refuse_duplicate_columns(where: str, what: str, names: list) -> None:
    """A column named twice in a CSV header or a Parquet schema is refused, naming it: pandas would
    read the second as ``name.1`` and drop it (pyarrow fails on it), and which of the two holds the
    data is the user's to say."""
    seen: dict[str, int] = {}
    for position, name in enumerate((str(name).strip() for name in names), 1):
        if name in seen:
            raise SamplesError(f"{where}: column {name!r} appears twice in the {what} (columns {seen[name]} and "
                               f"{position}); keep one")
        seen[name] = position


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def _checked(frame: pd.DataFrame, report: ValidationReport) -> pd.DataFrame:
    if report.rows_in and frame.empty and report.rejected:
        raise SamplesError(f"every row was rejected - {report.summary()}")
    return frame


def write_samples(frame: pd.DataFrame, path: str | Path) -> None:
    """Write fleet samples as CSV (ISO-8601 UTC timestamps) or Parquet, by the file's suffix."""
    path = checked_samples_output(path)
    frame = coerce(frame)
    if path.suffix.lower() == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False, date_format="%Y-%m-%dT%H:%M:%S.%fZ")


def checked_samples_output(path: str | Path) -> Path:
    """``path`` if fleet samples can be written there (before any work): a known file type, and
    outside every store's folder (only the store writes there; a file of its naming would be read
    as samples, twice)."""
    path = Path(path)
    if path.suffix.lower() != ".parquet" and not path.name.lower().endswith((".csv", ".csv.gz")):
        raise SamplesError(f"{path}: unknown file type {path.suffix!r}; expected .csv, .csv.gz or .parquet")
    holder = store_holding(path)
    if holder is not None:
        raise SamplesError(f"{path}: is inside the store {holder}; only the store writes there, write it elsewhere")
    return path
