"""The mixed replay over ten seeds, against the most any schedule could reach (issue 32 item 4).

For each seed (42-51 by default) it runs ``gpuwarden simulate mixed`` (naive whole-GPU first fit and
gpuwarden, the same stream) and prints: the stream's demand ratio; each policy's useful utilisation;
the ceiling (:func:`gpuwarden.scheduling.replay_mixed.ceiling`: the most a schedule that serves every
service from its submission could reach, with perfect packing and no restore time); gpuwarden's share
of that ceiling; the training gain over naive (training GPU-hours per hour) and the most the ceiling
allows. The goals (88% useful; +50% training over naive) are marked out of reach on a seed where the
ceiling itself is below them. Medians over the seeds at the end.

    .venv/bin/python bench/bench_mixed_seeds.py [--seeds 42-51] [--hours 72]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwarden.cli.simulate_cmd import mixed_rows  # noqa: E402
from gpuwarden.scheduling.replay_mixed import MixedSpec  # noqa: E402

USEFUL_GOAL = 0.88
GAIN_GOAL = 0.50


def seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=seeds, default=seeds("42-51"), help="first-last (default 42-51)")
    parser.add_argument("--hours", type=float, default=72.0)
    args = parser.parse_args()
    print("| seed | demand | naive useful | gpuwarden useful | ceiling | of ceiling | training gain | gain ceiling "
          "| 88% reachable | +50% reachable | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    figures: dict[str, list[float]] = {k: [] for k in ("useful", "share", "gain", "gain_ceiling", "naive")}
    for seed in args.seeds:
        started = time.perf_counter()
        naive, ours = mixed_rows(MixedSpec(seed=seed, hours=args.hours))
        took = time.perf_counter() - started
        ceiling = float(ours["useful_ceiling"])  # type: ignore[arg-type]
        useful, naive_useful = float(ours["useful_utilisation"]), float(naive["useful_utilisation"])  # type: ignore[arg-type]
        naive_training = float(naive["training_gpu_hours_per_hour"])  # type: ignore[arg-type]
        gain = float(ours["training_gpu_hours_per_hour"]) / naive_training - 1  # type: ignore[arg-type]
        gain_ceiling = float(ours["training_gpu_hours_per_hour_ceiling"]) / naive_training - 1  # type: ignore[arg-type]
        for key, value in (("useful", useful), ("share", useful / ceiling), ("gain", gain),
                           ("gain_ceiling", gain_ceiling), ("naive", naive_useful)):
            figures[key].append(value)
        print(f"| {seed} | {float(ours['demand_ratio']):.0%} | {naive_useful:.1%} | {useful:.1%} | {ceiling:.1%} "  # type: ignore[arg-type]
              f"| {useful / ceiling:.1%} | {gain:+.1%} | {gain_ceiling:+.1%} | {'yes' if ceiling >= USEFUL_GOAL else 'no'} "
              f"| {'yes' if gain_ceiling >= GAIN_GOAL else 'no'} | {took:.1f} |")
    median = {k: statistics.median(v) for k, v in figures.items()}
    print(f"\nmedians over {len(args.seeds)} seeds: gpuwarden useful {median['useful']:.1%} (min {min(figures['useful']):.1%}), "
          f"{median['share']:.1%} of the ceiling (min {min(figures['share']):.1%}); training gain {median['gain']:+.1%} "
          f"(min {min(figures['gain']):+.1%}) against a ceiling of {median['gain_ceiling']:+.1%} "
          f"(min {min(figures['gain_ceiling']):+.1%}); naive useful {median['naive']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
