"""``gpuwarden store``: inspect, load, read, check and repair the embedded store; print the samples schema.

Every command but ``load`` needs a store there already (a path that holds none is one line, exit 2,
and nothing is made); none writes its report or samples file inside a store's folder."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from .output import add_output_options, emit, render_record, render_rows
from .sources import timestamp
from .storemark import DEFAULT_STORE, adopt_store, checked_store, refuse_output_in_store, store_path


def _store_command(commands: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int], *,
                   output: bool, help: str, description: str) -> argparse.ArgumentParser:
    """A subcommand over one store: ``--store``, the output options where it prints a report, and its ``run``."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help, description=description)
    parser.add_argument("--store", type=store_path, default=DEFAULT_STORE, help=f"store directory (default {DEFAULT_STORE})")
    if output:
        add_output_options(parser)
    parser.set_defaults(run=run)
    return parser


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("store", help="embedded store tools", description="Embedded store tools.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=type(parser))

    _store_command(commands, "info", run_info, output=True, help="rows, files, size and time range of a store",
                   description="Show what a store holds.")

    load = _store_command(
        commands, "load", run_load, output=False, help="validate fleet samples files and append them to a store",
        description="Validate CSV / Parquet fleet samples files and append them to a store, all files or none. "
                    "A malformed file is rejected whole, naming the line or row and the column; implausible rows "
                    "(units, ranges, future timestamps, duplicates) are rejected and counted by reason; rows the "
                    "store already holds are not added again.")
    load.add_argument("files", type=Path, nargs="+", help="samples files (.csv, .csv.gz, .parquet)")
    load.add_argument("--strict", action="store_true", help="refuse the load (exit 2) if any row is rejected")

    read = _store_command(
        commands, "read", run_read, output=False, help="write a time range of samples to a file",
        description="Read samples with SINCE <= timestamp < UNTIL (UTC, ISO-8601) into a file.")
    read.add_argument("--since", type=timestamp, help="start time, ISO-8601 (default: the first sample)")
    read.add_argument("--until", type=timestamp, help="end time, ISO-8601, exclusive (default: after the last sample)")
    read.add_argument("--out", type=Path, required=True, help="output file (.csv, .csv.gz, .parquet)")

    _store_command(
        commands, "check", run_check, output=True,
        help="find unreadable files, leftovers of interrupted writes and duplicate rows",
        description="Check a store without changing it. Exit 0 when healthy, 1 when 'gpuwarden store repair' "
                    "has something to do.")
    _store_command(
        commands, "repair", run_repair, output=True,
        help="finish or undo interrupted writes, quarantine unreadable files, drop duplicates",
        description="Repair a store: complete committed operations and delete uncommitted leftovers, move "
                    "unreadable files to STORE/quarantine/, and remove duplicate rows.")

    schema = commands.add_parser("schema", help="print the fleet samples schema", description="Print the fleet samples schema.")
    schema.add_argument("--format", choices=["markdown", "csv"], default="markdown", help="output format (default markdown)")
    schema.set_defaults(run=run_schema)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)


def _existing_store(args: argparse.Namespace, output: str = "--output"):
    """The store ``--store`` names, which must exist (a read-only command), once the command's
    output file is known to lie outside every store's folder."""
    from gpuwarden.store import LocalStore

    refuse_output_in_store(getattr(args, output.lstrip("-"), None), output)
    return LocalStore(checked_store(args.store, existing=True))


def run_info(args: argparse.Namespace) -> int:
    store = _existing_store(args)
    span = store.time_range()
    ignored = store.survey().foreign
    record = {
        "store": str(store.root), "rows": store.row_count(), "files": store.file_count(),
        "size_bytes": store.size_bytes(),
        "first_sample": span[0].isoformat() if span else None, "last_sample": span[1].isoformat() if span else None,
        "quarantined_files": sum(1 for p in store.quarantine_dir.rglob("*.parquet")) if store.quarantine_dir.exists() else 0,
        "ignored_files": len(ignored),
    }
    if args.format == "table":
        text = (f"store:  {store.root}\n"
                f"rows:   {record['rows']:,} in {record['files']} file(s), {record['size_bytes'] / 2**20:.1f} MiB\n"
                "range:  " + (f"{record['first_sample']} .. {record['last_sample']}" if span else "empty") + "\n"
                + (f"note:   {record['quarantined_files']} unreadable file(s) set aside in {store.quarantine_dir}\n"
                   if record["quarantined_files"] else "")
                + (f"note:   {len(ignored)} file(s) or folder(s) the store did not write are ignored "
                   "('gpuwarden store check' names them)\n" if ignored else ""))
    else:
        text = render_record(record, args.format)
    emit(args, text)
    return 0


def run_load(args: argparse.Namespace) -> int:
    import pandas as pd

    from gpuwarden.store import LocalStore, SamplesError, ValidationReport, load_samples

    store = LocalStore(checked_store(args.store))
    frames, reports = [], []
    for path in args.files:  # validate every file before writing any
        report = ValidationReport(str(path))
        frames.append(load_samples(path, report=report))
        reports.append(report)
    rejected = sum(r.rejected_total for r in reports)
    if rejected and args.strict:
        first = next(r for r in reports if r.rejected)
        raise SamplesError(f"--strict: {rejected:,} row(s) rejected, nothing was loaded; {first.summary()}")
    for report in reports:
        for note in report.notes():
            print(f"gpuwarden: warning: {note}", file=sys.stderr)
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    written = store.append(frame, validate=len(frames) > 1, source="the files together")  # one operation: all or nothing
    adopt_store(args.store)  # the store now holds data the demo did not make
    held = store.last_append.already_stored
    more = store.last_append.report.rejected_total if store.last_append.report else 0  # duplicates across files
    print(f"{written:,} rows appended to {args.store} from {len(args.files)} file(s)"
          + (f"; {held:,} already stored (not added again)" if held else "")
          + (f"; {rejected + more:,} rejected (see the warnings)" if rejected + more else ""))
    return 0


def run_read(args: argparse.Namespace) -> int:
    from gpuwarden.store import SamplesError, write_samples
    from gpuwarden.store.samples_files import checked_samples_output

    checked_samples_output(args.out)  # its type, outside every store: before the store is read
    if not args.out.parent.is_dir():
        raise SamplesError(f"--out {args.out}: the folder {args.out.parent} does not exist")
    frame = _existing_store(args, "--out").read(args.since, args.until)
    write_samples(frame, args.out)
    print(f"{len(frame):,} rows -> {args.out}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    result = _existing_store(args).check()
    record = {
        "store": str(args.store), "healthy": result.ok, "files": result.files, "rows": result.rows,
        "unreadable_files": [str(p) for p in result.corrupt], "temporary_files_left": [str(p) for p in result.stale_tmp],
        "interrupted_operations": [str(p) for p in result.pending_ops], "duplicate_rows": result.duplicate_rows,
        "quarantined_files": [str(p) for p in result.quarantined], "ignored_files": [str(p) for p in result.foreign],
    }
    if args.format == "table":
        lines = [f"store:      {args.store}", f"rows:       {result.rows:,} in {result.files} readable file(s)"]
        lines += [f"unreadable: {p}" for p in result.corrupt]
        lines += [f"leftover:   {p} (an interrupted write, never read; the next write deletes it)"
                  for p in result.stale_tmp]
        lines += [f"leftover:   {p} (an interrupted write; the next read or write completes it)"
                  for p in result.pending_ops]
        lines += [f"ignored:    {p} (not written by the store: never read, moved or deleted)" for p in result.foreign]
        if result.duplicate_rows:
            lines.append(f"duplicates: {result.duplicate_rows:,} row(s)")
        if result.quarantined:
            lines.append(f"quarantine: {len(result.quarantined)} file(s) set aside earlier under {args.store}/quarantine")
        lines.append("healthy" if result.ok else "needs repair: run 'gpuwarden store repair'")
        text = "\n".join(lines) + "\n"
    else:
        text = render_record(record, args.format)
    emit(args, text)
    return 0 if result.ok else 1


def run_repair(args: argparse.Namespace) -> int:
    store = _existing_store(args)
    before = store.check()
    result = store.repair()
    record = {"store": str(args.store), "interrupted_operations_finished": len(before.pending_ops),
              "temporary_files_removed": len(before.stale_tmp), "files_quarantined": result["quarantined"],
              "duplicate_rows_removed": result["duplicates_removed"], "rows": store.row_count()}
    emit(args, render_record(record, args.format) if args.format != "csv" else render_rows([record], "csv"))
    return 0


def run_schema(args: argparse.Namespace) -> int:
    from gpuwarden.fleet import SAMPLE_COLUMNS
    from gpuwarden.store import schema_markdown

    if args.format == "markdown":
        print(schema_markdown(), end="")
    else:
        print("column,kind,nullable,description")
        for column in SAMPLE_COLUMNS:
            print(f'{column.name},{column.kind},{str(column.nullable).lower()},"{column.description}"')
    return 0
