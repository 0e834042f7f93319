"""Simulator speed: 7 simulated days of the default 512-GPU fleet at 60 s resolution.

Target (foundation issue): under 60 s on 2 cores. Prints the wall (and CPU) time of generating the
samples (the warm-up day and trace loading are reported apart; module imports are in neither), rows
per second, and the ratio to the target. ``--repeats N`` runs N times and reports the median. The fleet is scheduled by the
actuator's scheduling round on ``SimCluster`` (``gpuwarden.cli.simfleet``), as in the demo.

``--base PATH`` also measures another checkout of the project (another commit's worktree) in the
same run: each repeat runs this tree and then that one, each in a fresh process on the same seed,
and prints both trees' medians and their ratios (this tree / base; under 1 is faster). On a shared
machine the load moves both alike; the ratio is the figure to quote.

    .venv/bin/python bench/bench_sim.py [--days 7] [--nodes 64] [--repeats 1] [--base /tmp/other-tree]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET_SECONDS = 60.0
HERE = Path(__file__).resolve().parents[1]
FIELDS = ("setup", "generate", "rows", "gpus", "setup_cpu", "generate_cpu")


def one_run(days: float, nodes: int, seed: int) -> dict[str, float]:
    """One fleet, built and stepped ``days``; imports whichever project is first on the path."""
    import gpuwarden.scheduling  # noqa: F401 (imports are not setup: loaded before the clock starts)
    from gpuwarden.sim import SimConfig

    try:
        from gpuwarden.cli.simfleet import simulated_fleet
        import gpuwarden.scheduler.scheduling_round  # noqa: F401 (what simulated_fleet imports when called)
    except ImportError:  # a checkout from before the simulator became a cluster scheduled it itself
        from gpuwarden.sim import Simulation as simulated_fleet  # type: ignore[assignment]
    started, cpu = time.perf_counter(), time.process_time()
    simulation = simulated_fleet(SimConfig(seed=seed, nodes=nodes))
    setup, setup_cpu = time.perf_counter() - started, time.process_time() - cpu
    steps = int(days * 86400 / simulation.config.step_seconds)
    rows = 0
    started, cpu = time.perf_counter(), time.process_time()
    for frame in simulation.iter_chunks(steps):
        rows += len(frame)
    return dict(zip(FIELDS, (setup, time.perf_counter() - started, rows, len(simulation.gpus), setup_cpu,
                             time.process_time() - cpu)))


def run_in(tree: Path, days: float, nodes: int, seed: int) -> dict[str, float]:
    """``one_run`` in a fresh process on ``tree``'s code (this file, run with ``--one``)."""
    from gpuwarden.fleet.paths import default_data_dir  # this tree's, found from where the bench was started

    env = {**os.environ, "PYTHONPATH": str(tree), "GPUWARDEN_DATA": str(default_data_dir().resolve())}
    done = subprocess.run([sys.executable, __file__, "--one", str(seed), "--days", str(days), "--nodes", str(nodes)],
                          cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the run on {tree} failed:\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in FIELDS}


def report(name: str, m: dict[str, float], days: float, repeats: int) -> None:
    total = m["setup"] + m["generate"]
    print(f"{name}: {int(m['gpus'])} GPUs x {days:g} days at 60 s -> {int(m['rows']):,} sample rows (median of {repeats})")
    # CPU seconds too: on a shared machine they vary far less than wall time
    print(f"  setup (traces + 1 warm-up day): {m['setup']:6.1f} s   ({m['setup_cpu']:.1f} CPU s)")
    print(f"  generate samples:               {m['generate']:6.1f} s   ({m['generate_cpu']:.1f} CPU s)   "
          f"{m['rows'] / m['generate']:,.0f} rows/s")
    print(f"  total:                          {total:6.1f} s   target {TARGET_SECONDS:.0f} s -> ratio "
          f"{total / TARGET_SECONDS:.2f} ({'PASS' if total < TARGET_SECONDS else 'MISS'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--base", type=Path, help="another checkout to measure in the same run, alternating")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one run on this seed, as JSON
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.days, args.nodes, args.one)))
        return
    if args.base is None:
        runs = [one_run(args.days, args.nodes, seed=7 + i) for i in range(args.repeats)]
        report("simulator", medians(runs), args.days, args.repeats)
        print(f"  peak resident memory:           {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
        return
    base = args.base.resolve()
    if not (base / "gpuwarden").is_dir():
        raise SystemExit(f"--base {args.base}: not a checkout of the project (no gpuwarden/ in it)")
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for i in range(args.repeats):  # alternate, so a change in the machine's load hits both trees
        ours.append(run_in(HERE, args.days, args.nodes, seed=7 + i))
        theirs.append(run_in(base, args.days, args.nodes, seed=7 + i))
    mine, other = medians(ours), medians(theirs)
    report(f"this tree ({HERE})", mine, args.days, args.repeats)
    report(f"base ({base})", other, args.days, args.repeats)
    print("ratio this / base (under 1: this tree is faster; paired: the median of the repeats' own ratios,")
    print("each repeat's two runs on one seed back to back, so a load that comes and goes moves it less):")
    for key, label in (("setup", "setup wall"), ("setup_cpu", "setup CPU"), ("generate", "generate wall"),
                       ("generate_cpu", "generate CPU")):
        paired = [a[key] / b[key] for a, b in zip(ours, theirs)]
        print(f"  {label:14s} {mine[key] / other[key]:.2f}   paired {statistics.median(paired):.2f}   per repeat: "
              + " ".join(f"{r:.2f}" for r in paired))


if __name__ == "__main__":
    main()
