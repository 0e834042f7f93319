"""The same decisions live and in the simulator, on a larger slice (issue 21 item 7).

A slice of the simulator's own Philly training arrivals (``--hours`` of the trace, at most
``--jobs`` jobs, submitted ``--speedup`` times as fast, run times capped at ``--max-job-hours``,
``--load`` times the training demand) is played into the in-process simulator (arrivals off) and
into the fake cluster over HTTP (``SchedulingRound(KubeCluster)``, official client), both with the
simulator's ``--nodes`` x 8-GPU fleet (its pools, MIG nodes included) and teams, for
``--horizon-hours`` of virtual time. ``tests/parity_harness.py`` says how each side is set up.

Printed: jobs, admissions (bind / resume) and stops each side, the length of the
agreeing prefix, the first divergence (or none), the wall time of each side and the ratio
live / sim (the simulator's time includes rendering its fleet samples every step), and how many
live resumes were carried out (their pods admitted onto the nodes held for them) before it.

    PYTHONPATH=. .venv/bin/python bench/bench_live_replay_parity.py [--nodes 8] [--jobs 400]

A resume is carried out in two steps live (the Job unsuspended with its nodes held, its new gated
pods admitted there a round later) and decided the same; its pods start a round later, so it ends a
round later than in the simulator, and from its end the two fleets free GPUs at different times (see
``tests/scheduler/test_live_replay_parity.py``): the first divergence is where that lag first changes a choice.
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
        until = min(entry[0] for entry in (ours, theirs) if entry is not None)
        ended = [key for at, key, _ in live.carried_out if at <= until]
        print(f"  live resumes carried out onto their held nodes before it: {len(ended)}")
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
