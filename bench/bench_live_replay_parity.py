"""The same decisions live and in the simulator, on a larger slice (issue 21 item 7).

A slice of the simulator's own Philly training arrivals (``--hours`` of the trace, at most
``--jobs`` jobs, submitted ``--speedup`` times as fast, run times capped at ``--max-job-hours``,
``--load`` times the training demand) is played into the in-process simulator (arrivals off) and
into the fake cluster over HTTP (``SchedulingRound(KubeCluster)``, official client), both with the
simulator's ``--nodes`` x 8-GPU fleet (its pools, MIG nodes included) and teams, for
``--horizon-hours`` of virtual time. ``tests/parity_harness.py`` says how each side is set up.

Printed: jobs, admissions (bind / resume) and stops each side, the length of the
agreeing prefix, the first divergence (or none), the wall time of each side and the ratio
live / sim (the simulator's time includes rendering its fleet samples every step), and the live
re-admissions of resumed jobs (the known difference below) before the divergence.

    PYTHONPATH=. .venv/bin/python bench/bench_live_replay_parity.py [--nodes 8] [--jobs 400]

Known difference (see ``tests/test_live_replay_parity.py``): the planner's RESUME carries
placements; the simulator starts the job on them in that round, while a Job in a queue namespace
resumes unpinned and its new, gated pods are admitted by a BIND in a later round.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from parity_harness import config, first_divergence, play_live, play_sim, record_slice  # noqa: E402


def run(args: argparse.Namespace) -> None:
    cfg = config(nodes=args.nodes, max_job_hours=args.max_job_hours, training_load=args.load)
    jobs = record_slice(cfg, hours=args.hours, jobs=args.jobs, speedup=args.speedup)
    horizon = int(args.horizon_hours * 3600)
    sim, simulation = play_sim(cfg, jobs, horizon)
    with tempfile.TemporaryDirectory() as workdir:
        live = play_live(simulation, jobs, horizon, Path(workdir))
    divergence = first_divergence(sim, live)
    agreeing = divergence[0] if divergence else len(sim.admissions)
    print(f"{len(jobs)} jobs, {args.nodes} x 8 GPUs, {args.horizon_hours:g} h of rounds every 60 s")
    for name, side in (("sim", sim), ("live", live)):
        kinds = Counter(kind for _, kind, _, _ in side.admissions)
        print(f"  {name:4s}: {len(side.admissions)} admissions ({kinds['bind']} bind, {kinds['resume']} resume), "
              f"{len(side.stops)} stops, {side.rounds} rounds, {side.seconds:.2f} s")
    print(f"  agreeing prefix: {agreeing} admissions; stops equal: {sim.stops == live.stops}")
    if divergence is None:
        print("  first divergence: none")
    else:
        index, ours, theirs = divergence
        print(f"  first divergence at admission {index}: sim {ours} | live {theirs}")
        resumed: set[str] = set()
        readmitted = []
        until = min(entry[0] for entry in (ours, theirs) if entry is not None)
        for at, kind, key, _ in live.admissions:
            if at > until:
                break
            if kind == "resume":
                resumed.add(key)
            elif key in resumed:
                readmitted.append(key)
        print(f"  live BINDs of resumed jobs up to its round (queue-namespace resume, admitted a round later): {readmitted}")
    print(f"  time live / sim: {live.seconds / sim.seconds:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--hours", type=float, default=48.0)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--speedup", type=float, default=8.0)
    parser.add_argument("--max-job-hours", type=float, default=2.0)
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument("--horizon-hours", type=float, default=6.0)
    args = parser.parse_args()
    run(args)


if __name__ == "__main__":
    main()
