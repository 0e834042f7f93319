"""A uniform fleet (one model, pool and tier, no MIG) with a node the blocked job may not use: the
victim search must not evict work there, which frees nothing the job can take."""

from __future__ import annotations

from gpuwarden.scheduling import POLICIES, Job, JobState, NodeState, Scheduler, State


def node(name: str, schedulable: bool = True) -> NodeState:
    return NodeState(name=name, model="gpu", gpu_count=1, cpu_free=10**9, mem_free=10**15, nvlink_domain=name,
                     leaf_switch="leaf", schedulable=schedulable)


def low(state: State, name: str, where: str) -> Job:
    job = Job(name=name, team="a", priority=0, checkpointable=True, started=0.0)
    state.add_running(job, [(where, 0, 1000)])
    return job


def _schedule(avoid_first: bool) -> tuple[list[tuple[str, str]], State]:
    cordoned = not avoid_first
    state = State([node("n1", schedulable=not cordoned), node("n2")])
    low(state, "on-n1", "n1")  # listed first: the cheapest victim in state order
    low(state, "on-n2", "n2")
    urgent = Job(name="urgent", team="a", priority=100, submitted=10.0,
                 avoid_nodes=("n1",) if avoid_first else ())
    state.add_job(urgent)
    decisions = Scheduler(POLICIES["gpuwarden"]).schedule(state, 10.0)
    return [(str(d.kind), d.job) for d in decisions], state


def test_no_victim_on_a_cordoned_node_of_a_uniform_fleet():
    decisions, state = _schedule(avoid_first=False)
    assert ("bind", "urgent") in decisions
    assert state.jobs["on-n1"].state == JobState.RUNNING, decisions
    assert state.jobs["urgent"].placements[0][0] == "n2"


def test_no_victim_on_a_node_the_job_avoids_on_a_uniform_fleet():
    decisions, state = _schedule(avoid_first=True)
    assert ("bind", "urgent") in decisions
    assert state.jobs["on-n1"].state == JobState.RUNNING, decisions
    assert state.jobs["urgent"].placements[0][0] == "n2"
