"""The gap to the best possible on openb (issue 32 item 5): per pod list, FGD's published mean allocation at
130% demand, gpuwarden's mean over the same seeds ``gpuwarden simulate placement --seeds N`` runs (42..), the
upper bound on any policy's allocation for each seed's arrivals (``gpuwarden.scheduling.openb_bound``), the gap
bound - gpuwarden, and whether the bound rules out the goal (gpuwarden at least 0.3 pt above FGD): it does
when the mean of the per-seed bounds is below FGD + 0.3, since no policy's mean over those seeds can exceed it.

    .venv/bin/python bench/bench_openb_bound.py [--lists all] [--seeds 3] [--workers 2]

Prints a markdown table, then each seed's bound, the LP solves' median time and the wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwarden.scheduling.openb_bound import AllocationBound, bound_for_seed  # noqa: E402
from gpuwarden.scheduling.replay_openb import (  # noqa: E402
    OPENB_LISTS, PUBLISHED_NAMES, load_published, prepare, replay_openb,
)

GOAL_PTS = 0.3


def _quiet() -> None:
    """HiGHS's MILP prints a debug line now and then ("transformNewIntegerFeasibleSolution"): a worker's output
    goes nowhere (its results and errors come back through the pool)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


def _bound(job: tuple[str, str, int]) -> AllocationBound:
    data_dir, pod_list, seed = job
    return bound_for_seed(prepare(Path(data_dir), pod_list), seed, pod_list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lists", default="all", help="comma-separated openb lists, or all (the paper's 17)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 42..42+N-1, as simulate placement --seeds N")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    args = parser.parse_args()
    lists = list(OPENB_LISTS) if args.lists == "all" else args.lists.split(",")
    seeds = tuple(range(42, 42 + args.seeds))
    started = time.perf_counter()
    replays = replay_openb(args.data_dir, lists, ("gpuwarden",), seeds, workers=args.workers)
    replay_seconds = time.perf_counter() - started
    jobs = [(str(args.data_dir), pod_list, seed) for pod_list in lists for seed in seeds]
    with ProcessPoolExecutor(max_workers=args.workers, initializer=_quiet) as pool:
        bounds = list(pool.map(_bound, jobs, chunksize=1))
    published = load_published(args.data_dir)
    fgd = {row.pod_list: float(row.mean) for row in published.itertuples() if row.sc_policy == PUBLISHED_NAMES["fgd"]}

    print(f"| list | FGD published % | gpuwarden % ({len(seeds)} seeds) | bound % (mean) | bound - gpuwarden (pt) "
          f"| FGD + {GOAL_PTS} ruled out |")
    print("|---|---:|---:|---:|---:|---|")
    ruled_out = []
    for pod_list in lists:
        ours = statistics.fmean(100 * r.allocation_ratio for r in replays if r.pod_list == pod_list)
        bound = statistics.fmean(100 * b.bound_ratio for b in bounds if b.pod_list == pod_list)
        goal = fgd.get(pod_list, float("nan")) + GOAL_PTS
        out = bound < goal
        if out:
            ruled_out.append(pod_list)
        print(f"| {pod_list} | {fgd.get(pod_list, float('nan')):.3f} | {ours:.3f} | {bound:.3f} | {bound - ours:+.3f} "
              f"| {'yes: at most ' + format(bound, '.3f') if out else 'no'} |")
    print()
    for b in bounds:
        print(f"{b.pod_list} seed {b.seed}: bound {100 * b.bound_ratio:.3f}% (LP {100 * b.lp_milli / b.cluster_milli:.3f}%, "
              f"{b.iterations} iterations, {b.seconds:.1f} s); arrived {100 * b.arrived_milli / b.cluster_milli:.1f}%")
    seconds = [b.seconds for b in bounds]
    print(f"\n{len(bounds)} LP solves ({len(lists)} lists x {len(seeds)} seeds, {args.workers} workers): median "
          f"{statistics.median(seconds):.1f} s, max {max(seconds):.1f} s; replays {replay_seconds:.0f} s; "
          f"wall {time.perf_counter() - started:.0f} s")
    print(f"goal ruled out by the bound on: {', '.join(ruled_out) or 'no list'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
