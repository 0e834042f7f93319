"""How fast each dashboard page renders on the default demo store (64 nodes x 8 GPUs, 7 days):

- **first view**: a fresh dashboard process (no report in memory) on a store whose reports the
  demo precomputed (``gpuwarden demo`` writes the default window's report bundles beside the store
  before it opens the dashboard): what a person gets on opening a page;
- **cold**: no report in memory and none beside the store, every figure computed from the samples
  (a store nobody precomputed, or a window nobody opened yet). Pages that only glance at the
  health scan or the ledger (Fleet tile, GPU findings, Queue usage) do not wait for them; the
  background computation they start is left to finish outside the timing;
- **cached**: the same page again (what every later view costs);
- **previous design**: the pages of commit ``--baseline`` (default 0fc8ea1, before report bundles:
  every report computed on the page's first view), in a subprocess on the same store, in the same
  run.

    PYTHONPATH=. python bench/bench_dashboards.py [--store DIR] [--runs 5] [--window 24h] [--baseline REV|none]

Without ``--store`` it first builds the demo store with the simulator (about 3 minutes on 2
cores; pass ``--keep DIR`` to reuse it next time). Writes report bundles into the store's
``reports/`` folder (a cache of the samples; deleting it loses nothing). Timing is Streamlit's
own AppTest: the page script run headless in this process, every element built, no browser.
Prints medians per page and path, and the ratio of the previous design's first view to this one;
the target is < 2 s for every page's first view.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PAGES = ("fleet.py", "gpu.py", "idle.py", "cost.py", "health.py", "queue.py", "portal.py", "actions.py")
TARGET_S = 2.0


def load_screenshots_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts" / "screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(at) -> float:
    started = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - started
    if at.exception:
        raise SystemExit(f"bench: the page raised: {at.exception[0].value}")
    return elapsed


def baseline_first_views(revision: str, store: Path, window: str, runs: int, pages: list[str]) -> dict[str, float]:
    """Median uncached render time per page of the dashboards at ``revision`` (its own bench, run in
    a subprocess on a copy of that revision's tree): {page: seconds}."""
    import subprocess

    tree = Path(tempfile.mkdtemp(prefix="bench-dash-baseline-"))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        command = [sys.executable, str(tree / "bench" / "bench_dashboards.py"), "--store", str(store), "--window", window,
                   "--runs", "1", "--uncached-runs", str(runs), "--pages", *pages]
        result = subprocess.run(command, check=False, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)},
                                timeout=3600)
        if result.returncode != 0:
            print(f"bench: the previous design's bench failed: {result.stderr.strip().splitlines()[-1:]}", flush=True)
            return {}
        medians = {}
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] in pages:
                medians[parts[0]] = float(parts[2])  # its columns: page, cached, uncached, ratio
        return medians
    finally:
        import shutil

        shutil.rmtree(tree, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, help="an existing store (default: build the demo store)")
    parser.add_argument("--keep", type=Path, help="build the demo store here and keep it")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per page and path (default 5)")
    parser.add_argument("--cold-runs", type=int, default=3, help="timed cold runs per page (default 3)")
    parser.add_argument("--window", default="24h", choices=["1h", "6h", "24h", "7d"], help="the shared window (default 24h)")
    parser.add_argument("--pages", nargs="*", default=list(PAGES), help="page scripts under views/")
    parser.add_argument("--baseline", default="0fc8ea1",
                        help="git revision of the previous design to time in the same run, or 'none' (default 0fc8ea1)")
    parser.add_argument("--baseline-runs", type=int, default=1, help="its uncached runs per page (default 1: it is slow)")
    args = parser.parse_args(argv)

    from streamlit.testing.v1 import AppTest

    from gpuwarden.analytics import report_bundle
    from gpuwarden.cli.demo import precompute_reports
    from gpuwarden.dashboards import STORE_ENV, data
    from gpuwarden.dashboards.launch import APP_PATH
    from gpuwarden.store import LocalStore

    tmp = None
    store = args.store
    if store is None:
        store = args.keep or Path(tempfile.mkdtemp(prefix="bench-dash-")) / "store"
        tmp = None if args.keep else store.parent
        if not (store / "samples").is_dir():
            print("bench: building the demo store (64 nodes x 8 GPUs, 7 days)…", flush=True)
            started = time.perf_counter()
            load_screenshots_module().build_demo_store(store, nodes=64, days=7.0)
            print(f"bench: built in {time.perf_counter() - started:.0f} s", flush=True)
    rows = LocalStore(store).row_count()
    os.environ[STORE_ENV] = str(store)
    load = os.getloadavg()[0]
    print(f"store {store}: {rows:,} samples; window {args.window}; {args.runs} first-view / {args.cold_runs} cold / "
          f"{args.runs} cached runs; load average {load:.1f} on {os.cpu_count()} CPUs")
    baseline = {}
    if args.baseline != "none":
        print(f"bench: timing the previous design ({args.baseline}) on the same store…", flush=True)
        baseline = baseline_first_views(args.baseline, store, args.window, args.baseline_runs, args.pages)
    report_bundle.remove_all(store)
    started = time.perf_counter()
    precompute_reports(LocalStore(store), args.window)
    print(f"demo precompute of the {args.window} reports: {time.perf_counter() - started:.1f} s (once, before the dashboard opens)")
    print(f"{'page':<12} {'first view s':>12} {'cold s':>8} {'cached s':>9} {'previous s':>11} {'prev/first':>11}  "
          f"target first view < {TARGET_S:g} s")
    worst = 0.0
    for page in args.pages:
        at = AppTest.from_file(str(APP_PATH), default_timeout=900)
        at.session_state[data.WINDOW_KEY] = args.window
        at.run()
        at.switch_page(f"views/{page}")
        cold = []
        for _ in range(args.cold_runs):
            data.clear_caches()
            report_bundle.remove_all(store)
            cold.append(timed(at))
            data.board().wait()  # what the page left computing in the background, outside the timing
        if args.cold_runs:
            precompute_reports(LocalStore(store), args.window)
        first = []
        for _ in range(args.runs):
            data.clear_caches()
            first.append(timed(at))
        timed(at)  # fill every cache this page uses
        cached = [timed(at) for _ in range(args.runs)]
        f, c = statistics.median(first), statistics.median(cached)
        k = statistics.median(cold) if cold else float("nan")
        previous = baseline.get(page)
        worst = max(worst, f)
        ratio = f"{previous / f:>10.1f}x" if previous else f"{'n/a':>11}"
        print(f"{page:<12} {f:>12.2f} {k:>8.2f} {c:>9.2f} {previous or float('nan'):>11.2f} {ratio}  "
              f"{'ok' if f < TARGET_S else 'SLOW'}", flush=True)
    print(f"slowest first view: {worst:.2f} s ({'within' if worst < TARGET_S else 'over'} the {TARGET_S:g} s target); "
          f"load average now {os.getloadavg()[0]:.1f}")
    if tmp is not None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
