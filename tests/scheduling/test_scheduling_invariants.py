"""The invariants of live scheduling (issue 31), property-based: random clusters through the
production round (``SchedulingRound``, what ``gpuwarden scheduler run`` and the demo run), round
after round, and no round may break one.

Each example is a random cluster (``tests/random_clusters.py``): whole-GPU, time-sliced and MIG
nodes, taints and zones, teams with and without guarantees, a namespace outside the queue running
work of its own, gangs, priorities, checkpointable and bare work, selectors that match nothing,
MIG profiles no node offers, all arriving over rounds into a cluster that fills up. Every round:
- the plan verifier (``scheduling.verify``) refused nothing: the engine never proposed a plan that
  over-commits, takes a guarantee for another team's borrowing, passes a burst, splits a gang,
  stops what it started or acts outside the queue;
- the cluster, from its own records, holds no GPU, MIG instance, share or CPU over its capacity,
  was never told to act outside the queue, stopped nothing the round started, and every bare pod
  evicted was said to be the last resort.
The same rounds run on Kubernetes (the official client over HTTP, the fake API server and its
kube-scheduler and Job-controller stand-ins, which hold pods for their grace period) in
``tests/scheduling/test_scheduling_soak.py``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from random_clusters import ClusterSpec, ModelCluster, cluster_specs

from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.scheduling.verify import Violation

ROUNDS = 12
EXAMPLES = 400
SEEN = {"clusters": 0, "rounds": 0, "binds": 0, "stops": 0}


def _play(spec: ClusterSpec, policy: str = "gpuwarden") -> ModelCluster:
    cluster = ModelCluster(spec)
    refused: list[tuple[int, tuple[Violation, ...]]] = []
    loop = SchedulingRound(cluster, policy, on_round=[lambda outcome: refused.append((cluster.round, outcome.refused))
                                                      if outcome.refused else None])
    for _ in range(ROUNDS):
        results = loop.run_round()
        SEEN["rounds"] += 1
        SEEN["stops"] += sum(1 for r in results if r.action.kind.value in ("suspend", "preempt"))
        cluster.next_round()
    SEEN["clusters"] += 1
    SEEN["binds"] += cluster.binds
    assert not refused, refused[0]
    assert loop.plans_refused == 0
    assert not cluster.violations.found, cluster.violations.found[:5]
    return cluster


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cluster_specs())
def test_random_clusters_never_break_an_invariant_in_any_round(spec):
    _play(spec)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cluster_specs())
def test_the_kueue_baseline_keeps_them_too(spec):
    _play(spec, "kueue")


def test_the_random_clusters_exercised_the_round():
    """Not vacuous: the examples above admitted, preempted and ran many rounds (runs after them)."""
    assert SEEN["clusters"] >= EXAMPLES and SEEN["rounds"] >= EXAMPLES * ROUNDS, SEEN
    print(f"random clusters in memory: {SEEN}")
    assert SEEN["binds"] > 5 * EXAMPLES and SEEN["stops"] > EXAMPLES // 4, SEEN
