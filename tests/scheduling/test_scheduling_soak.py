"""The invariants of live scheduling on Kubernetes (issue 31): random clusters and a long soak with
churn, through ``SchedulingRound(KubeCluster)`` over the official client and real HTTP.

No kube-apiserver, kube-scheduler or Job controller can run here: the fake API server
(``tests/fake_kube_api.py``) enforces the API's rules, its kube-scheduler stand-in binds only what
fits every resource (GPUs, time-sliced shares, MIG instances, CPU, memory), evicts lower-priority
pods when a pod does not fit (DefaultPreemption), and deleted pods hold their resources for their
grace period, as a kubelet does (``tests/gated_scenario.FakeCluster``). Each round:
- the plan verifier refused nothing;
- gpuwarden wrote nothing into a namespace outside the queue, and a pod gated by hand there stays
  gated;
- kube-scheduler never had to make room for a pod gpuwarden admitted (no preemption by it), and no
  admitted pod waited unbound for more than two rounds: an admission is onto resources that are
  free, or held for it while its victims stop.
The random clusters are ``tests/random_clusters.py``'s (the same as ``tests/scheduling/test_scheduling_invariants.py``
plays in memory); the soak is one mixed cluster with work arriving, ending and deleted by its users
for 1,000 rounds.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from random_clusters import MIG_LAYOUTS, ClusterSpec, NodeSpec, WorkSpec, cluster_specs
from fake_kube_api import BATCH, CORE
from shared_cluster import Shared, gpu_node, pod_spec, team_namespace

from gpuwarden.kube.gates import ADMITTED_NODE_ANNOTATION

ROUND_SECONDS = 30
PRIORITY = {"low": "low", "normal": "normal", "high": "high"}
# Work outside the queue runs below every class of the queue's: kube-scheduler (PrioritySort) binds a
# higher-priority Pending pod first, so an outside pod of equal priority, Pending when gpuwarden
# admits onto the GPUs it waits for, could take them first (docs/scheduling-live.md, "Shared clusters")


def _install_nodes(cluster: Shared, nodes: Iterable[NodeSpec]) -> None:
    for n in nodes:
        labels = {"zone": n.zone}
        taints = [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}] if n.tainted else None
        cpu = str(n.cpu_milli // 1000)
        if n.kind == "shared":
            gpu_node(cluster.api, n.name, gpus=n.gpus, shared=n.gpus * n.replicas, leaf=n.leaf, labels=labels,
                     taints=taints, cpu=cpu)
        elif n.kind == "mig":
            counts: dict[str, int] = {}
            for profile in MIG_LAYOUTS[n.layout]:
                counts[profile] = counts.get(profile, 0) + n.gpus
            gpu_node(cluster.api, n.name, gpus=n.gpus, mig=counts, mig_config=n.layout, leaf=n.leaf, labels=labels,
                     taints=taints, cpu=cpu)
        else:
            gpu_node(cluster.api, n.name, gpus=n.gpus, leaf=n.leaf, labels=labels, taints=taints, cpu=cpu)


def _submit(cluster: Shared, work: WorkSpec, in_queue: bool, name: str | None = None) -> None:
    resource = {"whole": "nvidia.com/gpu", "share": "nvidia.com/gpu.shared", "mig": f"nvidia.com/mig-{work.profile}"}
    spec = pod_spec(resource[work.kind], work.count if work.kind == "whole" else 1,
                    priority=PRIORITY[work.priority] if in_queue else "background", gated=in_queue,
                    node_selector={"zone": work.zone} if work.zone else None,
                    tolerations=[{"key": "dedicated", "operator": "Exists"}] if work.tolerates else None,
                    cpu=f"{work.cpu_milli}m", memory="8Gi", grace_seconds=ROUND_SECONDS)
    notes = {"gpuwarden.io/checkpointable": "true"} if work.checkpointable else {}
    runs = {"fake.gpuwarden.io/run-seconds": str(work.runs * ROUND_SECONDS)}
    if work.bare:
        cluster.pod(work.team, name or work.name, spec, annotations={**notes, **runs})
    else:
        cluster.job(work.team, name or work.name, spec, parallelism=work.pods, annotations=notes,
                    run_seconds=work.runs * ROUND_SECONDS)


def _collect_finished(api) -> None:
    """What the TTL-after-finished controller does: finished Jobs and their pods, and finished bare
    pods, deleted (a long soak would otherwise carry every pod it ever made)."""
    done = {(j["metadata"]["namespace"], j["metadata"]["name"]) for j in api.objects(BATCH, "jobs", copy=False)
            if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in (j.get("status") or {}).get("conditions") or ())}
    with api._lock:
        jobs, pods = api.store.get((BATCH, "jobs"), {}), api.store.get((CORE, "pods"), {})
        for key in done:
            jobs.pop(key, None)
        for key, pod in list(pods.items()):
            owner = (pod["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name")
            finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if finished and (owner is None or (key[0], owner) in done):
                del pods[key]


class Watch:
    """The per-round checks, from the API server's objects and the requests since the last round."""

    def __init__(self, cluster: Shared, outside: set[str]) -> None:
        self.cluster, self.outside = cluster, outside
        # the queue's notes (positions, reasons, Events) at a smaller budget per round: the same path,
        # fewer requests to the fake server in a thousand rounds
        cluster.loop.publisher.writes_per_round = 8
        self.unbound_rounds: dict[str, int] = {}
        self.rounds = self.admissions = self.stops = 0
        self.seen_requests = 0

    def round(self) -> None:
        cluster = self.cluster
        _collect_finished(cluster.api)
        step = cluster.fake.step(ROUND_SECONDS)
        queue_preempted = [(v, p) for v, p in step.preempted if p.split("/", 1)[0] not in self.outside]
        assert not queue_preempted, f"kube-scheduler made room for gpuwarden's admissions: {queue_preempted}"
        results = cluster.loop.run_round()
        self.rounds += 1
        self.admissions += sum(1 for r in results if r.ok and r.action.kind.value in ("bind", "resume"))
        self.stops += sum(1 for r in results if r.ok and r.action.kind.value in ("suspend", "preempt"))
        assert cluster.loop.plans_refused == 0, "a plan broke an invariant (see the error log)"
        new, self.seen_requests = cluster.api.requests[self.seen_requests:], len(cluster.api.requests)
        outside = [f"{r.method} {r.path}" for r in new if r.user == "" and r.method in ("POST", "PATCH", "PUT", "DELETE")
                   and any(f"/namespaces/{ns}/" in r.path for ns in self.outside)]
        assert not outside, outside[:3]
        for pod in cluster.live_pods():
            name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            admitted = (pod["metadata"].get("annotations") or {}).get(ADMITTED_NODE_ANNOTATION)
            if admitted and not pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp"):
                self.unbound_rounds[name] = self.unbound_rounds.get(name, 0) + 1
                assert self.unbound_rounds[name] <= 2, f"{name} admitted to {admitted} and not bound for 2 rounds"


def _play(cluster: Shared, spec: ClusterSpec, rounds: int) -> Watch:
    _install_nodes(cluster, spec.nodes)
    outside = set(spec.outside)
    for team in spec.teams:
        team_namespace(cluster.api, team.name, guaranteed=f"{team.guaranteed_gpus:g}",
                       burst=f"{team.burst_limit_gpus:g}" if team.burst_limit_gpus < 1000 else None)
    for name in outside:
        team_namespace(cluster.api, name, queue=False)
    watch = Watch(cluster, outside)
    for r in range(rounds):
        for work in spec.work:
            if work.arrive == r and (work.team not in outside or r == 0):
                _submit(cluster, work, work.team not in outside)
        if r == 0 and outside:  # the gate written by hand where nobody opted in: left alone
            cluster.pod(sorted(outside)[0], "gated-by-hand", pod_spec(count=1))
        watch.round()
    for ns in outside:
        pod = cluster.pod_named(ns, "gated-by-hand")
        assert pod is not None and pod["spec"].get("schedulingGates"), "a pod outside the queue was admitted"
    return watch


SEEN = {"clusters": 0, "rounds": 0, "admissions": 0, "stops": 0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("soak")


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(cluster_specs(max_nodes=4, max_work=16))
def test_random_clusters_on_kubernetes_never_break_an_invariant(folder, spec):
    cluster = Shared(folder)
    try:
        watch = _play(cluster, spec, rounds=10)
    finally:
        cluster.stop()
    for key, value in (("clusters", 1), ("rounds", watch.rounds), ("admissions", watch.admissions),
                       ("stops", watch.stops)):
        SEEN[key] += value


def test_the_random_kubernetes_clusters_exercised_admission():
    """Not vacuous: the examples above admitted work (much of what random clusters ask can never
    start: a zone no node has, a MIG profile no node offers; each waits with its reason, and the
    soak below is where preemption runs hundreds of times)."""
    print(f"random clusters on Kubernetes: {SEEN}")
    assert SEEN["clusters"] >= 30 and SEEN["rounds"] >= 300, SEEN
    assert SEEN["admissions"] >= 60, SEEN


SOAK_NODES = (NodeSpec("whole-0", "whole", 8, leaf="leaf-a", zone="a"),
              NodeSpec("whole-1", "whole", 8, leaf="leaf-a", zone="b"),
              NodeSpec("whole-2", "whole", 4, leaf="leaf-b", zone="a", tainted=True),
              NodeSpec("shared-0", "shared", 2, replicas=4, leaf="leaf-b", zone="b"),
              NodeSpec("mig-0", "mig", 2, layout="balanced", leaf="leaf-b", zone="a"))


def test_a_thousand_rounds_of_churn_keep_every_invariant(tmp_path):
    """One mixed cluster, three teams in the queue and one namespace outside it, for 1,000 rounds of
    30 s: each round a few arrivals of every kind (Jobs, gangs, bare pods; whole GPUs, shares, MIG;
    priorities; selectors, tolerations), and now and then a user deleting a running pod."""
    rng = random.Random(31)
    cluster = Shared(tmp_path)
    try:
        _install_nodes(cluster, SOAK_NODES)
        for name, guaranteed, burst in (("research", "12", "24"), ("vision", "8", "16"), ("nlp", "4", None)):
            team_namespace(cluster.api, name, guaranteed=guaranteed, burst=burst)
        team_namespace(cluster.api, "web", queue=False)
        watch = Watch(cluster, {"web"})
        made = 0
        for r in range(1000):
            for _ in range(rng.choice((0, 0, 0, 0, 1, 1, 2))):  # about the fleet's capacity, over time
                made += 1
                kind = rng.choice(("whole", "whole", "whole", "share", "mig"))
                pods = rng.choice((1, 1, 1, 2)) if kind == "whole" else 1
                work = WorkSpec(f"w{made}", rng.choice(("research", "vision", "nlp")), kind,
                                count=rng.choice((1, 1, 1, 2, 2, 4, 8)) if kind == "whole" else 1, pods=pods,
                                priority=rng.choice(("low", "normal", "normal", "high")),
                                checkpointable=rng.random() < 0.5, bare=pods == 1 and rng.random() < 0.2,
                                runs=rng.randint(2, 20), zone=rng.choice((None, None, None, "a", "b")),
                                tolerates=rng.random() < 0.3, profile=rng.choice(("1g.10gb", "2g.20gb", "3g.40gb")),
                                cpu_milli=rng.choice((1000, 4000, 8000)))
                _submit(cluster, work, True)
            if r % 50 == 0:  # the namespace outside the queue runs its own work, and gates one pod by hand
                _submit(cluster, WorkSpec(f"web{r}", "web", "whole", runs=rng.randint(5, 60)), False)
                cluster.pod("web", f"by-hand-{r}", pod_spec(count=1))
            if r % 7 == 3:  # a user deletes a running pod of the queue
                running = [p for p in cluster.live_pods() if p["spec"].get("nodeName")
                           and p["metadata"]["namespace"] != "web" and not p["metadata"].get("deletionTimestamp")]
                if running:
                    victim = rng.choice(running)["metadata"]
                    cluster.api.act("alice@example.com", "DELETE",
                                    f"/api/v1/namespaces/{victim['namespace']}/pods/{victim['name']}")
            watch.round()
        left = len(cluster.live_pods())
        by_hand = [p for p in cluster.live_pods("web") if p["metadata"]["name"].startswith("by-hand-")]
        assert by_hand and all(p["spec"].get("schedulingGates") for p in by_hand)
        assert cluster.loop.queue["ignored_pods"] and all(
            row["pod"].startswith("web/by-hand-") for row in cluster.loop.queue["ignored_pods"])
    finally:
        cluster.stop()
    assert watch.rounds == 1000 and watch.admissions >= 400 and watch.stops >= 20, vars(watch)
    assert left < 200, left  # the queue drains about as fast as it fills: a steady state, not a pile
    print(f"soak: {watch.rounds} rounds, {made} workloads submitted, {watch.admissions} admissions, "
          f"{watch.stops} preemptions, {left} pods left, 0 invariants broken")
