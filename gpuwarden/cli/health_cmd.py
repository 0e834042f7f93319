"""``gpuwarden health``: scan fleet samples for health findings; run the evaluation harness on the
simulated fleet; fit the Titan GPU-lifetime survival model.

    gpuwarden health scan --source local|file|prometheus [--file PATH] [--since 24h] [--all]
                          [--format table|json|csv|markdown] [--output FILE]
    gpuwarden health eval --seed N --days D [--nodes 64] [--rate 0.004] [--noise on|off]
                          [--attribution on|off] [--format table|json|csv|markdown] [--output FILE]

``health scan --format json`` writes a versioned wrapper (``schema_version`` 1, ``report``
"health_scan", ``window``, ``summary``, ``findings``, ``application_events``, ``notes``): findings are
claims about a GPU (full UUID, node, kind, severity, recommended action, first/last seen, evidence);
application XIDs are the workload's own faults and are listed apart, never as GPU findings.
    gpuwarden health titan [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any
from pathlib import Path

import pandas as pd

from gpuwarden.analytics.health import StreamingScanner, scan
from gpuwarden.analytics.health.coverage import Coverage
from gpuwarden.analytics.health.catalogue import APPLICATION_XIDS, CORDONING_ACTIONS, XID_RULES
from gpuwarden.analytics.health.features import NEEDED_COLUMNS
from gpuwarden.analytics.health.evaluation import REPORTING_SEEDS, TUNING_SEEDS, EvalReport, combine, evaluate, verdict
from gpuwarden.fleet import Finding
from gpuwarden.fleet.semantics import iso_utc
from gpuwarden.fleet.traces import default_data_dir
from gpuwarden.sim import SimConfig
from gpuwarden.sim.faults import KINDS

from .args import positive_float, positive_int
from .simfleet import simulated_fleet
from .sources import add_source_options, open_window
from .source_notes import add_attribution_option, apply_attribution, source_notes

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
    scan_parser.set_defaults(since=None)  # default: the whole file for --source file, else 24h
    scan_parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    scan_parser.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")
    scan_parser.add_argument("--all", action="store_true", help="include findings that are no longer active")
    add_attribution_option(scan_parser)
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
    eval_parser.add_argument("--noise", choices=["on", "off"], default="on",
                             help="background noise and confounders on healthy GPUs (default on)")
    eval_parser.add_argument("--attribution", choices=["on", "off", "mixed"], default="mixed",
                             help="pod labels: on (every allocated GPU), off (none), mixed (some nodes without; default)")
    eval_parser.add_argument("--data-dir", type=Path, help="real traces (default ../shared/data)")
    eval_parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    eval_parser.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")
    eval_parser.add_argument("--json", type=Path, help="deprecated: same as --format json --output FILE")
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
FORMATS = ("table", "json", "csv", "markdown")
# 2: active, model and pool are a finding's own keys, no longer inside its evidence.
SCAN_SCHEMA_VERSION = 2
EVAL_SCHEMA_VERSION = 1
DAY = pd.Timedelta(days=1)
APP_KINDS = frozenset(XID_RULES[code].kind for code in APPLICATION_XIDS)


def run_scan(args: argparse.Namespace) -> int:
    if args.since is None:
        args.since = DAY if args.source != "file" else pd.Timedelta(days=36500)  # a file: all of it
    window = open_window(args)
    apply_attribution(window.source, args.pod_attribution)
    start, end = window.start, window.end
    if args.source == "file":
        span = window.source.time_range()
        if span is not None:
            start = max(start, span[0])
    findings, rows, notes = scan_source(window.source, start, end)
    if not args.all:
        findings = [f for f in findings if f.active]
    gpu_findings = [f for f in findings if f.kind not in APP_KINDS]
    app_events = [f for f in findings if f.kind in APP_KINDS]
    notes += source_notes(window.source, args.pod_attribution, reads_attribution=False)
    text = render_scan(args.format, gpu_findings, app_events, start, end, rows, notes)
    code = write_output(text, args.output)
    if args.format == "csv" and notes:  # a CSV has no room for notes: they go beside it, on stderr
        print("\n".join(f"note: {note}" for note in notes), file=sys.stderr)
    return code


def scan_source(source, start: pd.Timestamp, end: pd.Timestamp) -> tuple[list[Finding], int, list[str]]:
    """Scan [start, end) of ``source``: in one go up to a day, else a day at a time (only the columns
    the scan reads), as a live scan would, so memory stays that of a day. Also the notes on what
    the scan could not see (detectors without their signals, nodes gone silent). A Prometheus
    source also gives the scrape health of the GPU exporter targets (observability collapse)."""
    if end - start <= DAY:
        frame = source.read(start, end, columns=_columns(source))
        scrape = _scrape_health(source, start, end)
        coverage = Coverage().add(frame).add_scrape(scrape)
        return scan(frame, now=end - pd.Timedelta(microseconds=1), scrape=scrape), len(frame), coverage.notes()
    scanner = StreamingScanner()
    coverage = Coverage()
    cursor = start
    while cursor < end:
        upper = min(cursor + DAY, end)
        chunk = source.read(cursor, upper, columns=_columns(source))
        if len(chunk):
            scrape = _scrape_health(source, cursor, upper)
            scanner.feed(chunk, scrape)
            coverage.add(chunk).add_scrape(scrape)
        del chunk
        cursor = upper
    return scanner.findings(), coverage.rows, coverage.notes()


def _scrape_health(source, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame | None:
    """The scrape health of the window where the source knows it (Prometheus), else None. A failed
    read of it is said and the scan goes on judging series presence alone: it never costs the samples."""
    from gpuwarden.store.prometheus import PrometheusError, PrometheusSource

    if not isinstance(source, PrometheusSource):
        return None
    try:
        return source.read_scrape_health(start, end)
    except PrometheusError as error:
        logging.getLogger(__name__).warning("scrape health of %s..%s not read (%s); judging series presence only",
                                            start, end, error)
        return None


def _columns(source) -> list[str] | None:
    from gpuwarden.fleet import SAMPLE_COLUMN_NAMES

    return [name for name in NEEDED_COLUMNS if name in SAMPLE_COLUMN_NAMES]


def write_output(text: str, output: Path | None) -> int:
    if output is not None:
        output.write_text(text)
        return 0
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


def scan_dict(findings: list[Finding], app_events: list[Finding], start, end, rows: int, notes: Sequence[str] = ()) -> dict:
    cordoning = {a.value for a in CORDONING_ACTIONS}
    by_kind: dict[str, int] = {}
    for f in findings:
        by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
    return {
        "schema_version": SCAN_SCHEMA_VERSION,
        "report": "health_scan",
        "window": {"start": iso_utc(start, fraction=True), "end": iso_utc(end, fraction=True), "hours": round((end - start).total_seconds() / 3600.0, 3)},
        "summary": {
            "rows_read": rows, "findings": len(findings), "gpus_with_findings": len({f.gpu_uuid for f in findings if f.gpu_uuid}),  # node findings name none
            "cordon_or_drain": sum(1 for f in findings if f.recommended_action and f.recommended_action.value in cordoning),
            "by_kind": dict(sorted(by_kind.items())), "application_events": len(app_events),
        },
        "findings": [finding_dict(f) for f in findings],
        "application_events": [finding_dict(f) for f in app_events],
        "notes": ["findings are claims about a GPU; application XIDs (13, 31, 43, 45, 68) are the workload's own "
                  "faults, listed under application_events, and never recommend an action on the node", *notes],
    }




CSV_FIELDS = ("gpu_uuid", "node", "kind", "severity", "recommended_action", "confidence", "first_seen", "last_seen", "evidence")


def render_scan(fmt: str, findings: list[Finding], app_events: list[Finding], start, end, rows: int,
                notes: Sequence[str] = ()) -> str:
    if fmt == "json":
        return json.dumps(scan_dict(findings, app_events, start, end, rows, notes), indent=2) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for f in findings:
            row = finding_dict(f)
            row["evidence"] = json.dumps(row["evidence"], sort_keys=True)
            writer.writerow({k: row[k] for k in CSV_FIELDS})
        return buffer.getvalue()
    if fmt == "markdown":
        lines = [f"# Health scan {start:%Y-%m-%d %H:%M} -> {end:%Y-%m-%d %H:%M} UTC", "",
                 f"{len(findings)} finding(s) on {len({f.gpu_uuid for f in findings})} GPU(s) over {rows:,} samples; "
                 f"{len(app_events)} application event(s).", ""]
        if findings:
            lines.append("| severity | kind | node | gpu_uuid | action | first seen | last seen |")
            lines.append("|---|---|---|---|---|---|---|")
            for f in findings:
                lines.append(f"| {f.severity.value} | {f.kind} | {f.node} | {f.gpu_uuid} | "
                             f"{f.recommended_action.value if f.recommended_action else '-'} | "
                             f"{f.first_seen:%Y-%m-%d %H:%M} | {f.last_seen:%Y-%m-%d %H:%M} |")
        lines += [""] + [f"> {note}" for note in notes] if notes else []
        return "\n".join(lines) + "\n"
    text = format_findings(findings, start, end, rows)
    if app_events:
        text += f"\n\n{len(app_events)} application event(s) (the workload's own faults; no action on the node):\n"
        text += "\n".join(f"  {f.kind:12} {f.node:22} {f.gpu_uuid}  {f.first_seen:%Y-%m-%d %H:%M}" for f in app_events)
    if notes:
        text += "\n\nnotes:\n" + "\n".join(f"- {note}" for note in notes)
    return text + "\n"


def finding_dict(finding: Finding) -> dict:
    return {
        "kind": finding.kind, "severity": finding.severity.value, "node": finding.node, "gpu_uuid": finding.gpu_uuid,
        "recommended_action": finding.recommended_action.value if finding.recommended_action else None,
        "confidence": round(finding.confidence, 3), "first_seen": finding.first_seen.isoformat(),
        "last_seen": finding.last_seen.isoformat(), "active": finding.active, "model": finding.model,
        "pool": finding.pool, "evidence": dict(finding.evidence),
    }


def format_findings(findings: list[Finding], start, end, rows: int) -> str:
    head = f"{len(findings)} finding(s) over {rows:,} samples, {start:%Y-%m-%d %H:%M} -> {end:%Y-%m-%d %H:%M} UTC"
    if not findings:
        return head
    lines = [head, ""]
    lines.append(f"{'severity':8}  {'kind':26} {'node':22} {'gpu':40} {'action':7} {'conf':>4}  {'first seen':16}  {'last seen':16}  evidence")
    for f in findings:
        keys = [k for k in f.evidence if k not in ("note", "title", "signal")]
        evidence = ", ".join(f"{k}={f.evidence[k]}" for k in keys[:4])
        lines.append(f"{f.severity.value:8}  {f.kind:26} {f.node:22} {(f.gpu_uuid or '-'):40} "
                     f"{f.recommended_action.value if f.recommended_action else '-':7} {f.confidence:4.2f}  "
                     f"{f.first_seen:%Y-%m-%d %H:%M}  {f.last_seen:%Y-%m-%d %H:%M}  {evidence}")
    return "\n".join(lines)


# -- eval ----------------------------------------------------------------------------------------
def simulate_and_score(seed: int, days: float, nodes: int = 64, rate: float = DEFAULT_RATE, data_dir: Path | None = None,
                       config=None, progress=None, noise: bool = True, attribution: str = "mixed") -> EvalReport:
    """One harness run: simulate, scan day by day (with context), score against the ground truth."""
    return simulate_and_scan(seed, days, nodes, rate, data_dir, config, progress, background_noise=noise,
                             attribution=attribution)[0]


def simulate_and_scan(seed: int, days: float, nodes: int = 64, rate: float = DEFAULT_RATE, data_dir: Path | None = None,
                      config=None, progress=None, **sim_options) -> tuple[EvalReport, list[Finding], Any]:
    """:func:`simulate_and_score`, also returning the findings and the simulation (its node-condition
    truth, say); ``sim_options`` go to :class:`SimConfig` (``background_noise``, ``attribution``,
    ``node_conditions``, ``step_seconds``)."""
    sim_config = SimConfig(seed=seed, nodes=nodes, data_dir=data_dir, counts_overrides={kind: rate for kind in KINDS},
                           **sim_options)
    simulation = simulated_fleet(sim_config)
    scanner = StreamingScanner(config)
    start = simulation.now + pd.Timedelta(seconds=sim_config.step_seconds)
    steps = int(round(days * 86400 / sim_config.step_seconds))
    for index, chunk in enumerate(simulation.iter_chunks(steps)):
        scanner.feed(chunk)
        if progress:
            progress(f"seed {seed}: day {index + 1} scanned, {len(scanner.log)} findings")
    end = simulation.now + pd.Timedelta(seconds=sim_config.step_seconds)
    findings = scanner.findings()
    return evaluate(findings, simulation.ground_truth(), start, end, len(simulation.gpus)), findings, simulation


def run_eval(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.json is not None:  # deprecated alias
        args.format, args.output = "json", args.json
    tuned = sorted(set(args.seed) & set(TUNING_SEEDS))
    reports = []
    for seed in args.seed:
        reports.append(simulate_and_score(seed, args.days, args.nodes, args.rate, args.data_dir,
                                          progress=lambda m: print(m, file=sys.stderr),
                                          noise=args.noise == "on", attribution=args.attribution))
    report = combine(reports) if len(reports) > 1 else reports[0]
    head = (f"health evaluation: seeds {', '.join(map(str, args.seed))} x {args.days:g} days x {args.nodes * 8} GPUs, "
            f"every fault kind at {args.rate:g} per GPU-day, noise {args.noise}, attribution {args.attribution} "
            f"({time.perf_counter() - started:.0f} s)\n"
            f"thresholds tuned on seeds {', '.join(map(str, TUNING_SEEDS))}; "
            + (f"WARNING: seed(s) {', '.join(map(str, tuned))} were used for tuning" if tuned else "these seeds were not used for tuning"))
    if args.format == "json":
        text = json.dumps(report_dict(report, args), indent=2, default=str) + "\n"
    elif args.format == "csv":
        text = report.table.reset_index(names="fault_kind").to_csv(index=False)
    elif args.format == "markdown":
        table = report.table.reset_index(names="fault_kind")
        lines = [f"# {head.splitlines()[0]}", "", head.splitlines()[1], "",
                 "| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
        lines += ["| " + " | ".join("" if pd.isna(v) else (f"{v:.3f}" if isinstance(v, float) else str(v)) for v in row) + " |"
                  for row in table.itertuples(index=False)]
        lines += ["", "targets:"] + [f"- {verdict(ok).strip()} {t}: {m} (target {g})" for t, g, m, ok in report.targets()]
        text = "\n".join(lines) + "\n"
    else:
        text = head + "\n\n" + report.format() + "\n"
    return write_output(text, args.output)


def report_dict(report: EvalReport, args: argparse.Namespace | None = None) -> dict:
    table = report.table.reset_index(names="fault_kind")
    return {
        "schema_version": EVAL_SCHEMA_VERSION, "report": "health_eval",
        "seeds": getattr(args, "seed", None), "days": getattr(args, "days", None), "nodes": getattr(args, "nodes", None),
        "noise": getattr(args, "noise", None), "attribution": getattr(args, "attribution", None),
        "tuning_seeds": list(TUNING_SEEDS), "gpu_days": report.gpu_days,
        "table": json.loads(table.to_json(orient="records")),
        "false_cordons": len(report.false_cordons),
        "false_cordons_per_1000_gpu_days": report.false_cordons_per_1000_gpu_days,
        "missed_fatal_xids": report.missed_fatal_xids,
        "pooled_f1": _number(report.overall["f1"]), "median_lead_minutes": _number(report.overall["median_lead_minutes"]),
        "targets": [{"target": t, "goal": g, "measured": m, "met": ok} for t, g, m, ok in report.targets()],
        "faults_injected": report.faults_injected,
    }


def _number(value) -> float | None:
    return None if pd.isna(value) else round(float(value), 4)


# -- titan ---------------------------------------------------------------------------------------
def run_titan(args: argparse.Namespace) -> int:
    from gpuwarden.analytics.health.titan import titan_survival

    report = titan_survival(args.data_dir or default_data_dir(), seed=args.seed)
    print(report.format())
    return 0
