"""``gpuwarden report idle|efficiency|cost|chargeback``: analytics reports over a window of samples.

    gpuwarden report idle --since 7d --format table
    gpuwarden report chargeback --since 30d --format csv > chargeback.csv
    gpuwarden report cost --price-book my-prices.yaml --inventory my-nodes.yaml --format json

The JSON output's keys are stable (``schema_version`` 1) and documented in
``gpuwarden/analytics/REPORTS.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .args import number
from .output import FORMATS
from .source_notes import add_attribution_option, apply_attribution, source_notes
from .sources import add_source_options, duration, open_window

if TYPE_CHECKING:  # imported when a report runs, not to parse arguments
    import pandas as pd

# Kept here so that parsing needs no analytics import; a test checks it matches analytics.reports.
REPORT_KINDS = ("idle", "efficiency", "cost", "chargeback")


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of fractions") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: fractions must be in 0..1, e.g. 0.25,0.5,1")
    return values


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="idle, efficiency, cost and chargeback reports",
        description="Analytics reports over fleet samples: idle GPU time by reason, fleet efficiency, cost with "
                    "a reclaim what-if and buy-vs-rent, and chargeback per team and project.")
    parser.add_argument("kind", choices=REPORT_KINDS, help="which report")
    add_source_options(parser, since_default="7d")
    output = parser.add_argument_group("output")
    output.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    output.add_argument("--table", help="only this table (csv: which table to write; default the report's main table)")
    output.add_argument("--limit", type=number(int, 0, 10**7), default=20,
                        help="rows per table for table/markdown (default 20; 0 = all)")
    output.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")
    output.add_argument("--wide", action="store_true", help="table format: every column, not only those that fit 120 columns")
    pricing = parser.add_argument_group("pricing and classification")
    add_pricing_options(pricing)
    output.add_argument("--bucket", type=_bucket,
                        help="over-time tables: bucket length, a multiple of 5m (default: 1h up to a 2-day window, "
                             "6h up to 14 days, 1d beyond)")
    pricing.add_argument("--hoard-grace", type=duration, default="30m",
                         help="idle longer than this while holding memory is hoarding (default 30m)")
    pricing.add_argument("--reclaim", type=_fractions, default=(0.25, 0.5, 1.0),
                         help="cost report: reclaim what-if fractions of idle GPU-hours (default 0.25,0.5,1)")
    add_attribution_option(pricing)
    pricing.add_argument("--unallocated", choices=["separate", "proportional"], default="separate",
                         help="chargeback: unallocated cost as its own row, or spread over teams (default separate)")
    parser.set_defaults(run=run)


def add_pricing_options(parser) -> None:
    """--price-book and --inventory (the environment's files, else the bundled ones, where not given:
    gpuwarden.analytics.pricing_files)."""
    parser.add_argument("--price-book", type=Path,
                        help="price book YAML (default: $GPUWARDEN_PRICE_BOOK, else the bundled one)")
    parser.add_argument("--inventory", type=Path,
                        help="node -> pool/tier YAML (default: $GPUWARDEN_INVENTORY, else the bundled one, which "
                             "follows the simulated fleet's naming); a node's price-tier label wins over it")


def _bucket(text: str) -> pd.Timedelta:
    """A bucket the 5-minute recording-rule rollups tile exactly (and at most 31 days)."""
    value = duration(text)
    if value.total_seconds() % 300 or value.total_seconds() > 31 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a multiple of 5m, at most 31d (e.g. 1h, 6h, 1d)")
    return value


def run(args: argparse.Namespace) -> int:
    from gpuwarden.analytics import IdleParams, build_ledger, build_report
    from gpuwarden.analytics.params import AnalyticsError
    from gpuwarden.analytics.pricing_files import load_pricing
    from gpuwarden.analytics.render import render

    window = open_window(args)
    apply_attribution(window.source, args.pod_attribution)
    price_book, inventory = load_pricing(args.price_book, args.inventory)
    from gpuwarden.analytics.windows import report_bucket_for

    bucket = args.bucket if args.bucket is not None else report_bucket_for(window.end - window.start)
    ledger = build_ledger(window.source, window.start, window.end, price_book=price_book, inventory=inventory,
                          params=IdleParams(hoard_grace=args.hoard_grace), bucket=bucket)
    if ledger.rows.empty:
        raise AnalyticsError(f"no samples between {window.start.isoformat()} and {window.end.isoformat()}")
    from gpuwarden.scheduler.scheduler_metrics import pending_gpus_history  # the queue depth the scheduler exported

    pending = pending_gpus_history(window.source, window.start, window.end) if args.kind == "efficiency" else None
    options = {"cost": {"reclaim_fractions": args.reclaim}, "chargeback": {"unallocated": args.unallocated},
               "efficiency": {"pending": pending}}
    report = build_report(args.kind, ledger, **options.get(args.kind, {}))
    report.notes.extend(source_notes(window.source, args.pod_attribution))
    text = render(report, args.format, args.table, None if args.limit == 0 else args.limit, wide=args.wide)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    # After the results, on stderr: JSON and CSV on stdout stay clean. A CSV table has no room
    # for notes, so it names its price book there.
    after = [window.note] if window.note else []
    if args.format == "csv":  # the report's notes (rows rejected, the book, the tiers): no room in the table
        named = any(n.startswith("price book: ") for n in report.notes)
        after += [*([] if named else [f"note: price book: {price_book.identity}"]), *(f"note: {n}" for n in report.notes)]
    if after:
        sys.stdout.flush()
        print("\n".join(after), file=sys.stderr)
    return 0
