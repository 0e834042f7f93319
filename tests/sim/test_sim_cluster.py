"""``SimCluster``: the ``Cluster`` protocol over the simulated fleet.

Each test builds its own small fleet (8 nodes, half a day of warmup at 1.5x training demand, so
the training pools are full and a queue waits), acts through ``apply`` exactly as the actuator would, steps the
simulation and checks what the scheduler did. Refused actions must come back ``ok=False`` with the
reason, never as an exception.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.fleet import (
    Action,
    ActionKind,
    Cluster,
    ClusterSnapshot,
    PriceTier,
    PriorityClass,
    WorkloadKind,
    WorkloadPhase,
)
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.sim import SimConfig, Simulation
from gpuwarden.sim.cluster import SimCluster

TRAINING_KINDS = (WorkloadKind.TRAINING, WorkloadKind.FINE_TUNING)


@pytest.fixture
def sim(data_dir: Path) -> Simulation:
    # Half a day of warmup at 1.5x training demand: training pools full, a queue waiting behind them.
    return simulated_fleet(SimConfig(nodes=8, warmup_days=0.5, training_load=1.5, fault_rate_scale=0.0,
                                spot_reclaims_per_node_day=0.0, data_dir=data_dir))


@pytest.fixture
def cluster(sim: Simulation) -> SimCluster:
    return SimCluster(sim)


def act(cluster: SimCluster, kind: ActionKind | str, target: str, **params):
    return cluster.apply(Action(kind, target, reason="test", params=params))


def state(cluster: SimCluster, name: str):
    """The workload's state in a fresh snapshot (None once it is no longer live)."""
    for workload in cluster.snapshot().workloads:
        if workload.workload.name == name:
            return workload
    return None


def on_node(cluster: SimCluster, node: str) -> set[str]:
    return {w.workload.name for w in cluster.snapshot().workloads for p in w.placements if p.node == node}


def busiest_training_node(cluster: SimCluster, spot: bool = True) -> str:
    """The training node running the most pods (``spot=False``: of those not on spot capacity)."""
    snapshot = cluster.snapshot()
    counts = {n.name: 0 for n in snapshot.nodes if n.pool.startswith("train")
              and (spot or n.price_tier != PriceTier.SPOT)}
    for workload in snapshot.workloads:
        for placement in workload.placements:
            if placement.node in counts:
                counts[placement.node] += 1
    node = max(counts, key=counts.get)
    assert counts[node] > 0, "warmup left the training pools empty"
    return node


def empty_node(cluster: SimCluster, node: str) -> set[str]:
    """Evict everything on ``node`` (one evict per workload, as the actuator would)."""
    evicted = on_node(cluster, node)
    for name in evicted:
        result = act(cluster, ActionKind.EVICT, name)
        assert result.ok, result.message
    assert on_node(cluster, node) == set()
    return evicted


def step(sim: Simulation, times: int) -> None:
    for _ in range(times):
        sim.step()


def running_checkpointable_training(cluster: SimCluster):
    candidates = [
        w for w in cluster.snapshot().workloads
        if w.phase == WorkloadPhase.RUNNING and w.workload.kind in TRAINING_KINDS and w.workload.checkpointable
        and w.progress_seconds > 0 and w.workload.gang_size == 1
    ]
    assert candidates, "no running checkpointable training job after warmup"
    return min(candidates, key=lambda w: w.workload.gpus.count)


# -- reading -------------------------------------------------------------------------------------


def test_sim_cluster_implements_the_cluster_protocol(cluster):
    assert isinstance(cluster, Cluster)


def test_snapshot_lists_nodes_gpus_and_live_workloads_with_placements(sim, cluster):
    sim.step()
    snapshot = cluster.snapshot()
    assert isinstance(snapshot, ClusterSnapshot)
    assert snapshot.taken_at == sim.now
    assert len(snapshot.nodes) == 8 and len(snapshot.gpus) == 64
    assert {g.node for g in snapshot.gpus} == {n.name for n in snapshot.nodes}
    assert snapshot.teams and not snapshot.cordoned and not snapshot.taints and not snapshot.unhealthy_gpus
    phases = {w.phase for w in snapshot.workloads}
    assert phases <= {WorkloadPhase.PENDING, WorkloadPhase.RUNNING, WorkloadPhase.SUSPENDED}
    assert WorkloadPhase.RUNNING in phases
    gpu_node = {g.uuid: g.node for g in snapshot.gpus}
    mig_ids = {g.uuid: {i.gpu_instance_id for i in g.mig_instances} for g in snapshot.gpus}
    taken = []
    for workload in snapshot.workloads:
        if workload.phase != WorkloadPhase.RUNNING:
            assert workload.placements == ()
            continue
        assert workload.started_at is not None and workload.started_at >= workload.submitted_at
        request = workload.workload.gpus
        if request.fraction_milli == 1000 and request.mig_profile is None:
            assert len(workload.placements) == request.count * workload.workload.gang_size
        for placement in workload.placements:
            assert gpu_node[placement.gpu_uuid] == placement.node
            if placement.mig_instance_id is not None:
                assert placement.mig_instance_id in mig_ids[placement.gpu_uuid]
            taken.append((placement.gpu_uuid, placement.mig_instance_id))
    assert len(taken) == len(set(taken)), "two workloads on one device"
    # The snapshot agrees with the samples of the same step.
    frame = sim.latest
    allocated = frame[frame["pod"].notna()]
    assert len(allocated) == len(taken)
    mig = [int(m.split(":")[0]) if isinstance(m, str) else None for m in allocated["mig_instance"]]
    assert set(zip(allocated["gpu_uuid"].astype(str), mig)) == set(taken)


# -- cordon, taint, drain ------------------------------------------------------------------------


def test_cordon_keeps_new_work_off_the_node_and_uncordon_restores_it(sim, cluster):
    node = busiest_training_node(cluster)
    result = act(cluster, ActionKind.CORDON, node)
    assert result.ok and node in result.message
    assert node in cluster.snapshot().cordoned
    evicted = empty_node(cluster, node)  # pending work that fits exactly there
    for _ in range(30):
        sim.step()
        assert on_node(cluster, node) == set(), "the scheduler placed a pod on a cordoned node"
    assert any(state(cluster, name) is not None for name in evicted)
    assert act(cluster, ActionKind.UNCORDON, node).ok
    assert node not in cluster.snapshot().cordoned
    step(sim, 5)
    assert on_node(cluster, node), "after uncordon the queued work lands on the node again"


def test_taint_keeps_new_work_off_the_node_and_untaint_restores_it(sim, cluster):
    node = busiest_training_node(cluster)
    assert act(cluster, ActionKind.TAINT, node, taint="gpuwarden.io/xid=79:NoSchedule").ok
    assert act(cluster, ActionKind.TAINT, node, taint="gpuwarden.io/ecc=dbe:NoSchedule").ok
    assert act(cluster, ActionKind.TAINT, node, taint="gpuwarden.io/ecc=dbe:NoSchedule").ok  # idempotent
    assert cluster.snapshot().taints[node] == ("gpuwarden.io/xid=79:NoSchedule", "gpuwarden.io/ecc=dbe:NoSchedule")
    empty_node(cluster, node)
    for _ in range(30):
        sim.step()
        assert on_node(cluster, node) == set(), "the scheduler placed a pod on a tainted node"
    # Removing one taint of two keeps the node unschedulable.
    assert act(cluster, ActionKind.UNTAINT, node, taint="gpuwarden.io/xid=79:NoSchedule").ok
    assert cluster.snapshot().taints[node] == ("gpuwarden.io/ecc=dbe:NoSchedule",)
    step(sim, 5)
    assert on_node(cluster, node) == set()
    assert act(cluster, ActionKind.UNTAINT, node).ok  # no taint named: all of them
    assert node not in cluster.snapshot().taints
    step(sim, 5)
    assert on_node(cluster, node), "after untaint the queued work lands on the node again"


def test_drain_evicts_everything_on_the_node_and_requeues_it(sim, cluster):
    node = busiest_training_node(cluster)
    before = {w.workload.name: w for w in cluster.snapshot().workloads if any(p.node == node for p in w.placements)}
    result = act(cluster, ActionKind.DRAIN, node)
    assert result.ok and f"{len(before)} workload(s)" in result.message
    snapshot = cluster.snapshot()
    assert node in snapshot.cordoned
    assert on_node(cluster, node) == set()
    for name, old in before.items():
        new = state(cluster, name)
        assert new is not None and new.phase == WorkloadPhase.PENDING and new.placements == ()
        assert new.preemptions == old.preemptions + 1
        if old.workload.checkpointable:
            assert new.progress_seconds == pytest.approx(old.progress_seconds)  # graceful: checkpointed
    assert {j.name for j in sim.queue} >= set(before)
    step(sim, 20)
    assert on_node(cluster, node) == set()


# -- suspend, resume, priority, preempt ----------------------------------------------------------


def test_suspend_frees_gpus_keeps_progress_and_resume_runs_it_again(sim, cluster):
    victim = running_checkpointable_training(cluster)
    name, progress = victim.workload.name, victim.progress_seconds
    held = {p.gpu_uuid for p in victim.placements}
    assert act(cluster, ActionKind.SET_PRIORITY, name, priority_class="critical").ok

    result = act(cluster, ActionKind.SUSPEND, name)
    assert result.ok, result.message
    suspended = state(cluster, name)
    assert suspended.phase == WorkloadPhase.SUSPENDED and suspended.placements == ()
    assert suspended.progress_seconds == pytest.approx(progress)
    assert suspended.preemptions == victim.preemptions + 1
    index = next(j.index for j in sim.jobs if j.name == name)
    assert not (sim.dev_job == index).any(), "a suspended job holds no GPU"
    assert act(cluster, ActionKind.SUSPEND, name).ok  # suspending twice is harmless

    for _ in range(30):
        sim.step()
        again = state(cluster, name)
        assert again.phase == WorkloadPhase.SUSPENDED and again.placements == ()
        assert again.progress_seconds == pytest.approx(progress)
    # Its GPUs are free for other work meanwhile (the point of suspending).
    assert held and not held & {p.gpu_uuid for p in state(cluster, name).placements}

    assert act(cluster, ActionKind.RESUME, name).ok
    assert state(cluster, name).phase == WorkloadPhase.PENDING
    refused = act(cluster, ActionKind.RESUME, name)
    assert not refused.ok and "not suspended" in refused.message
    for _ in range(400):
        sim.step()
        current = state(cluster, name)
        if current is None or current.phase == WorkloadPhase.RUNNING:
            break
    job = next(j for j in sim.jobs if j.name == name)
    assert job.phase == WorkloadPhase.RUNNING, "resumed job never ran again"
    assert job.progress_s == pytest.approx(progress)  # placed at the end of a step; runs from the next
    sim.step()
    if job.phase == WorkloadPhase.RUNNING:
        # It continues from the kept progress: not restarted from zero, nothing skipped.
        assert job.progress_s == pytest.approx(progress + sim.config.step_seconds)
    else:
        assert job.phase == WorkloadPhase.SUCCEEDED and job.spec.duration_s <= progress + sim.config.step_seconds


def test_set_priority_changes_it_and_rejects_unknown_values(cluster):
    workload = next(w for w in cluster.snapshot().workloads if w.workload.priority_class != PriorityClass.CRITICAL)
    name = workload.workload.name
    result = act(cluster, ActionKind.SET_PRIORITY, f"{workload.workload.namespace}/{name}", priority_class="critical")
    assert result.ok and "critical" in result.message
    assert state(cluster, name).priority_override == "critical"

    refused = act(cluster, ActionKind.SET_PRIORITY, name, priority_class="urgent")
    assert not refused.ok
    assert "'urgent'" in refused.message
    for value in PriorityClass:
        assert value.value in refused.message
    assert state(cluster, name).priority_override == "critical"  # unchanged
    assert not act(cluster, ActionKind.SET_PRIORITY, name).ok  # no value at all

    assert act(cluster, ActionKind.SET_PRIORITY, name, priority_class=workload.workload.priority_class.value).ok
    assert state(cluster, name).priority_override is None


def test_higher_priority_is_scheduled_first(sim, cluster):
    """Set-priority is not cosmetic: the queue orders by it. With every other training node
    cordoned and one node emptied, the newest pending job, raised to critical, is placed first (an
    on-demand node: spot capacity takes only checkpointable training)."""
    node = busiest_training_node(cluster, spot=False)
    others = [n.name for n in cluster.snapshot().nodes if n.pool.startswith("train") and n.name != node]
    for other in others:
        assert act(cluster, ActionKind.CORDON, other).ok
    assert act(cluster, ActionKind.CORDON, node).ok
    evicted = sorted(empty_node(cluster, node))
    pending = [w for w in cluster.snapshot().workloads if w.phase == WorkloadPhase.PENDING
               and w.workload.kind in TRAINING_KINDS and w.workload.gang_size == 1]
    assert len(pending) >= 2, "precondition: the contended fixture (training_load 1.5) queues training jobs"
    last = max(pending, key=lambda w: (w.submitted_at, w.workload.name))
    assert act(cluster, ActionKind.SET_PRIORITY, last.workload.name, priority_class="critical").ok
    assert act(cluster, ActionKind.UNCORDON, node).ok
    sim.step()
    assert last.workload.name in on_node(cluster, node), evicted


def test_preempt_suspends_checkpointable_and_requeues_others(cluster):
    running = [w for w in cluster.snapshot().workloads if w.phase == WorkloadPhase.RUNNING]
    checkpointable = next(w for w in running if w.workload.checkpointable)
    plain = next(w for w in running if not w.workload.checkpointable)
    assert act(cluster, ActionKind.PREEMPT, checkpointable.workload.name).ok
    assert state(cluster, checkpointable.workload.name).phase == WorkloadPhase.SUSPENDED
    assert act(cluster, ActionKind.PREEMPT, plain.workload.name).ok
    requeued = state(cluster, plain.workload.name)
    assert requeued.phase == WorkloadPhase.PENDING and requeued.placements == ()


def test_non_checkpointable_training_restarts_from_zero_when_evicted(cluster):
    candidates = [w for w in cluster.snapshot().workloads if w.phase == WorkloadPhase.RUNNING
                  and w.workload.kind in TRAINING_KINDS and not w.workload.checkpointable and w.progress_seconds > 0]
    assert candidates, "precondition: some running training job is not checkpointable (15-40% are)"
    name = candidates[0].workload.name
    assert act(cluster, ActionKind.EVICT, name).ok
    assert state(cluster, name).progress_seconds == 0.0


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, target, params, words",
    [
        (ActionKind.EVICT, "no-such/workload", {}, "not found"),
        (ActionKind.SUSPEND, "ghost", {}, "not found"),
        (ActionKind.RESUME, "ghost", {}, "not found"),
        (ActionKind.SET_PRIORITY, "ghost", {"priority_class": "high"}, "not found"),
        (ActionKind.BIND, "ghost", {"gpu_uuids": []}, "not found"),
        (ActionKind.CORDON, "no-such-node", {}, "not found"),
        (ActionKind.DRAIN, "no-such-node", {}, "not found"),
        (ActionKind.TAINT, "no-such-node", {}, "not found"),
    ],
)
def test_refused_actions_return_ok_false_and_never_raise(cluster, kind, target, params, words):
    before = cluster.snapshot()
    result = act(cluster, kind, target, **params)
    assert result.ok is False
    assert words in result.message and target in result.message
    after = cluster.snapshot()
    assert after.cordoned == before.cordoned and dict(after.taints) == dict(before.taints)


def test_evicting_or_binding_a_workload_in_the_wrong_phase_is_refused(cluster):
    snapshot = cluster.snapshot()
    pending = next(w for w in snapshot.workloads if w.phase == WorkloadPhase.PENDING)
    running = next(w for w in snapshot.workloads if w.phase == WorkloadPhase.RUNNING)
    refused = act(cluster, ActionKind.EVICT, pending.workload.name)
    assert not refused.ok and "pending" in refused.message
    refused = act(cluster, ActionKind.BIND, running.workload.name, gpu_uuids=[p.gpu_uuid for p in running.placements])
    assert not refused.ok and "running" in refused.message


def test_malformed_params_are_refused_not_raised(cluster):
    pending = next(w for w in cluster.snapshot().workloads if w.phase == WorkloadPhase.PENDING)
    result = act(cluster, ActionKind.BIND, pending.workload.name, gpu_uuids=None)
    assert result.ok is False


# -- bind ----------------------------------------------------------------------------------------


def test_bind_places_a_pending_job_on_the_named_free_gpus(sim, cluster):
    node = busiest_training_node(cluster)
    assert act(cluster, ActionKind.DRAIN, node).ok
    assert act(cluster, ActionKind.UNCORDON, node).ok  # free and schedulable, until the next step
    free = [g.uuid for g in cluster.snapshot().gpus if g.node == node]
    pending = [w for w in cluster.snapshot().workloads if w.phase == WorkloadPhase.PENDING
               and w.workload.kind in TRAINING_KINDS and w.workload.gang_size == 1
               and w.workload.gpus.fraction_milli == 1000 and w.workload.gpus.count < len(free)]
    assert pending
    job = pending[-1]
    count = job.workload.gpus.count
    chosen = free[-count:]

    wrong = act(cluster, ActionKind.BIND, job.workload.name, gpu_uuids=free[: count + 1])
    assert not wrong.ok and f"needs {count}" in wrong.message
    unknown = act(cluster, ActionKind.BIND, job.workload.name, gpu_uuids=["GPU-nope"] * count)
    assert not unknown.ok and "GPU-nope" in unknown.message

    result = act(cluster, ActionKind.BIND, job.workload.name, gpu_uuids=chosen)
    assert result.ok, result.message
    bound = state(cluster, job.workload.name)
    assert bound.phase == WorkloadPhase.RUNNING
    assert sorted(p.gpu_uuid for p in bound.placements) == sorted(chosen)
    assert {p.node for p in bound.placements} == {node}
    assert job.workload.name not in {j.name for j in sim.queue}

    # Those GPUs are now taken: binding another job onto them (right count, some GPUs busy) is refused.
    others = [w for w in cluster.snapshot().workloads if w.phase == WorkloadPhase.PENDING and w.workload.gang_size == 1
              and w.workload.gpus.fraction_milli == 1000 and w.workload.gpus.mig_profile is None
              and 1 <= w.workload.gpus.count <= len(free)]
    assert others
    other = others[0]
    want = other.workload.gpus.count
    names = chosen[: min(want, count)] + free[: want - min(want, count)]
    assert len(set(names)) == want and set(names) & set(chosen)
    taken = act(cluster, ActionKind.BIND, other.workload.name, gpu_uuids=names)
    assert not taken.ok and f"needs {want} free" in taken.message
    assert state(cluster, other.workload.name).phase == WorkloadPhase.PENDING

    sim.step()
    after = state(cluster, job.workload.name)
    if after is not None:  # (it may have finished within the step)
        assert sorted(p.gpu_uuid for p in after.placements) == sorted(chosen)
        assert after.progress_seconds > bound.progress_seconds
    frame = sim.latest
    assert set(frame.loc[frame["gpu_uuid"].isin(chosen), "pod"].astype(str)) == {job.workload.name}


def test_bind_refuses_gpus_on_a_cordoned_node(sim, cluster):
    node = busiest_training_node(cluster)
    assert act(cluster, ActionKind.DRAIN, node).ok  # drained and still cordoned
    pending = next(w for w in cluster.snapshot().workloads if w.phase == WorkloadPhase.PENDING
                   and w.workload.gang_size == 1 and w.workload.gpus.fraction_milli == 1000
                   and w.workload.gpus.mig_profile is None and w.workload.gpus.count <= 8)
    gpus = [g.uuid for g in cluster.snapshot().gpus if g.node == node][: pending.workload.gpus.count]
    result = act(cluster, ActionKind.BIND, pending.workload.name, gpu_uuids=gpus)
    assert not result.ok
    assert state(cluster, pending.workload.name).phase == WorkloadPhase.PENDING


def test_unhealthy_gpus_show_in_the_snapshot(data_dir):
    sim = simulated_fleet(SimConfig(nodes=8, warmup_days=0.0, step_seconds=300, fault_rate_scale=0.0,
                               counts_overrides={"xid79_off_bus": 2.0}, data_dir=data_dir))
    cluster = SimCluster(sim)
    step(sim, 48)
    snapshot = cluster.snapshot()
    lost = {g.uuid for g, flag in zip(sim.gpus, sim.gpu_lost) if flag}
    assert lost and lost <= snapshot.unhealthy_gpus
    placed = {p.gpu_uuid for w in snapshot.workloads for p in w.placements}
    assert not placed & snapshot.unhealthy_gpus


# -- the production scheduler ----------------------------------------------------------------------


def test_the_simulator_is_scheduled_by_the_production_scheduler(sim, cluster):
    """The simulator keeps no placement code: every start is a BIND or RESUME the actuator's
    scheduling round decided on SimCluster's snapshot and SimCluster carried out, within the job's
    pools and off spot unless checkpointable training; the round's view and the simulator's never
    disagree."""
    import inspect

    from gpuwarden.scheduler.scheduling_round import SchedulingRound
    from gpuwarden.sim import engine

    source = inspect.getsource(engine)
    assert isinstance(sim.scheduling, SchedulingRound) and sim.scheduling.cluster is sim.cluster
    assert "_fit" not in source and "best-fit" not in source.lower()
    applied = []
    real_apply = sim.cluster.apply
    sim.cluster.apply = lambda action: applied.append(action) or real_apply(action)
    empty_node(cluster, busiest_training_node(cluster))  # room, and an action: a round at the next step
    step(sim, 15)
    assert sim.scheduling.refused == 0
    assert applied and {a.kind for a in applied} <= {ActionKind.BIND, ActionKind.RESUME, ActionKind.SUSPEND,
                                                     ActionKind.PREEMPT}
    snapshot = cluster.snapshot()
    pool_of = {n.name: n.pool for n in snapshot.nodes}
    spot = {n.name for n in snapshot.nodes if n.price_tier.value == "spot"}
    for workload in snapshot.workloads:
        job = sim.job_by_name[workload.workload.name]
        for placement in workload.placements:
            assert pool_of[placement.node] in job.spec.workload.pools
            if placement.node in spot:
                assert workload.workload.kind in TRAINING_KINDS and workload.workload.checkpointable
