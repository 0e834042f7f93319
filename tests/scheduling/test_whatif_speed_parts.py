"""The parts that make what-if fast decide and compute what the code before them did: the replay's
array accrual gives the loop's floats, the rebuild's integer groupings match pandas' groupbys, a
whole-GPU request remembered as finding no room is placed again once a node it may use changes, and
a failed victim search remembered for a job is not remembered past a start."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd

from gpuwarden.scheduling import POLICIES, Job, JobState, NodeState, Scheduler, State
from gpuwarden.scheduling.replay.accrual import Accrual
from gpuwarden.scheduling.whatif_history import _dense_rank_within, _group_sizes


def node(name: str, gpus: int = 2, model: str = "gpu") -> NodeState:
    return NodeState(name=name, model=model, gpu_count=gpus, cpu_free=10**9, mem_free=10**15, nvlink_domain=name,
                     leaf_switch="leaf")


def test_accrual_gives_the_step_loops_floats_for_fractional_shares_and_resume_overheads():
    rng = random.Random(3)
    jobs = [Job(name=f"j{i}", team="t", milli=rng.choice((1000, 333, 250, 700))) for i in range(40)]
    since = {job.name: rng.choice((0.0, 7.3, 55.1, 1e3 / 3)) for job in jobs}
    accrual = Accrual()
    for job in jobs:
        accrual.add(job, since[job.name])
    expected = {job.name: [0.0, 0.0] for job in jobs}
    now = 0.0
    for step in range(200):
        to = now + rng.choice((0.1, 1.0 / 3, 60.0, 299.7))
        for job in accrual.jobs:  # the loop the arrays replace, verbatim
            seconds, start = to - now, since[job.name]
            expected[job.name][0] += seconds if start <= now else max(0.0, to - start)
            expected[job.name][1] += seconds * job.gpu_equivalents
        accrual.advance(now, to)
        now = to
        if step % 50 == 49:  # a job stops: its figures come back, its slot goes to the last job
            accrual.remove(accrual.jobs[step % len(accrual.jobs)])
    accrual.write_back()
    assert all([job.progress, job.attained] == expected[job.name] for job in jobs)  # the same floats, not close ones
    assert len(accrual.jobs) == 36


def test_integer_groupings_match_pandas_dense_rank_and_group_sizes():
    rng = np.random.default_rng(5)
    nodes = rng.integers(-1, 9, 5000)
    times = np.sort(rng.integers(0, 300, 5000))
    frame = pd.DataFrame({"node": nodes, "time": times})
    ranks = frame.groupby("node")["time"].rank(method="dense").to_numpy(np.int64)
    assert (_dense_rank_within(nodes, times) == ranks).all()
    key = rng.integers(0, 50, 5000)
    assert (_group_sizes(key) == np.bincount(key)[key]).all()


def test_a_request_that_found_no_room_is_placed_once_a_node_it_may_use_frees_room():
    state = State([node("a1", model="A"), node("b1", gpus=4, model="B")])
    holder = Job(name="holder", team="t", gpus_per_pod=2, gpu_model="A")
    state.add_running(holder, [("a1", 0, 1000), ("a1", 1, 1000)])
    state.add_job(Job(name="pair", team="t", gpus_per_pod=2, gpu_model="A", submitted=1.0))
    scheduler = Scheduler(POLICIES["fifo"])
    assert scheduler.schedule(state, 2.0) == []  # b1 has room, but of the other model
    reason = state.jobs["pair"].wait_reason
    other = Job(name="other", team="t", gpu_model="B")
    state.add_running(other, [("b1", 0, 1000)])  # a change on a node the pair may not use
    assert scheduler.schedule(state, 3.0) == [] and state.jobs["pair"].wait_reason == reason
    state.release(holder, holder.placements)
    holder.placements, holder.state = [], JobState.DONE
    del state.jobs["holder"]
    assert [(str(d.kind), d.job) for d in scheduler.schedule(state, 4.0)] == [("bind", "pair")]


def test_a_failed_victim_search_answers_the_same_request_in_its_pass_and_is_searched_again_in_the_next():
    # tiresias: 'old' (long served) may be suspended, 'young' not yet: a 2-GPU pod finds one GPU to free
    state = State([node("n1")])
    old = Job(name="old", team="t", checkpointable=True, attained=20 * 3600.0, started=0.0)
    young = Job(name="young", team="t", checkpointable=True, started=0.0)
    state.add_running(old, [("n1", 0, 1000)])
    state.add_running(young, [("n1", 1, 1000)])
    for name in ("p1", "p2"):
        state.add_job(Job(name=name, team="t", gpus_per_pod=2, submitted=10.0, checkpointable=True))
    scheduler = Scheduler(POLICIES["tiresias"])
    assert scheduler.schedule(state, 20.0) == []
    assert state.jobs["p1"].wait_reason == state.jobs["p2"].wait_reason
    assert state.jobs["p2"].wait_reason.endswith("not enough preemptible GPUs")
    young.attained = 20 * 3600.0  # served long enough by the next pass: both may be suspended now
    kinds = [(str(d.kind), d.job) for d in scheduler.schedule(state, 30.0)]
    assert kinds == [("suspend", "old"), ("suspend", "young"), ("bind", "p1")]
