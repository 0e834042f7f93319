"""``--source local|file|prometheus`` and ``--since/--until`` for commands that read fleet samples.

The window ends at ``--until`` or, by default, now: never at the newest sample, so one row dated
in the future cannot pull the window away from every other sample. ``--since 7d`` counts back from
the end. A window reaching further back than the data held is trimmed to the first sample, with a
note that says so (``Window.note``); a window that holds no data at all is an error naming the
span the source does hold.
"""

from __future__ import annotations

import argparse
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.fleet.durations import DurationError, parse_duration_seconds
from gpuwarden.fleet.inputs import MAX_SECRET_FILE_BYTES, checked_input
from gpuwarden.fleet.semantics import to_utc

from .args import number
from .storemark import DEFAULT_STORE, checked_store, store_path

if TYPE_CHECKING:
    import pandas as pd

    from gpuwarden.store.sources import SamplesSource

MAX_WINDOW_SECONDS = 10 * 366 * 86400  # ten years


def duration(text: str) -> pd.Timedelta:
    """A positive duration of at most ten years (``7d``, ``6h``, ``1h30m``: :mod:`gpuwarden.fleet.durations`)."""
    import pandas as pd

    try:
        seconds = parse_duration_seconds(text)
    except DurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not 0 < seconds <= MAX_WINDOW_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range; expected a duration > 0s and <= 3660d")
    return pd.Timedelta(seconds=seconds)


def timestamp(text: str) -> pd.Timestamp:
    import pandas as pd

    try:
        stamp = pd.Timestamp(text.strip())
    except (ValueError, OverflowError) as error:
        if "out of bounds" in str(error).lower() or "year" in str(error).lower():
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; expected a time between 1970 and 2262") from None
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time (e.g. 2026-11-30T12:00:00Z)") from None
    if stamp is pd.NaT or not isinstance(stamp, pd.Timestamp):
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time (e.g. 2026-11-30T12:00:00Z)")
    if stamp.year < 1970 or stamp.year > 2261:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range; expected a time between 1970 and 2262")
    return to_utc(stamp)


def prometheus_url(text: str) -> str:
    try:
        parts = urllib.parse.urlsplit(text.strip())
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL (e.g. http://prometheus:9090)")
    return text.strip()


def add_source_options(parser: argparse.ArgumentParser, since_default: str = "7d") -> None:
    group = parser.add_argument_group("fleet samples source")
    group.add_argument("--source", choices=["local", "file", "prometheus"], default="local",
                       help="where samples come from (default local: the embedded store)")
    group.add_argument("--store", type=store_path, default=DEFAULT_STORE, help=f"embedded store directory (default {DEFAULT_STORE})")
    group.add_argument("--file", type=Path, help="samples file for --source file (.csv, .csv.gz, .parquet)")
    group.add_argument("--prometheus-url", type=prometheus_url,
                       help="Prometheus base URL for --source prometheus (e.g. http://prometheus:9090)")
    group.add_argument("--prometheus-step", type=duration, default="60s",
                       help="resolution of Prometheus reads (default 60s; use the scrape interval for every sample)")
    group.add_argument("--prometheus-selector", default="",
                       help='extra label matchers for every series, e.g. cluster="prod"')
    group.add_argument("--prometheus-cluster", default="default",
                       help="cluster name for series without a cluster label (default: default)")
    group.add_argument("--prometheus-token-file", type=Path,
                       help="file holding a bearer token for Prometheus (surrounding whitespace is ignored)")
    group.add_argument("--prometheus-ca-file", type=Path, help="CA bundle to verify Prometheus' TLS certificate")
    group.add_argument("--prometheus-insecure", action="store_true", help="do not verify Prometheus' TLS certificate")
    group.add_argument("--prometheus-timeout", type=number(float, 0.1, 3600), default=30.0,
                       help="seconds per Prometheus request, 0.1..3600 (default 30)")
    group.add_argument("--since", type=duration, default=since_default,
                       help=f"how far back from --until (default {since_default})")
    group.add_argument("--until", type=timestamp, help="end of the window, ISO-8601 UTC (default: now)")


def open_prometheus(args: argparse.Namespace):
    """The Prometheus source the ``--prometheus-*`` options describe (errors are SamplesError)."""
    from gpuwarden.store import SamplesError
    from gpuwarden.store.sources import open_prometheus as validated_prometheus

    if not args.prometheus_url:
        raise SamplesError("--source prometheus needs --prometheus-url URL (e.g. http://prometheus:9090)")
    for flag, path in (("--prometheus-token-file", args.prometheus_token_file), ("--prometheus-ca-file", args.prometheus_ca_file)):
        if path is not None:
            checked_input(path, flag, MAX_SECRET_FILE_BYTES)  # a FIFO would block the TLS set-up for ever
    return validated_prometheus(
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
    note: str = ""  # e.g. the window was trimmed to the data held; print it beside the results


def open_source(args: argparse.Namespace) -> SamplesSource:
    from gpuwarden.store import LocalStore, SamplesError
    from gpuwarden.store.sources import FileSource

    if args.source == "local":
        store = LocalStore(checked_store(args.store))
        if store.row_count() == 0:
            raise SamplesError(f"{args.store}: the store is empty or missing; fill it with 'gpuwarden demo' or 'gpuwarden store load'")
        return store
    if args.source == "file":
        if args.file is None:
            raise SamplesError("--source file needs --file PATH")
        return FileSource(args.file)  # validated when read
    return open_prometheus(args)


def open_window(args: argparse.Namespace, now: pd.Timestamp | None = None) -> Window:
    """The source and the [start, end) window the arguments name; a clear error when unusable."""
    import pandas as pd

    from gpuwarden.store import SamplesError

    source = open_source(args)
    since = args.since if isinstance(args.since, pd.Timedelta) else duration(str(args.since))
    end = args.until if args.until is not None else (now or pd.Timestamp.now(tz="UTC")).ceil("s")
    start = end - since
    span = source.time_range()
    if span is None:
        raise SamplesError("the source holds no samples")
    first, last = span
    shown = "%Y-%m-%d %H:%M"
    if last < start or first >= end:
        raise SamplesError(
            f"no samples between {start:{shown}} and {end:{shown}} UTC; the source holds {first:{shown}} .. "
            f"{last:{shown}} UTC (use --until {(last + pd.Timedelta(minutes=1)).ceil('min'):%Y-%m-%dT%H:%M}Z "
            "or a longer --since)")
    note = ""
    if first > start:
        note = (f"note: the window was trimmed to the data held: samples start at {first:{shown}} UTC, "
                f"after the asked-for start {start:{shown}} UTC")
        start = first.floor("s")
    return Window(source, start, end, note)
