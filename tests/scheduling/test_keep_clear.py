"""The shipped placement keeps nodes of lower-priority work clearable (``PlacementOptions.keep_clear``).

Found on issue 21's end-to-end scenario (tests/scheduler/test_live_scheduling_e2e.py): with FGD's exact sums
a 1-GPU high-priority job went, among equal scores, to whichever node packed tightest; by the time a
high-priority 8-GPU job arrived every whole-GPU node ran some high-priority work it may not preempt,
and it waited 8 rounds. With keep_clear, work of a priority gathers on the nodes already running work
of that priority or higher, so a node of lower-priority work stays one a preemption can clear.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpuwarden.scheduling import Job, NodeState, State, find_placement
from gpuwarden.scheduling.nodearrays import NO_PRIORITY
from gpuwarden.scheduling.placement import _keep_clear
from gpuwarden.scheduling.policy import policy_named
from gpuwarden.scheduling.scheduler import Scheduler
from gpuwarden.scheduling.state import JobState, Statement

LOW, NORMAL, HIGH = 1, 2, 3
H100 = "NVIDIA H100 80GB HBM3"
SHIPPED = policy_named("gpuwarden")
WITHOUT = replace(SHIPPED, name="gpuwarden-without-keep-clear", placement=replace(SHIPPED.placement, keep_clear=False))


def _state(*names: str) -> State:
    return State(NodeState(name, H100, 8, cpu_free=190_000, mem_free=2**41) for name in names)


def _run(state: State, name: str, priority: int, node: str, gpus: int = 1) -> Job:
    job = Job(name, "t", priority=priority, gpus_per_pod=gpus, checkpointable=True)
    state.add_running(job, [(node, g, 1000) for g in range(gpus)])
    job.started = 0.0
    return job


def test_a_high_priority_pod_joins_high_priority_work_and_the_node_of_low_work_stays_clearable():
    def play(policy) -> tuple[str, list[tuple[str, str]]]:
        state = _state("n1", "n2")
        _run(state, "low", LOW, "n1")
        _run(state, "high", HIGH, "n2")
        pod = Job("pod", "t", priority=HIGH)
        state.add_job(pod)
        scheduler = Scheduler(policy)
        first = scheduler.schedule(state, now=0)
        (where,) = {node for d in first for node, _, _ in d.placements}
        state.add_job(Job("urgent", "t", priority=HIGH, gpus_per_pod=8, submitted=10.0))
        return where, [(d.kind.value, d.job) for d in scheduler.schedule(state, now=10)]

    assert SHIPPED.placement.keep_clear and not policy_named("fifo").placement.keep_clear
    # both nodes score the same for the pod (7 GPUs left either way); the tie rule alone takes n1
    assert play(WITHOUT) == ("n1", [])  # then each node runs high work: the 8-GPU job cannot start
    assert play(SHIPPED) == ("n2", [("suspend", "low"), ("bind", "urgent")])


def test_without_a_node_of_its_priority_or_higher_the_scorer_alone_decides():
    """No node runs high work yet: the pod may go to the node of low work (FGD packs it there rather
    than break the empty node); an empty node is never ruled out."""
    state = _state("n1", "n2")
    _run(state, "low", LOW, "n1")
    placements, _ = find_placement(state, Job("pod", "t", priority=HIGH), SHIPPED.placement)
    assert placements is not None and placements[0][0] == "n1"
    # with a node of high work among them, the node of low work is ruled out and the empty one is not
    nodes = np.arange(4)
    top = np.array([LOW, HIGH, NO_PRIORITY, NORMAL])
    assert _keep_clear(top, nodes, HIGH).tolist() == [1, 2]
    assert _keep_clear(top, nodes, NORMAL).tolist() == [1, 2, 3]
    assert _keep_clear(top, nodes, LOW).tolist() == [0, 1, 2, 3]
    assert _keep_clear(np.array([LOW, NO_PRIORITY]), np.arange(2), HIGH).tolist() == [0, 1]


def test_the_top_priority_per_node_follows_every_booking():
    state = _state("n1", "n2")
    placed = Job("placed", "t", priority=NORMAL)
    state.add_placed(placed, [("n2", 0, 1000)])  # read from a cluster before the arrays exist
    low = _run(state, "low", LOW, "n1")
    top = state.arrays.top_priority
    assert top.tolist() == [LOW, NORMAL]
    statement = Statement(state)
    high = Job("high", "t", priority=HIGH)
    statement.allocate(high, [("n1", 1, 1000)])
    assert top.tolist() == [HIGH, NORMAL]
    statement.evict(low)
    assert top.tolist() == [HIGH, NORMAL]
    statement.rollback()
    assert top.tolist() == [LOW, NORMAL] and high.state == JobState.PENDING
    state.release(low, low.placements)
    assert top.tolist() == [NO_PRIORITY, NORMAL]
    assert state.runs_below(HIGH) and not state.runs_below(NORMAL)
