"""One actuator round at fleet scale: snapshot from the API server, plan, limits.

The official ``kubernetes`` client reads a fake API server speaking the real REST protocol
(``tests/fake_kube_api.py``; there is no kube-apiserver here) holding ``--nodes`` 8-GPU nodes and
``--pods-per-node`` pods per node (8 one-GPU Job pods and the rest CPU-only), then the round plans
from health findings, hoarding findings and the scheduling planner, and evaluates the limits as
observe mode does. Reported per size: API calls per round (lists, page by page: they must not grow
with pods beyond the page count), snapshot seconds, planning seconds (median of ``--repeat``). The
baseline is the same round on a fleet ``--baseline-ratio`` times smaller, measured in the same run.

    PYTHONPATH=. .venv/bin/python bench/bench_actuator.py [--nodes 1000] [--pods-per-node 10] [--repeat 3]

Target (#11): 1,000 nodes, 8,000 GPUs, 10,000 pods: planning < 1 s.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, UTC
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fake_kube_api import FakeKubeAPI  # noqa: E402
from kube_fleet import namespace, node, pod  # noqa: E402

from gpuwarden.remediation import Actuator, Mode, PlanningPolicy, SafetyLimits, plan_from_findings  # noqa: E402
from gpuwarden.kube import KubeApi, KubeCluster, load_client  # noqa: E402
from gpuwarden.fleet import ActionKind, Finding, Severity  # noqa: E402
from gpuwarden.fleet.clock import FakeClock  # noqa: E402
from gpuwarden.scheduling.planner import plan as schedule_plan  # noqa: E402

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def build(api: FakeKubeAPI, nodes: int, pods_per_node: int, namespaces: int = 20) -> int:
    for n in range(namespaces):
        namespace(api, f"team-{n}", {"gpuwarden.io/team": f"team-{n}", "gpuwarden.io/reclaim-idle": "true"},
                  {"gpuwarden.io/guaranteed-gpus": str(8 * nodes // namespaces)})
    pods = 0
    for i in range(nodes):
        name = f"gpu-node-{i:04d}"
        node(api, name, 8)
        for p in range(pods_per_node):
            ns = f"team-{(i + p) % namespaces}"
            if p < 8:
                job_name = f"job-{i:04d}-{p}"
                pod(api, ns, f"{job_name}-0", name, 1, owner=("Job", job_name),
                    labels={"batch.kubernetes.io/job-name": job_name})
            else:
                pod(api, ns, f"sidecar-{i:04d}-{p}", name, 0, owner=("ReplicaSet", f"svc-{i:04d}"))
            pods += 1
    return pods


def findings(nodes: int) -> list[Finding]:
    health = [Finding("off-the-bus", Severity.CRITICAL, f"gpu-node-{i:04d}", f"GPU-{i}-1", {"xid": 79},
                      ActionKind.DRAIN, 0.99, NOW, NOW) for i in range(0, nodes, 20)]
    idle = [Finding("hoarded", Severity.WARNING, "", None,
                    {"namespace": f"team-{(i + 3) % 20}", "pod": f"job-{i:04d}-3-0"}, None, 1.0,
                    NOW - timedelta(hours=5), NOW) for i in range(0, nodes, 5)]
    return health + idle


def serve(nodes: int, pods_per_node: int, answers: multiprocessing.Queue, stop: multiprocessing.Event,
          fleet=build) -> None:
    """The API server runs in its own process, as a real one would: its objects are not in the
    actuator's heap (nor its garbage collector's work). ``fleet`` fills it (a top-level function)."""
    api = FakeKubeAPI().start()
    pods = fleet(api, nodes, pods_per_node)
    with tempfile.TemporaryDirectory() as tmp:
        answers.put((Path(api.kubeconfig(Path(tmp) / "kc.json")).read_text(), pods))
        stop.wait()
    api.stop()


@contextlib.contextmanager
def api_server(nodes: int, pods_per_node: int, fleet=build) -> Iterator[tuple[str, int]]:
    """:func:`serve` in its own process: yields (its kubeconfig's text, pods), stops it on the way out."""
    answers, stop = multiprocessing.Queue(), multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(nodes, pods_per_node, answers, stop, fleet), daemon=True)
    server.start()
    try:
        yield answers.get(timeout=600)
    finally:
        stop.set()
        server.join(timeout=30)


def one_size(nodes: int, pods_per_node: int, repeat: int, page_size: int = 500) -> dict:
    with api_server(nodes, pods_per_node) as (kubeconfig, pods):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "kc.json"
            path.write_text(kubeconfig)
            client = load_client(str(path), timeout_seconds=60)
        cluster = KubeCluster(KubeApi(client), page_size=page_size, clock=FakeClock(NOW))
        snap_s, plan_s, calls = [], [], []
        for _ in range(repeat):
            before = cluster.api.calls
            started = time.perf_counter()
            snapshot = cluster.snapshot()
            snap_s.append(time.perf_counter() - started)
            calls.append(cluster.api.calls - before)
            started = time.perf_counter()
            schedule_plan(snapshot, "gpuwarden")  # the scheduling loop's plan on the same snapshot (its own loop now)
            found = findings(nodes)
            plan = plan_from_findings(found, snapshot, PlanningPolicy(notify_grace_seconds=0))
            actuator = Actuator(cluster, Mode.OBSERVE, SafetyLimits(), clock=FakeClock(NOW))
            entries = actuator.execute(plan, snapshot)  # limits evaluated on the same snapshot
            plan_s.append(time.perf_counter() - started)
        return {"nodes": nodes, "gpus": len(snapshot.gpus), "pods": pods, "workloads": len(snapshot.workloads),
                "calls": statistics.median(calls), "snapshot_s": statistics.median(snap_s),
                "plan_s": statistics.median(plan_s), "actions": len(plan.actions),
                "blocked": sum(e.outcome.value == "blocked-by-limit" for e in entries)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods-per-node", type=int, default=10)
    parser.add_argument("--baseline-ratio", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--page-size", type=int, default=500, help="items per list page (default 500, as kubectl)")
    args = parser.parse_args()
    base = one_size(max(1, args.nodes // args.baseline_ratio), args.pods_per_node, args.repeat, args.page_size)
    full = one_size(args.nodes, args.pods_per_node, args.repeat, args.page_size)
    for row in (base, full):
        print(f"{row['nodes']:>5} nodes {row['gpus']:>5} GPUs {row['pods']:>6} pods ({row['workloads']} GPU workloads): "
              f"{row['calls']:.0f} API calls/round, snapshot {row['snapshot_s']:.2f} s, planning+limits "
              f"{row['plan_s']:.3f} s, {row['actions']} actions ({row['blocked']} would be blocked)")
    print(f"ratio to baseline: pods x{full['pods'] / base['pods']:.1f} -> API calls x{full['calls'] / base['calls']:.2f} "
          f"(list pages of {args.page_size}; one GET per pod would be {full['pods']} calls), "
          f"planning x{full['plan_s'] / base['plan_s']:.1f}")
    ok = full["plan_s"] < 1.0
    print(f"target planning < 1 s at {full['nodes']} nodes: {'met' if ok else 'MISSED'} ({full['plan_s']:.3f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
