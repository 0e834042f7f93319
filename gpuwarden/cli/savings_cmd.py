"""``gpuwarden simulate savings``: the smallest fleet that serves one window of a trace, or of your
own history (``--since``, a store or Prometheus), per queue policy, and the GPU-hours gpuwarden saves
against kube-default and Kueue (docs/savings.md)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .args import number
from .output import emit, render_rows

if TYPE_CHECKING:
    from gpuwarden.scheduling.savings import SavingsReport
    from gpuwarden.scheduling.tiers import TierPrices

# gpuwarden.scheduling.tiers' defaults (a test checks they agree): not imported, so --help loads no numpy
DEFAULT_RECLAIMS_PER_HOUR = 0.05
DEFAULT_CHECKPOINT_SECONDS = 60.0
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"

DESCRIPTION = """\
For each queue policy, find the smallest fleet of whole 8-GPU nodes that serves one window of a
trace: every job submitted in the window has finished by the window's end plus its tail (the
longest job's duration), and every team's p95 wait (time between submission and finish not
holding GPUs: queued or suspended) is within --slo-wait. The search starts at --gpus, steps
down or up (1, 2, 4, ... nodes) and bisects; every replay is cached by (policy, nodes) and
counted. Reports per policy the fleet, GPU-hours provisioned (nodes x 8 x the time from the
window's start to the last job's finish), useful GPU-hours (GPUs x duration asked for),
utilisation, mean JCT, p95 wait and the worst team's guarantee met; and gpuwarden's GPU-hours
saved against kube-default (when that policy exists) and kueue.

--tiers adds, for each served policy's fleet, a procurement plan over its replay's GPUs in use:
reserved GPUs by the classic rule (the r-th GPU when the load is >= r for at least
reserved/on-demand price of the time), spot for checkpointable load above them (reclaims at
--spot-reclaims-per-hour, checkpoints every sqrt(2 C / rate) by Young/Daly, C =
--checkpoint-seconds, the work lost counted), on-demand for the rest; its cost against the same
load all on-demand (cost_saved_pct), priced from the price book (--price-book, --gpu-model).

Your own history instead of a trace (--since 7d, and --store PATH or --source file|prometheus, as
`gpuwarden simulate whatif` reads it): the workloads of the window's fleet samples, rebuilt as the
what-if rebuilds them (each pod submitted at its first sample, as checkpointable training, MIG and
time-sliced shares rounded up to whole GPUs; each team's guarantee share its share of the window's
GPU-hours), searched from the fleet's own size unless --gpus is given.

A jobs CSV (--trace FILE) has one row per job and the columns
  submitted         submit time, ISO 8601 (UTC unless a zone is given), e.g. 2017-10-09 14:00:00
  duration_seconds  run time once started, seconds >= 0
  gpus              whole GPUs, >= 0 (0-GPU jobs are left out; more than 8: a gang of 8-GPU pods)
  team              the submitting team, not empty (teams get equal guarantees)
  checkpointable    optional: true/false, yes/no, 1/0 (default true)
in any order; other columns are ignored. Example:
  submitted,duration_seconds,gpus,team,checkpointable
  2017-10-09 00:00:00,3600,8,vision,true
"""


def _policy_list(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated policy names (e.g. kueue,gpuwarden)")
    return names


def _date(text: str) -> str:
    """A UTC date or date-time, as written (a one-line error for anything else)."""
    from .sources import timestamp

    timestamp(text)
    return text.strip()


def add_savings_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .output import add_output_options
    from .sources import add_source_options, duration

    savings = commands.add_parser(
        "savings", help="smallest fleet per queue policy for one trace window; GPU-hours gpuwarden saves",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    savings.add_argument("--trace", default=None,
                         help="'philly' (the bundled Philly jobs) or a jobs CSV (format above; default philly)")
    savings.add_argument("--start", type=_date, default=None,
                         help="window start, a UTC date or date-time (default: 2017-10-09 for philly, "
                              "the first submission for a jobs CSV)")
    savings.add_argument("--days", type=number(float, 0, 3660, above=True), default=None,
                         help="window length in days, > 0 (default: 2 for philly; all of a jobs CSV)")
    savings.add_argument("--max-jobs", type=number(int, 1, 10**6), default=None,
                         help="only the first N jobs of the window (default: all)")
    savings.add_argument("--gpus", type=number(int, 1, 8 * 4096), default=None,
                         help="fleet size the search starts from, in GPUs (rounded up to 8-GPU nodes; default 256, "
                              "for your history the fleet's own GPUs)")
    savings.add_argument("--slo-wait", type=duration, default="1h",
                         help="each team's p95 wait must be at most this (e.g. 30m, 1h, 2h30m; default 1h)")
    savings.add_argument("--policies", type=_policy_list, default=None,
                         help="comma-separated queue policies (default: every queue policy: kube-default when "
                              "present, fifo, kueue, tiresias, gpuwarden)")
    savings.add_argument("--data-dir", type=Path, default=None, help="trace folder (default ../shared/data)")
    tiers = savings.add_argument_group("cost by tier (--tiers)")
    tiers.add_argument("--tiers", action="store_true",
                       help="add a reserved/spot/on-demand plan per served policy and its cost against all on-demand")
    tiers.add_argument("--spot-reclaims-per-hour", type=number(float, 0, 3600), default=DEFAULT_RECLAIMS_PER_HOUR,
                       help=f"spot reclaims per running spot job per hour, >= 0 (default {DEFAULT_RECLAIMS_PER_HOUR:g}: "
                            "an assumption, see docs/savings.md)")
    tiers.add_argument("--checkpoint-seconds", type=number(float, 0, 86400), default=DEFAULT_CHECKPOINT_SECONDS,
                       help=f"seconds one checkpoint costs, >= 0 (0: free checkpoints; default "
                            f"{DEFAULT_CHECKPOINT_SECONDS:g})")
    tiers.add_argument("--gpu-model", default=DEFAULT_GPU_MODEL,
                       help=f"the price book entry the fleet's GPUs are priced at (default {DEFAULT_GPU_MODEL})")
    tiers.add_argument("--price-book", type=Path, default=None,
                       help="price book YAML (default: $GPUWARDEN_PRICE_BOOK, else the bundled one)")
    add_output_options(savings)
    add_source_options(savings, since_default="7d")  # your own history instead of --trace
    # None: not given, so any of them given means "your history" (open_window gets the defaults back)
    savings.set_defaults(run=run_savings, since=None, source=None, store=None)


SUBMISSION_NOTE = ("submission times are not in the samples: each workload is taken as submitted at its first sample "
                   "(queueing before it started is not seen)")
TRACE_FLAGS = ("trace", "start", "days", "max_jobs", "data_dir")
HISTORY_FLAGS = ("since", "until", "source", "store", "file", "prometheus_url")


def is_history(args: argparse.Namespace) -> bool:
    """Whether the arguments name your own history (a source option given) rather than a trace."""
    return any(getattr(args, flag, None) is not None for flag in HISTORY_FLAGS)


def savings_report(args: argparse.Namespace) -> tuple[SavingsReport, list[str]]:
    """The search the arguments ask for (a trace's window, or your history's), and notes about its
    input (history only). Also run by ``scripts/savings_plots.py``."""
    from gpuwarden.fleet.paths import default_data_dir
    from gpuwarden.scheduling.errors import SchedulingError
    from gpuwarden.scheduling.policy import POLICIES
    from gpuwarden.scheduling.savings import find_savings, savings_policies
    from gpuwarden.scheduling.savings_jobs import file_workload, philly_workload

    policies = args.policies or savings_policies()
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SchedulingError(f"--policies: {unknown[0]!r} is not a queue policy; choose from {', '.join(POLICIES)}")
    if is_history(args):
        return _history_report(args, tuple(policies))
    trace = args.trace or "philly"
    if trace == "philly":
        workload = philly_workload(args.data_dir or default_data_dir(), args.start, args.days, args.max_jobs)
    else:
        from gpuwarden.fleet.inputs import MAX_SAMPLES_FILE_BYTES, checked_input

        path = Path(trace)
        checked_input(path, "--trace", MAX_SAMPLES_FILE_BYTES)  # a FIFO or /dev/zero: refused unread
        workload = file_workload(path, args.start, args.days, args.max_jobs)
    gpus = 256 if args.gpus is None else args.gpus
    return find_savings(workload, policies, gpus, args.slo_wait.total_seconds()), []


def _history_report(args: argparse.Namespace, policies: tuple[str, ...]) -> tuple[SavingsReport, list[str]]:
    from gpuwarden.scheduling.errors import SchedulingError
    from gpuwarden.scheduling.savings_history import history_savings
    from .source_notes import rejected_rows_note
    from .sources import open_window

    clash = [f"--{flag.replace('_', '-')}" for flag in TRACE_FLAGS if getattr(args, flag, None) is not None]
    if clash:
        raise SchedulingError(f"{clash[0]}: a trace's flag; your history's window is --since/--until "
                              "(give either a trace or a samples source, not both)")
    args.source = args.source or "local"
    args.since = args.since or "7d"
    if args.store is None:
        from .storemark import DEFAULT_STORE

        args.store = DEFAULT_STORE
    window = open_window(args)
    found = history_savings(window.source, window.start, window.end, policies, args.slo_wait.total_seconds(),
                            args.gpus)
    if found.report is None:
        raise SchedulingError(f"--since: no savings figure between {window.start:%Y-%m-%d %H:%M} and "
                              f"{window.end:%Y-%m-%d %H:%M} UTC: {found.why}")
    notes = [SUBMISSION_NOTE, f"the fleet seen in the window: {found.fleet_gpus:,} GPUs", *found.notes,
             *rejected_rows_note(window.source)]
    return found.report, notes + ([window.note.removeprefix("note: ")] if window.note else [])


def run_savings(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    prices = _tier_prices(args) if args.tiers else None  # a bad price book or model: refused before any replay
    report, notes = savings_report(args)
    if prices is not None:
        from gpuwarden.scheduling.savings import JOB_MODEL
        from gpuwarden.scheduling.tiers import SpotModel

        report.add_tiers(prices, SpotModel(args.spot_reclaims_per_hour, args.checkpoint_seconds,
                                           JOB_MODEL.resume_overhead))
    emit(args, render_savings(report, args.format, args.wide, time.perf_counter() - started, notes))
    sys.stdout.flush()  # after the results, on stderr: JSON and CSV on stdout stay clean
    if args.format in ("json", "csv"):
        for line in notes:
            print(f"note: {line}", file=sys.stderr)
    for line in report.unserved():
        print(f"gpuwarden: warning: {line}", file=sys.stderr)
    return 0


def _tier_prices(args: argparse.Namespace) -> TierPrices:
    from gpuwarden.analytics.pricebook import PriceBookError
    from gpuwarden.analytics.pricing_files import load_pricing
    from gpuwarden.scheduling.errors import SchedulingError
    from gpuwarden.scheduling.tiers import TierPrices

    book, _ = load_pricing(args.price_book)  # a bad file: PriceBookError naming it
    try:
        return TierPrices.from_book(book, args.gpu_model)
    except PriceBookError as error:
        raise SchedulingError(f"--gpu-model: {error}") from None


def render_savings(report: SavingsReport, fmt: str, wide: bool = False, seconds: float | None = None,
                   extra_notes: Sequence[str] = ()) -> str:
    """JSON: ``report.to_dict()``; CSV: one row per policy; a table or markdown: the rows and notes
    (``extra_notes`` after them: about your history's input)."""
    import json

    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"
    if fmt == "csv":
        return render_rows(report.rows(with_tiers=True), "csv")
    w = report.workload
    saved = ", ".join(f"{pct:.1f}% {key.removeprefix('vs_').replace('_', '-')}" if pct is not None else
                      f"n/a {key.removeprefix('vs_').replace('_', '-')}" for key, pct in report.saved().items())
    notes = [f"window {w.start:%Y-%m-%d %H:%M} UTC + {w.window_seconds / 86400:g} d of {w.trace}: {len(w.jobs):,} "
             f"GPU jobs; tail {w.tail_seconds / 3600:.1f} h (the longest job): every job done by "
             f"{w.deadline_seconds / 3600:.1f} h; every team's p95 wait <= {report.slo_seconds:g} s",
             f"nodes = the smallest fleet of 8-GPU nodes that serves it (search from {report.start_nodes} nodes, "
             f"bounds {w.min_nodes()}..{w.max_nodes()}); times in seconds; wait_p95 over all jobs",
             f"gpuwarden saves GPU-hours provisioned vs: {saved}",
             f"{sum(report.replays.values())} replays" + (f" in {seconds:.1f} s wall" if seconds is not None else ""),
             *extra_notes]
    prefix = "> " if fmt == "markdown" else "note: "
    text = render_rows(report.rows(), fmt, wide=wide) + "\n" + "".join(prefix + n + "\n" for n in notes)
    if report.tiers is None:
        return text
    return text + "\n" + render_rows(report.tier_rows(), fmt, wide=wide) + "\n" + "".join(
        prefix + n + "\n" for n in _tier_notes(report.tiers))


def _tier_notes(tiers: dict[str, Any]) -> list[str]:
    p, interval = tiers["prices_per_gpu_hour"], tiers["checkpoint_interval_seconds"]
    every = "never (no reclaims)" if interval is None else f"every {interval:,.0f} s (Young/Daly)"
    return [f"price book {tiers['price_book']['identity']}: {tiers['gpu_model']} per GPU-hour on-demand "
            f"{p['on-demand']:g}, reserved {p['reserved']:g}, spot {p['spot']:g} {tiers['currency']}",
            f"reserved: the r-th GPU when the load is >= r for >= {p['reserved'] / p['on-demand']:.3f} of the horizon; "
            f"spot for checkpointable load above it" + ("" if tiers["spot_used"] else " (not used: it costs more "
                                                         "than on-demand, losses counted)") + "; on-demand the rest",
            f"spot: {tiers['spot_reclaims_per_hour']:g} reclaims per job-hour, checkpoint {tiers['checkpoint_seconds']:g} s "
            f"{every}, restart {tiers['restart_seconds']:g} s: {tiers['spot_lost_fraction']:.1%} of spot hours lost",
            "cost_saved_pct: against the same GPUs-in-use all on-demand (paid only while held)"]
