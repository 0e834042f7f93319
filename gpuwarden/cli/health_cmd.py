"""``gpuwarden health``: scan fleet samples for health findings; run the evaluation harness on the
simulated fleet; fit the Titan GPU-lifetime survival model.

    gpuwarden health scan --source local|file|prometheus [--file PATH] --since 24h --format table|json
    gpuwarden health eval --seed N --days D [--nodes 64] [--rate 0.004]
    gpuwarden health titan [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from gpuwarden.analytics.health import StreamingScanner, scan
from gpuwarden.analytics.health.evaluation import REPORTING_SEEDS, TUNING_SEEDS, EvalReport, combine, evaluate
from gpuwarden.fleet import Finding
from gpuwarden.fleet.traces import default_data_dir
from gpuwarden.sim import SimConfig, Simulation
from gpuwarden.sim.faults import KINDS

from .args import positive_float, positive_int
from .sources import add_source_options, open_window

DEFAULT_RATE = 0.004  # events per GPU-day for every fault kind in the harness


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("health", help="GPU health findings, evaluation and fleet risk",
                                   description="GPU health: findings from fleet samples, the evaluation harness, Titan risk.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=type(parser))

    scan_parser = commands.add_parser(
        "scan", help="print health findings over a window of fleet samples",
        description="Run the health rules (XID catalogue, NVML recovery action, row remapping, ECC) and the "
                    "early-warning detectors (peer comparison within model and node pool) over the window.")
    add_source_options(scan_parser, since_default="24h")
    scan_parser.add_argument("--format", choices=["table", "json"], default="table", help="output format (default table)")
    scan_parser.add_argument("--all", action="store_true", help="include findings that are no longer active")
    scan_parser.set_defaults(run=run_scan)

    eval_parser = commands.add_parser(
        "eval", help="score the detectors against the simulated fleet's injected faults",
        description="Simulate a fleet with every fault kind injected at --rate per GPU-day, scan it day by day "
                    "as a live scan would, and score the findings against the ground truth: precision / recall / "
                    f"F1 per fault kind, lead time, false cordons per 1,000 GPU-days. Thresholds were tuned on "
                    f"seeds {', '.join(map(str, TUNING_SEEDS))}; report with others (e.g. {', '.join(map(str, REPORTING_SEEDS))}).")
    eval_parser.add_argument("--seed", type=int, nargs="+", default=[REPORTING_SEEDS[0]], help="simulator seed(s)")
    eval_parser.add_argument("--days", type=positive_float, default=2.0, help="simulated days per seed (default 2)")
    eval_parser.add_argument("--nodes", type=positive_int, default=64, help="8-GPU nodes (default 64)")
    eval_parser.add_argument("--rate", type=positive_float, default=DEFAULT_RATE,
                             help=f"events per GPU-day of each fault kind (default {DEFAULT_RATE})")
    eval_parser.add_argument("--data-dir", type=Path, help="real traces (default ../shared/data)")
    eval_parser.add_argument("--json", type=Path, help="also write the table and targets to this JSON file")
    eval_parser.set_defaults(run=run_eval)

    titan_parser = commands.add_parser(
        "titan", help="survival model of GPU death on the Titan supercomputer data",
        description="Fit a Cox model of GPU death (DBE or off-the-bus) from location and history on half of "
                    "Titan's GPUs, report the concordance index on the other half and the location effects.")
    titan_parser.add_argument("--data-dir", type=Path, help="real traces (default ../shared/data)")
    titan_parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split (default 0)")
    titan_parser.set_defaults(run=run_titan)
    parser.set_defaults(run=lambda args: parser.print_help() or 2)


# -- scan ----------------------------------------------------------------------------------------
def run_scan(args: argparse.Namespace) -> int:
    window = open_window(args)
    frame = window.source.read(window.start, window.end)
    findings = scan(frame, now=window.end - pd.Timedelta(microseconds=1))
    if not args.all:
        findings = [f for f in findings if f.evidence.get("active")]
    if args.format == "json":
        json.dump([finding_dict(f) for f in findings], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(format_findings(findings, window.start, window.end, len(frame)))
    return 0


def finding_dict(finding: Finding) -> dict:
    return {
        "kind": finding.kind, "severity": finding.severity.value, "node": finding.node, "gpu_uuid": finding.gpu_uuid,
        "recommended_action": finding.recommended_action.value if finding.recommended_action else None,
        "confidence": round(finding.confidence, 3), "first_seen": finding.first_seen.isoformat(),
        "last_seen": finding.last_seen.isoformat(), "evidence": dict(finding.evidence),
    }


def format_findings(findings: list[Finding], start, end, rows: int) -> str:
    head = f"{len(findings)} finding(s) over {rows:,} samples, {start:%Y-%m-%d %H:%M} -> {end:%Y-%m-%d %H:%M} UTC"
    if not findings:
        return head
    lines = [head, ""]
    lines.append(f"{'severity':8}  {'kind':26} {'node':22} {'gpu':14} {'action':7} {'conf':>4}  {'first seen':16}  {'last seen':16}  evidence")
    for f in findings:
        keys = [k for k in f.evidence if k not in ("note", "model", "pool", "active", "title", "signal")]
        evidence = ", ".join(f"{k}={f.evidence[k]}" for k in keys[:4])
        lines.append(f"{f.severity.value:8}  {f.kind:26} {f.node:22} {(f.gpu_uuid or '-')[:14]:14} "
                     f"{f.recommended_action.value if f.recommended_action else '-':7} {f.confidence:4.2f}  "
                     f"{f.first_seen:%Y-%m-%d %H:%M}  {f.last_seen:%Y-%m-%d %H:%M}  {evidence}")
    return "\n".join(lines)


# -- eval ----------------------------------------------------------------------------------------
def simulate_and_score(seed: int, days: float, nodes: int = 64, rate: float = DEFAULT_RATE, data_dir: Path | None = None,
                       config=None, progress=None) -> EvalReport:
    """One harness run: simulate, scan day by day (with context), score against the ground truth."""
    sim_config = SimConfig(seed=seed, nodes=nodes, data_dir=data_dir, counts_overrides={kind: rate for kind in KINDS})
    simulation = Simulation(sim_config)
    scanner = StreamingScanner(config)
    start = simulation.now + pd.Timedelta(seconds=sim_config.step_seconds)
    steps = int(round(days * 86400 / sim_config.step_seconds))
    for index, chunk in enumerate(simulation.iter_chunks(steps)):
        scanner.feed(chunk)
        if progress:
            progress(f"seed {seed}: day {index + 1} scanned, {len(scanner.log)} findings")
    end = simulation.now + pd.Timedelta(seconds=sim_config.step_seconds)
    return evaluate(scanner.findings(), simulation.ground_truth(), start, end, len(simulation.gpus))


def run_eval(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    tuned = sorted(set(args.seed) & set(TUNING_SEEDS))
    reports = []
    for seed in args.seed:
        reports.append(simulate_and_score(seed, args.days, args.nodes, args.rate, args.data_dir,
                                          progress=lambda m: print(m, file=sys.stderr)))
    report = combine(reports) if len(reports) > 1 else reports[0]
    print(f"health evaluation: seeds {', '.join(map(str, args.seed))} x {args.days:g} days x {args.nodes * 8} GPUs, "
          f"every fault kind at {args.rate:g} per GPU-day ({time.perf_counter() - started:.0f} s)")
    print(f"thresholds tuned on seeds {', '.join(map(str, TUNING_SEEDS))}; "
          + (f"WARNING: seed(s) {', '.join(map(str, tuned))} were used for tuning" if tuned else "these seeds were not used for tuning"))
    print()
    print(report.format())
    if args.json:
        args.json.write_text(json.dumps(report_dict(report, args), indent=2, default=str))
    return 0


def report_dict(report: EvalReport, args: argparse.Namespace | None = None) -> dict:
    table = report.table.reset_index(names="fault_kind")
    return {
        "seeds": getattr(args, "seed", None), "days": getattr(args, "days", None), "nodes": getattr(args, "nodes", None),
        "tuning_seeds": list(TUNING_SEEDS), "gpu_days": report.gpu_days,
        "table": json.loads(table.to_json(orient="records")),
        "false_cordons": len(report.false_cordons),
        "false_cordons_per_1000_gpu_days": report.false_cordons_per_1000_gpu_days,
        "missed_fatal_xids": report.missed_fatal_xids,
        "targets": [{"target": t, "goal": g, "measured": m, "met": bool(ok)} for t, g, m, ok in report.targets()],
    }


# -- titan ---------------------------------------------------------------------------------------
def run_titan(args: argparse.Namespace) -> int:
    from gpuwarden.analytics.health.titan import titan_survival

    report = titan_survival(args.data_dir or default_data_dir(), seed=args.seed)
    print(report.format())
    return 0
