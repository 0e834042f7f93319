"""Issue 32 item 1: ``kube-default``, kube-scheduler's default behaviour as a policy on the engine.

Its parts one by one: PrioritySort (priority, then creation order), LeastAllocated spreading (where
gpuwarden's FGD packs), no gang (a job of two pods with room for one holds one pod's GPUs and waits,
computing nothing, where gpuwarden's gang admission holds none), and the plan verifier's rule that a
workload starts whole kept for every policy (a replay hands kube-default each pod as a workload). Pod-for-pod parity with the kube-scheduler stand-in
through the live loop: ``tests/scheduler/test_kube_default_parity.py``.
"""

from __future__ import annotations

import pytest

from gpuwarden.scheduling import POLICIES, DecisionKind, Job, NodeState, Scheduler, State
from gpuwarden.scheduling.replay import Replay, ReplayMetrics
from gpuwarden.scheduling.replay.pods import split_pods
from gpuwarden.scheduling.verify import Holder, Ledger, Step, violations

KUBE = POLICIES["kube-default"]


def node(name: str, gpus: int = 8, cpu: int = 64_000, mem: int = 512 * 2**30) -> NodeState:
    return NodeState(name=name, model="H100", gpu_count=gpus, cpu_free=cpu, mem_free=mem)


def test_kube_default_is_kube_schedulers_defaults_made_of_registered_parts():
    assert KUBE.name == "kube-default"
    assert (KUBE.order, KUBE.preempt, KUBE.admission_check, KUBE.placement.scorer) == \
        ("fifo", "priority", "open", "leastallocated")
    assert not KUBE.quotas and not KUBE.reclaim and not KUBE.checkpoint and not KUBE.gang
    assert all(POLICIES[name].gang for name in ("fifo", "kueue", "tiresias", "gpuwarden"))


def test_priority_sort_takes_priority_first_then_creation_order_then_name():
    state = State([node("n0")])
    for name, priority, submitted in (("old-low", 1, 0.0), ("new-high", 3, 50.0), ("old-high", 3, 10.0),
                                      ("b-normal", 2, 20.0), ("a-normal", 2, 20.0)):
        state.add_job(Job(name, "t", priority=priority, submitted=submitted))
    order = [j.name for j in Scheduler(KUBE).queue(state, 100.0)]
    assert order == ["old-high", "new-high", "a-normal", "b-normal", "old-low"]


def _one_pass(policy: str, jobs: list[Job], nodes: list[NodeState]) -> dict[str, set[str]]:
    state = State(nodes)
    for job in jobs:
        state.add_job(job)
    decisions = Scheduler(POLICIES[policy]).schedule(state, 0.0)
    return {d.job: {slot[0] for slot in d.placements} for d in decisions if d.kind == DecisionKind.BIND}


def test_least_allocated_spreads_two_one_gpu_pods_where_gpuwarden_packs_them():
    jobs = lambda: [Job("first", "t", submitted=0.0, cpu_milli=4000, mem_bytes=2**34),  # noqa: E731
                    Job("second", "t", submitted=1.0, cpu_milli=4000, mem_bytes=2**34)]
    spread = _one_pass("kube-default", jobs(), [node("n0"), node("n1")])
    assert spread == {"first": {"n0"}, "second": {"n1"}}  # equal scores: the first node; then the emptier one
    packed = _one_pass("gpuwarden", jobs(), [node("n0"), node("n1")])
    assert len(packed["first"] | packed["second"]) == 1


def test_least_allocated_weighs_cpu_and_memory_too():
    """Two nodes with the same GPUs free: the one left with more CPU and memory free (as shares) wins."""
    job = Job("p", "t", cpu_milli=8000, mem_bytes=2**35)
    assert _one_pass("kube-default", [job], [node("small", cpu=16_000), node("large", cpu=128_000)]) == {"p": {"large"}}


def test_in_one_pass_kube_default_places_the_pods_of_a_job_one_by_one_and_starts_it_whole():
    """In a pass (what the live loop carries out: a Cluster binds a workload whole) a job's pods are
    placed one by one by the scorer: spread over the nodes; one that fits only in part waits, and its
    tentative pods leave the state as it was."""
    assert _one_pass("kube-default", [Job("pair", "t", pods=2, gpus_per_pod=2)], [node("n0"), node("n1")]) == \
        {"pair": {"n0", "n1"}}
    state = State([node("n0", gpus=4)])
    state.add_job(Job("pair", "t", pods=2, gpus_per_pod=4))
    assert Scheduler(KUBE).schedule(state, 0.0) == []
    assert state.nodes["n0"].gpu_free == [1000] * 4 and state.nodes["n0"].cpu_free == 64_000
    assert state.quotas.used("t", Job("pair", "t").flavour) == 0


class _Held(ReplayMetrics):
    """GPU-seconds each job's pods held while running, by job."""

    def __init__(self) -> None:
        self.held: dict[str, float] = {}

    def accrue(self, replay: Replay, start: float, end: float) -> None:
        for job in replay.running.values():
            name = job.name.split("/pod-")[0]
            self.held[name] = self.held.get(name, 0.0) + (end - start) * job.gpu_equivalents


def _two_pods_with_room_for_one(policy: str) -> tuple[Job, Replay, _Held]:
    """Two 8-GPU nodes; ``first`` (8 GPUs) runs on one for 500 s; ``big`` (2 pods x 8 GPUs, 100 s of
    work) arrives at 1 s, with room for one of its pods."""
    first = Job("first", "t", gpus_per_pod=8, submitted=0.0, duration=500.0)
    big = Job("big", "t", pods=2, gpus_per_pod=8, submitted=1.0, duration=100.0)
    metrics = _Held()
    replay = Replay(State([node("n0"), node("n1")]), Scheduler(POLICIES[policy]), [first, big], metrics=metrics).run()
    return big, replay, metrics


def test_a_two_pod_job_with_room_for_one_holds_one_pods_gpus_and_waits_under_kube_default():
    big, replay, metrics = _two_pods_with_room_for_one("kube-default")
    # one pod held 8 GPUs from 1 s to 500 s computing nothing; then both ran its 100 s of work
    assert metrics.held["big"] == pytest.approx(8 * 499 + 16 * 100)
    assert big.first_started == 500.0 and big.finished == 600.0 and big.progress == pytest.approx(100.0)
    assert replay.runs["big"] == [(500.0, 600.0)]  # it computed only while both pods ran
    assert replay.runs["big/pod-0"] == [(1.0, 600.0)] and replay.runs["big/pod-1"] == [(500.0, 600.0)]


def test_gpuwardens_gang_admission_holds_none_of_it_meanwhile():
    big, replay, metrics = _two_pods_with_room_for_one("gpuwarden")
    assert metrics.held["big"] == pytest.approx(16 * 100)
    assert big.first_started == 500.0 and big.finished == 600.0
    assert replay.runs["big"] == [(500.0, 600.0)]


def test_a_job_whose_pods_can_never_all_run_holds_what_it_got_and_ends_the_replay():
    """Three pods on two nodes: two hold their GPUs for good, the job never computes; the replay ends
    (nothing computes, nothing arrives: no end will free room) instead of ticking to its horizon."""
    job = Job("three", "t", pods=3, gpus_per_pod=8, duration=100.0, checkpointable=True)
    replay = Replay(State([node("n0"), node("n1")]), Scheduler(KUBE), [job], tick_seconds=300.0).run()
    assert job.finished is None and job.progress == 0.0 and job.first_started is None
    assert sorted(replay.running) == ["three/pod-0", "three/pod-1"] and list(replay.waiting) == ["three/pod-2"]
    assert replay.now == 0.0


def test_a_preempted_pod_stops_its_job_which_keeps_its_last_checkpoint():
    """A high-priority arrival preempts one pod of a running two-pod job (priority preemption, by pod):
    the job stops computing and rolls back to its last periodic checkpoint; its other pod keeps its
    GPUs; once the pod runs again the job computes the rest."""
    from gpuwarden.scheduling.replay import JobModel

    low = Job("low", "t", priority=1, pods=2, gpus_per_pod=8, submitted=0.0, duration=1000.0, checkpointable=True)
    urgent = Job("urgent", "t", priority=3, gpus_per_pod=8, submitted=250.0, duration=100.0)
    model = JobModel(resume_overhead_seconds=10.0, checkpoint_interval_seconds=200.0)
    replay = Replay(State([node("n0"), node("n1")]), Scheduler(KUBE), [low, urgent], model).run()
    assert urgent.first_started == 250.0 and urgent.finished == 350.0
    # computed 0-250 (checkpoint at 200), waited 250-350, resumed at 350 (+10 s), 800 s left
    assert replay.runs["low"] == [(0.0, 250.0), (350.0, 1160.0)] and low.finished == 1160.0
    assert low.progress == pytest.approx(1000.0)


def test_split_pods_splits_multi_pod_whole_gpu_jobs_only():
    jobs = [Job("gang", "t", pods=3, gpus_per_pod=2), Job("one", "t"), Job("shares", "t", milli=500)]
    given, job_of, pods_of = split_pods(jobs)
    assert [j.name for j in given] == ["gang/pod-0", "gang/pod-1", "gang/pod-2", "one", "shares"]
    assert all(j.pods == 1 and j.gpus_per_pod == 2 for j in given[:3])
    assert set(job_of) == {"gang/pod-0", "gang/pod-1", "gang/pod-2"} and list(pods_of) == ["gang"]


def _partial_start() -> set[str]:
    ledger = Ledger(gpus={("n0", g): None for g in range(8)},
                    waiting={"t/pair": Holder("t/pair", "t", 8.0, pods=2, slots_per_pod=4)})
    step = Step(True, "t/pair", tuple(("n0", g, 1000) for g in range(4)))
    return {v.invariant for v in violations(ledger, [step])}


def test_the_verifier_refuses_a_partial_start_for_every_policy():
    assert _partial_start() == {"gang"}
    # and a start of what does not wait, and an over-commit
    ledger = Ledger(gpus={("n0", 0): None})
    ledger.running["t/x"] = Holder("t/x", "t", 1.0, 1, (("n0", 0, 1000),))
    ledger.waiting["t/y"] = Holder("t/y", "t", 1.0, 1)
    steps = [Step(True, "t/ghost", (("n0", 0, 1000),)), Step(True, "t/y", (("n0", 0, 1000),))]
    assert {v.invariant for v in violations(ledger, steps)} == {"gang", "over-commit"}
