"""``gpuwarden simulate placement|queue|mixed``: replay traces through the scheduling policies (what-if)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from gpuwarden.fleet.traces import default_data_dir

from .args import positive_int


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="replay traces through the scheduling policies",
                                   description="Replay traces through the production scheduling policies.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=type(parser))

    placement = commands.add_parser(
        "placement", help="openb placement replay (FGD paper protocol)",
        description="Place openb pods with the FGD paper's protocol (130%% arrived milli-GPU, no departures) "
                    "and report the GPU allocation ratio per list and policy, beside the published results.")
    placement.add_argument("--lists", default="default",
                           help="comma-separated pod lists, or 'all' for the paper's 17 (default: default)")
    placement.add_argument("--policies", default="random,bestfit,fgd,gpuwarden", help="comma-separated policies")
    placement.add_argument("--seeds", type=positive_int, default=10, help="seeds from 42 (default 10: 42-51)")
    placement.add_argument("--workers", type=positive_int, default=min(2, os.cpu_count() or 1))
    _common(placement)
    placement.set_defaults(run=run_placement)

    queue = commands.add_parser(
        "queue", help="Philly queue replay: fifo, kueue, tiresias, gpuwarden",
        description="Replay a slice of the Philly trace through four queue policies on one cluster.")
    queue.add_argument("--start", default="2017-10-09", help="slice start (UTC date)")
    queue.add_argument("--end", default="2017-10-16", help="slice end (UTC date, exclusive)")
    queue.add_argument("--nodes", type=positive_int, default=16, help="8-GPU nodes (default 16)")
    queue.add_argument("--max-jobs", type=positive_int, default=4000,
                       help="only the first N jobs of the slice (default 4000)")
    queue.add_argument("--policies", default="fifo,kueue,tiresias,gpuwarden")
    queue.add_argument("--trace", type=Path, help="a Philly-format CSV instead of the bundled trace "
                                                  "(columns timestamp,duration,num_gpus,cluster; must be time-ordered)")
    _common(queue)
    queue.set_defaults(run=run_queue)

    mixed = commands.add_parser("mixed", help="mixed inference + training on simulated H100/H200",
                                description="Naive whole-GPU first fit vs MIG- and topology-aware placement, "
                                            "same workload, same run.")
    mixed.add_argument("--hours", type=float, default=72.0)
    mixed.add_argument("--seed", type=int, default=42)
    _common(mixed)
    mixed.set_defaults(run=run_mixed)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)


def _common(parser) -> None:
    parser.add_argument("--data-dir", type=Path, default=None, help="trace folder (default ../shared/data)")
    parser.add_argument("--format", choices=["table", "json"], default="table")


def _emit(args, rows: list[dict], note: str = "") -> None:
    if args.format == "json":
        print(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        print("(no rows)")
        return
    columns = list(rows[0])
    cells = [[_fmt(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    if note:
        print(note)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, dict):
        return ";".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def run_placement(args: argparse.Namespace) -> int:
    from gpuwarden.scheduling.replay_openb import OPENB_LISTS, load_published, replay_openb, summarise

    data_dir = args.data_dir or default_data_dir()
    lists = OPENB_LISTS if args.lists == "all" else tuple(x for x in args.lists.split(",") if x)
    policies = tuple(x for x in args.policies.split(",") if x)
    started = time.perf_counter()
    results = replay_openb(data_dir, lists, policies, tuple(range(42, 42 + args.seeds)), workers=args.workers)
    table = summarise(results, load_published(data_dir))
    rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in table.to_dict("records")]
    _emit(args, rows, f"{len(results)} replays in {time.perf_counter() - started:.1f} s wall "
                      f"({args.workers} workers); alloc_pct = allocated / cluster milli-GPU at 130% arrived demand")
    return 0


def run_queue(args: argparse.Namespace) -> int:
    from gpuwarden.scheduling.replay_queue import QueueSlice, run_queue_replay, run_queue_replay_file

    data_dir = args.data_dir or default_data_dir()
    spec = QueueSlice(start=args.start, end=args.end, nodes=args.nodes, max_jobs=args.max_jobs)
    policies = tuple(x for x in args.policies.split(",") if x)
    started = time.perf_counter()
    if args.trace:
        results = run_queue_replay_file(args.trace, data_dir, spec, policies)
    else:
        results = run_queue_replay(data_dir, spec, policies)
    _emit(args, [r.as_dict() for r in results],
          f"slice {spec.start}..{spec.end}, {spec.nodes} x 8 GPUs; times in seconds; "
          f"{time.perf_counter() - started:.1f} s wall")
    return 0


def run_mixed(args: argparse.Namespace) -> int:
    from gpuwarden.scheduling.replay_mixed import MixedSpec, run_mixed as replay

    rows = replay(MixedSpec(hours=args.hours, seed=args.seed))
    _emit(args, rows)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0)
