"""Reports as text: ``table`` (aligned plain text), ``json``, ``csv`` (one table) and ``markdown``.

JSON is :meth:`Report.to_dict` (keys documented in ``REPORTS.md``); CSV writes one table, the
report's main table unless another is named; ``table`` and ``markdown`` write the summary and every
table, at most ``limit`` rows each (JSON and CSV are never cut).
"""

from __future__ import annotations

import io
import json
import math
import textwrap

import pandas as pd

from .params import AnalyticsError
from .report_schema import Report

FORMATS = ("table", "json", "csv", "markdown")
TERMINAL_COLUMNS = 120  # table output fits this width unless the caller asks for it wide
# Figures that are shares of a whole (0..1 in JSON and CSV) read as percentages in text.
_PERCENT_NAMES = ("share", "efficiency_score", "utilisation", "allocation_ratio", "cost_share")


def _is_share(name: str) -> bool:
    return name.endswith(("_share", "_ratio")) or name in _PERCENT_NAMES


def _cell(value, name: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if _is_share(name.rsplit(".", 1)[-1]):
            return f"{value:.1%}"
        return f"{value:,.2f}"
    if isinstance(value, pd.Timestamp):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)


def _rows(table: pd.DataFrame, limit: int | None) -> tuple[list[str], list[list[str]], int]:
    shown = table if limit is None else table.head(limit)
    header = [str(c) for c in table.columns]
    body = [[_cell(v, h) for v, h in zip(row, header)] for row in shown.astype(object).itertuples(index=False, name=None)]
    return header, body, len(table) - len(shown)


def _summary_items(summary: dict, prefix: str = ""):
    for key, value in summary.items():
        if isinstance(value, dict):
            yield from _summary_items(value, f"{prefix}{key}.")
        elif isinstance(value, list):
            yield f"{prefix}{key}", ", ".join(map(str, value)) or "-"
        else:
            yield f"{prefix}{key}", _cell(value, key)


def render(report: Report, fmt: str = "table", table: str | None = None, limit: int | None = 20,
           wide: bool = False) -> str:
    """The report as text; ``table`` output fits :data:`TERMINAL_COLUMNS` unless ``wide``."""
    if fmt not in FORMATS:
        raise AnalyticsError(f"format {fmt!r} is not one of: {', '.join(FORMATS)}")
    if table is not None and table not in report.tables:
        raise AnalyticsError(f"report {report.kind!r} has no table {table!r}; tables: {', '.join(report.tables)}")
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        report.tables[table or report.main].to_csv(buffer, index=False, date_format="%Y-%m-%dT%H:%M:%SZ")
        return buffer.getvalue()
    names = [table] if table else list(report.tables)
    ledger = report.ledger
    title = f"{report.kind} report, {ledger.start:%Y-%m-%d %H:%M} -> {ledger.end:%Y-%m-%d %H:%M} UTC ({ledger.price_book.currency})"
    out: list[str] = []
    if fmt == "markdown":
        out += [f"# {title}", "", "| figure | value |", "|---|---|"]
        out += [f"| `{k}` | {v} |" for k, v in _summary_items(report.summary)]
        out += [""] + [f"> {note}" for note in report.notes] + ([""] if report.notes else [])
        for name in names:
            header, body, more = _rows(report.tables[name], limit)
            out += [f"## {name}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            out += ["| " + " | ".join(row) + " |" for row in body]
            out += (["", f"_{more} more rows (use --format csv or json for all)_"] if more else []) + [""]
        return "\n".join(out)
    out += [title, "=" * len(title)]
    items = list(_summary_items(report.summary))
    width = max((len(k) for k, _ in items), default=0)
    for key, value in items:
        line = f"{key.ljust(width)}  {value}"
        out += [line] if wide else textwrap.wrap(line, TERMINAL_COLUMNS, subsequent_indent=" " * (width + 2))
    for note in report.notes:
        out += [f"note: {note}"] if wide else textwrap.wrap(f"note: {note}", TERMINAL_COLUMNS, subsequent_indent="      ")
    for name in names:
        header, body, more = _rows(report.tables[name], limit)
        widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(header)]
        hidden: list[str] = []
        if not wide:  # keep the leading columns that fit; name the rest
            keep, used = 0, 0
            for w in widths:
                if keep and used + w > TERMINAL_COLUMNS - 2:
                    break
                keep, used = keep + 1, used + w + 2
            hidden = header[keep:]
            header, widths, body = header[:keep], widths[:keep], [row[:keep] for row in body]
        out += ["", f"[{name}]", "  ".join(h.ljust(w) for h, w in zip(header, widths)),
                "  ".join("-" * w for w in widths)]
        out += ["  ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(row, widths)) for row in body]
        if more:
            out.append(f"... {more} more rows (use --format csv or json for all)")
        if hidden:
            out += textwrap.wrap(f"... {len(hidden)} more column(s) not shown: {', '.join(hidden)} (use --wide, "
                                 "or --format csv or json)", TERMINAL_COLUMNS)
    return "\n".join(out) + "\n"


def _numeric(text: str) -> bool:
    return bool(text) and text.replace(",", "").replace(".", "", 1).removesuffix("%").lstrip("-").isdigit()
