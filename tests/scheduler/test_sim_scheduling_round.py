"""The simulator is a cluster: the actuator's scheduling round plans on ``SimCluster``'s snapshot and
applies through it, and every fact the planner uses comes from the snapshot."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from builders import node, snapshot, workload
from gpuwarden.scheduler.scheduling_round import EPOCH, SchedulingRound
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.fleet import Action, ActionKind, PriorityClass, WorkloadKind, WorkloadPhase
from gpuwarden.fleet.taints import taint_blocks
from gpuwarden.scheduling import plan, state_from_snapshot
from gpuwarden.scheduling.state import MILLI
from gpuwarden.sim import ConfigError, SimConfig
from gpuwarden.sim.cluster import UNREACHABLE_TAINT
from sim_decisions import record

RECORDED = Path(__file__).parents[1] / "recorded" / "dispatcher_seed7_8nodes_12h.txt"


def test_the_round_makes_the_decisions_the_old_dispatcher_made(data_dir):
    """Twelve hours of a seeded 8-node fleet at twice the training demand: every bind, resume,
    suspend and preemption, at the same time, on the same GPUs, in the same order as
    ``sim/dispatch.Dispatcher`` (which built the engine's state from the simulator's arrays) up to
    the one decision of it that broke a team's guarantee (tests/sim_decisions.py says which), and as
    the round decides with guarantees kept from there."""
    expected = RECORDED.read_text().splitlines()
    kinds = {line.split()[1] for line in expected}
    assert kinds == {"bind", "resume", "suspend", "preempt"}  # the recording exercises all four
    assert record(data_dir) == expected


def test_attained_service_reaches_the_planner_and_orders_the_queue():
    """LAS: of two waiting jobs, the one with less attained service starts first although it was
    submitted later; the planner reads the service from the snapshot."""
    one_gpu = node("node-0", gpus=1)
    served = workload("served", phase=WorkloadPhase.PENDING, attained_gpu_seconds=20 * 3600.0)
    fresh = workload("fresh", phase=WorkloadPhase.PENDING, submitted_at=served.submitted_at.replace(minute=30))
    cluster = snapshot([one_gpu], [served, fresh])
    state, _ = state_from_snapshot(cluster)
    assert state.jobs["alpha/served"].attained == 20 * 3600.0 and state.jobs["alpha/fresh"].attained == 0.0
    binds = [a.target for a in plan(cluster).actions if a.kind == ActionKind.BIND]
    assert binds == ["alpha/fresh"]
    equal = snapshot([one_gpu], [replace(served, attained_gpu_seconds=0.0), fresh])
    assert [a.target for a in plan(equal).actions if a.kind == ActionKind.BIND] == ["alpha/served"]  # FIFO again


@pytest.mark.parametrize(("taint", "tolerations", "blocks"), [
    ("gpuwarden.io/unhealthy=true:NoSchedule", (), True),
    ("node.kubernetes.io/unreachable=:NoExecute", (), True),
    ("gpuwarden.io/unhealthy=true:PreferNoSchedule", (), False),  # steers, never forbids
    ("gpuwarden.io/unhealthy=true:NoSchedule", ("gpuwarden.io/unhealthy",), False),
    ("gpuwarden.io/unhealthy=true:NoSchedule", ("gpuwarden.io/unhealthy=true:NoSchedule",), False),
    ("gpuwarden.io/unhealthy=true:NoSchedule", ("gpuwarden.io/unhealthy:NoExecute",), True),
    ("gpuwarden.io/unhealthy=true:NoSchedule", ("gpuwarden.io/unhealthy=false",), True),
    ("gpuwarden.io/unhealthy=true:NoSchedule", ("other",), True),
])
def test_taints_block_as_kube_scheduler_reads_them(taint, tolerations, blocks):
    assert taint_blocks(taint, tolerations) is blocks


def test_taints_reach_the_planner_per_workload():
    """A NoSchedule taint keeps workloads that do not tolerate it off the node; one that tolerates
    it may go there; a PreferNoSchedule taint forbids nothing."""
    nodes = [node("node-0", gpus=2), node("node-1", gpus=2)]
    tainted = {"node-0": ("gpuwarden.io/unhealthy=true:NoSchedule",)}
    jobs = [workload("a", gpus=2, phase=WorkloadPhase.PENDING), workload("b", gpus=2, phase=WorkloadPhase.PENDING)]
    placed = {a.target: a.params["placements"][0]["node"] for a in plan(snapshot(nodes, jobs, taints=tainted)).actions}
    assert placed == {"alpha/a": "node-1"}  # b waits: the only other node is closed to it
    state, _ = state_from_snapshot(snapshot(nodes, jobs, taints=tainted))
    assert not state.nodes["node-0"].schedulable  # no workload tolerates it: closed to all
    tolerant = workload("b", gpus=2, phase=WorkloadPhase.PENDING)
    tolerant = replace(tolerant, workload=replace(tolerant.workload, tolerations=("gpuwarden.io/unhealthy",)))
    placed = {a.target: a.params["placements"][0]["node"]
              for a in plan(snapshot(nodes, [jobs[0], tolerant], taints=tainted)).actions}
    assert placed == {"alpha/a": "node-1", "alpha/b": "node-0"}
    soft = {"node-0": ("gpuwarden.io/unhealthy=true:PreferNoSchedule",)}
    assert len(plan(snapshot(nodes, jobs, taints=soft)).actions) == 2


@pytest.fixture(scope="module")
def busy_sim(data_dir):
    return simulated_fleet(SimConfig(nodes=8, warmup_days=0.5, training_load=1.5, fault_rate_scale=0.0,
                                     spot_reclaims_per_node_day=0.0, data_dir=data_dir))


def test_the_sim_snapshot_carries_attained_service_and_mig_instances(busy_sim):
    """Attained service is GPU-equivalents x seconds run (an inference service runs at rate 1, so
    its progress is its run time); the planner books each pod on the MIG instance it holds, so the
    engine sees exactly the simulator's free MIG instances."""
    sim = busy_sim
    view = sim.cluster.snapshot()
    services = [w for w in view.workloads if w.phase == WorkloadPhase.RUNNING and w.workload.kind == WorkloadKind.INFERENCE]
    assert services
    for ws in services:
        job = sim.job_by_name[ws.workload.name]
        assert ws.attained_gpu_seconds == pytest.approx(ws.progress_seconds * job.gpu_equivalents)
        assert ws.attained_gpu_seconds > 0
    state, _ = state_from_snapshot(view)
    on_mig = 0
    for g, gpu in enumerate(sim.gpus):
        if not gpu.mig_enabled:
            continue
        devices = np.flatnonzero(sim.dev_gpu == g)
        held = sorted(str(sim.dev_mig_profile[d]) for d in devices if sim.dev_job[d] >= 0)
        on_mig += len(held)
        assert sorted(state.nodes[gpu.node].mig_used[gpu.index]) == held
    assert on_mig > 0, "no pod holds a MIG instance: the check above proved nothing"
    whole = [gpu for gpu in sim.gpus if not gpu.mig_enabled]
    for gpu in whole:  # a simulated GPU holds one pod: a fraction on it takes it whole
        taken = (sim.dev_job[(sim.dev_gpu == sim.gpu_index_of[gpu.uuid])] >= 0).any()
        assert state.nodes[gpu.node].gpu_free[gpu.index] == (0 if taken else MILLI)


def test_a_reclaimed_spot_node_is_unreachable_to_the_planner(data_dir):
    sim = simulated_fleet(SimConfig(nodes=16, warmup_days=0.0, fault_rate_scale=0.0, spot_reclaims_per_node_day=60.0,
                                    data_dir=data_dir))
    for _ in range(240):
        sim.step()
        down = np.flatnonzero(sim.node_down_until > sim.now_s)
        if down.size:
            break
    assert down.size, "no spot node was reclaimed"
    view = sim.cluster.snapshot()
    name = sim.nodes[int(down[0])].name
    assert UNREACHABLE_TAINT in view.taints[name]
    state, _ = state_from_snapshot(view)
    assert not state.nodes[name].schedulable


def test_the_round_never_resumes_what_someone_else_suspended(data_dir):
    """An operator suspends a running job and raises it to critical: the round, running with room to
    spare, starts other work but leaves that job suspended; the plan on the same snapshot would have
    resumed it, so it is the round's memory of its own suspends that holds it."""
    sim = simulated_fleet(SimConfig(nodes=8, warmup_days=0.5, training_load=1.5, fault_rate_scale=0.0,
                                    spot_reclaims_per_node_day=0.0, data_dir=data_dir))
    view = sim.cluster.snapshot()
    running = [w for w in view.workloads if w.phase == WorkloadPhase.RUNNING and w.workload.checkpointable
               and w.workload.gang_size == 1 and w.workload.kind == WorkloadKind.TRAINING]
    target = min(running, key=lambda w: w.workload.gpus.count).workload.key
    for kind, params in ((ActionKind.SET_PRIORITY, {"priority_class": PriorityClass.CRITICAL.value}),
                         (ActionKind.SUSPEND, {})):
        assert sim.cluster.apply(Action(kind, target, "operator", params)).ok
    assert any(a.kind == ActionKind.RESUME and a.target == target for a in plan(sim.cluster.snapshot()).actions)
    round_ = sim.scheduling
    assert isinstance(round_, SchedulingRound)
    rounds, started = round_.rounds, sim.counts["started"]
    for _ in range(60):
        sim.step()
        assert sim.job_by_name[target.split("/")[1]].phase == WorkloadPhase.SUSPENDED
    assert round_.rounds > rounds and sim.counts["started"] > started  # the round ran and started other work
    assert target not in round_.suspended
    assert sim.cluster.apply(Action(ActionKind.RESUME, target, "operator")).ok  # the operator's to resume
    for _ in range(60):
        sim.step()
        if sim.job_by_name[target.split("/")[1]].phase == WorkloadPhase.RUNNING:
            break
    assert sim.job_by_name[target.split("/")[1]].phase == WorkloadPhase.RUNNING


def test_the_round_keeps_every_suspend_it_made_to_resume_it(busy_sim):
    """Every job suspended on a fleet nobody else acts on was suspended by the round, and the round
    remembers it (so it will resume it); its preemption history is in its own time."""
    round_ = busy_sim.scheduling
    for _ in range(240):
        busy_sim.step()
    suspended = {j.spec.workload.key for j in busy_sim.jobs if j.phase == WorkloadPhase.SUSPENDED}
    assert suspended <= round_.suspended
    assert round_.preemptions, "the busy fleet saw no preemption: the round's history is untested"
    assert all(t <= (busy_sim.now - EPOCH).total_seconds() for times, _ in round_.preemptions.values() for t in times)


def test_a_policy_the_scheduler_does_not_know_is_refused_with_the_allowed_names(data_dir):
    with pytest.raises(ConfigError, match=r"scheduler_policy: 'lottery' .*gpuwarden"):
        simulated_fleet(SimConfig(scheduler_policy="lottery", data_dir=data_dir))
    with pytest.raises(ConfigError, match="scheduler_policy"):
        SimConfig(scheduler_policy="")
