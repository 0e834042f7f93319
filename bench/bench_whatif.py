"""``gpuwarden simulate whatif`` on a week of the default demo fleet (64 nodes, 512 GPUs): wall time,
CPU time and peak memory of the whole command, and the ratio to a baseline measured in the same run.

The baseline is the same command on another source tree when ``--base PATH`` is given (a worktree of
main: ``git worktree add --detach /tmp/whatif-base main``), and then the two JSON reports must be the
same bytes (the speed-ups change no decision); without ``--base`` it is this tree's command for the
``fifo`` policy alone (the replay's floor: no preemption). Runs alternate baseline / this tree
``--repeat`` times; the figures are medians. The load (``/proc/loadavg``) is printed before and after:
on a shared machine quote the ratio, not the seconds.

    PYTHONPATH=. .venv/bin/gpuwarden sim generate --days 7 --start 2026-11-24T14:15:00Z --store /tmp/whatif-store
    PYTHONPATH=. .venv/bin/python bench/bench_whatif.py --store /tmp/whatif-store --until 2026-12-01T14:15:00Z \\
        [--base /tmp/whatif-base] [--repeat 1]

Target (issue 22): under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run(tree: Path, store: str, since: str, until: str, policies: str | None, out: Path) -> dict[str, float]:
    """One ``simulate whatif --format json`` with ``tree`` on PYTHONPATH: wall, cpu seconds and peak MB."""
    command = [sys.executable, "-m", "gpuwarden.cli", "simulate", "whatif", "--store", store, "--since", since,
               "--until", until, "--format", "json", "-o", str(out)]
    if policies:
        command += ["--policies", policies]
    timer = shutil.which("time") or "/usr/bin/time"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    done = subprocess.run([timer, "-v", *command], env=env, capture_output=True, text=True, cwd=tree, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-2000:]}")

    def field(name: str) -> float:
        found = re.search(rf"{re.escape(name)}: ([0-9.]+)", done.stderr)
        return float(found.group(1)) if found else float("nan")

    return {"wall_s": wall, "cpu_s": field("User time (seconds)") + field("System time (seconds)"),
            "peak_mb": field("Maximum resident set size (kbytes)") / 1024.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="store filled by `gpuwarden sim generate --days 7`")
    parser.add_argument("--since", default="7d")
    parser.add_argument("--until", required=True, help="end of the window, ISO-8601 UTC (the store's last day)")
    parser.add_argument("--base", type=Path, help="source tree of the baseline (a worktree of main)")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    base = args.base.resolve() if args.base else HERE
    base_policies = None if args.base else "fifo"
    label = f"base {base}" if args.base else "fifo alone (this tree)"
    print(f"load before: {Path('/proc/loadavg').read_text().split()[:3]}, cores: {os.cpu_count()}", flush=True)
    figures: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name, tree, policies in (("base", base, base_policies), ("this", HERE, None)):
                out = Path(tmp) / f"{name}-{i}.json"
                figures[name].append(run(tree, args.store, args.since, args.until, policies, out))
                print(f"  {name} #{i + 1}: {figures[name][-1]}", flush=True)
        same = None
        if args.base:
            same = all((Path(tmp) / f"base-{i}.json").read_bytes() == (Path(tmp) / f"this-{i}.json").read_bytes()
                       for i in range(args.repeat))
    print(f"load after: {Path('/proc/loadavg').read_text().split()[:3]}")
    med = {name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
           for name, runs in figures.items()}
    for key in ("wall_s", "cpu_s", "peak_mb"):
        print(f"{key:8s} this {med['this'][key]:9.1f}   baseline ({label}) {med['base'][key]:9.1f}"
              f"   ratio {med['this'][key] / med['base'][key]:.3f}")
    if same is not None:
        print("reports identical to the baseline's:", "yes" if same else "NO")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
