"""Output for the CLI's own tables: ``--format table|json|csv|markdown``, ``--output FILE`` and
``--wide``. Terminal tables fit 120 columns unless ``--wide`` (long cells are cut with "..."; IDs
such as GPU UUIDs are never cut); ratios show as percentages in tables, raw in JSON and CSV."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path

FORMATS = ("table", "json", "csv", "markdown")
TERMINAL_COLUMNS = 120
_NEVER_CUT = ("uuid", "gpu", "node", "id", "path", "store", "file")


def add_output_options(parser: argparse.ArgumentParser, default: str = "table") -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--format", choices=FORMATS, default=default, help=f"output format (default {default})")
    group.add_argument("--output", "-o", type=Path, help="write to this file instead of standard output")
    group.add_argument("--wide", action="store_true", help=f"do not fit tables to {TERMINAL_COLUMNS} columns")


def cell(name: str, value, for_humans: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if for_humans and isinstance(value, float) and (name.endswith("_ratio") or name == "ratio"):
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:,.3f}" if for_humans and abs(value) < 100 else (f"{value:,.0f}" if for_humans else repr(value))
    if isinstance(value, int) and not isinstance(value, bool) and for_humans:
        return f"{value:,}"
    if isinstance(value, dict):
        return ";".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def render_rows(rows: list[dict], fmt: str, wide: bool = False, note: str = "") -> str:
    """``rows`` (dicts with the same keys) in ``fmt``; ``note`` follows a table, stays out of data."""
    if fmt == "json":
        return json.dumps(rows, indent=2, default=str) + "\n"
    columns = list(rows[0]) if rows else []
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([cell(c, row.get(c), False) for c in columns])
        return buffer.getvalue()
    if not rows:
        return "(no rows)\n" + (note + "\n" if note else "")
    cells = [[cell(c, row.get(c), True) for c in columns] for row in rows]
    if fmt == "markdown":
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(v.replace("|", "\\|") for v in r) + " |" for r in cells]
        return "\n".join(lines) + "\n" + (f"\n{note}\n" if note else "")
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    if not wide:
        widths = _fit(columns, widths, TERMINAL_COLUMNS)
    lines = ["  ".join(_cut(c, w).ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(_cut(v, w).ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines) + "\n" + (note + "\n" if note else "")


def _fit(columns: list[str], widths: list[int], limit: int) -> list[int]:
    """Shrink the widest cuttable columns until the table fits ``limit`` characters."""
    widths = list(widths)
    cuttable = [i for i, c in enumerate(columns) if not any(word in c.lower() for word in _NEVER_CUT)]
    while sum(widths) + 2 * (len(widths) - 1) > limit and cuttable:
        widest = max(cuttable, key=lambda i: widths[i])
        if widths[widest] <= 8:
            break
        widths[widest] -= 1
    return widths


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def render_record(record: dict, fmt: str) -> str:
    """One record (``store info``): ``key: value`` lines as a table, else one row."""
    if fmt == "table":
        width = max(len(k) for k in record) + 1
        return "".join(f"{(k + ':').ljust(width)} {cell(k, v, True)}\n" for k, v in record.items())
    if fmt == "json":
        return json.dumps(record, indent=2, default=str) + "\n"
    return render_rows([record], fmt)


def emit(args: argparse.Namespace, text: str) -> None:
    """Write ``text`` to ``--output`` or standard output."""
    output = getattr(args, "output", None)
    if output:
        from gpuwarden.fleet.inputs import write_output_text  # a FIFO made since parsing fails, never blocks

        write_output_text(Path(output), text)
    else:
        sys.stdout.write(text)
