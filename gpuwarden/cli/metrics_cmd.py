"""``gpuwarden metrics serve``: the analytics results as Prometheus metrics, for Grafana and Alertmanager.

    gpuwarden metrics serve --listen 0.0.0.0:9402 --source prometheus --prometheus-url http://prometheus:9090 \\
        --audit /var/lib/gpuwarden/audit.jsonl --cluster-state /var/lib/gpuwarden/cluster --interval 5m
    gpuwarden metrics show --source local        # one computation, printed in the exposition format

Every ``--interval`` it recomputes, over the last ``--since`` of fleet samples, the idle GPU-hours
and cost by reason, team and namespace, the fleet efficiency, the open health findings, the
actuator's state from its audit log (read only) and, given a cluster snapshot, the scheduling
queue; scrapes read the latest computation (metric names: gpuwarden/analytics/metrics_collector.py).
A part that fails in one round is left out and counted in ``gpuwarden_metrics_compute_errors``;
the other parts are still served.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.remediation.audit import DEFAULT_AUDIT_PATH

from .args import host_port
from .report_cmd import add_pricing_options
from .sources import add_source_options, duration

if TYPE_CHECKING:
    from gpuwarden.analytics.metrics_snapshot import MetricsSnapshot

log = logging.getLogger("gpuwarden.cli.metrics")
DEFAULT_AUDIT = DEFAULT_AUDIT_PATH  # the actuator command's default, so both agree
MIN_INTERVAL_SECONDS = 10.0


def _interval(text: str) -> float:
    seconds = duration(text).total_seconds()
    if seconds < MIN_INTERVAL_SECONDS:
        raise argparse.ArgumentTypeError(f"--interval {text!r}: expected at least {MIN_INTERVAL_SECONDS:g}s")
    return seconds


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("metrics", help="serve analytics results as Prometheus metrics",
                                   description="Analytics results (idle, cost, efficiency, health findings, actuator "
                                               "and queue state) as Prometheus metrics.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(parser))
    serve = sub.add_parser("serve", help="serve /metrics, recomputing on an interval")
    serve.add_argument("--listen", type=host_port, default=("0.0.0.0", 9402),
                       help="HOST:PORT of /metrics (default 0.0.0.0:9402)")
    serve.add_argument("--interval", type=_interval, default="5m", help="recompute this often (default 5m; at least 10s)")
    show = sub.add_parser("show", help="compute once and print the metrics (exposition format)")
    for each in (serve, show):
        add_source_options(each, since_default="1d")
        each.add_argument("--audit", type=Path, default=DEFAULT_AUDIT,
                          help=f"the actuator's audit log (default {DEFAULT_AUDIT}; absent: no actuator metrics)")
        each.add_argument("--cluster-state", type=Path,
                          help="folder holding a cluster snapshot.json (absent: no queue metrics)")
        add_pricing_options(each)
        each.set_defaults(run=run)


def compute(args: argparse.Namespace, now: float | None = None, strict: bool = False,
            notes: list[str] | None = None) -> MetricsSnapshot:
    """One snapshot of every figure, over the window ``args`` names, ending now. A part that fails
    is left out and named in ``errors`` (one part never costs the others), or with ``strict``
    (``metrics show``) its error goes to the caller. ``notes`` gathers what the source says of
    its reads (rows it rejected, and why)."""
    import pandas as pd

    from gpuwarden.analytics import IdleParams, build_ledger
    from gpuwarden.analytics.metrics_snapshot import MetricsSnapshot, fleet_figures, finding_figures, idle_figures
    from gpuwarden.analytics.pricing_files import load_pricing
    from gpuwarden.fleet.cluster_state import read_snapshot

    from .health_cmd import APP_KINDS, scan_source
    from .metrics_inputs import queue_figures, read_actuator
    from .source_notes import rejected_rows_note
    from .sources import open_window

    started = time.perf_counter()
    now = time.time() if now is None else now
    errors: list[str] = []

    def _part(errors: list[str], name: str, compute: Any) -> Any:
        try:
            return compute()
        except Exception as error:  # noqa: BLE001 - a failing part is logged and served as an error metric
            if strict:
                raise
            log.warning("metrics: %s not computed: %s", name, error)
            errors.append(name)
            return None

    window = _part(errors, "source", lambda: open_window(args, now=pd.Timestamp(now, unit="s", tz="UTC")))
    book, inventory = load_pricing(args.price_book, args.inventory)
    fleet, idle, findings = None, (), ()
    if window is not None:
        ledger = _part(errors, "ledger", lambda: build_ledger(window.source, window.start, window.end, price_book=book,
                                                              inventory=inventory, params=IdleParams()))
        if ledger is not None:
            span = window.source.time_range()
            newest = span[1].timestamp() if span else None
            fleet = _part(errors, "fleet", lambda: fleet_figures(ledger, newest))
            idle = _part(errors, "idle", lambda: idle_figures(ledger)) or ()
        scanned = _part(errors, "health", lambda: scan_source(window.source, window.start, window.end))
        if scanned is not None:
            findings = finding_figures(f for f in scanned[0] if f.kind not in APP_KINDS)
        if notes is not None:
            notes.extend(rejected_rows_note(window.source))
    actuator = _part(errors, "actuator", lambda: read_actuator(args.audit, now))
    queue, taken_at = None, None
    if args.cluster_state is not None:
        snapshot = _part(errors, "queue", lambda: read_snapshot(args.cluster_state))
        if snapshot is not None:
            queue, taken_at = _part(errors, "queue", lambda: queue_figures(snapshot)), snapshot.taken_at.timestamp()
    return MetricsSnapshot(
        computed_at_seconds=now, compute_duration_seconds=time.perf_counter() - started,
        price_book="bundled" if book.source == "built-in" else book.source, fleet=fleet, idle=idle,
        findings=findings, actuator=actuator, queue=queue, cluster_snapshot_timestamp_seconds=taken_at,
        errors=tuple(dict.fromkeys(errors)), pricing=(book.version or "", book.digest, inventory.identity))


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from gpuwarden.analytics.metrics_collector import SnapshotCollector

    latest: list[MetricsSnapshot] = []
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: latest[-1] if latest else None))
    notes: list[str] = []
    if args.action == "show":
        latest.append(compute(args, strict=True, notes=notes))
        sys.stdout.write(generate_latest(registry).decode())
        for note in notes:  # beside the figures, never inside the exposition format
            print(f"metrics: {note}", file=sys.stderr)
        return 0
    start_http_server(args.listen[1], addr=args.listen[0], registry=registry)
    print(f"metrics: serving http://{args.listen[0]}:{args.listen[1]}/metrics, recomputed every {args.interval:g} s",
          flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while True:
            notes.clear()
            snapshot = compute(args, notes=notes)
            latest[:] = [snapshot]  # scrapes switch to the new snapshot in one step
            for note in notes:
                log.warning("metrics: %s", note)
            log.info("metrics: computed in %.1f s (errors: %s)", snapshot.compute_duration_seconds,
                     ", ".join(snapshot.errors) or "none")
            if stop.wait(max(0.0, args.interval - snapshot.compute_duration_seconds)):
                return 0
    except KeyboardInterrupt:
        return 0
