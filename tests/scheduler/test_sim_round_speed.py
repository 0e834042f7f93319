"""What makes the simulated scheduling round as fast as the dispatcher it replaced, without changing
what it decides: reused node layouts, renewed (not rebuilt) snapshot states, and queue positions
worked out only when the queue is read."""

from __future__ import annotations

import dataclasses
import threading

from builders import node, snapshot, workload
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.fleet import WorkloadPhase
from gpuwarden.scheduling import state_from_snapshot
from gpuwarden.sim import SimConfig
from gpuwarden.sim.cluster import SimCluster

FLEET = dict(nodes=8, warmup_days=0.0, fault_rate_scale=0.0, spot_reclaims_per_node_day=0.0, training_load=2.0)


def _nodes_seen(cluster_snapshot):
    state, _ = state_from_snapshot(cluster_snapshot)
    return {name: (n.schedulable, n.gpu_free, n.mig_used, n.gpu_ids) for name, n in state.nodes.items()}


def test_a_kept_layout_still_reads_each_snapshots_health_and_cordons():
    """Two snapshots that share their node and GPU tuples (the layout is read once) still give each
    its own unhealthy GPUs, cordons and running work, as a snapshot with fresh tuples does."""
    first = snapshot([node("node-0"), node("node-1")], [workload("a", gpus=2, on="node-0")])
    second = dataclasses.replace(first, workloads=(workload("b", on="node-1"),), cordoned=frozenset({"node-0"}),
                                 unhealthy_gpus=frozenset({"GPU-node-1-3"}))
    assert _nodes_seen(first)["node-0"][1] == [0, 0, 1000, 1000]
    kept = _nodes_seen(second)
    fresh = _nodes_seen(dataclasses.replace(second, nodes=tuple(second.nodes), gpus=tuple(list(second.gpus))))
    assert kept == fresh
    assert kept["node-0"] == (False, [1000] * 4, [[]] * 4, [f"GPU-node-0-{g}" for g in range(4)])
    assert kept["node-1"][1] == [0, 1000, 1000, 0]  # b's GPU and the unhealthy one


def test_a_renewed_state_is_the_state_with_its_progress_moved_on():
    state = workload("a", on="node-0", progress_seconds=10.0, attained_gpu_seconds=5.0, annotations={"k": "v"})
    renewed = state.progressed(70.0, 65.0)
    assert renewed == dataclasses.replace(state, progress_seconds=70.0, attained_gpu_seconds=65.0)
    assert (state.progress_seconds, state.attained_gpu_seconds) == (10.0, 5.0)  # the old one is untouched


def test_the_snapshot_follows_jobs_that_finish_and_arrive(data_dir):
    sim = simulated_fleet(SimConfig(seed=3, data_dir=str(data_dir), **FLEET))
    cluster: SimCluster = sim.cluster
    for _ in range(120):
        sim.step()
        live = [j.spec.workload.key for j in sim.jobs if j.phase in (WorkloadPhase.PENDING, WorkloadPhase.RUNNING,
                                                                       WorkloadPhase.SUSPENDED)]
        taken = cluster.snapshot()
        assert [ws.workload.key for ws in taken.workloads] == live
        by_key = {j.spec.workload.key: j for j in sim.jobs}
        for ws in taken.workloads:  # progress and service as the simulator counts them now
            job = by_key[ws.workload.key]
            assert ws.progress_seconds == job.progress_s and ws.phase == job.phase
            assert ws.attained_gpu_seconds == job.attained_gpu_seconds(sim.now_s)
    assert sim.counts["succeeded"] > 0 and sim.counts["started"] > 0


def test_reading_the_queue_now_and_then_gives_what_reading_it_every_round_gives(data_dir):
    """A round whose queue nobody read drops its positions; a round read later (or a round read
    every time) gives the same document, and the decisions do not depend on who reads."""
    every, sometimes = (simulated_fleet(SimConfig(seed=5, data_dir=str(data_dir), **FLEET)) for _ in range(2))
    read_every, read_sometimes = [], []
    for step in range(180):
        every.step()
        sometimes.step()
        read_every.append(every.scheduling.queue)
        if step % 37 == 36:
            read_sometimes.append((step, sometimes.scheduling.queue))
    assert every.scheduling.rounds == sometimes.scheduling.rounds > 20
    assert all(read_every[step] == document for step, document in read_sometimes)
    assert any(document["workloads"] for _, document in read_sometimes)
    assert every.counts == sometimes.counts


def test_a_first_reader_during_a_round_waits_for_its_queue(data_dir):
    """Nobody read the queue, so the next round drops its positions; a reader that comes while that
    round runs waits for it and gets the new round's queue, not one worked out from jobs in change."""
    sim = simulated_fleet(SimConfig(seed=5, data_dir=str(data_dir), **FLEET))
    for _ in range(30):
        sim.step()
    inside, release = threading.Event(), threading.Event()

    class Paused:  # the round's cluster, held inside the snapshot until the reader is waiting
        def __init__(self, inner: SimCluster) -> None:
            self.inner, self.hold = inner, False

        def snapshot(self):
            if self.hold:
                inside.set()
                release.wait(10)
            return self.inner.snapshot()

        def apply(self, action):
            return self.inner.apply(action)

    paused = Paused(sim.cluster)
    scheduling = SchedulingRound(paused)
    scheduling.run_round()
    paused.hold = True
    runner = threading.Thread(target=scheduling.run_round)
    runner.start()
    assert inside.wait(10)
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.append(scheduling.queue))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and not got  # waiting: the round it would read is being replaced
    release.set()
    runner.join(10)
    reader.join(10)
    assert got and got[0]["round"] == 2 == scheduling.rounds
