"""What-if's speed-ups change no decision: a contended day shaped like the demo store's week (four GPU
models, a MIG node, mostly 1-GPU pods with 2-, 4- and 8-GPU ones and MIG slices, six teams of very
different sizes) replayed under every policy gives the report recorded from the code before them
(tests/data/whatif_pinned.json, written by ``python tests/scheduling/test_whatif_pinned.py`` on that code).

The history is built with the standard library's seeded ``random`` (stable across Python versions),
not from the simulator, so a change to the simulated fleet does not move these figures; a change to
the scheduler's or placement's decisions does, and must re-record them saying why.

Re-recorded for issue 31: a job a pass starts is never a victim in that pass (kueue reclaimed work
it had just admitted: 125 preemptions, not 123), and a borrowing job never takes another team below
its guarantee, whatever the priorities (gpuwarden: 266 suspends, not 269; mean wait 7,126 s, not
6,473 s; worst team's guarantee met 0.510, not 0.527).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pandas as pd

from gpuwarden.scheduling.whatif import WHATIF_POLICIES, build_report
from gpuwarden.scheduling.whatif_history import FleetNode, History, Workload

PINNED = Path(__file__).parents[1] / "data" / "whatif_pinned.json"
START = pd.Timestamp("2026-11-23T00:00:00Z")
WINDOW_SECONDS = 12 * 3600.0
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S")
MIG_LAYOUT = ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")  # the demo store's A100 MIG cut
TEAMS = (("llm-pretrain", 0.5), ("research", 0.2), ("applied-ml", 0.17), ("recsys", 0.05), ("speech", 0.05),
         ("vision", 0.03))


def contended_day(seed: int = 7, nodes_per_model: int = 2, workloads: int = 420) -> History:
    """Eight 8-GPU nodes (one A100 node cut into MIG), ``workloads`` pods over 12 h: about twice what fits."""
    rng = random.Random(seed)
    nodes = []
    for model in MODELS:
        for i in range(nodes_per_model):
            mig = model.startswith("NVIDIA A100") and i == 0
            name = f"{model.split()[1].lower()}-{i}"
            nodes.append(FleetNode(name, model, tuple(f"{name}/GPU-{g}" for g in range(8)),
                                   tuple(MIG_LAYOUT if mig else None for _ in range(8))))
    mig_model = MODELS[2]
    loads = []
    for n in range(workloads):
        team = rng.choices([t for t, _ in TEAMS], [w for _, w in TEAMS])[0]
        shape = rng.random()
        model, profile, gpus = rng.choice(MODELS), None, 1
        if shape < 0.06:
            model, profile = mig_model, rng.choice(MIG_LAYOUT)
        elif shape < 0.12:
            gpus = rng.choice((2, 4, 8))
        submitted = round(rng.uniform(0.0, WINDOW_SECONDS * 0.8) / 60.0) * 60.0
        duration = min(round(rng.lognormvariate(8.2, 1.4) / 60.0 + 1) * 60.0, WINDOW_SECONDS - submitted)
        loads.append(Workload(f"ns/pod-{n}", team, model, gpus, profile, 1.0, submitted,
                              ((submitted, submitted + duration),)))
    return History(START, START + pd.Timedelta(seconds=WINDOW_SECONDS), 60.0, tuple(loads), tuple(nodes))


def report_tables() -> dict[str, object]:
    report = build_report(contended_day(), WHATIF_POLICIES).to_dict()
    return {"summary": report["summary"], "tables": report["tables"], "notes": report["notes"]}


def test_the_replays_decide_as_the_code_they_were_recorded_from():
    got = report_tables()
    pinned = json.loads(PINNED.read_text())
    rows = {row["policy"]: row for row in got["tables"]["policies"]}  # type: ignore[index]
    # the day is contended enough that every preemption path runs
    assert rows["kueue"]["preemptions"] > 0 and rows["tiresias"]["suspends"] > 0 and rows["gpuwarden"]["suspends"] > 0
    assert json.loads(json.dumps(got)) == pinned  # floats through JSON, as the file holds them


if __name__ == "__main__":  # record the figures from the code on PYTHONPATH
    PINNED.parent.mkdir(exist_ok=True)
    PINNED.write_text(json.dumps(report_tables(), indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {PINNED}\n")
