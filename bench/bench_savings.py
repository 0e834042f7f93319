"""``gpuwarden simulate savings`` on the Philly window of 2017-10-09 (two days, 3,794 GPU jobs), every
queue policy, with the search: wall time, the number of replays, and the ratio to one ``simulate
queue`` run (all its policies, its default 4,000-job slice on 16 nodes) measured in the same script.
Both run as commands in a fresh process, one after the other; the load (``/proc/loadavg``) is printed
before and after: on a shared machine quote the ratio, not the seconds.

    .venv/bin/python bench/bench_savings.py [--gpus 256] [--slo-wait 1h]

Target (issue 32): under 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TARGET_SECONDS = 300.0


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpuwarden.cli", *argv], check=True, cwd=HERE)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="256", help="the search's start (default 256)")
    parser.add_argument("--slo-wait", default="1h", help="each team's p95 wait (default 1h)")
    args = parser.parse_args()
    print(f"load before: {load()}")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "savings.json"
        savings = timed(["simulate", "savings", "--gpus", args.gpus, "--slo-wait", args.slo_wait,
                         "--format", "json", "-o", str(out)])
        report = json.loads(out.read_text())
        queue = timed(["simulate", "queue", "--format", "json", "-o", str(Path(folder) / "queue.json")])
        queue_policies = [row["policy"] for row in json.loads((Path(folder) / "queue.json").read_text())]
    print(f"load after: {load()}")
    print(f"simulate savings: {savings:.1f} s wall, {report['replays']} replays "
          f"({', '.join(f'{p} {n}' for p, n in report['replays_by_policy'].items())}), "
          f"{report['jobs']:,} jobs, SLO {report['slo_wait_seconds']:g} s")
    for policy, figures in report["policies"].items():
        print(f"  {policy:<13} {figures['nodes']} nodes, {figures['gpu_hours_provisioned']:,.0f} GPU-h provisioned")
    print(f"  gpu_hours_saved_pct: {report['gpu_hours_saved_pct']}")
    print(f"simulate queue (4,000 jobs, 16 nodes, {len(queue_policies)} policies: {', '.join(queue_policies)}): "
          f"{queue:.1f} s wall")
    print(f"ratio savings / queue: {savings / queue:.1f}x; target: savings under {TARGET_SECONDS:.0f} s "
          f"({'met' if savings < TARGET_SECONDS else 'NOT met'})")


if __name__ == "__main__":
    main()
