"""How fast each dashboard page renders on the default demo store (64 nodes x 8 GPUs, 7 days),
with the reports cached by window (what a person gets after the first view) and without (every
cache cleared before each run: the path a page took when it recomputed everything).

    PYTHONPATH=. python bench/bench_dashboards.py [--store DIR] [--runs 5] [--window 24h]

Without ``--store`` it first builds the demo store with the simulator (about 3 minutes on 2
cores; pass ``--keep DIR`` to reuse it next time). Timing is Streamlit's own AppTest: the page
script run headless in this process, every element built, no browser. Prints per page the median
cached and uncached render time and their ratio; the target is < 2 s cached.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, help="an existing store (default: build the demo store)")
    parser.add_argument("--keep", type=Path, help="build the demo store here and keep it")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per page and path (default 5)")
    parser.add_argument("--uncached-runs", type=int, default=3, help="timed runs without caches (default 3)")
    parser.add_argument("--window", default="24h", choices=["1h", "6h", "24h", "7d"], help="the shared window (default 24h)")
    parser.add_argument("--pages", nargs="*", default=list(PAGES), help="page scripts under views/")
    args = parser.parse_args(argv)

    from streamlit.testing.v1 import AppTest

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
    print(f"store {store}: {rows:,} samples; window {args.window}; {args.runs} cached / {args.uncached_runs} uncached runs")
    print(f"{'page':<12} {'cached median s':>16} {'uncached median s':>18} {'ratio':>7}  target < {TARGET_S:g} s")
    worst = 0.0
    for page in args.pages:
        at = AppTest.from_file(str(APP_PATH), default_timeout=900)
        at.session_state[data.WINDOW_KEY] = args.window
        at.run()
        at.switch_page(f"views/{page}")
        uncached = []
        for _ in range(args.uncached_runs):
            data.clear_caches()
            uncached.append(timed(at))
        timed(at)  # fill every cache this page uses
        cached = [timed(at) for _ in range(args.runs)]
        c, u = statistics.median(cached), statistics.median(uncached)
        worst = max(worst, c)
        print(f"{page:<12} {c:>16.2f} {u:>18.2f} {u / c:>6.1f}x  {'ok' if c < TARGET_S else 'SLOW'}", flush=True)
    print(f"slowest cached page: {worst:.2f} s ({'within' if worst < TARGET_S else 'over'} the {TARGET_S:g} s target)")
    if tmp is not None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
