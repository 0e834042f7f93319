"""Simulator speed: 7 simulated days of the default 512-GPU fleet at 60 s resolution.

Target (foundation issue): under 60 s on 2 cores. Prints the wall (and CPU) time of generating the
samples (the warm-up day and trace loading are reported apart), rows per second, and the ratio to
the target. ``--repeats N`` runs N times and reports the median. The fleet is scheduled by the
actuator's scheduling round on ``SimCluster`` (``gpuwarden.cli.simfleet``), as in the demo.

    .venv/bin/python bench/bench_sim.py [--days 7] [--nodes 64] [--repeats 1]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.sim import SimConfig

TARGET_SECONDS = 60.0


def one_run(days: float, nodes: int, seed: int) -> tuple[float, float, int, int, float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    simulation = simulated_fleet(SimConfig(seed=seed, nodes=nodes))
    setup, setup_cpu = time.perf_counter() - started, time.process_time() - cpu
    steps = int(days * 86400 / simulation.config.step_seconds)
    rows = 0
    started, cpu = time.perf_counter(), time.process_time()
    for frame in simulation.iter_chunks(steps):
        rows += len(frame)
    return setup, time.perf_counter() - started, rows, len(simulation.gpus), setup_cpu, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    runs = [one_run(args.days, args.nodes, seed=7 + i) for i in range(args.repeats)]
    setup = statistics.median(r[0] for r in runs)
    generate = statistics.median(r[1] for r in runs)
    rows, gpus = runs[0][2], runs[0][3]
    total = setup + generate
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"simulator: {gpus} GPUs x {args.days:g} days at 60 s -> {rows:,} sample rows (median of {args.repeats})")
    setup_cpu = statistics.median(r[4] for r in runs)
    generate_cpu = statistics.median(r[5] for r in runs)
    # CPU seconds too: on a shared machine they vary far less than wall time
    print(f"  setup (traces + 1 warm-up day): {setup:6.1f} s   ({setup_cpu:.1f} CPU s)")
    print(f"  generate samples:               {generate:6.1f} s   ({generate_cpu:.1f} CPU s)   {rows / generate:,.0f} rows/s")
    print(f"  total:                          {total:6.1f} s   target {TARGET_SECONDS:.0f} s -> ratio {total / TARGET_SECONDS:.2f} "
          f"({'PASS' if total < TARGET_SECONDS else 'MISS'})")
    print(f"  peak resident memory:           {peak_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
