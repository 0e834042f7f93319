"""``gpuwarden demo``: the whole pipeline on the embedded simulated fleet, no GPU, no cluster.

simulated fleet -> backfill a week into the embedded store (progress bar) -> precompute the
dashboard's reports of its default window beside the store -> serve exporter metrics for every
simulated node on localhost, and the live queue of the simulation's scheduling round (``/queue``,
``/metrics``, ``POST /submit`` as ``gpuwarden scheduler run`` serves them; the dashboard gets its
URL as ``GPUWARDEN_SCHEDULER_URL``) -> keep stepping the fleet while the embedded scraper reads
/metrics into the store, the store compacts and the actuator reconciles, all jobs of one runner on one clock
(:mod:`.demo_live`) -> open the dashboard. ``--headless --duration S`` does the
same without the dashboard and prints a summary. Ctrl-C or SIGTERM stops everything and prints the
same summary.

The demo only ever deletes data it made: it marks the store it fills (a marker file), starts a
marked store afresh, and refuses a store holding samples it did not make unless ``--reset`` is
given. It checks its ports before it touches the store. The simulated week ends an hour before
now, so reports over the demo store see it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import webbrowser
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.fleet.errors import UserError
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock, ModelClock
from gpuwarden.portal.submit import DEMO_TEMPLATES_PATH, TEMPLATES_ENV

from .args import host_port, number, plain, port
from .demo_dra import DRA_HELP, demo_backend, dra_config, summary_lines
from .demo_live import (HEALTH_WINDOW_HOURS, HealthScan, PodOwners, RECONCILE_INTERVAL_S, add_live_jobs, count_series,
                        portal_submitter)
from .queue_cmd import SCHEDULER_URL_ENV
from .simconfig import add_sim_options, recording_ends_at, sim_config_from
from .storemark import (
    DEFAULT_STORE,
    STORE_PARTS,
    checked_store,
    demo_running_on,
    is_demo_store,
    mark_demo_store,
    store_has_data,
    store_path,
)

if TYPE_CHECKING:  # the heavy rooms are imported when the demo runs, not when it parses
    from gpuwarden.remediation import Reconciler
    from gpuwarden.sim import Simulation
    from gpuwarden.store import LocalStore
    from gpuwarden.store.scraper import Scraper

DEMO_FAULT_SCALE = 25.0  # published rates give about one fault per simulated week on 512 GPUs
DEMO_LEAD_HOURS = 1.0  # the backfill ends this long before now: an hour of live demo stays in the past
SUMMARY_ROWS = 5  # findings and actions listed in the summary; the rest are counted
SCHEDULER_PORT = 8083  # the scheduler's /queue port, as on a cluster


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on the embedded simulated fleet",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--headless", action="store_true", help="no dashboard; print a summary and exit")
    parser.add_argument("--duration", type=number(float, 0, 7 * 86400),
                        help="seconds to run live after the backfill, 0..604800 (default: until Ctrl-C; 60 with --headless)")
    parser.add_argument("--days", type=number(float, 0, 31), default=7.0,
                        help="days of history to backfill, 0..31 (default 7)")
    parser.add_argument("--store", type=store_path, default=DEFAULT_STORE,
                        help=f"embedded store directory (default {DEFAULT_STORE}); a store the demo made is "
                             "started afresh, one holding other samples is refused unless --reset")
    parser.add_argument("--reset", action="store_true",
                        help="delete the samples and audit log in --store even if the demo did not make them")
    parser.add_argument("--exporter-listen", type=host_port, default=("127.0.0.1", 9400),
                        help="HOST:PORT for the simulated nodes' /metrics (port 0 picks a free one; default 127.0.0.1:9400)")
    parser.add_argument("--dashboard-port", type=port, default=8501, help="Streamlit port, 1..65535 (default 8501)")
    parser.add_argument("--scheduler-listen", type=host_port,
                        help="HOST:PORT for the scheduler's /queue, /metrics and POST /submit (port 0 picks a free "
                             f"one; default 127.0.0.1:{SCHEDULER_PORT}, with --headless a free port)")
    parser.add_argument("--step-interval", type=number(float, 0.01, 3600), default=1.0,
                        help="wall seconds between live simulated steps, 0.01..3600 (default 1)")
    parser.add_argument("--no-browser", action="store_true", help="print the dashboard URL without opening a browser")
    parser.add_argument("--dra", action="store_true", help=DRA_HELP)
    add_sim_options(parser, fault_scale_default=DEMO_FAULT_SCALE)
    parser.set_defaults(run=run)


class DemoError(UserError, RuntimeError):
    """A reason the demo cannot start (a port taken, a store it must not delete): one line, exit 2."""


class Stopped(BaseException):
    """SIGTERM: stop like Ctrl-C does (the summary is still printed).

    A BaseException, as KeyboardInterrupt is: the handler raises it wherever the main thread is, and
    no ``except Exception`` on the way may take it for an error. One that did: ``Thread.start``,
    interrupted just after the thread began, undid its bookkeeping of a thread already running, which
    then died with ``KeyError`` in ``threading``."""


def _stop(signum, frame) -> None:
    raise Stopped(signal.Signals(signum).name)


def port_free(host: str, port_number: int) -> bool:
    """Whether a server could listen on ``host:port_number`` now (as the exporter would bind it)."""
    if port_number == 0:
        return True
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port_number))
        return True
    except OSError:
        return False


def preflight(args: argparse.Namespace) -> None:
    """Everything that can stop the demo, checked before it touches anything."""
    host, exporter_port = args.exporter_listen
    if not port_free(host, exporter_port):
        raise DemoError(f"--exporter-listen {host}:{exporter_port}: the port is in use; choose another "
                        "(port 0 picks a free one)")
    if args.scheduler_listen is None:
        args.scheduler_listen = ("127.0.0.1", 0 if args.headless else SCHEDULER_PORT)
    if not port_free(*args.scheduler_listen):
        raise DemoError(f"--scheduler-listen {args.scheduler_listen[0]}:{args.scheduler_listen[1]}: the port is in use; "
                        "choose another (port 0 picks a free one)")
    if not args.headless and not port_free("127.0.0.1", args.dashboard_port):
        raise DemoError(f"--dashboard-port {args.dashboard_port}: the port is in use; choose another")
    checked_store(args.store)
    running = demo_running_on(args.store) if is_demo_store(args.store) else None
    if running is not None:
        raise DemoError(f"--store {args.store}: another demo (pid {running}) is using it; give this one another --store")
    if store_has_data(args.store) and not is_demo_store(args.store) and not args.reset:
        raise DemoError(f"--store {args.store}: holds samples the demo did not make; the demo will not delete them. "
                        "Use another --store, or --reset to delete them")


def reset_store(root: Path) -> None:
    """Delete what a store holds (only the store's own parts, never other files in the folder)."""
    import shutil

    from gpuwarden.analytics import report_bundle

    for part in STORE_PARTS:
        target = root / part
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    report_bundle.remove_all(root)  # reports of the samples just deleted
    mark_demo_store(root)


def run(args: argparse.Namespace, clock: Clock = SYSTEM_CLOCK) -> int:
    import pandas as pd

    config = dra_config(sim_config_from(args), args.dra)
    if not args.config:  # the simulated week ends just before now (a config file's start is kept)
        end = pd.Timestamp(clock.now()).floor("min") - pd.Timedelta(hours=DEMO_LEAD_HOURS)
        config = recording_ends_at(config, end, args.days)
    try:
        preflight(args)
    except DemoError as error:
        print(f"gpuwarden demo: error: {error}", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return _run(args, config, clock)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, config, clock: Clock) -> int:
    from gpuwarden.remediation import Actuator, AuditLog, Mode, Reconciler
    from gpuwarden.fleet.object_names import REQUESTED_BY_ANNOTATION
    from gpuwarden.scheduler.queue_server import QueueServer
    from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics
    from gpuwarden.scheduler.scheduling_round import SchedulingRound
    from gpuwarden.dashboards.launch import dashboard_url, launch_dashboard
    from gpuwarden.exporter import ExporterService
    from gpuwarden.cli.simfleet import simulated_fleet
    from gpuwarden.fleet.processes import stop_process
    from gpuwarden.fleet.runner import Runner
    from gpuwarden.sim.cluster import SimCluster
    from gpuwarden.store import LocalStore
    from gpuwarden.store.scraper import Scraper

    duration = args.duration if args.duration is not None else (60.0 if args.headless else None)
    print(f"gpuwarden demo: simulating {config.nodes} nodes x {config.gpus_per_node} GPUs "
          f"(seed {config.seed}, fault rates x{config.fault_rate_scale:g} the published ones)"
          + ("; GPUs allocated by DRA (driver gpu.nvidia.com)" if config.dra else ""), flush=True)
    # The simulated fleet and the cluster the actuator acts on: built here, and only here.
    simulation = simulated_fleet(config)
    cluster = SimCluster(simulation)
    reset_store(args.store)
    store = LocalStore(args.store, clock=ModelClock(lambda: simulation.now))  # the demo's clock is simulated
    host, exporter_port = args.exporter_listen
    exporter = ExporterService(demo_backend(simulation), interval_seconds=max(1.0, args.step_interval),
                               host=host, port=exporter_port, clock=clock)
    runner = Runner(clock, name="gpuwarden-demo")
    dashboard: subprocess.Popen | None = None
    started = clock.monotonic()
    return_code = 0
    scraper: Scraper | None = None
    reconciler: Reconciler | None = None
    queue_server: QueueServer | None = None
    series = 0
    try:
        backfill(simulation, store, args.days)
        exporter.start()
        exporter.collect_now()
        # The live queue of the simulation's own scheduling round (the one a cluster's scheduler runs),
        # served as 'gpuwarden scheduler run' serves it; metrics from now on (the backfill is history).
        scheduling = simulation.scheduling
        assert isinstance(scheduling, SchedulingRound)  # simulated_fleet hands it the actuator's round
        metrics = SchedulerMetrics()
        scheduling.on_round.append(metrics)
        queue_server = QueueServer(lambda: scheduling.queue, metrics.registry,
                                   submit=portal_submitter(simulation, REQUESTED_BY_ANNOTATION),
                                   host=args.scheduler_listen[0], port=args.scheduler_listen[1]).start()
        reconciler = Reconciler(Actuator(cluster, Mode.OBSERVE, audit=AuditLog(audit_path(args.store)), clock=clock),
                                HealthScan(store, simulation), interval_seconds=RECONCILE_INTERVAL_S)
        first = reconciler.reconcile_once()  # findings and the plan for the backfilled week, before going live
        print(f"health:    {first.findings} findings; actuator (observe mode) would take "
              f"{len(first.plan.actions)} action(s); audit log {audit_path(args.store)}", flush=True)
        print(f"exporter:  {exporter.url}  ({simulation.device_count} GPU devices on {len(simulation.nodes)} simulated nodes)")
        print(f"queue:     {queue_server.url}/queue  (gpuwarden queue --scheduler-url {queue_server.url}; "
              "POST /submit adds a portal request)", flush=True)
        if not args.headless:
            precompute_reports(store)
            # On a laptop the person running the demo is its approver (no sign-in).
            dashboard = launch_dashboard(args.store, port=args.dashboard_port, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, local_approver=os.environ.get("USER") or "demo",
                                         env={**os.environ, SCHEDULER_URL_ENV: queue_server.url,
                                              TEMPLATES_ENV: str(DEMO_TEMPLATES_PATH)})
            url = dashboard_url("127.0.0.1", args.dashboard_port)
            wait_for_dashboard(dashboard, url, args.dashboard_port)
            print(f"dashboard: {url}")
            if not args.no_browser and has_display():
                webbrowser.open(url)
        print("live: stepping the simulated fleet and feeding the store" +
              (f" for {duration:g} s" if duration is not None else "; Ctrl-C stops"), flush=True)
        owners = PodOwners(cluster)
        scraper = Scraper([exporter.url], store, interval_seconds=args.step_interval, cluster=config.cluster,
                          attribution=owners, clock=clock, sample_time=lambda: simulation.now)
        add_live_jobs(runner, simulation, exporter, scraper, owners, store, reconciler, args.step_interval)
        runner.start()
        clock.wait(threading.Event(), duration)  # the jobs run; Ctrl-C or SIGTERM ends the wait early
    except (KeyboardInterrupt, Stopped) as stop:
        print(f"\nstopping ({stop or 'Ctrl-C'})...", flush=True)
        return_code = 130 if isinstance(stop, KeyboardInterrupt) else 143
    except DashboardError as error:
        print(f"gpuwarden demo: error: {error}", file=sys.stderr)
        return_code = 2
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the summary short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            runner.stop()
            if queue_server is not None:
                queue_server.stop()
            series = count_series(exporter.url) if exporter.port else 0
            exporter.stop()
            if dashboard is not None:
                stop_process(dashboard)  # waits after a kill too: no zombie
            print_summary(simulation, store, exporter.url, series, clock.monotonic() - started, scraper, reconciler)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return return_code


def backfill(simulation: Simulation, store: LocalStore, days: float) -> None:
    from tqdm import tqdm

    steps = round(days * 86400 / simulation.config.step_seconds)
    chunk = max(1, int(6 * 3600 / simulation.config.step_seconds))  # six simulated hours per write
    with tqdm(total=steps, desc="backfill", unit="step", file=sys.stdout, mininterval=0.5,
              bar_format="{desc}: {percentage:3.0f}%|{bar:30}| {n_fmt}/{total_fmt} steps [{elapsed}<{remaining}]") as bar:
        for frame in simulation.iter_chunks(steps, chunk_steps=chunk):
            store.append(frame)
            bar.update(len(frame) // simulation.device_count)
    store.compact(min_files=2)


def precompute_reports(store: LocalStore, preset: str | None = None) -> list[str]:
    """Compute the dashboard's report bundles (fleet summary, ledger, health scan, GPU histories) of its default
    window once, beside the store, so its first page view reads them instead of scanning the
    backfilled samples; the dashboard refreshes them in the background as live samples arrive."""
    from gpuwarden.analytics import report_bundle
    from gpuwarden.analytics.fleet_report import fleet_bundle, gpu_histories_bundle
    from gpuwarden.analytics.health_report import health_bundle
    from gpuwarden.analytics.idle_cost_report import ledger_bundle
    from gpuwarden.analytics.windows import DEFAULT_PRESET, PRESET_LABELS, window_for

    span = store.time_range()
    if span is None:
        return []
    preset = preset or DEFAULT_PRESET
    window = window_for(preset, span[0], span[1])
    version = report_bundle.store_version(store.root)
    started = time.monotonic()
    written = []
    for kind, build in (("fleet", fleet_bundle), ("ledger", ledger_bundle), ("health", health_bundle),
                        ("gpus", gpu_histories_bundle)):
        report_bundle.save(store.root, kind, window.key, build(store, window, version))
        written.append(kind)
    print(f"reports:   {', '.join(written)} of the {PRESET_LABELS[preset].lower()} precomputed for the dashboard "
          f"({time.monotonic() - started:.0f} s)", flush=True)
    return written


def has_display() -> bool:
    """Open a browser only where one can show up (a console browser would take over the terminal)."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


class DashboardError(UserError, RuntimeError):
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


def print_summary(simulation: Simulation, store: LocalStore, exporter_url: str, series: int, run_seconds: float,
                  scraper: Scraper | None = None, reconciler: Reconciler | None = None) -> None:
    from gpuwarden.analytics.inventory import Inventory
    from gpuwarden.analytics.summary import headline, headline_lines

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
    print(f"run time:         {run_seconds:.0f} s (backfill, first findings and the live phase)")
    for line in summary_lines(simulation, store.root):
        print(line)
    if span is not None:
        for line in headline_lines(headline(store, inventory=Inventory.from_nodes(simulation.nodes))):
            print(line)
    if reconciler is not None and reconciler.rounds:
        last = reconciler.rounds[-1]
        findings = reconciler.find.last
        by_severity = Counter(f.severity.value for f in findings)
        print(f"health findings:  {len(findings)} in the last {HEALTH_WINDOW_HOURS:g} h "
              + ("(" + ", ".join(f"{k} {v}" for k, v in sorted(by_severity.items())) + ")" if findings else ""))
        for finding in findings[:SUMMARY_ROWS]:
            print(f"                  {finding.severity.value:8} {finding.kind} on {finding.node} {finding.gpu_uuid or ''}")
        if len(findings) > SUMMARY_ROWS:
            print(f"                  ...and {len(findings) - SUMMARY_ROWS} more ('gpuwarden health scan' lists them all)")
        actions = last.plan.actions
        print(f"planned actions:  {len(actions)} (observe mode: none applied; {len(reconciler.rounds)} reconcile round(s))")
        for planned in actions[:SUMMARY_ROWS]:
            print(f"                  {planned.action.kind.value} {planned.action.target}: {planned.action.reason}")
        if len(actions) > SUMMARY_ROWS:
            print(f"                  ...and {len(actions) - SUMMARY_ROWS} more (the audit log lists them all)")
