"""What the simulated round reuses from round to round decides nothing: a state built with the jobs
and pod slots kept from the last round equals one built from nothing, field by field, and the
scheduler decides the same on both; pod codes written at bind are the ones read per device before."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from builders import node, snapshot, workload
from gpuwarden.scheduler import scheduling_round
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.fleet import GpuRequest, PriorityClass, Workload, WorkloadKind
from gpuwarden.scheduling import Scheduler, planner
from gpuwarden.scheduling.state import MILLI, State
from gpuwarden.sim import SimConfig
from gpuwarden.sim.workloads import TRAINING_POOLS

FLEET = dict(nodes=8, warmup_days=0.0, fault_rate_scale=0.0, spot_reclaims_per_node_day=0.0, training_load=2.0)
JOB_FIELDS = ("name", "team", "priority", "pods", "gpus_per_pod", "milli", "mig_profile", "kind", "submitted", "pools",
              "avoid_nodes", "state", "started", "progress", "attained", "duration", "placements", "preempted_at",
              "protected_until")


def _facts(state: State) -> dict[str, object]:
    """Everything a pass reads from a freshly built state, in order (not what an earlier pass left on
    a kept job: its wait reason and first start are carried by design)."""
    return {
        "nodes": [(n.name, n.schedulable, n.gpu_free, n.mig_used, n.cpu_free, n.mem_free) for n in state.nodes.values()],
        "jobs": [tuple(getattr(job, f) for f in JOB_FIELDS) for job in state.jobs.values()],
        "usage": list(state.quotas.usage.items()),  # floats summed in the same order: equal to the bit
        "demand": list(state.demand().items()),
        "capacity": state.capacity,
    }


def test_a_round_built_from_kept_jobs_and_slots_is_a_round_built_from_nothing(data_dir):
    sim = simulated_fleet(SimConfig(seed=11, data_dir=str(data_dir), **FLEET))
    real_build = scheduling_round.state_from_snapshot
    compared = []

    def build_both(taken, **kwargs):
        kept = real_build(taken, **kwargs)  # the round's own: its known jobs and the kept slots
        latest = planner._latest_slots
        planner._set_latest_slots({})
        try:
            fresh = real_build(taken, origin=kwargs["origin"])  # nothing kept
        finally:
            planner._set_latest_slots(latest)
        assert kept[1] == fresh[1]
        assert _facts(kept[0]) == _facts(fresh[0])
        policy = planner.policy_for(taken, "gpuwarden")
        now = (taken.taken_at - kwargs["origin"]).total_seconds()
        assert Scheduler(policy).schedule(copy.deepcopy(kept[0]), now) == Scheduler(policy).schedule(fresh[0], now)
        compared.append(sum(job.state == "running" for job in fresh[0].jobs.values()))
        return kept

    scheduling_round.state_from_snapshot = build_both
    try:
        for _ in range(240):
            sim._advance(render=False)
    finally:
        scheduling_round.state_from_snapshot = real_build
    assert len(compared) > 30 and max(compared) > 10  # rounds with running work whose slots were kept
    assert sim.counts["preempted"] > 0 or sim.counts["succeeded"] > 0


def test_kept_slots_follow_the_layout_and_whether_gpus_are_shared():
    """The same running workload object on a fleet that shares GPUs books its fraction; on one that
    does not (a new snapshot, same workload objects) it books the whole GPU, as a fresh build does."""
    half = dataclasses.replace(workload("half", on="node-0"), workload=dataclasses.replace(
        workload("half").workload, gpus=GpuRequest(count=1, fraction_milli=500)))
    shared = snapshot([node("node-0")], [half])
    whole = dataclasses.replace(shared, nodes=tuple(dataclasses.replace(n, shares_gpus=False) for n in shared.nodes))
    for taken, free in ((shared, 500), (whole, 0), (shared, 500)):
        state, _ = planner.state_from_snapshot(taken)
        assert state.nodes["node-0"].gpu_free[0] == free
        assert state.jobs["alpha/half"].placements == [("node-0", 0, MILLI - free)]


def test_pod_codes_written_at_bind_are_each_devices_pod(data_dir):
    """Each allocated device renders its own pod: the job's only pod, or in a gang the pod whose
    gpus.count devices (in the order they were bound) include it."""
    sim = simulated_fleet(SimConfig(seed=4, data_dir=str(data_dir), **FLEET))
    team = sim._team_names[0]
    sim.submit(Workload("gang", team, WorkloadKind.TRAINING, team, f"{team}-x", PriorityClass.CRITICAL,
                        GpuRequest(count=4), gang_size=2, pools=TRAINING_POOLS), duration_s=3600.0)
    gangs = 0
    for _ in range(90):
        frame = sim.step()
        for device in np.flatnonzero(sim.dev_job >= 0):
            job = sim.jobs[int(sim.dev_job[device])]
            codes, per_pod = sim._job_pod_codes[job.index], max(1, job.spec.workload.gpus.count)
            position = int(np.flatnonzero(job.devices == device)[0])
            expected = codes[0] if job.spec.workload.gang_size == 1 else codes[position // per_pod]
            assert sim.dev_pod[device] == expected
            assert frame["pod"].iloc[device] == sim._pod_names[expected]
            gangs += job.spec.workload.gang_size > 1
    assert gangs > 0
