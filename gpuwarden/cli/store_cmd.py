"""``gpuwarden store``: inspect, load and read the embedded store; print the samples schema."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuwarden.fleet import SAMPLE_COLUMNS
from gpuwarden.store import LocalStore, load_samples, schema_markdown, write_samples

DEFAULT_STORE = Path(".gpuwarden/demo-store")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("store", help="embedded store tools", description="Embedded store tools.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=type(parser))

    info = commands.add_parser("info", help="rows, files, size and time range of a store", description="Show what a store holds.")
    info.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"store directory (default {DEFAULT_STORE})")
    info.set_defaults(run=run_info)

    load = commands.add_parser("load", help="validate fleet samples files and append them to a store",
                               description="Validate CSV / Parquet fleet samples files and append them to a store. "
                                           "A bad file is rejected whole, naming the line or row and the column.")
    load.add_argument("files", type=Path, nargs="+", help="samples files (.csv, .csv.gz, .parquet)")
    load.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"store directory (default {DEFAULT_STORE})")
    load.set_defaults(run=run_load)

    read = commands.add_parser("read", help="write a time range of samples to a file",
                               description="Read samples with SINCE <= timestamp < UNTIL (UTC, ISO-8601) into a file.")
    read.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"store directory (default {DEFAULT_STORE})")
    read.add_argument("--since", help="start time, ISO-8601 (default: the first sample)")
    read.add_argument("--until", help="end time, ISO-8601, exclusive (default: after the last sample)")
    read.add_argument("--out", type=Path, required=True, help="output file (.csv, .csv.gz, .parquet)")
    read.set_defaults(run=run_read)

    schema = commands.add_parser("schema", help="print the fleet samples schema", description="Print the fleet samples schema.")
    schema.add_argument("--format", choices=["markdown", "csv"], default="markdown", help="output format (default markdown)")
    schema.set_defaults(run=run_schema)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)


def run_info(args: argparse.Namespace) -> int:
    store = LocalStore(args.store)
    span = store.time_range()
    print(f"store:  {store.root}")
    print(f"rows:   {store.row_count():,} in {store.file_count()} file(s), {store.size_bytes() / 2**20:.1f} MiB")
    print("range:  " + (f"{span[0].isoformat()} .. {span[1].isoformat()}" if span else "empty"))
    return 0


def run_load(args: argparse.Namespace) -> int:
    store = LocalStore(args.store)
    frames = [(path, load_samples(path)) for path in args.files]  # validate every file before writing any
    for path, frame in frames:
        print(f"{path}: {store.append(frame, validate=False):,} rows appended")
    return 0


def run_read(args: argparse.Namespace) -> int:
    frame = LocalStore(args.store).read(args.since, args.until)
    write_samples(frame, args.out)
    print(f"{len(frame):,} rows -> {args.out}")
    return 0


def run_schema(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        print(schema_markdown(), end="")
    else:
        print("column,kind,nullable,description")
        for column in SAMPLE_COLUMNS:
            print(f'{column.name},{column.kind},{str(column.nullable).lower()},"{column.description}"')
    return 0
