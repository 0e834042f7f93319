"""The GPUHealthy NodeCondition's cost per round at fleet scale, against the snapshot read it rides on.

The official ``kubernetes`` client talks to the fake API server (``tests/fake_kube_api.py``) holding
``--nodes`` 8-GPU nodes, ``--sick`` of them with an open health finding. Reported, median of
``--repeat``: the snapshot read (the baseline, measured in the same run), the first publish (every
node's condition written), a steady publish (nothing changed: one node list, no write) and a publish
after ``--sick`` nodes flipped; each with its API calls and its ratio to the snapshot.

    PYTHONPATH=. .venv/bin/python bench/bench_node_conditions.py [--nodes 1000] [--sick 50] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fake_kube_api import FakeKubeAPI  # noqa: E402
from kube_fleet import node  # noqa: E402

from gpuwarden.kube import KubeApi, KubeCluster, load_client  # noqa: E402
from gpuwarden.fleet import ActionKind, Finding, FindingKind, Severity  # noqa: E402
from gpuwarden.fleet.clock import FakeClock  # noqa: E402

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def one_run(nodes: int, sick: int) -> dict[str, tuple[float, int]]:
    api = FakeKubeAPI().start()
    try:
        for i in range(nodes):
            node(api, f"n{i}")
        with tempfile.TemporaryDirectory() as folder:
            client = load_client(api.kubeconfig(Path(folder) / "kc.json"), timeout_seconds=30.0)
            cluster = KubeCluster(KubeApi(client), clock=FakeClock(NOW))
            health = {f"n{i}": (Finding(FindingKind.OFF_THE_BUS, Severity.CRITICAL, f"n{i}", f"GPU-n{i}-0", {},
                                        ActionKind.CORDON, 0.99, NOW, NOW),) for i in range(sick)}
            out = {}
            for name, call in (("snapshot (baseline)", cluster.snapshot),
                               ("publish, first", lambda: cluster.publish_conditions(health)),
                               ("publish, steady", lambda: cluster.publish_conditions(health)),
                               (f"publish, {sick} flipped", lambda: cluster.publish_conditions({}))):
                before = len(api.requests)
                start = time.perf_counter()
                call()
                out[name] = (time.perf_counter() - start, len(api.requests) - before)
            return out
    finally:
        api.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--sick", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = [one_run(args.nodes, args.sick) for _ in range(args.repeat)]
    base = statistics.median(r["snapshot (baseline)"][0] for r in runs)
    print(f"{args.nodes} GPU nodes, {args.sick} with an open finding; median of {args.repeat}")
    for name in runs[0]:
        seconds = statistics.median(r[name][0] for r in runs)
        calls = runs[0][name][1]
        print(f"  {name:<22} {seconds:7.3f} s  {calls:5d} API calls  x{seconds / base:5.2f} of the snapshot")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
