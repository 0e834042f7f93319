"""``gpuwarden simulate placement|queue|mixed|whatif|savings``: replay traces, or your own history, through the
scheduling policies (what-if); ``savings`` (in :mod:`.savings_cmd`) finds each policy's smallest serving fleet."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .args import number, seed
from .output import FORMATS, emit, render_rows

if TYPE_CHECKING:
    from gpuwarden.scheduling.replay_mixed import MixedSpec
    from gpuwarden.scheduling.whatif import WhatIfReport

PLACEMENT_POLICIES = ("random", "bestfit", "fgd", "gpuwarden")  # checked against the replay at run time
QUEUE_POLICIES = ("fifo", "kueue", "tiresias", "gpuwarden")
WHATIF_POLICIES = QUEUE_POLICIES  # a test checks it matches scheduling.whatif.WHATIF_POLICIES
BASELINES = ("kube-default",)  # kube-scheduler's default behaviour: what users have without a queue
WHATIF_TABLES = ("policies", "teams")


def _choices(allowed: tuple[str, ...]):
    """A comma-separated list of names from ``allowed``, or a one-line error naming them."""
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(",") if x.strip())
        unknown = [x for x in names if x not in allowed]
        if not names or unknown:
            raise argparse.ArgumentTypeError(
                f"{(unknown or [text])[0]!r} is not a policy; choose from {', '.join(allowed)} (comma-separated)")
        return names
    return parse


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="replay traces through the scheduling policies",
                                   description="Replay traces through the production scheduling policies.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=type(parser))

    placement = commands.add_parser(
        "placement", help="openb placement replay (FGD paper protocol)",
        description="Place openb pods with the FGD paper's protocol (130% arrived milli-GPU, no departures) "
                    "and report the GPU allocation ratio per list and policy, beside the published results.")
    placement.add_argument("--lists", default="default",
                           help="comma-separated pod lists: names under the data folder's openb/ (e.g. default, "
                                "cpu037), CSV paths in the openb format, or 'all' for the paper's 17 (default: default)")
    placement.add_argument("--policies", type=_choices(PLACEMENT_POLICIES), default=",".join(PLACEMENT_POLICIES),
                           help=f"comma-separated policies from {', '.join(PLACEMENT_POLICIES)} (default all)")
    placement.add_argument("--seeds", type=number(int, 1, 1000), default=10, help="seeds from 42, 1..1000 (default 10: 42-51)")
    placement.add_argument("--workers", type=number(int, 1, 256), default=min(2, os.cpu_count() or 1),
                           help="worker processes, 1..256 (default: 2 or the CPU count if less)")
    _common(placement)
    placement.set_defaults(run=run_placement)

    queue = commands.add_parser(
        "queue", help="Philly queue replay: fifo, kueue, tiresias, gpuwarden",
        description="Replay a slice of the Philly trace through four queue policies on one cluster.")
    queue.add_argument("--start", type=_date, default="2017-10-09", help="slice start (UTC date)")
    queue.add_argument("--end", type=_date, default="2017-10-16", help="slice end (UTC date, exclusive)")
    queue.add_argument("--nodes", type=number(int, 1, 4096), default=16, help="8-GPU nodes, 1..4096 (default 16)")
    queue.add_argument("--max-jobs", type=number(int, 1, 10**6), default=4000,
                       help="only the first N jobs of the slice (default 4000)")
    queue.add_argument("--policies", type=_choices(QUEUE_POLICIES + BASELINES), default=",".join(QUEUE_POLICIES),
                       help=f"comma-separated policies from {', '.join(QUEUE_POLICIES + BASELINES)} (default: "
                            f"{', '.join(QUEUE_POLICIES)})")
    queue.add_argument("--trace", type=Path, help="a Philly-format CSV instead of the bundled trace "
                                                  "(columns timestamp,duration,num_gpus,cluster; must be time-ordered)")
    _common(queue)
    queue.set_defaults(run=run_queue)

    mixed = commands.add_parser("mixed", help="mixed inference + training on simulated H100/H200",
                                description="Naive whole-GPU first fit vs MIG- and topology-aware placement, "
                                            "same workload, same run.")
    mixed.add_argument("--hours", type=number(float, 1, 24 * 366), default=72.0,
                       help="simulated hours, 1..8784 (default 72)")
    mixed.add_argument("--seed", type=seed, default=42, help="random seed, 0..4294967295 (default 42)")
    _common(mixed)
    mixed.set_defaults(run=run_mixed)
    _add_whatif(commands)
    from .savings_cmd import add_savings_parser

    add_savings_parser(commands)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)


def _date(text: str) -> str:
    from .sources import timestamp

    timestamp(text)  # a one-line error for anything that is not a date
    return text.strip()


def _common(parser) -> None:
    parser.add_argument("--data-dir", type=Path, default=None, help="trace folder (default ../shared/data)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    parser.add_argument("--output", "-o", type=Path, help="write to this file instead of standard output")
    parser.add_argument("--wide", action="store_true", help="do not fit tables to 120 columns")


def _emit(args, rows: list[dict], note: str = "") -> None:
    emit(args, render_rows(rows, args.format, wide=args.wide, note=note if args.format in ("table", "markdown") else ""))


def run_placement(args: argparse.Namespace) -> int:
    from gpuwarden.fleet.traces import default_data_dir
    from gpuwarden.scheduling.replay_openb import (
        OPENB_LISTS,
        load_published,
        replay_openb,
        summarise,
    )

    data_dir = args.data_dir or default_data_dir()
    # the paper's 17, any list under the data folder by name, or a CSV path in the openb format
    lists = OPENB_LISTS if args.lists == "all" else tuple(x.strip() for x in args.lists.split(",") if x.strip())
    policies = args.policies
    started = time.perf_counter()
    results = replay_openb(data_dir, lists, policies, tuple(range(42, 42 + args.seeds)), workers=args.workers)
    table = summarise(results, load_published(data_dir))
    rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in table.to_dict("records")]
    _emit(args, rows, f"{len(results)} replays in {time.perf_counter() - started:.1f} s wall "
                      f"({args.workers} workers); alloc_pct = allocated / cluster milli-GPU at 130% arrived demand")
    return 0


def run_queue(args: argparse.Namespace) -> int:
    from gpuwarden.fleet.traces import default_data_dir
    from gpuwarden.scheduling.replay_queue import (
        QueueSlice,
        run_queue_replay,
        run_queue_replay_file,
    )

    data_dir = args.data_dir or default_data_dir()
    spec = QueueSlice(start=args.start, end=args.end, nodes=args.nodes, max_jobs=args.max_jobs)
    policies = args.policies
    started = time.perf_counter()
    if args.trace:
        from gpuwarden.fleet.inputs import MAX_SAMPLES_FILE_BYTES, checked_input

        checked_input(args.trace, "--trace", MAX_SAMPLES_FILE_BYTES)  # a FIFO or /dev/zero: refused unread
        results = run_queue_replay_file(args.trace, data_dir, spec, policies)
    else:
        results = run_queue_replay(data_dir, spec, policies)
    _emit(args, [r.as_dict() for r in results],
          f"slice {spec.start}..{spec.end}, {spec.nodes} x 8 GPUs; times in seconds; "
          f"{time.perf_counter() - started:.1f} s wall")
    return 0


def run_mixed(args: argparse.Namespace) -> int:
    from gpuwarden.scheduling.replay_mixed import MixedSpec

    _emit(args, mixed_rows(MixedSpec(hours=args.hours, seed=args.seed)))
    return 0


def mixed_rows(spec: MixedSpec) -> list[dict[str, object]]:
    """The mixed replay on the fleet the simulator's fleet generator builds from ``spec``'s pools
    (the CLI wires the simulator to the scheduling replay; bench/bench_scheduling.py calls this too)."""
    from gpuwarden.fleet import ClusterSnapshot
    from gpuwarden.scheduling.replay_mixed import run_mixed as replay
    from gpuwarden.sim.fleetgen import build_fleet

    built = build_fleet("mixed", spec.nodes, spec.gpus_per_node, None, pools=spec.pools(), leaf_nodes=4)
    fleet = ClusterSnapshot(taken_at=datetime(2026, 1, 1, tzinfo=UTC), nodes=built.nodes, gpus=built.gpus,
                            workloads=(), teams=())
    return replay(spec, fleet)


def _guarantees(text: str) -> dict[str, float]:
    """TEAM=GPUS,TEAM=GPUS (teams not named get no guarantee)."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        team, sep, value = part.partition("=")
        try:
            gpus = float(value)
        except ValueError:
            gpus = float("nan")
        if not sep or not team.strip() or not (0 <= gpus <= 10**6):
            raise argparse.ArgumentTypeError(f"{part!r} is not TEAM=GPUS with GPUS a number 0..1000000 "
                                             "(e.g. research=16,vision=8)")
        out[team.strip()] = gpus
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TEAM=GPUS pairs, comma-separated (e.g. research=16,vision=8)")
    return out


def _add_whatif(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .output import add_output_options
    from .sources import add_source_options, duration

    whatif = commands.add_parser(
        "whatif", help="replay your own history (a store or Prometheus) under each queue policy",
        description="Rebuild the workloads of a window of fleet samples (pod, GPUs or MIG slice, start, end, team) "
                    "and replay them under each queue policy on the same fleet. Reports wait, idle GPU-hours, "
                    "cost and per-team guarantee met beside the schedule as it really ran. Submission times are "
                    "not in the samples: a workload is taken as submitted at its first sample.")
    add_source_options(whatif, since_default="7d")
    policy = whatif.add_argument_group("replay")
    policy.add_argument("--policies", type=_choices(WHATIF_POLICIES), default=",".join(WHATIF_POLICIES),
                        help=f"comma-separated policies from {', '.join(WHATIF_POLICIES)} (default all)")
    policy.add_argument("--guarantees", type=_guarantees,
                        help="TEAM=GPUS,... guaranteed GPUs per team (default: the fleet split in proportion to "
                             "each team's GPU-hours in the window; teams not named get none)")
    policy.add_argument("--max-gap", type=duration, default="30m",
                        help="a pod gone longer than this and back is a new workload; shorter, a pause (default 30m)")
    pricing = whatif.add_argument_group("pricing")
    pricing.add_argument("--price-book", type=Path, help="price book YAML (default: the bundled one)")
    pricing.add_argument("--inventory", type=Path, help="node -> pool/tier YAML (default: the simulated fleet's naming)")
    add_output_options(whatif)
    whatif.add_argument("--table", choices=WHATIF_TABLES,
                        help="only this table (csv writes one table: default policies)")
    whatif.set_defaults(run=run_whatif)


def run_whatif(args: argparse.Namespace) -> int:
    from gpuwarden.analytics import Inventory, PriceBook
    from gpuwarden.scheduling.whatif import WhatIfError, whatif_report

    from .source_notes import rejected_rows_note
    from .sources import open_window

    window = open_window(args)
    price_book = PriceBook.from_yaml(args.price_book) if args.price_book else PriceBook.default()
    inventory = Inventory.from_yaml(args.inventory) if args.inventory else Inventory.default()
    started = time.perf_counter()
    try:
        report = whatif_report(window.source, window.start, window.end, tuple(args.policies), args.guarantees,
                               args.max_gap.total_seconds(), price_book, inventory)
    except WhatIfError as error:
        print(f"gpuwarden: error: {error}", file=sys.stderr)
        return 2
    if not report.history.workloads:  # a table of zeros would read as "no policy changes anything"
        print(f"gpuwarden: error: nothing to replay between {window.start:%Y-%m-%d %H:%M} and {window.end:%Y-%m-%d %H:%M} "
              "UTC: no sample names a pod on a GPU. What-if rebuilds workloads from the pods GPUs are attributed to "
              "(the exporter reads them from the kubelet's pod-resources socket; Prometheus must keep the pod "
              "label)" + "".join(f"; {note}" for note in report.history.notes), file=sys.stderr)
        return 2
    seconds = time.perf_counter() - started
    report.notes.extend(rejected_rows_note(window.source))  # rows the source dropped are said here too
    emit(args, render_whatif(report, args.format, args.table, args.wide, seconds))
    if window.note:  # after the results, on stderr: JSON and CSV on stdout stay clean
        sys.stdout.flush()
        print(window.note, file=sys.stderr)
    return 0


def render_whatif(report: WhatIfReport, fmt: str, table: str | None = None, wide: bool = False,
                  seconds: float | None = None) -> str:
    """The what-if report in ``fmt``: JSON is ``report.to_dict()``; CSV one table; text every table and the notes."""
    import json

    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        return render_rows(report.table(table or "policies"), "csv")
    history = report.history
    title = (f"what-if, {history.start:%Y-%m-%d %H:%M} -> {history.end:%Y-%m-%d %H:%M} UTC: "
             f"{len(history.workloads):,} workloads on {history.gpus:,} GPUs ({report.currency})")
    parts = [f"# {title}\n" if fmt == "markdown" else f"{title}\n{'=' * len(title)}\n"]
    for name in [table] if table else list(WHATIF_TABLES):
        heading = {"policies": "policies (one column each; as-it-ran first)",
                   "teams": "guarantee met per team and policy"}[name]
        parts.append(f"\n## {heading}\n\n" if fmt == "markdown" else f"\n[{heading}]\n")
        parts.append(render_rows(_side_by_side(report, name), fmt, wide=wide))
    notes = [*report.notes, *([f"replayed in {seconds:.1f} s wall"] if seconds is not None else [])]
    parts.append("\n" + "".join(("> " if fmt == "markdown" else "note: ") + n + "\n" for n in notes))
    return "".join(parts)


def _side_by_side(report: WhatIfReport, name: str) -> list[dict[str, Any]]:
    """Text tables with the policies as columns, so the as-it-ran column sits beside the replays."""
    from .output import cell

    rows = report.table(name)
    if name == "policies":
        return [{"figure": key, **{row["policy"]: cell(key, row[key], True) for row in rows}}
                for key in rows[0] if key != "policy"] if rows else []
    teams: dict[str, dict[str, Any]] = {}
    for row in rows:
        line = teams.setdefault(row["team"], {"team": row["team"],
                                              "guarantee_gpus": cell("guarantee_gpus", row["guarantee_gpus"], True)})
        line[row["policy"]] = cell("guarantee_met_ratio", row["guarantee_met_ratio"], True)
    return list(teams.values())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0)
