"""Regenerate ``docs/screenshots/``: every dashboard page on a simulated fleet, in real headless
Chromium.

    PYTHONPATH=. python scripts/screenshots.py [--nodes 16] [--days 1] [--out docs/screenshots]

It builds a store with the simulator (samples, a cluster snapshot, an audit log holding one
action awaiting approval), starts the dashboard on it with a local demo
approver, and saves one PNG per page. ``build_demo_store`` is also what the browser tests use.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpuwarden.remediation import Actuator, AuditLog, Mode, Reconciler
from gpuwarden.cli.demo import precompute_reports
from gpuwarden.fleet import cluster_state as cs
from gpuwarden.dashboards.cdp import Chromium, find_chromium
from gpuwarden.dashboards.launch import launch_dashboard
from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.sim.cluster import SimCluster
from gpuwarden.sim.config import SimConfig
from gpuwarden.store import LocalStore

DATA_DIR = ROOT.parent / "shared" / "data"
APPROVER = "dana-oncall"
# (url path, what the page itself must show once drawn, file name)
PAGES: tuple[tuple[str, str, str], ...] = (
    ("", "Fleet overview", "fleet"),
    ("gpu", "GPU detail", "gpu"),
    ("idle", "Idle GPUs and why", "idle"),
    ("cost", "Cost and chargeback", "cost"),
    ("health", "GPU health", "health"),
    ("queue", "Queue & quotas", "queue"),
    ("portal", "Request GPUs", "portal"),
    ("actions", "Actuator actions", "actions"),
)


def xid79_finding(node: str, gpu_uuid: str, at) -> Finding:
    return Finding(FindingKind.OFF_THE_BUS, Severity.CRITICAL, node, gpu_uuid,
                   {"xid": 79, "events": 2, "active": True}, ActionKind.CORDON, 0.99, at - timedelta(minutes=20), at)


def build_demo_store(root: Path, nodes: int = 4, days: float = 0.25, seed: int = 7, data_dir: Path = DATA_DIR,
                     fault_rate_scale: float = 50.0) -> dict:
    """A store a dashboard can show everything on: samples, cluster snapshot, one pending approval
    (a cordon planned by the real actuator in approve mode on the simulated cluster)."""
    config = SimConfig(seed=seed, nodes=nodes, warmup_days=0.1, data_dir=data_dir, fault_rate_scale=fault_rate_scale)
    simulation = simulated_fleet(config)
    store = LocalStore(root)
    steps = round(days * 86400 / config.step_seconds)
    for frame in simulation.iter_chunks(steps):
        store.append(frame)
    cluster = SimCluster(simulation)
    snapshot = cluster.snapshot()
    cs.write_snapshot(root / "cluster", snapshot)
    node = snapshot.nodes[0].name
    gpu = next(g.uuid for g in snapshot.gpus if g.node == node)
    audit = root / "actuator" / "audit.jsonl"
    finding = xid79_finding(node, gpu, snapshot.taken_at)
    actuator = Actuator(cluster, Mode.APPROVE, audit=AuditLog(audit))  # audit times: wall clock, as live
    round_ = Reconciler(actuator, lambda _snapshot: [finding]).reconcile_once()
    return {"simulation": simulation, "cluster": cluster, "node": node, "gpu": gpu, "finding": finding,
            "audit": audit, "planned": round_.plan}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_dashboard(store: Path, port: int, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    import os

    env = dict(os.environ)
    env.update(env_extra or {})
    process = launch_dashboard(store, port=port, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)
    process.terminate()
    raise RuntimeError(f"the dashboard never answered on port {port}")


def shrink(path: Path, colours: int = 128) -> Path:
    """Rewrite a screenshot with a palette of ``colours`` (a quarter of the bytes; dashboards are
    flat colours). Pillow comes with Streamlit."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16, help="simulated nodes of 8 GPUs (default 16)")
    parser.add_argument("--days", type=float, default=1.0, help="simulated days of samples (default 1)")
    parser.add_argument("--fault-rate-scale", type=float, default=1000.0,
                        help="times the published fault rates, so the Health page has something to show (default 1000)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="folder for the PNGs")
    args = parser.parse_args(argv)
    browser = find_chromium()
    if browser is None:
        print("screenshots: chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        print(f"screenshots: simulating {args.nodes} nodes x 8 GPUs for {args.days:g} day(s)…", flush=True)
        build_demo_store(store, nodes=args.nodes, days=args.days, fault_rate_scale=args.fault_rate_scale)
        precompute_reports(LocalStore(store))  # as gpuwarden demo does before it opens the dashboard
        port = free_port()
        process = start_dashboard(store, port, {"GPUWARDEN_DEMO_APPROVER": APPROVER})
        try:
            with Chromium(browser, Path(tmp) / "profile", width=1400, height=1800) as chrome:
                chrome.goto(f"http://127.0.0.1:{port}/")  # a fresh server can serve a blank first load
                chrome.settle(("Fleet overview",), timeout_s=180)
                for path, needle, name in PAGES:
                    chrome.goto(f"http://127.0.0.1:{port}/{path}")
                    chrome.settle((needle,), timeout_s=180)
                    saved = shrink(chrome.screenshot(args.out / f"{name}.png"))
                    print(f"screenshots: {saved.relative_to(ROOT) if saved.is_relative_to(ROOT) else saved}", flush=True)
        finally:
            process.terminate()
            process.wait(timeout=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
