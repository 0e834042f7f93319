"""One live scheduling round on the Kubernetes API at the issue's scale: read, plan, admit (issue 21).

The API side of the round (``bench_scheduler_round.py`` times the round itself without an API server).

The official ``kubernetes`` client reads a fake API server speaking the real REST protocol
(``tests/fake_kube_api.py``, in its own process, as a real one would be) holding ``--nodes`` 8-GPU
nodes under 50 leaf switches, 20 queue namespaces (``gpuwarden.io/queue``), 6 running one-GPU Job
pods and 2 CPU-only pods per node, and ``--gated`` pods behind gpuwarden's gate: one-GPU Jobs and
gangs (Jobs of 4 pods). With 1,000 nodes: 8,000 GPUs, 10,000 pods of which 2,000 gated.

Phases, timed separately (the scheduling round's own steps, ``actuator.scheduling_round``):
- snapshot: ``KubeCluster.snapshot()`` (paged lists; median of ``--repeat`` rounds);
- plan: the engine's state from the snapshot, one ``Scheduler`` pass with the ``gpuwarden``
  policy, decisions as actions, round after round as the loop runs it (it keeps the engine's jobs
  of unchanged workloads): the first round, and the median of the later ones (target < 1 s);
- apply: ``KubeCluster.apply`` of every action of the last plan (once: it admits the pods).
API calls of the round are counted by verb; the check: list pages (computed from the objects
served and the page size) plus exactly one PATCH per admitted pod, nothing else. The baseline is
the snapshot of the same fleet without the gated pods, measured in the same run.

    PYTHONPATH=. .venv/bin/python bench/bench_kube_admission.py [--nodes 1000] [--gated 2000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_actuator import api_server  # noqa: E402
from fake_kube_api import FakeKubeAPI  # noqa: E402
from kube_fleet import job, namespace, node, pod  # noqa: E402

from gpuwarden.kube import KubeApi, KubeCluster, load_client  # noqa: E402
from gpuwarden.kube.gates import QUEUE_LABEL  # noqa: E402
from gpuwarden.scheduler.scheduling_round import EPOCH  # noqa: E402
from gpuwarden.fleet import ActionKind  # noqa: E402
from gpuwarden.fleet.clock import FakeClock  # noqa: E402
from gpuwarden.scheduling import Scheduler  # noqa: E402
from gpuwarden.scheduling.planner import actions_for, policy_for, state_from_snapshot  # noqa: E402

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NAMESPACES = 20
GANG_PODS = 4
LISTS = ("nodes", "namespaces", "poddisruptionbudgets", "priorityclasses", "workloads.kueue.x-k8s.io", "pods", "jobs")


class CountingApi(KubeApi):
    """The client as the loop uses it, counting requests by verb and resource."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.by_verb: Counter[str] = Counter()
        self.by_list: Counter[str] = Counter()

    def call(self, method: Any, *args: Any, verb: str, resource: str, **kwargs: Any) -> Any:
        self.by_verb[verb] += 1
        if verb == "list":
            self.by_list[resource] += 1
        return super().call(method, *args, verb=verb, resource=resource, **kwargs)


def build(api: FakeKubeAPI, nodes: int, gated: int) -> dict[str, int]:
    """The fleet; returns how many objects each listed resource holds."""
    for n in range(NAMESPACES):
        namespace(api, f"team-{n}", {QUEUE_LABEL: f"team-{n}"}, {"gpuwarden.io/guaranteed-gpus": str(8 * nodes // NAMESPACES),
                                                  "gpuwarden.io/burst-gpus": str(16 * nodes // NAMESPACES)})
    pods = jobs = 0
    for i in range(nodes):
        name = f"gpu-node-{i:04d}"
        node(api, name, 8, labels={"gpuwarden.io/leaf-switch": f"leaf-{i % 50:02d}"})
        for p in range(8):
            ns = f"team-{(i + p) % NAMESPACES}"
            if p < 6:
                pod(api, ns, f"run-{i:04d}-{p}-0", name, 1, owner=("Job", f"run-{i:04d}-{p}"))
            else:
                pod(api, ns, f"svc-{i:04d}-{p}", name, 0, owner=("ReplicaSet", f"svc-{i:04d}"))
            pods += 1
    gangs = gated // 5 // GANG_PODS  # a fifth of the gated pods in gangs
    singles = gated - gangs * GANG_PODS
    for g in range(gangs + singles):
        ns, size = f"team-{g % NAMESPACES}", GANG_PODS if g < gangs else 1
        job_name = f"queued-{g:05d}"
        job(api, ns, job_name, 1, parallelism=size)
        jobs += 1
        for p in range(size):
            pod(api, ns, f"{job_name}-{p}", None, 1, owner=("Job", job_name), phase="Pending", gated=True)
            pods += 1
    return {"nodes": nodes, "namespaces": NAMESPACES, "poddisruptionbudgets": 0, "priorityclasses": 0,
            "workloads.kueue.x-k8s.io": 0, "pods": pods, "jobs": jobs}


@contextlib.contextmanager
def connected(nodes: int, gated: int) -> Iterator[tuple[dict[str, int], Any]]:
    """:func:`build` served in its own process (``bench_actuator.api_server``): (objects served, a client)."""
    with api_server(nodes, gated, fleet=build) as (kubeconfig, counts), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kc.json"
        path.write_text(kubeconfig)
        yield counts, load_client(str(path), timeout_seconds=120)


def medians(step: Any, repeat: int) -> tuple[float, float, Any]:
    """``step()`` run ``repeat`` times: (median wall seconds, median CPU seconds of this process, last result)."""
    wall, cpu, result = [], [], None
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        result = step()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    return statistics.median(wall), statistics.median(cpu), result


def plan(snapshot: Any, known: Any) -> tuple[tuple[Any, ...], Any]:
    """The round's planning step as ``SchedulingRound.run_round`` takes it: the engine's state (jobs
    of unchanged workloads kept from the last round), one ``gpuwarden`` pass, decisions as actions.
    Returns the actions and the jobs to keep."""
    state, workloads = state_from_snapshot(snapshot, origin=EPOCH, known=known)
    scheduler = Scheduler(policy_for(snapshot, "gpuwarden"))
    now = (snapshot.taken_at - EPOCH).total_seconds()
    actions = actions_for(scheduler.schedule(state, now), state, scheduler.policy.name)
    return actions, {key: (workloads[key], job) for key, job in state.jobs.items()}


def one_round(nodes: int, gated: int, repeat: int, page_size: int) -> dict[str, Any]:
    with connected(nodes, gated) as (counts, client):
        api = CountingApi(client)
        cluster = KubeCluster(api, page_size=page_size, clock=FakeClock(NOW))
        snap_s, snap_cpu_s, plan_s, plan_cpu_s, known, actions = [], [], [], [], None, ()
        for _ in range(repeat):  # round after round, as the loop runs (the plan keeps its jobs)
            wall, cpu, snapshot = medians(cluster.snapshot, 1)
            snap_s.append(wall)
            snap_cpu_s.append(cpu)
            wall, cpu, (actions, known) = medians(lambda: plan(snapshot, known), 1)  # noqa: B023 - called at once
            plan_s.append(wall)
            plan_cpu_s.append(cpu)
        api.by_verb.clear()
        api.by_list.clear()
        cluster.snapshot()  # the round whose requests are counted: read, then apply the plan
        started = time.perf_counter()
        results = [cluster.apply(a) for a in actions]
        apply_s = time.perf_counter() - started
        admitted = sum(len(cluster.inventory.pods.get(r.action.target, ())) for r in results
                       if r.ok and r.action.kind == ActionKind.BIND)
        pages = {r: max(1, math.ceil(n / page_size)) for r, n in counts.items()}
        return {"nodes": nodes, "gpus": len(snapshot.gpus), "pods": counts["pods"], "gated": gated,
                "workloads": len(snapshot.workloads), "snapshot_s": statistics.median(snap_s),
                "snapshot_cpu_s": statistics.median(snap_cpu_s), "plan_cold_s": plan_s[0], "plan_cold_cpu_s": plan_cpu_s[0],
                "plan_s": statistics.median(plan_s[1:] or plan_s), "plan_cpu_s": statistics.median(plan_cpu_s[1:] or plan_cpu_s),
                "apply_s": apply_s, "actions": Counter(a.kind.value for a in actions),
                "failed": [r.message for r in results if not r.ok][:3], "admitted": admitted,
                "verbs": dict(api.by_verb), "lists": dict(api.by_list), "pages": pages}


def baseline(nodes: int, repeat: int, page_size: int) -> tuple[float, float]:
    """The snapshot read of the same fleet without gated pods: (median wall, median CPU seconds)."""
    with connected(nodes, 0) as (_, client):
        cluster = KubeCluster(KubeApi(client), page_size=page_size, clock=FakeClock(NOW))
        wall, cpu, _ = medians(cluster.snapshot, repeat)
        return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gated", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--page-size", type=int, default=500)
    args = parser.parse_args()
    base_s, base_cpu_s = baseline(args.nodes, args.repeat, args.page_size)
    row = one_round(args.nodes, args.gated, args.repeat, args.page_size)
    print(f"{row['nodes']} nodes, {row['gpus']} GPUs, {row['pods']} pods of which {row['gated']} gated "
          f"({row['workloads']} GPU workloads in the snapshot)")
    print(f"snapshot read {row['snapshot_s']:.2f} s wall, {row['snapshot_cpu_s']:.2f} s CPU (medians of {args.repeat}); "
          f"baseline without gated pods {base_s:.2f} s wall, {base_cpu_s:.2f} s CPU; ratio x{row['snapshot_s'] / base_s:.2f} "
          f"wall, x{row['snapshot_cpu_s'] / base_cpu_s:.2f} CPU")
    print(f"plan (state + one gpuwarden pass + actions), first round {row['plan_cold_s']:.3f} s wall, "
          f"{row['plan_cold_cpu_s']:.3f} s CPU; later rounds {row['plan_s']:.3f} s wall, {row['plan_cpu_s']:.3f} s CPU "
          f"(medians of {args.repeat - 1}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs); "
          f"actions {dict(row['actions'])}")
    print(f"apply {row['apply_s']:.2f} s: {row['admitted']} pods admitted; failures: {row['failed'] or 'none'}")
    print(f"API calls in the round by verb: {row['verbs']}; lists by resource: {row['lists']}")
    expected = {"list": sum(row["pages"].values()), "patch": row["admitted"]}
    bounded = row["verbs"] == {k: v for k, v in expected.items() if v}
    print(f"check list pages ({expected['list']}) + one PATCH per admitted pod ({expected['patch']}): "
          f"{'holds' if bounded else 'BROKEN'}")
    ok = row["plan_s"] < 1.0
    print(f"target plan < 1 s: {'met' if ok else 'MISSED'} ({row['plan_s']:.3f} s)")
    return 0 if ok and bounded else 1


if __name__ == "__main__":
    sys.exit(main())
