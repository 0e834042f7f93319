"""Health evaluation harness at scale: the detectors against the simulated fleet's injected faults.

Simulates a 64 x 8 GPU fleet per seed with every fault kind injected at ``--rate`` events per
GPU-day (the simulator's ``counts_overrides``; the published Llama 3 rates would give about one
fault a week on 512 GPUs), scans it day by day as a live scan would (``StreamingScanner``), and
scores the findings against the ground truth: precision / recall / F1 per fault kind, median lead
time for faults with precursors, missed fatal XIDs, false cordons per 1,000 GPU-days.

The thresholds (``HealthConfig`` defaults) were tuned on seeds 1 and 2 only; the default reporting
seeds are 201-204 (``evaluation.REPORTING_SEEDS``), and the script refuses to mix them.

    .venv/bin/python bench/bench_health.py [--seeds 201 202 203 204] [--days 7] [--nodes 64] [--rate 0.004]

Targets (health issue): zero missed fatal XIDs; F1 >= 0.93; median lead >= 30 min; <= 1 false
cordon per 10,000 GPU-days.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from gpuwarden.analytics.health.evaluation import REPORTING_SEEDS, TUNING_SEEDS, combine
from gpuwarden.cli.health_cmd import DEFAULT_RATE, report_dict, simulate_and_score


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(REPORTING_SEEDS))
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE)
    parser.add_argument("--json", type=Path, help="write the report as JSON here too")
    parser.add_argument("--allow-tuning-seeds", action="store_true", help="score tuning seeds (for tuning only)")
    args = parser.parse_args()
    overlap = sorted(set(args.seeds) & set(TUNING_SEEDS))
    if overlap and not args.allow_tuning_seeds:
        parser.error(f"seed(s) {overlap} were used for tuning; pick others or pass --allow-tuning-seeds")
    started = time.perf_counter()
    reports = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        reports.append(simulate_and_score(seed, args.days, args.nodes, args.rate))
        print(f"seed {seed}: {len(reports[-1].faults)} scored faults, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    report = combine(reports)
    print(f"health harness: seeds {' '.join(map(str, args.seeds))} (reporting) x {args.days:g} days x {args.nodes * 8} GPUs; "
          f"tuning seeds {' '.join(map(str, TUNING_SEEDS))}; every fault kind at {args.rate:g} per GPU-day; "
          f"{report.gpu_days:,.0f} GPU-days")
    print(report.format())
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nwall time {time.perf_counter() - started:.0f} s, peak resident memory {peak_mib:,.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(report_dict(report, argparse.Namespace(seed=args.seeds, days=args.days, nodes=args.nodes)),
                                        indent=2, default=str))
    met = all(ok for *_, ok in report.targets())
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
