"""Where fleet samples live: the schema, file loaders, and the embedded (Parquet) store."""

from .local import LocalStore
from .sources import FileSource, SamplesSource
from .samples_files import load_samples, write_samples
from .schema import PANDAS_DTYPES, SamplesError, ValidationReport, coerce, empty_samples, schema_markdown

__all__ = ["FileSource", "LocalStore", "SamplesSource", "PANDAS_DTYPES", "SamplesError", "ValidationReport", "coerce", "empty_samples", "load_samples", "schema_markdown", "write_samples"]
