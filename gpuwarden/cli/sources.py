"""``--source local|file|prometheus`` and ``--since/--until`` for commands that read fleet samples.

``--since 7d`` counts back from ``--until``; ``--until`` defaults to just after the newest sample
for every source (the demo's clock is simulated; a Prometheus may hold backfilled or old data), so
the same data gives the same window whichever source holds it.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from gpuwarden.store import LocalStore, SamplesError
from gpuwarden.store.prometheus import PrometheusSource
from gpuwarden.store.sources import FileSource, SamplesSource

DEFAULT_STORE = Path(".gpuwarden/demo-store")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> pd.Timedelta:
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; expected a number and one of s, m, h, d, w (e.g. 7d)")
    return pd.Timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def timestamp(text: str) -> pd.Timestamp:
    try:
        stamp = pd.Timestamp(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time") from None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def add_source_options(parser: argparse.ArgumentParser, since_default: str = "7d") -> None:
    group = parser.add_argument_group("fleet samples source")
    group.add_argument("--source", choices=["local", "file", "prometheus"], default="local",
                       help="where samples come from (default local: the embedded store)")
    group.add_argument("--store", type=Path, default=DEFAULT_STORE, help=f"embedded store directory (default {DEFAULT_STORE})")
    group.add_argument("--file", type=Path, help="samples file for --source file (.csv, .csv.gz, .parquet)")
    group.add_argument("--prometheus-url", help="Prometheus base URL for --source prometheus (e.g. http://prometheus:9090)")
    group.add_argument("--prometheus-step", type=duration, default=duration("60s"),
                       help="resolution of Prometheus reads (default 60s; use the scrape interval for every sample)")
    group.add_argument("--prometheus-selector", default="",
                       help='extra label matchers for every series, e.g. \'cluster="prod"\'')
    group.add_argument("--prometheus-cluster", default="default",
                       help="cluster name for series without a cluster label (default: default)")
    group.add_argument("--prometheus-token-file", type=Path, help="file holding a bearer token for Prometheus")
    group.add_argument("--prometheus-ca-file", type=Path, help="CA bundle to verify Prometheus' TLS certificate")
    group.add_argument("--prometheus-insecure", action="store_true", help="do not verify Prometheus' TLS certificate")
    group.add_argument("--prometheus-timeout", type=float, default=30.0, help="seconds per Prometheus request (default 30)")
    group.add_argument("--since", type=duration, default=duration(since_default),
                       help=f"how far back from --until (default {since_default})")
    group.add_argument("--until", type=timestamp, help="end of the window, ISO-8601 UTC (default: just after the newest sample)")


def open_prometheus(args: argparse.Namespace) -> PrometheusSource:
    """The Prometheus source the ``--prometheus-*`` options describe (errors are SamplesError)."""
    if not args.prometheus_url:
        raise SamplesError("--source prometheus needs --prometheus-url URL (e.g. http://prometheus:9090)")
    return PrometheusSource(
        args.prometheus_url,
        step=args.prometheus_step.total_seconds(),
        selector=args.prometheus_selector,
        cluster=args.prometheus_cluster,
        bearer_token_file=args.prometheus_token_file,
        ca_file=args.prometheus_ca_file,
        insecure_skip_verify=args.prometheus_insecure,
        timeout=args.prometheus_timeout,
    )


@dataclass(frozen=True)
class Window:
    source: SamplesSource
    start: pd.Timestamp
    end: pd.Timestamp  # exclusive


def open_window(args: argparse.Namespace) -> Window:
    """The source and the [start, end) window the arguments name; a clear error when unusable."""
    if args.source == "local":
        source: SamplesSource = LocalStore(args.store)
        if source.row_count() == 0:
            raise SamplesError(f"{args.store}: the store is empty or missing; fill it with 'gpuwarden demo' or 'gpuwarden store load'")
    elif args.source == "file":
        if args.file is None:
            raise SamplesError("--source file needs --file PATH")
        source = FileSource(args.file)
    else:
        source = open_prometheus(args)
    if args.until is not None:
        end = args.until
    else:
        span = source.time_range()
        if span is None:
            raise SamplesError("the source holds no samples")
        end = span[1] + pd.Timedelta(microseconds=1)
    return Window(source, end - args.since, end)
