"""Scheduling benchmarks: the openb placement replay on all 17 lists (FGD protocol, seeds 42-51),
the default list's 10-seed timing, the Philly queue replay and the mixed replay.

    .venv/bin/python bench/bench_scheduling.py [--quick] [--workers 2]

Regression limits sit beside the numbers they came from (kueue's rangespec idea): a run that
falls below them exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwarden.fleet.traces import default_data_dir  # noqa: E402
from gpuwarden.cli.simulate_cmd import mixed_rows  # noqa: E402
from gpuwarden.scheduling.replay_openb import OPENB_LISTS, load_published, replay_openb, summarise  # noqa: E402
from gpuwarden.scheduling.replay_mixed import MixedSpec  # noqa: E402
from gpuwarden.scheduling.replay_queue import QueueSlice, run_queue_replay  # noqa: E402

# measured on 2 cores (see docs/scheduling.md); limits leave a little room for noise
LIMITS = {
    "default_10_seed_seconds": 60.0,
    "default_gpuwarden_min_pct": 95.5,  # the target; measured 95.69 (seeds 42-51)
    "baseline_max_gap_pts": 1.0,
    # Philly queue, default slice (gpuwarden measured 0.982 / worst team 0.906; its p99 wait, 84,322 s,
    # is above Tiresias's 74,616 s, so the p99-wait check below reports a miss: docs/scheduling.md)
    "queue_gpuwarden_min_guarantee_met": 0.95,
    "queue_gpuwarden_min_worst_team": 0.85,
    "mixed_min_training_gain": 0.40,  # the target; measured +42.1% with defragmenting moves (seed 42)
    "mixed_min_useful": 0.85,  # the target; measured 85.01% (seed 42) and 85.0-86.6% over seeds 42-51
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="default list only")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-queue", action="store_true")
    args = parser.parse_args()
    data_dir = default_data_dir()
    published = load_published(data_dir)
    failures = []

    started = time.perf_counter()
    replay_openb(data_dir, ("default",), ("gpuwarden",), tuple(range(42, 52)), workers=args.workers)
    seconds = time.perf_counter() - started
    print(f"default list, gpuwarden, 10 seeds: {seconds:.1f} s wall on {args.workers} workers")
    if seconds > LIMITS["default_10_seed_seconds"]:
        failures.append(f"default 10-seed run took {seconds:.1f} s")

    lists = ("default",) if args.quick else OPENB_LISTS
    results = replay_openb(data_dir, lists, ("random", "bestfit", "fgd", "gpuwarden"), tuple(range(42, 52)),
                           workers=args.workers)
    table = summarise(results, published)
    print(table.to_string(index=False))
    for row in table.itertuples():
        if row.policy in ("random", "bestfit") and abs(row.delta_pts) > LIMITS["baseline_max_gap_pts"]:
            failures.append(f"{row.pod_list} {row.policy}: {row.delta_pts:+.2f} pts from published")
    ours = table[table.policy == "gpuwarden"]
    beat = (ours["delta_pts"] >= 0).sum()
    print(f"gpuwarden >= published FGD on {beat} of {len(ours)} lists")
    for row in ours[ours["delta_pts"] < 0].itertuples():  # the target: at or above FGD on every list
        failures.append(f"{row.pod_list} gpuwarden {row.alloc_pct:.3f}% < FGD's published {row.published_pct:.3f}%")
    value = float(ours[ours.pod_list == "default"]["alloc_pct"].iloc[0])
    if value < LIMITS["default_gpuwarden_min_pct"]:
        failures.append(f"default gpuwarden {value:.2f}% < {LIMITS['default_gpuwarden_min_pct']}%")

    if not args.skip_queue:
        started = time.perf_counter()
        queue = run_queue_replay(data_dir, QueueSlice())
        print(json.dumps([r.as_dict() for r in queue], indent=1))
        print(f"queue replay: {time.perf_counter() - started:.1f} s")
        by = {r.policy: r for r in queue}
        ours_q = by["gpuwarden"]
        for r in queue:
            print(f"  {r.policy:10s} JCT mean {r.jct_mean:>8,.0f} s  wait mean {r.wait_mean:>8,.0f} s  "
                  f"wait p99 {r.wait_p99:>8,.0f} s  worst team {r.worst_team_guarantee_met:.3f}")
        if ours_q.wait_p99 > min(r.wait_p99 for r in queue):
            failures.append(f"queue: gpuwarden p99 wait {ours_q.wait_p99:,.0f} s is not the lowest")
        tiresias = by.get("tiresias")
        if tiresias is not None:
            print(f"queue: gpuwarden mean JCT / Tiresias's = {ours_q.jct_mean / tiresias.jct_mean:.3f} "
                  f"(target <= 1; see docs/scheduling.md for the Pareto front)")
        if ours_q.guarantee_met < LIMITS["queue_gpuwarden_min_guarantee_met"]:
            failures.append(f"queue: gpuwarden guarantee met {ours_q.guarantee_met:.3f}")
        if ours_q.worst_team_guarantee_met < LIMITS["queue_gpuwarden_min_worst_team"]:
            failures.append(f"queue: gpuwarden worst team guarantee met {ours_q.worst_team_guarantee_met:.3f}")
    naive, ours_m = mixed_rows(MixedSpec())
    print(json.dumps([naive, ours_m], indent=1, default=str))
    gain = float(ours_m["training_gpu_hours_per_hour"]) / float(naive["training_gpu_hours_per_hour"]) - 1  # type: ignore[arg-type]
    print(f"mixed: demand {float(ours_m['demand_ratio']):.0%} of the fleet, useful utilisation "  # type: ignore[arg-type]
          f"{float(ours_m['useful_utilisation']):.1%} (target 85%), training GPU-hours {gain:+.1%} over naive (target +40%)")  # type: ignore[arg-type]
    if gain < LIMITS["mixed_min_training_gain"]:
        failures.append(f"mixed: training GPU-hours {gain:+.1%} over naive")
    if float(ours_m["useful_utilisation"]) < LIMITS["mixed_min_useful"]:  # type: ignore[arg-type]
        failures.append(f"mixed: useful utilisation {float(ours_m['useful_utilisation']):.1%}")  # type: ignore[arg-type]
    for failure in failures:
        print("REGRESSION:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
