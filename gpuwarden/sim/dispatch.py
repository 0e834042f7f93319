"""The simulated fleet is scheduled by the production scheduler, and only by it.

Each pass reads the simulation into the scheduling engine's working state (nodes with their free
GPUs and MIG instances, running jobs where they run, waiting jobs, team quotas), runs one
``Scheduler.schedule`` pass of the configured policy (``SimConfig.scheduler_policy``), turns the
decisions into fleet actions with the planner's own ``actions_for`` and carries them out through
``SimCluster.apply`` -- the same BIND, RESUME, SUSPEND and PREEMPT a live cluster receives. The
simulator keeps no placement code of its own.

Two facts about the simulated fleet (not about the policy) are passed to the engine: a GPU cannot
be shared by two pods, so a fractional request takes the smallest free MIG instance that holds it,
else a whole GPU (``FractionMode.MIG_OR_WHOLE``); and a job may only run in its pools (training
pools for training, inference pools for services and notebooks).

A workload suspended by someone else (the actuator reclaiming an idle GPU) is held until that
someone resumes it; one the scheduler suspended waits in its queue and is resumed by it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from gpuwarden.fleet import PriorityClass, WorkloadPhase
from gpuwarden.scheduling import (
    FractionMode,
    Job,
    JobState,
    NodeState,
    QuotaSpec,
    Quotas,
    Scheduler,
    State,
    actions_for,
)
from gpuwarden.scheduling.policy import policy_named
from gpuwarden.scheduling.state import MILLI, Slot

if TYPE_CHECKING:
    from .cluster import SimCluster
    from .engine import SimJob, Simulation

RANK = {member: member.rank for member in PriorityClass}
UNLIMITED = 10**15  # simulated pods ask for no CPU or memory: the scheduler never runs short of them


class Dispatcher:
    """Runs the production scheduler over a ``Simulation`` and applies its decisions."""

    def __init__(self, simulation: Simulation, cluster: SimCluster, policy: str) -> None:
        self.sim = simulation
        self.cluster = cluster
        base = policy_named(policy)
        self.scheduler = Scheduler(replace(base, placement=replace(base.placement, fractions=FractionMode.MIG_OR_WHOLE)))
        self.index_of: dict[str, int] = {}
        self.jobs: dict[int, Job] = {}  # engine view of each simulated job, kept across passes (LAS service, preemption history)
        self.suspended: dict[int, SimJob] = {}  # suspended by the scheduler: it resumes them
        self.refused = 0  # actions SimCluster refused (a mismatch between the two views; should stay 0)
        self.last_now = 0.0
        self._slot_cache: dict[int, tuple[np.ndarray, list[Slot]]] = {}
        sim = simulation
        node_index = {node.name: n for n, node in enumerate(sim.nodes)}
        self._gpus_of_node: list[list[int]] = [[] for _ in sim.nodes]
        for g, gpu in enumerate(sim.gpus):
            self._gpus_of_node[node_index[gpu.node]].append(g)
        self._gpu_ids = [[sim.gpus[g].uuid for g in gpus] for gpus in self._gpus_of_node]
        self._layouts = [tuple(i.profile for i in g.mig_instances) if g.mig_enabled else None for g in sim.gpus]
        self._devices_of_gpu = [np.flatnonzero(sim.dev_gpu == g) for g in range(len(sim.gpus))]
        # a whole GPU is one device: its device index (MIG GPUs: -1)
        self._whole_device = np.array([d[0] if self._layouts[g] is None else -1 for g, d in enumerate(self._devices_of_gpu)])
        self.quota_specs = tuple(QuotaSpec(t.name, t.guaranteed_gpus, t.burst_limit_gpus, weight=t.weight)
                                 for t in sim.teams)

    # -- reading the simulation ------------------------------------------------------------------
    def _engine_job(self, job: SimJob) -> Job:
        known = self.jobs.get(job.index)
        workload = job.spec.workload
        if known is None:
            request = workload.gpus
            known = self.jobs[job.index] = Job(
                name=workload.key, team=workload.team, priority=RANK[job.priority],
                pods=workload.gang_size, gpus_per_pod=max(1, request.count), milli=request.fraction_milli,
                mig_profile=request.mig_profile, gpu_model=request.gpu_model, kind=workload.kind,
                checkpointable=workload.checkpointable, submitted=job.spec.submit_s, pools=job.spec.pools,
                duration=job.spec.duration_s,
            )
            self.index_of[known.name] = job.index
        known.priority = RANK[job.priority]  # set-priority may have changed it
        known.progress = job.progress_s
        return known

    def state(self, now: float) -> State:
        sim = self.sim
        available = sim.available(now)
        allocated = sim.dev_job >= 0
        node_ok = sim.schedulable_nodes(now)
        # the nodes show what is free now; running jobs are registered on top (State.add_placed)
        whole_free = np.where(available[self._whole_device] & (self._whole_device >= 0), MILLI, 0).tolist()
        nodes: list[NodeState] = []
        for n, node in enumerate(sim.nodes):
            gpus = self._gpus_of_node[n]
            gpu_free = [whole_free[g] for g in gpus]
            layouts = [self._layouts[g] for g in gpus]
            used: list[list[str]] = []
            for g in gpus:
                if self._layouts[g] is None:
                    used.append([])
                else:
                    devices = self._devices_of_gpu[g]
                    used.append([str(sim.dev_mig_profile[d]) for d in devices[~available[devices]]])
            nodes.append(NodeState(
                name=node.name, model=node.gpu_model, gpu_count=len(gpu_free), cpu_free=UNLIMITED, mem_free=UNLIMITED,
                tier=node.price_tier, nvlink_domain=node.topology.nvlink_domain, leaf_switch=node.topology.leaf_switch,
                schedulable=bool(node_ok[n]), gpu_free=gpu_free, mig_layout=layouts, mig_used=used,
                gpu_ids=self._gpu_ids[n], pool=node.pool,
            ))
        state = State(nodes, Quotas(self.quota_specs))
        elapsed = max(0.0, now - self.last_now)
        for index in np.unique(sim.dev_job[allocated]):
            sim_job = sim.jobs[int(index)]
            job = self._engine_job(sim_job)
            job.attained += elapsed * job.gpu_equivalents
            state.add_placed(job, self._slots(sim_job))
        for sim_job in sim.queue:
            if sim_job.phase == WorkloadPhase.PENDING:
                job = self._engine_job(sim_job)
                job.state = JobState.PENDING
                state.jobs[job.name] = job
        for index, sim_job in list(self.suspended.items()):
            if sim_job.phase != WorkloadPhase.SUSPENDED:
                del self.suspended[index]  # resumed or finished by someone else
                continue
            job = self._engine_job(sim_job)
            job.state = JobState.SUSPENDED
            state.jobs[job.name] = job
        self.last_now = now
        return state

    def _slots(self, job: SimJob) -> list[Slot]:
        sim = self.sim
        assert job.devices is not None
        cached = self._slot_cache.get(job.index)
        if cached is not None and cached[0] is job.devices:
            return cached[1]
        slots: list[Slot] = []
        for d in job.devices.tolist():
            g = int(sim.dev_gpu[d])
            node = sim.nodes[int(sim.dev_node[d])].name
            slots.append((node, sim.gpus[g].index, str(sim.dev_mig_profile[d]) if sim.dev_is_mig[d] else MILLI))
        self._slot_cache[job.index] = (job.devices, slots)
        return slots

    # -- one pass --------------------------------------------------------------------------------
    def schedule(self, now: float) -> None:
        state = self.state(now)
        decisions = self.scheduler.schedule(state, now)
        for action in actions_for(decisions, state, self.scheduler.policy.name):
            result = self.cluster.apply(action)
            if not result.ok:
                self.refused += 1
                continue
            sim_job = self.sim.jobs[self.index_of[action.target]]
            if sim_job.phase == WorkloadPhase.SUSPENDED:
                self.suspended[sim_job.index] = sim_job
            else:
                self.suspended.pop(sim_job.index, None)
