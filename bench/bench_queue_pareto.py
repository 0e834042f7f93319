"""The Philly queue replay's trade-off: mean JCT against p99 wait and the worst team's guarantee.

Runs the baselines (kube-default, FIFO, Kueue, Tiresias) and variants of the gpuwarden policy on the default slice (4,000 jobs from
2017-10-09, 16 x 8 GPUs) and prints one row each: mean JCT, p99 wait (queued or suspended), worst
team's share of its asked-for guarantee, suspends. A point is on the Pareto front when no other
point is at least as good on all three and better on one; the last column does the same on mean JCT and the
worst team's guarantee alone (issue 32's two axes). docs/scheduling.md holds the figures.

    .venv/bin/python bench/bench_queue_pareto.py [--variants a,b,...]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from gpuwarden.fleet.traces import default_data_dir  # noqa: E402
from gpuwarden.scheduling.policy import POLICIES, QueuePolicy  # noqa: E402
from gpuwarden.scheduling.replay_queue import QueueSlice, build_jobs, replay_queue, slice_jobs  # noqa: E402

BASE = POLICIES["gpuwarden"]
VARIANTS: dict[str, QueuePolicy] = {
    "kube-default": POLICIES["kube-default"],
    "fifo": POLICIES["fifo"],
    "kueue": POLICIES["kueue"],
    "tiresias": POLICIES["tiresias"],
    "gpuwarden": BASE,
    "gw-gittins-edges": replace(BASE, name="gw-gittins-edges", las_thresholds=(300.0, 3600.0, 36000.0)),
    "gw-4-edges-gap2": replace(BASE, name="gw-4-edges-gap2", las_thresholds=(900.0, 3600.0, 14400.0, 57600.0), las_gap=2),
    "gw-no-guarantee-first": replace(BASE, name="gw-no-guarantee-first", guarantee_first=False),
    "gw-protect-1": replace(BASE, name="gw-protect-1", protect_after=1),
    "gw-las-takes-guarantee": replace(BASE, name="gw-las-takes-guarantee", las_keep_guarantee=False),
    "gw-defragment": replace(BASE, name="gw-defragment", defragment=True),
    "gw-las-takes-guarantee-no-first": replace(BASE, name="gw-las-takes-guarantee-no-first", las_keep_guarantee=False,
                                              guarantee_first=False),
}


def pareto(rows: list[dict[str, float]], keys: tuple[str, ...] = ("jct_mean", "wait_p99")) -> list[bool]:
    """On the front: no other row is at least as good on ``keys`` (lower is better) and on the worst team's
    guarantee met (higher is better), and better on one."""
    def figures(row: dict[str, float]) -> tuple[float, ...]:
        return (*(row[k] for k in keys), -row["worst_team_guarantee_met"])

    def dominates(a: dict[str, float], b: dict[str, float]) -> bool:  # equal figures dominate neither way
        fa, fb = figures(a), figures(b)
        return all(x <= y for x, y in zip(fa, fb)) and fa != fb
    return [not any(dominates(o, r) for o in rows) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    spec = QueueSlice()
    frame, guarantees = slice_jobs(default_data_dir(), spec)
    jobs = build_jobs(frame, spec.gpus_per_node, pd.Timestamp(spec.start, tz="UTC"))
    rows = []
    for name in args.variants.split(","):
        result = replay_queue(jobs, guarantees, VARIANTS[name], spec)
        rows.append(result.as_dict())
        r = rows[-1]
        print(f"{name:24s} jct {r['jct_mean']:>9,.0f}  wait p99 {r['wait_p99']:>9,.0f}  wait mean {r['wait_mean']:>8,.0f}  "
              f"delay p99 {r['queue_delay_p99']:>8,.0f}  worst team {r['worst_team_guarantee_met']:.3f}  "
              f"suspends {r['suspends']:>5}  {r['seconds']:.0f} s", flush=True)
    print("\n| policy | mean JCT (s) | p99 wait (s) | worst team's guarantee met | front (JCT, p99, guarantee) "
          "| front (JCT, guarantee) |\n|---|---|---|---|---|---|")
    for r, front3, front2 in zip(rows, pareto(rows), pareto(rows, ("jct_mean",))):
        print(f"| {r['policy']} | {r['jct_mean']:,.0f} | {r['wait_p99']:,.0f} | {r['worst_team_guarantee_met']:.3f} "
              f"| {'on' if front3 else 'dominated'} | {'on' if front2 else 'dominated'} |")
    if not math.isfinite(sum(r["jct_mean"] for r in rows)):
        sys.exit(1)


if __name__ == "__main__":
    main()
