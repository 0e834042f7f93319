"""The live scheduling round at fleet scale, without the API server: what the round adds to the planner.

A snapshot of ``--nodes`` 8-GPU nodes, one-GPU workloads running on ``--running`` GPUs and
``--pending`` one-GPU workloads waiting (gated), four teams sharing the fleet's guarantee. Timed,
median of ``--repeat``: the planner alone (``scheduling.plan``, the baseline, measured in the same
run), the whole round (screening bad input, attained service filled in, planning, applying through
a cluster that accepts every action, publication skipped) and the live queue document built from it.

    PYTHONPATH=. .venv/bin/python bench/bench_scheduler_round.py [--nodes 1000] [--running 8000] [--pending 2000]

Target (issue 21): 1,000 nodes, 8,000 GPUs, 10,000 pods of which 2,000 gated: plan < 1 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from builders import NOW, node, snapshot, workload  # noqa: E402

from gpuwarden.scheduler.scheduling_round import SchedulingRound  # noqa: E402
from gpuwarden.fleet import ActionResult, Placement, Team, WorkloadPhase  # noqa: E402
from gpuwarden.scheduling import plan  # noqa: E402

TEAMS = ("research", "prod", "vision", "speech")


class StaticCluster:
    """The same snapshot every round; every action accepted (the round's own cost, not the API's)."""

    def __init__(self, nodes: int, running: int, pending: int) -> None:
        fleet = [node(f"n{i:04d}", gpus=8) for i in range(nodes)]
        placed = [dataclasses.replace(workload(f"run-{k}", TEAMS[k % 4], 1, on=fleet[k // 8].name),
                                      placements=(Placement(fleet[k // 8].name, f"GPU-{fleet[k // 8].name}-{k % 8}"),))
                  for k in range(running)]  # one GPU each, node by node
        waiting = [workload(f"wait-{k}", TEAMS[k % 4], 1, WorkloadPhase.PENDING,
                            submitted_at=NOW - timedelta(seconds=k)) for k in range(pending)]
        guarantee = nodes * 8 / len(TEAMS)
        self.snap = snapshot(fleet, placed + waiting, tuple(Team(t, guarantee, guarantee * 2) for t in TEAMS))

    def snapshot(self):
        return self.snap

    def apply(self, action):
        return ActionResult(action, True, "accepted")


def median_seconds(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--running", type=int, default=7000, help="GPUs held by running one-GPU workloads")
    parser.add_argument("--pending", type=int, default=2000, help="waiting (gated) one-GPU workloads")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cluster = StaticCluster(args.nodes, args.running, args.pending)
    planner_s = median_seconds(lambda: plan(cluster.snap), args.repeat)
    scheduling = SchedulingRound(cluster)
    round_s = median_seconds(scheduling.run_round, args.repeat)

    def queue_document() -> None:
        scheduling._queue = None  # built anew each time (a round builds it once)
        _ = scheduling.queue

    queue_s = median_seconds(queue_document, args.repeat)
    waiting = len(scheduling.queue["workloads"])
    print(f"{args.nodes} nodes, {len(cluster.snap.gpus)} GPUs, {len(cluster.snap.workloads)} workloads "
          f"({args.pending} waiting; {waiting} still waiting after the round), median of {args.repeat}:")
    print(f"  planner alone (baseline)   {planner_s:.3f} s")
    print(f"  scheduling round           {round_s:.3f} s  ({round_s / planner_s:.2f}x the planner)")
    print(f"  live queue document        {queue_s:.3f} s  ({queue_s / planner_s:.2f}x the planner)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
