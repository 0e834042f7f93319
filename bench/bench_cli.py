"""The console script's start-up cost: `gpuwarden --help` wall time and `gpuwarden exporter` RSS.

The CLI imports a room only when its subcommand runs, so `--help` should cost little more than
starting Python, and the exporter through `gpuwarden exporter` little more than the DaemonSet's
own `python -m gpuwarden.exporter`. Both baselines are measured in the same run; medians of
--repeats. Targets (issue 13 item 9): --help < 0.5 s, exporter < 60 MiB RSS.

    .venv/bin/python bench/bench_cli.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def wall(command: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=ENV, cwd=ROOT)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def exporter_rss_mib(command: list[str], port: int) -> float:
    """Start an exporter on the replay backend, wait for its first /metrics, read VmRSS."""
    process = subprocess.Popen([*command, "--backend", "replay", "--listen", f"127.0.0.1:{port}", "--interval", "1"],
                               env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError(process.stderr.read().decode()) from None
                time.sleep(0.2)
        time.sleep(2)  # a few collections
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    python = wall([sys.executable, "-c", "pass"], args.repeats)
    helped = wall([sys.executable, "-m", "gpuwarden.cli", "--help"], args.repeats)
    print(f"python start-up:          {python * 1000:7.0f} ms (median of {args.repeats})")
    print(f"gpuwarden --help:         {helped * 1000:7.0f} ms  ({helped / python:.1f}x python; target < 500 ms)")
    daemonset = statistics.median(exporter_rss_mib([sys.executable, "-m", "gpuwarden.exporter"], 19401 + i) for i in range(3))
    console = statistics.median(exporter_rss_mib([sys.executable, "-m", "gpuwarden.cli", "exporter"], 19411 + i) for i in range(3))
    print(f"python -m gpuwarden.exporter RSS: {daemonset:6.1f} MiB (baseline)")
    print(f"gpuwarden exporter RSS:           {console:6.1f} MiB  ({console / daemonset:.2f}x baseline; target < 60 MiB)")


if __name__ == "__main__":
    main()
