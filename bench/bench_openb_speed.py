"""openb replay speed: CPU per pod of the shipped policy on this tree against a baseline tree, in one run.

    git worktree add --detach /tmp/openb-base <commit>   # the baseline's code
    PYTHONPATH=. python bench/bench_openb_speed.py --base /tmp/openb-base --lists default --seeds 42,43

Each (tree, list) runs in its own process (as a ``simulate placement`` worker does, seed after seed
with its memos warm), the trees alternating, ``--rounds`` times; the figure
is the ratio of CPU seconds (less sensitive than wall time to other load on the machine), and every
seed's allocation must be the same on both trees. The projection for all 17 lists x 10 seeds on 2
workers multiplies this tree's CPU per pod by those runs' pods (1.87 M) and halves it; the two workers
share the machine's caches and memory, so a full run takes some 9% longer than that.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL_RUN_PODS = 1_871_467  # pods arriving in all 17 lists x seeds 42-51 (sum of SeedResult.arrived)
CHILD = """
import json, sys, time
from pathlib import Path
from gpuwarden.scheduling import replay_openb as r
data = r.prepare(Path(sys.argv[1]), sys.argv[2])
started = time.process_time()
results = [r.replay_seed(data, "gpuwarden", int(seed), sys.argv[2]) for seed in sys.argv[3].split(",")]
print(json.dumps({"cpu_seconds": time.process_time() - started, "pods": sum(x.arrived for x in results),
                  "allocated": [x.allocated_milli for x in results], "placed": [x.placed for x in results]}))
"""


def run(tree: Path, data_dir: str, pod_list: str, seeds: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, data_dir, pod_list, seeds], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    figures: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="a checkout of the baseline code")
    parser.add_argument("--lists", default="default", help="comma-separated openb lists")
    parser.add_argument("--seeds", default="42,43", help="comma-separated seeds, run in one process per list")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    args = parser.parse_args()
    cpu = {"base": 0.0, "ours": 0.0}
    pods, differs = 0, []
    for _ in range(args.rounds):
        for pod_list in args.lists.split(","):
            base = run(args.base, args.data_dir, pod_list, args.seeds)
            ours = run(ROOT, args.data_dir, pod_list, args.seeds)
            if (base["allocated"], base["placed"]) != (ours["allocated"], ours["placed"]):
                print(f"{pod_list}: allocation differs (per seed): base placed {base['placed']} allocated "
                      f"{base['allocated']} milli; ours placed {ours['placed']} allocated {ours['allocated']} milli")
                differs.append(pod_list)
            for name, figures in (("base", base), ("ours", ours)):
                seconds = figures["cpu_seconds"]
                assert isinstance(seconds, float)
                cpu[name] += seconds
            count = ours["pods"]
            assert isinstance(count, int)
            pods += count
    per_pod = {name: 1e3 * seconds / pods for name, seconds in cpu.items()}
    ratio = cpu["base"] / cpu["ours"]
    print(json.dumps({"lists": args.lists, "seeds": args.seeds, "rounds": args.rounds, "pods": pods,
                      "base_cpu_ms_per_pod": round(per_pod["base"], 4), "ours_cpu_ms_per_pod": round(per_pod["ours"], 4),
                      "speedup_ratio": round(ratio, 2), "same_allocations": not differs,
                      "projected_full_run_seconds_2_workers": round(per_pod["ours"] / 1e3 * FULL_RUN_PODS / 2, 1)}))
    return 1 if differs else 0  # a speed-up that places differently is not the same work done faster


if __name__ == "__main__":
    raise SystemExit(main())
