"""``gpuwarden sim``: generate fleet samples (and the fault ground truth) from the simulated fleet."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .args import number
from .simconfig import add_sim_options, recording_ends_at, sim_config_from
from .sources import timestamp
from .storemark import adopt_store, checked_store, store_path

MAX_DAYS = 366


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("sim", help="simulated fleet tools", description="Simulated fleet tools.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=type(parser))
    generate = commands.add_parser(
        "generate", help="generate fleet samples to a file or store",
        description="Run the simulated fleet for --days and write its fleet samples to --out (.csv, .csv.gz, "
                    ".parquet) or into --store; the injected faults go to --ground-truth, never into the samples. "
                    "The recorded days end at now unless --start (or a --config file) dates them.",
    )
    generate.add_argument("--days", type=number(float, 0, MAX_DAYS, above=True), default=1.0,
                          help=f"simulated days to record, up to {MAX_DAYS} (default 1)")
    target = generate.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, help="samples file (.csv, .csv.gz or .parquet)")
    target.add_argument("--store", type=store_path, help="append into this embedded store directory")
    generate.add_argument("--ground-truth", type=Path, help="write the injected faults here (.csv or .parquet)")
    generate.add_argument("--start", type=timestamp,
                          help="where the recorded days begin, ISO-8601 UTC; the first sample is one step later "
                               "(default: --days before now, so a report over the last days sees them; a --config "
                               "file's start is kept); same seed and start, same samples")
    add_sim_options(generate)
    generate.set_defaults(run=run_generate)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)


def run_generate(args: argparse.Namespace) -> int:
    from gpuwarden.store import LocalStore, SamplesError, write_samples

    from .simfleet import simulated_fleet

    for flag, path in (("--out", args.out), ("--ground-truth", args.ground_truth)):
        if path is not None and not str(path).lower().endswith((".csv", ".csv.gz", ".parquet")):
            raise SamplesError(f"{flag} {path}: unknown file type; expected .csv, .csv.gz or .parquet")
        if path is not None and path.is_dir():
            raise SamplesError(f"{flag} {path}: is a directory; expected a file name")
    store_root = checked_store(args.store) if args.store else None  # refused before minutes of simulation
    config = sim_config_from(args)
    if args.start is not None:
        config = config.replace(start=args.start.to_pydatetime())
    elif not args.config:  # the recorded days end at now: `report --since 7d` over the store sees them
        import pandas as pd

        config = recording_ends_at(config, pd.Timestamp.now(tz="UTC"), args.days)
    started = time.perf_counter()
    simulation = simulated_fleet(config)
    steps = int(round(args.days * 86400 / config.step_seconds))
    rows = 0
    if store_root is not None:
        from gpuwarden.fleet.clock import ModelClock

        store = LocalStore(store_root, clock=ModelClock(lambda: simulation.now))  # simulated samples, simulated clock
        for frame in simulation.iter_chunks(steps):
            rows += store.append(frame)
        adopt_store(args.store)
    else:
        import pandas as pd

        frame = pd.concat(list(simulation.iter_chunks(steps)), ignore_index=True)
        write_samples(frame, args.out)
        rows = len(frame)
    truth = simulation.ground_truth()
    if args.ground_truth:
        if args.ground_truth.suffix == ".parquet":
            truth.to_parquet(args.ground_truth, index=False)
        else:
            truth.to_csv(args.ground_truth, index=False)
    print(f"{rows:,} samples for {len(simulation.gpus)} GPUs over {args.days:g} days, {len(truth)} faults injected, "
          f"in {time.perf_counter() - started:.1f} s -> {args.out or args.store}", file=sys.stdout)
    return 0
