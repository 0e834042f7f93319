"""Health figures on harder fleets, on fresh seeds (never seen while tuning), per fleet kind:

1. **today's independent** scenario (tests/scenarios_independent.py: one H100 model, 60 s steps);
2. **harder independent** (tests/scenarios_harder.py: H100 / A100 / H200 / L40S nodes, 30 s and 15 s
   steps, scrape gaps, idle dips, lifetime counters, node power cap / clock policy / hot inlet /
   driver reload on healthy nodes, gentle NVLink and PCIe ramps);
3. **harder simulated** (``gpuwarden.sim`` with background noise, no pod labels, 30 s steps and
   node-wide conditions at ``--node-rate`` per node-day and kind; its fleet mixes models already).

Per kind: precision / recall / F1 (by GPU for the independent fleets, by fault for the simulator:
``evaluation.evaluate``), missed fatal XIDs, median lead of precursor faults, node-wide conditions
reported as node findings (found / injected; a power cap or clock policy on a node that stays idle
cannot show), per-GPU findings on the GPUs of a node condition (must be 0), node findings where no
condition was injected, and cordons on healthy GPUs (must be 0).

Tuning seeds (looked at while the node rules and the gentle-precursor rules were written):
independent 11-13 (``TUNING_SEEDS`` here), simulator ``evaluation.TUNING_SEEDS``; seen (fresh runs
before a fix, and earlier reporting sets): ``SEEN_SEEDS``, ``SIM_SEEN_SEEDS``. Reporting seeds: the
defaults below; the script refuses tuning and seen seeds.

    PYTHONPATH=. .venv/bin/python bench/bench_health_harder.py [--seeds 41 42 43] [--sim-seeds 401 402]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from scenarios_harder import generate_harder, score_harder  # noqa: E402
from scenarios_independent import generate  # noqa: E402

from gpuwarden.analytics.health import scan  # noqa: E402
from gpuwarden.analytics.health.evaluation import TUNING_SEEDS as SIM_TUNING_SEEDS, combine  # noqa: E402
from gpuwarden.cli.health_cmd import DEFAULT_RATE, finding_dict, simulate_and_scan  # noqa: E402

TUNING_SEEDS = (11, 12, 13)
# The first fresh run (41-44, 401-402) found straggler cordons on clock-policy nodes of the simulated
# fleet; the rule was fixed on tuning seeds, and those seeds count as seen since. Seed 99 showed the
# several-GPU straggler rule's flaw (docs/health.md): seen too.
# Gentle precursors (issue 35 item 4): 45-48 and 403-404 were the reporting seeds before; 71-74 and
# 421-422, then 75-78 and 423-424 were fresh runs that each showed a PCIe replay storm's aftermath
# read as a rise (the rule was fixed; those seeds count as seen since). 91-94 and 425-426 reported
# the gentle-precursor figures; seed 94's healthy noisy link was then looked at (the no-history cordon
# rule) and the straggler fix measured there: seen since. The next fresh run (95-98, 427-428) showed a
# straggler cordon on simulated seed 428's only busy GPU of a clock-policy node, at lower power (now a
# taint): seen since. The figures in docs/health.md are on 101-104 and 431-432, run once after that.
SEEN_SEEDS = (41, 42, 43, 44, 45, 46, 47, 48, 71, 72, 73, 74, 75, 76, 77, 78, 91, 92, 93, 94, 95, 96, 97, 98, 99)
SIM_SEEN_SEEDS = (401, 402, 403, 404, 421, 422, 423, 424, 425, 426, 427, 428)
REPORTING_SEEDS = (101, 102, 103, 104)
SIM_REPORTING_SEEDS = (431, 432)
NODE_GRACE = pd.Timedelta(hours=1)  # a node finding may start up to a window after its condition's start or end


def _independent(seed: int, harder: bool, step_s: int) -> dict:
    if harder:
        frame, truth, healthy, all_gpus, conditions = generate_harder(seed, nodes=16, days=2.0, step_s=step_s,
                                                                      faults_per_kind=2)
    else:
        hot: list[dict] = []
        frame, truth, healthy, all_gpus = generate(seed, nodes=16, days=2.0, faults_per_kind=2, conditions=hot)
        conditions = pd.DataFrame(hot)
    findings = [finding_dict(f) for f in scan(frame) if not f.kind.startswith("app-xid")]
    return score_harder(findings, truth, healthy, all_gpus, conditions)


def _simulated(seed: int, days: float, nodes: int, node_rate: float) -> dict:
    report, findings, simulation = simulate_and_scan(seed, days, nodes, DEFAULT_RATE, background_noise=True,
                                                     attribution="off", step_seconds=30,
                                                     node_conditions_per_node_day=node_rate)
    start, end = simulation.origin + pd.Timedelta(days=simulation.config.warmup_days), pd.Timestamp(simulation.now)
    truth = simulation.node_condition_truth()
    truth = truth[(truth["start"] >= start) & (truth["start"] < end - NODE_GRACE)]
    node_findings = [f for f in findings if f.gpu_uuid is None]
    found, explained = 0, set()
    for row in truth.itertuples():
        hits = [i for i, f in enumerate(node_findings) if f.node == row.node
                and pd.Timestamp(f.first_seen) <= row.end + NODE_GRACE and pd.Timestamp(f.last_seen) >= row.start]
        found += bool(hits)
        explained.update(hits)
    false_pos = report.false_positives
    on_conditions = sum(1 for fp in false_pos.itertuples() for row in truth.itertuples()
                        if fp.node == row.node and fp.first_seen <= row.end + NODE_GRACE and fp.last_seen >= row.start)
    return {"report": report, "node_conditions": len(truth), "node_conditions_found": found,
            "false_node_findings": sum(1 for i, f in enumerate(node_findings) if i not in explained
                                       and pd.Timestamp(f.first_seen) >= start),
            "per_gpu_on_node_conditions": on_conditions, "cordon_on_healthy": len(report.false_cordons),
            "kinds": truth["kind"].value_counts().to_dict(),
            "false_kinds": sorted(set(false_pos["kind"]))}


def _row(name: str, results: list[dict]) -> str:
    tp, fp, fn = (sum(r[k] for r in results) for k in ("tp", "fp", "fn"))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    leads = [r["median_lead_minutes"] for r in results if not np.isnan(r["median_lead_minutes"])]
    return _line(name, precision, recall, f1, sum(r["missed_fatal"] for r in results),
                 float(np.median(leads)) if leads else float("nan"), results)


def _false_kinds(results: list[dict]) -> str:
    kinds = sorted({str(k) for r in results for k in r["false_kinds"]})
    return f"    false positives' kinds: {', '.join(kinds) if kinds else 'none'}"


def _line(name, precision, recall, f1, missed, lead, results) -> str:
    total = lambda key: sum(r[key] for r in results)  # noqa: E731
    return (f"{name:34} {precision:9.3f} {recall:6.3f} {f1:6.3f} {missed:6d} {lead:9.0f} "
            f"{total('node_conditions_found'):>5}/{total('node_conditions'):<5} {total('per_gpu_on_node_conditions'):8d} "
            f"{total('false_node_findings'):9d} {total('cordon_on_healthy'):8d}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(REPORTING_SEEDS),
                        help="independent scenarios' seeds (each runs today's fleet and the harder one)")
    parser.add_argument("--steps", type=int, nargs="+", default=[30, 15],
                        help="harder independent steps, taken in turn per seed (default 30 15)")
    parser.add_argument("--sim-seeds", type=int, nargs="*", default=list(SIM_REPORTING_SEEDS))
    parser.add_argument("--sim-days", type=float, default=1.0)
    parser.add_argument("--sim-nodes", type=int, default=24)
    parser.add_argument("--node-rate", type=float, default=0.15, help="simulated node conditions per node-day and kind")
    parser.add_argument("--allow-tuning-seeds", action="store_true", help="score tuning seeds (for tuning only)")
    args = parser.parse_args()
    tuning = sorted((set(args.seeds) & set(TUNING_SEEDS + SEEN_SEEDS))
                    | (set(args.sim_seeds) & set(SIM_TUNING_SEEDS + SIM_SEEN_SEEDS)))
    if tuning and not args.allow_tuning_seeds:
        parser.error(f"seed(s) {tuning} were used for tuning (or seen before a fix); pick others or pass "
                     "--allow-tuning-seeds")
    started = time.perf_counter()
    today, harder = [], {step: [] for step in args.steps}
    for i, seed in enumerate(args.seeds):
        t0 = time.perf_counter()
        today.append(_independent(seed, harder=False, step_s=60))
        step = args.steps[i % len(args.steps)]
        harder[step].append(_independent(seed, harder=True, step_s=step))
        print(f"independent seed {seed} (harder at {step} s): {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    simulated = []
    for seed in args.sim_seeds:
        t0 = time.perf_counter()
        simulated.append(_simulated(seed, args.sim_days, args.sim_nodes, args.node_rate))
        print(f"simulated seed {seed}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"health on harder fleets: reporting seeds {' '.join(map(str, args.seeds))} (independent, 16 nodes x 2 days, "
          f"2 faults per kind) and {' '.join(map(str, args.sim_seeds))} (simulated, {args.sim_nodes} nodes x "
          f"{args.sim_days:g} days, every fault kind at {DEFAULT_RATE:g} per GPU-day); tuning seeds "
          f"{' '.join(map(str, TUNING_SEEDS))} and {' '.join(map(str, SIM_TUNING_SEEDS))} set aside")
    print(f"{'fleet':34} {'precision':>9} {'recall':>6} {'F1':>6} {'missed':>6} {'lead min':>9} "
          f"{'node found':>11} {'per-GPU':>8} {'node FP':>9} {'cordons':>8}")
    print(_row("today's independent (60 s, H100)", today))
    print(_false_kinds(today))
    for step, results in harder.items():
        if results:
            print(_row(f"harder independent ({step} s, mixed)", results))
            print(_false_kinds(results))
    if simulated:
        report = combine([r["report"] for r in simulated])
        overall = report.overall
        print(_line("harder simulated (30 s, mixed)", overall["precision"], overall["recall"], overall["f1"],
                    report.missed_fatal_xids, overall["median_lead_minutes"], simulated))
        print(_false_kinds(simulated))
        kinds: dict[str, int] = {}
        for r in simulated:
            for kind, n in r["kinds"].items():
                kinds[kind] = kinds.get(kind, 0) + n
        print(f"  simulated node conditions injected: {kinds}")
    print("columns: missed = fatal faults with no finding; lead = median minutes from the first finding to the fatal "
          "event (precursor faults); node found = node conditions reported as a node finding / injected; per-GPU = "
          "per-GPU findings on a node condition's GPUs (must be 0); node FP = node findings with no injected condition; "
          "cordons = cordon or drain recommended on a healthy GPU (must be 0)")
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
