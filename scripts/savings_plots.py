"""Plots of one ``gpuwarden simulate savings`` run (docs/savings.md), PNG with matplotlib:

- ``savings_wait_cdf.png``: per policy, the CDF of each job's wait (seconds between submission and
  finish not holding GPUs, queued or suspended: what the SLO judges) on that policy's smallest
  serving fleet, with the SLO marked;
- ``savings_utilisation.png``: per policy, the share of that fleet's GPUs held over time (GPUs
  held / fleet GPUs, from the window's start to the last finish: the horizon GPU-hours provisioned
  count), over the whole horizon and over the window itself.

    .venv/bin/python scripts/savings_plots.py                                  # the tests' Philly window
    .venv/bin/python scripts/savings_plots.py --trace jobs.csv --out-dir /tmp/plots

The search is the command's own (``gpuwarden.cli.savings_cmd.savings_report``), with its flags
and defaults. Policies that no fleet served have no series (the script says so). matplotlib is a
test dependency, not the package's: only this script imports it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # not pyplot: no display, no global figures to close

from gpuwarden.cli.args import number
from gpuwarden.cli.savings_cmd import _date, _policy_list, savings_report
from gpuwarden.cli.sources import duration
from gpuwarden.scheduling.savings import SavingsReport
from gpuwarden.scheduling.savings_jobs import GPUS_PER_NODE

ROOT = Path(__file__).resolve().parents[1]
WAIT_CDF_PNG = "savings_wait_cdf.png"
UTILISATION_PNG = "savings_utilisation.png"
COLOURS = {"kube-default": "#d62728", "fifo": "#7f7f7f", "kueue": "#1f77b4", "tiresias": "#ff7f0e",
           "gpuwarden": "#2ca02c"}
STYLES = {"kube-default": "-", "fifo": ":", "kueue": "-.", "tiresias": (0, (5, 2)), "gpuwarden": "-"}  # overlaps stay legible


def served(report: SavingsReport) -> list[str]:
    """The policies with a fleet that served (the only ones with waits and a load)."""
    return [p for p, o in report.outcomes.items() if o.served and o.waits is not None and o.load is not None]


def wait_cdf(report: SavingsReport, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """(waits in seconds, sorted; the share of jobs that waited at most that long)."""
    waits = np.sort(np.asarray(report.outcomes[policy].waits, dtype=float))
    return waits, np.arange(1, len(waits) + 1) / len(waits)


def utilisation_series(report: SavingsReport, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """(the load curve's edges in hours, GPUs held / fleet GPUs in each interval): one value fewer
    than edges, a step function."""
    outcome = report.outcomes[policy]
    assert outcome.load is not None
    return outcome.load.edges / 3600.0, outcome.load.held / (outcome.nodes * GPUS_PER_NODE)


def _title(report: SavingsReport) -> str:
    w = report.workload
    return (f"{w.trace}, {w.start:%Y-%m-%d %H:%M} UTC + {w.window_seconds / 86400:.3g} d: {len(w.jobs):,} GPU jobs, "
            f"each policy on its smallest serving fleet (p95 wait SLO {report.slo_seconds / 3600:g} h per team)")


def wait_cdf_figure(report: SavingsReport) -> Figure:
    """One line per served policy: the CDF of its jobs' waits, on a log scale linear below a minute;
    the share axis starts at the tenth below the lowest share that never waited."""
    figure = Figure(figsize=(10, 5.5), layout="constrained")
    axes = figure.subplots()
    lowest = 1.0
    for policy in served(report):
        waits, share = wait_cdf(report, policy)
        lowest = min(lowest, float(np.searchsorted(waits, 0.0, side="right")) / len(waits))  # never waited
        figures = report.policy_figures(policy)
        axes.step(waits, share, where="post", color=COLOURS.get(policy), linestyle=STYLES.get(policy, "-"), linewidth=1.6,
                  label=f"{policy}: {figures['nodes']} nodes, p95 {figures['wait_p95']:,.0f} s, "
                        f"max {waits[-1]:,.0f} s")
    axes.axvline(report.slo_seconds, color="black", linestyle="--", linewidth=1, label="SLO (each team's p95)")
    axes.set_xscale("symlog", linthresh=60.0)
    axes.set_xlim(left=0)
    axes.set_ylim(max(0.0, np.floor(lowest * 10) / 10 - 0.1), 1.005)
    axes.set_xlabel("job wait, seconds (queued or suspended; linear below 60 s, log above)")
    axes.set_ylabel("share of jobs waiting at most that long")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(loc="lower right", fontsize=9)
    figure.suptitle("Wait-time CDF per policy\n" + _title(report), fontsize=10)
    return figure


def utilisation_figure(report: SavingsReport) -> Figure:
    """Per served policy, GPUs held / fleet GPUs over time: the whole horizon, and the window alone."""
    figure = Figure(figsize=(10, 7.5), layout="constrained")
    whole, window = figure.subplots(2, 1)
    window_hours = report.workload.window_seconds / 3600.0
    for policy in served(report):
        edges, ratio = utilisation_series(report, policy)
        figures = report.policy_figures(policy)
        label = f"{policy}: {figures['nodes']} nodes, utilisation {figures['utilisation']:.3f} (useful / provisioned)"
        for axes in (whole, window):
            axes.stairs(ratio, edges, color=COLOURS.get(policy), linestyle=STYLES.get(policy, "-"), linewidth=1.2,
                        label=label, baseline=None)
    whole.set_title("the whole horizon (the window's start to each policy's last finish)", fontsize=9)
    window.set_title(f"the window ({window_hours:.4g} h)", fontsize=9)
    window.set_xlim(0, window_hours)
    for axes in (whole, window):
        axes.set_ylim(0, 1.02)
        axes.set_xlabel("hours from the window's start")
        axes.set_ylabel("GPUs held / fleet GPUs")
        axes.grid(True, alpha=0.3)
    whole.legend(loc="upper right", fontsize=8)
    figure.suptitle("Fleet utilisation over time per policy\n" + _title(report), fontsize=10)
    return figure


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=None, help="'philly' or a jobs CSV (default philly)")
    parser.add_argument("--start", type=_date, default=None, help="window start, a UTC date or date-time")
    parser.add_argument("--days", type=number(float, 0, 3660, above=True), default=None, help="window length in days")
    parser.add_argument("--max-jobs", type=number(int, 1, 10**6), default=None, help="only the first N jobs")
    parser.add_argument("--gpus", type=number(int, 1, 8 * 4096), default=None,
                        help="fleet size the search starts from, GPUs (default 256)")
    parser.add_argument("--slo-wait", type=duration, default="1h", help="each team's p95 wait limit (default 1h)")
    parser.add_argument("--policies", type=_policy_list, default=None, help="comma-separated (default: all)")
    parser.add_argument("--data-dir", type=Path, default=None, help="trace folder (default ../shared/data)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "img",
                        help="where the PNGs go (default docs/img)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from gpuwarden.fleet.errors import UserError

    args = parse(argv)
    started = time.perf_counter()
    try:
        report, _ = savings_report(args)
    except UserError as error:  # a bad trace or window: one line, as the command says it
        print(f"savings_plots: error: {error}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, draw in ((WAIT_CDF_PNG, wait_cdf_figure), (UTILISATION_PNG, utilisation_figure)):
        draw(report).savefig(args.out_dir / name, dpi=110)
    for line in report.unserved():
        print(f"warning: no series for {line}", file=sys.stderr)
    print(f"wrote {args.out_dir / WAIT_CDF_PNG} and {args.out_dir / UTILISATION_PNG} "
          f"({sum(report.replays.values())} replays, {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
