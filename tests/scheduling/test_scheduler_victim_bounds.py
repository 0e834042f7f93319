"""The scheduler's two shortcuts for blocked jobs (what-if's speed): no victim scan when no running
job can be a victim, and no victim-by-victim search when evicting every candidate would still not
gather a pod's GPUs on one node. Both must answer what the full search answers."""

from __future__ import annotations

from gpuwarden.scheduling import POLICIES, Job, JobState, NodeState, Scheduler, State
from gpuwarden.scheduling.victims import _whole_room_after_evicting

HIGH_SERVICE = 10 * 3600.0  # GPU-seconds: tiresias level 1 (edges 1 GPU-h and 10 GPU-h)


def node(name: str, gpus: int = 2) -> NodeState:
    return NodeState(name=name, model="gpu", gpu_count=gpus, cpu_free=10**9, mem_free=10**15, nvlink_domain=name,
                     leaf_switch="leaf")


def running(state: State, name: str, where: str, gpu: int, attained: float = 0.0, milli: int = 1000) -> Job:
    job = Job(name=name, team="a", milli=milli, checkpointable=True, attained=attained, started=0.0)
    state.add_running(job, [(where, gpu, milli)])
    return job


def test_room_after_evicting_counts_whole_gpus_per_node_with_fractions_freed():
    state = State([node("n1"), node("n2")])
    whole_victim = running(state, "v1", "n1", 0)
    share_victim = running(state, "v2", "n2", 0, milli=500)
    running(state, "stay", "n2", 1)
    pair = Job(name="pair", team="a", gpus_per_pod=2)
    allowed = list(state.nodes.values())
    assert _whole_room_after_evicting(pair, [whole_victim], allowed)  # n1: 1 free + 1 freed
    assert not _whole_room_after_evicting(pair, [share_victim], allowed)  # n2 keeps 'stay'
    assert not _whole_room_after_evicting(pair, [], allowed)
    one = Job(name="one", team="a")
    assert _whole_room_after_evicting(one, [share_victim], allowed)  # its 500 + the 500 free: one whole GPU


def test_a_pod_that_no_eviction_can_gather_waits_and_nothing_is_suspended():
    # a 2-GPU pod: each node has one long-served victim beside a fresh job no LAS policy may evict
    state = State([node("n1"), node("n2")])
    for i, where in enumerate(("n1", "n2")):
        running(state, f"old-{i}", where, 0, attained=HIGH_SERVICE)
        running(state, f"new-{i}", where, 1)
    state.add_job(Job(name="pair", team="a", gpus_per_pod=2, submitted=100.0))
    decisions = Scheduler(POLICIES["tiresias"]).schedule(state, 100.0)
    assert decisions == []
    assert state.jobs["pair"].wait_reason.endswith("preemption would not free enough room")
    assert all(state.jobs[name].state == JobState.RUNNING for name in ("old-0", "old-1", "new-0", "new-1"))


def test_with_a_victim_on_one_node_the_pod_takes_its_gpus():
    state = State([node("n1"), node("n2")])
    running(state, "old", "n1", 0, attained=HIGH_SERVICE)
    running(state, "new", "n2", 0)
    state.add_job(Job(name="pair", team="a", gpus_per_pod=2, submitted=100.0))
    decisions = Scheduler(POLICIES["tiresias"]).schedule(state, 100.0)
    assert [(str(d.kind), d.job) for d in decisions] == [("suspend", "old"), ("bind", "pair")]


def test_no_running_job_above_the_blocked_jobs_level_means_no_victims():
    # every running job is at level 0 like the waiting one: LAS has nobody to preempt
    state = State([node("n1", gpus=1)])
    running(state, "young", "n1", 0)
    state.add_job(Job(name="wait", team="a", submitted=100.0))
    scheduler = Scheduler(POLICIES["tiresias"])
    assert scheduler.schedule(state, 100.0) == []
    assert state.jobs["wait"].wait_reason.startswith("capacity")
    assert state.jobs["young"].state == JobState.RUNNING
