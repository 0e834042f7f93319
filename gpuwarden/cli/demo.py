"""``gpuwarden demo``: the whole pipeline on the embedded simulated fleet, no GPU, no cluster.

simulated fleet -> backfill a week into the embedded store (progress bar) -> serve exporter
metrics for every simulated node on localhost -> keep stepping the fleet while the embedded
scraper reads /metrics into the store -> open the dashboard. ``--headless --duration S`` does the same without the dashboard and prints a
summary. Ctrl-C stops everything and prints the same summary.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
import shutil
import subprocess
import sys
import time
import urllib.request
import webbrowser
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from gpuwarden.actuator import Actuator, AuditLog, Mode, Reconciler
from gpuwarden.analytics.health import scan
from gpuwarden.analytics.inventory import Inventory
from gpuwarden.analytics.summary import headline, headline_lines
from gpuwarden.dashboards.launch import dashboard_url, launch_dashboard
from gpuwarden.exporter import ExporterService
from gpuwarden.sim import Simulation
from gpuwarden.sim.backend import SimGpuBackend
from gpuwarden.sim.cluster import SimCluster
from gpuwarden.store import LocalStore
from gpuwarden.store.scraper import Scraper

from .args import host_port, non_negative_float, positive_float, positive_int
from .simconfig import add_sim_options, sim_config_from

DEMO_FAULT_SCALE = 25.0
RECONCILE_INTERVAL_S = 30.0  # wall seconds between actuator rounds (30 simulated minutes at the default pace)
HEALTH_WINDOW = pd.Timedelta(hours=6)  # samples each health scan reads  # published rates give about one fault per simulated week on 512 GPUs


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on the embedded simulated fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--headless", action="store_true", help="no dashboard; print a summary and exit")
    parser.add_argument("--duration", type=non_negative_float,
                        help="seconds to run live after the backfill (default: until Ctrl-C; 60 with --headless)")
    parser.add_argument("--days", type=non_negative_float, default=7.0, help="days of history to backfill (default 7)")
    parser.add_argument("--store", type=Path, default=Path(".gpuwarden/demo-store"),
                        help="embedded store directory; the demo starts it afresh (default .gpuwarden/demo-store)")
    parser.add_argument("--exporter-listen", type=host_port, default=("127.0.0.1", 9400),
                        help="HOST:PORT for the simulated nodes' /metrics (port 0 picks a free one; default 127.0.0.1:9400)")
    parser.add_argument("--dashboard-port", type=positive_int, default=8501, help="Streamlit port (default 8501)")
    parser.add_argument("--step-interval", type=positive_float, default=1.0,
                        help="wall seconds between live simulated steps (default 1)")
    parser.add_argument("--no-browser", action="store_true", help="print the dashboard URL without opening a browser")
    add_sim_options(parser, fault_scale_default=DEMO_FAULT_SCALE)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = sim_config_from(args)
    duration = args.duration if args.duration is not None else (60.0 if args.headless else None)
    print(f"gpuwarden demo: simulating {config.nodes} nodes x {config.gpus_per_node} GPUs "
          f"(seed {config.seed}, fault rates x{config.fault_rate_scale:g} the published ones)", flush=True)
    simulation = Simulation(config)
    cluster = SimCluster(simulation)
    store = LocalStore(args.store)
    store.clear()
    backfill(simulation, store, args.days)

    host, port = args.exporter_listen
    exporter = ExporterService(SimGpuBackend(simulation), interval_seconds=max(1.0, args.step_interval), host=host, port=port)
    dashboard: subprocess.Popen | None = None
    started = time.monotonic()
    return_code = 0
    scraper: Scraper | None = None
    reconciler: Reconciler | None = None
    try:
        exporter.start()
        exporter.collect_now()
        reconciler = Reconciler(Actuator(cluster, Mode.OBSERVE, audit=AuditLog(audit_path(args.store))),
                                HealthScan(store, simulation), interval_seconds=RECONCILE_INTERVAL_S)
        first = reconciler.reconcile_once()  # findings and the plan for the backfilled week, before going live
        print(f"health:    {first.findings} findings; actuator (observe mode) would take "
              f"{len(first.plan.actions)} action(s); audit log {audit_path(args.store)}", flush=True)
        print(f"exporter:  {exporter.url}  ({simulation.device_count} GPU devices on {len(simulation.nodes)} simulated nodes)")
        if not args.headless:
            dashboard = launch_dashboard(args.store, port=args.dashboard_port, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
            url = dashboard_url("127.0.0.1", args.dashboard_port)
            wait_for_dashboard(dashboard, url, args.dashboard_port)
            print(f"dashboard: {url}")
            if not args.no_browser and has_display():
                webbrowser.open(url)
        print("live: stepping the simulated fleet and feeding the store" +
              (f" for {duration:g} s" if duration is not None else "; Ctrl-C stops"), flush=True)
        owners = PodOwners(cluster)
        scraper = Scraper([exporter.url], store, interval_seconds=args.step_interval, cluster=config.cluster,
                          attribution=owners, clock=lambda: simulation.now)
        reconciler.start()
        live(simulation, exporter, scraper, owners, store, args.step_interval, duration)
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
    except DashboardError as error:
        print(f"gpuwarden demo: error: {error}", file=sys.stderr)
        return_code = 2
    finally:
        if reconciler is not None:
            reconciler.stop()
        series = count_series(exporter.url) if exporter.port else 0
        exporter.stop()
        if dashboard is not None:
            dashboard.terminate()
            try:
                dashboard.wait(timeout=10)
            except subprocess.TimeoutExpired:
                dashboard.kill()
    print_summary(simulation, store, exporter.url, series, time.monotonic() - started, scraper, reconciler)
    return return_code


def backfill(simulation: Simulation, store: LocalStore, days: float) -> None:
    steps = int(round(days * 86400 / simulation.config.step_seconds))
    chunk = max(1, int(6 * 3600 / simulation.config.step_seconds))  # six simulated hours per write
    with tqdm(total=steps, desc="backfill", unit="step", file=sys.stdout, mininterval=0.5,
              bar_format="{desc}: {percentage:3.0f}%|{bar:30}| {n_fmt}/{total_fmt} steps [{elapsed}<{remaining}]") as bar:
        for frame in simulation.iter_chunks(steps, chunk_steps=chunk):
            store.append(frame)
            bar.update(len(frame) // simulation.device_count)
    store.compact(min_files=2)


def has_display() -> bool:
    """Open a browser only where one can show up (a console browser would take over the terminal)."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


class DashboardError(RuntimeError):
    pass


def wait_for_dashboard(process: subprocess.Popen, url: str, port: int, timeout_s: float = 60.0) -> None:
    """Poll Streamlit's health endpoint; fail clearly if it exits (port taken) or never answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            detail = (process.stderr.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise DashboardError(f"the dashboard could not start on port {port} ({detail}); "
                                 "choose another with --dashboard-port")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise DashboardError(f"the dashboard did not answer on {url} within {timeout_s:.0f} s")


def audit_path(store_path: Path) -> Path:
    return Path(store_path) / "actuator" / "audit.jsonl"  # where the Actions page looks by default


class HealthScan:
    """The actuator's source of findings: a health scan of the store's newest samples."""

    def __init__(self, store: LocalStore, simulation: Simulation) -> None:
        self.store = store
        self.pools = {node.name: node.pool for node in simulation.nodes}
        self.last: list = []

    def __call__(self, snapshot) -> list:
        span = self.store.time_range()
        if span is None:
            return []
        self.last = scan(self.store.read(span[1] - HEALTH_WINDOW), pools=self.pools)
        return self.last


class PodOwners:
    """Team and project of each simulated pod, as a real cluster's pod labels would give them; the
    scraper asks it for the pods it sees in ``/metrics`` (the exporter only knows namespaces)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.owners: dict[str, tuple[str, str]] = {}

    def refresh(self) -> None:
        self.owners = {w.workload.name: (w.workload.team, w.workload.project) for w in self.cluster.snapshot().workloads}

    def __call__(self, namespace: str | None, pod: str | None) -> tuple[str | None, str | None]:
        if pod is None:
            return namespace, None
        owner = self.owners.get(pod) or self.owners.get(pod.rsplit("-", 1)[0])  # gang pods are <job>-<k>
        return owner or (namespace, None)


def live(simulation: Simulation, exporter: ExporterService, scraper: Scraper, owners: PodOwners, store: LocalStore,
         interval: float, duration: float | None) -> None:
    """Every ``interval`` wall seconds: step the fleet, collect it through the exporter, and let the
    embedded scraper read ``/metrics`` into the store (one simulated step, one scrape)."""
    deadline = None if duration is None else time.monotonic() + duration
    next_step = time.monotonic()
    steps = 0
    while deadline is None or time.monotonic() < deadline:
        simulation.step()
        exporter.collect_now()
        owners.refresh()
        scraper.scrape_once()
        steps += 1
        if steps % 60 == 0:
            store.compact()
        next_step += interval
        pause = next_step - time.monotonic()
        if deadline is not None:
            pause = min(pause, deadline - time.monotonic())
        if pause > 0:
            time.sleep(pause)


def count_series(url: str) -> int:
    """Scrape our own exporter once, as Prometheus would, to report what it serves."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
    except OSError:
        return 0
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


def print_summary(simulation: Simulation, store: LocalStore, exporter_url: str, series: int, live_seconds: float,
                  scraper: Scraper | None = None, reconciler: Reconciler | None = None) -> None:
    summary = simulation.summary()
    truth = simulation.ground_truth()
    span = store.time_range()
    by_kind = truth["kind"].value_counts().to_dict() if len(truth) else {}
    print("\n== gpuwarden demo summary ==")
    print(f"fleet:            {summary['nodes']} nodes, {summary['gpus']} GPUs ({summary['devices']} devices incl. MIG instances)")
    print(f"jobs:             {summary['submitted']} submitted, {summary['started']} started, {summary['succeeded']} finished, "
          f"{summary['running']} running, {summary['pending']} pending")
    print(f"interruptions:    {summary['failed_by_fault']} jobs killed by GPU faults, {summary['preempted']} preempted "
          f"({summary['spot_reclaims']} spot reclaims), {summary['application_xids']} application XIDs")
    print(f"samples stored:   {store.row_count():,} rows in {store.root}"
          + (f" ({span[0]:%Y-%m-%d %H:%M} .. {span[1]:%Y-%m-%d %H:%M} UTC)" if span else ""))
    print(f"injected faults:  {len(truth)}" + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())) + ")" if by_kind else ""))
    print(f"exporter:         {exporter_url} ({series} series at the last scrape)")
    if scraper is not None:
        print(f"embedded scraper: {scraper.scrapes} scrapes of /metrics, {scraper.rows_written:,} rows into the store")
    print(f"live run:         {live_seconds:.0f} s")
    for line in headline_lines(headline(store, inventory=Inventory.from_nodes(simulation.nodes))):
        print(line)
    if reconciler is not None and reconciler.rounds:
        last = reconciler.rounds[-1]
        findings = reconciler.find.last
        by_severity = Counter(f.severity.value for f in findings)
        print(f"health findings:  {len(findings)} in the last {HEALTH_WINDOW.total_seconds() / 3600:g} h "
              + ("(" + ", ".join(f"{k} {v}" for k, v in sorted(by_severity.items())) + ")" if findings else ""))
        for finding in findings[:5]:
            print(f"                  {finding.severity.value:8} {finding.kind} on {finding.node} {finding.gpu_uuid or ''}")
        print(f"planned actions:  {len(last.plan.actions)} (observe mode: none applied; "
              f"{len(reconciler.rounds)} reconcile round(s))")
        for planned in last.plan.actions[:5]:
            print(f"                  {planned.action.kind.value} {planned.action.target}: {planned.action.reason}")
