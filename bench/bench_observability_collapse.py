"""Observability collapse as an early signal: its false alarms after ordinary scrape gaps, and its lead
before a GPU falls off the bus (tests/scenarios_collapse.py builds the fleets).

1. **Ordinary fleets**: Prometheus restarts, targets down 1-10 min, slow scrapes (one node's, the
   whole fleet's), network blips, node reboots whose GPUs come back one by one; no fault. Reported:
   ``observability-collapse`` findings per 1,000 node-days (all false), and cordons (must be 0).
2. **Detachment fleets**: the same gaps, plus GPUs falling off the bus (XID 79) after 10-40 minutes
   of collapse (series thinning, scrapes slowing and losing samples, ``up`` failing now and then).
   Reported: detachments with a collapse finding before the XID (on the GPU or its node), the
   median lead, collapse findings on other nodes (false), and cordons on healthy GPUs (must be 0).

Each fleet is scanned with its scrape health (what a Prometheus source reads) and without it (a
samples file: series presence only). ``--before REF`` also scans every fleet's samples with the
scan of a committed revision, in a separate git worktree (``--worktree``, removed afterwards), and
prints its ``gpu-series-lost`` cordons on healthy GPUs beside today's.

Tuning seeds (looked at while the rule was written): 1-10; reporting seeds: the defaults.

    PYTHONPATH=. .venv/bin/python bench/bench_observability_collapse.py [--before HEAD]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from scenarios_collapse import CollapseFleet, make_fleet  # noqa: E402

from gpuwarden.analytics.health import scan  # noqa: E402
from gpuwarden.fleet import Finding, FindingKind  # noqa: E402
from gpuwarden.fleet.node_actions import CORDONING_ACTIONS  # noqa: E402

TUNING_SEEDS = range(1, 11)
COLLAPSE = FindingKind.OBSERVABILITY_COLLAPSE

# Run inside the old revision's worktree: its scan over each saved fleet, the cordons it recommends.
BEFORE = """
import json, sys, pandas as pd
from gpuwarden.analytics.health import scan
out = {}
for path in sys.argv[1:]:
    found = scan(pd.read_parquet(path))
    out[path] = [[f.kind, f.node, f.gpu_uuid, str(f.recommended_action.value) if f.recommended_action else None]
                 for f in found]
print(json.dumps(out))
"""


def cordons(findings: list[Finding], faulty: set[str]) -> list[Finding]:
    """Cordoning findings on GPUs that did not fall off the bus."""
    return [f for f in findings if f.recommended_action in CORDONING_ACTIONS and f.gpu_uuid not in faulty]


def score(fleet: CollapseFleet, findings: list[Finding]) -> dict:
    faulty = {gpu for _, gpu, _ in fleet.detachments}
    faulty_nodes = {node for node, _, _ in fleet.detachments}
    collapse = [f for f in findings if f.kind == COLLAPSE]
    leads = []
    for node, gpu, at in fleet.detachments:
        before = [f for f in collapse if f.node == node and f.gpu_uuid in (gpu, None) and f.first_seen <= at.to_pydatetime()]
        if before:
            leads.append((at.to_pydatetime() - min(f.first_seen for f in before)).total_seconds() / 60.0)
    false_collapse = [f for f in collapse if f.node not in faulty_nodes]
    false_cordons = cordons(findings, faulty)
    return {"node_days": fleet.node_days, "detachments": len(fleet.detachments), "found": len(leads), "leads": leads,
            "false_collapse": len(false_collapse), "false_cordons": len(false_cordons),
            "false_series_lost_cordons": sum(f.kind == FindingKind.GPU_SERIES_LOST for f in false_cordons),
            "signals": sorted({s for f in collapse for s in f.evidence.get("signals", [])})}


def before_counts(ref: str, worktree: Path, fleets: dict[str, CollapseFleet]) -> dict[str, int]:
    """gpu-series-lost cordons on healthy GPUs by ``ref``'s scan, per fleet."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), ref], check=True,
                   capture_output=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            paths = {}
            for name, fleet in fleets.items():
                paths[name] = str(Path(tmp) / f"{name}.parquet")
                fleet.samples.to_parquet(paths[name])
            done = subprocess.run([sys.executable, "-c", BEFORE, *paths.values()], cwd=worktree, check=True,
                                  capture_output=True, text=True, env={"PYTHONPATH": str(worktree), "PATH": "/usr/bin:/bin"})
            found = json.loads(done.stdout)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=True,
                       capture_output=True)
    out = {}
    for name, fleet in fleets.items():
        faulty = {gpu for _, gpu, _ in fleet.detachments}
        out[name] = sum(1 for kind, _, gpu, action in found[paths[name]]
                        if kind == "gpu-series-lost" and action in ("cordon", "drain") and gpu not in faulty)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(101, 109)), help="ordinary fleets")
    parser.add_argument("--fault-seeds", type=int, nargs="+", default=list(range(201, 209)), help="detachment fleets")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--detachments", type=int, default=4, help="per detachment fleet")
    parser.add_argument("--before", metavar="REF", help="also scan with this revision's code (a git worktree)")
    parser.add_argument("--worktree", type=Path, default=Path("/work/wt-c"))
    parser.add_argument("--tuning", action="store_true", help="allow tuning seeds (while tuning only)")
    args = parser.parse_args(argv)
    seen = sorted(set(args.seeds + args.fault_seeds) & set(TUNING_SEEDS))
    if seen and not args.tuning:
        parser.error(f"seeds {seen} were looked at while tuning; report on others")
    started = time.perf_counter()
    fleets = {f"ordinary-{s}": make_fleet(s, args.nodes, args.days) for s in args.seeds}
    fleets.update({f"detach-{s}": make_fleet(s, args.nodes, args.days, detachments=args.detachments)
                   for s in args.fault_seeds})
    rows = []
    for name, fleet in fleets.items():
        for mode, scrape in (("scrape health", fleet.scrape), ("presence only", None)):
            rows.append({"fleet": name.split("-")[0], "mode": mode, **score(fleet, scan(fleet.samples, scrape=scrape))})
    table = pd.DataFrame(rows)
    events: dict[str, int] = {}
    for fleet in fleets.values():
        for key, value in fleet.events.items():
            events[key] = events.get(key, 0) + value
    print(f"fleets: {len(args.seeds)} ordinary + {len(args.fault_seeds)} with detachments, {args.nodes} nodes x 8 GPUs x "
          f"{args.days:g} days, 30 s steps; seeds {args.seeds} / {args.fault_seeds}")
    print("ordinary events injected (all fleets):", ", ".join(f"{k} {v}" for k, v in sorted(events.items())))
    print()
    print("| fleet | scan reads | node-days | false collapse findings | per 1,000 node-days | detachments | "
          "with a collapse finding before the XID | median lead (min) | false cordons |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (kind, mode), part in table.groupby(["fleet", "mode"], sort=False):
        node_days = part["node_days"].sum()
        leads = [lead for row in part["leads"] for lead in row]
        det = int(part["detachments"].sum())
        print(f"| {kind} | {mode} | {node_days:g} | {int(part['false_collapse'].sum())} | "
              f"{1000 * part['false_collapse'].sum() / node_days:.1f} | {det or '-'} | "
              f"{f'{len(leads)} / {det}' if det else '-'} | {f'{np.median(leads):.1f}' if leads else '-'} | "
              f"{int(part['false_cordons'].sum())} |")
    if args.before:
        old = before_counts(args.before, args.worktree, fleets)
        now = table[table["mode"] == "presence only"].set_index(table[table["mode"] == "presence only"].index)
        print()
        print(f"gpu-series-lost cordons on healthy GPUs: {args.before} {sum(old.values())}, now "
              f"{int(now['false_series_lost_cordons'].sum())} (same samples, no scrape health; now with scrape health "
              f"{int(table[table['mode'] == 'scrape health']['false_series_lost_cordons'].sum())})")
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
