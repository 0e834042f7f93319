"""``SimCluster``: the ``Cluster`` protocol over the simulated fleet, so the actuator acts on it and
the scheduling round (the same one a real cluster gets) plans on its snapshot.

The snapshot says what a live cluster says, in the same fields: cordons; taints, with a spot node
that was reclaimed shown as Kubernetes shows an unreachable node (a NoExecute taint); unhealthy
GPUs (down or lost); MIG layouts and which instance each pod holds; that no GPU is shared by two
pods (``Node.shares_gpus`` is False); each workload's pools, latest start and attained service. On a
fleet allocated by DRA (``SimConfig.dra``, :mod:`.dra`) a running workload holds what its pods' claims
hold, as the Kubernetes reader says of one: a fractional pod on a whole GPU holds the GPU, on a MIG
device that device.

Each action returns an ``ActionResult``; a refused action (unknown node, a job that is not
running) is ``ok=False`` with the reason, never an exception.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import numpy as np

from gpuwarden.fleet import (
    Action,
    ActionKind,
    ActionResult,
    ClusterSnapshot,
    Placement,
    PriorityClass,
    WorkloadPhase,
    WorkloadState,
)
from gpuwarden.fleet.capabilities import handler_table

from .dra import SimDra
from .fleet_state import SimulatedFleet
from .jobs import SimJob

_LIVE = (WorkloadPhase.PENDING, WorkloadPhase.RUNNING, WorkloadPhase.SUSPENDED)
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable=:NoExecute"  # what Kubernetes puts on a lost node


class SimCluster:
    def __init__(self, simulation: SimulatedFleet) -> None:
        self.sim = simulation
        # nodes and their GPUs in name order, as a Kubernetes API lists them: the planner breaks ties
        # in the order it is given, so a live cluster and its simulation must give the same one
        self._nodes = tuple(sorted(simulation.nodes, key=lambda n: n.name))
        rank = {node.name: i for i, node in enumerate(self._nodes)}
        self._gpus = tuple(sorted(simulation.gpus, key=lambda g: (rank[g.node], g.index)))
        self._placements: dict[int, tuple[np.ndarray, tuple[Placement, ...]]] = {}  # by job, while its devices stay
        # by job: what its state was built from (phase, priority, preemptions, latest start, devices)
        # and the state, last; a waiting job's is reused from round to round
        self._states: dict[int, list[Any]] = {}
        # the jobs not yet finished as of the last snapshot, in submission order, and how many of
        # the simulation's jobs it has seen (a finished job never runs again: none is looked at twice)
        self._live: list[SimJob] = []
        self._seen = 0
        self.dra = SimDra(simulation) if simulation.config.dra else None  # its DRA objects, on a DRA fleet

    # -- reading -------------------------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        sim = self.sim
        with sim.lock:
            now = sim.now
            self._live = [job for job in (*self._live, *sim.jobs[self._seen:]) if job.phase in _LIVE]
            self._seen = len(sim.jobs)
            state_of = self._state
            workloads = tuple([state_of(job) for job in self._live])
            if len(self._states) > 2 * len(workloads) + 64:  # forget finished jobs now and then
                live = {job.index for job in self._live}
                self._states = {index: kept for index, kept in self._states.items() if index in live}
            unhealthy = frozenset(
                sim.gpus[g].uuid for g in np.flatnonzero((sim.gpu_down_until > sim.now_s) | sim.gpu_lost)
            )
            taints = {sim.nodes[i].name: taints for i, taints in sim.node_taints.items()}
            for i in np.flatnonzero(sim.node_down_until > sim.now_s):
                taints[sim.nodes[i].name] = (*taints.get(sim.nodes[i].name, ()), UNREACHABLE_TAINT)
            return ClusterSnapshot(
                taken_at=now,
                nodes=self._nodes,
                gpus=self._gpus,
                workloads=workloads,
                teams=sim.teams,
                cordoned=frozenset(sim.nodes[i].name for i in np.flatnonzero(sim.node_cordoned)),
                taints=taints,
                unhealthy_gpus=unhealthy,
            )

    def _placements_of(self, job: SimJob) -> tuple[Placement, ...]:
        sim = self.sim
        if job.devices is None:
            self._placements.pop(job.index, None)
            return ()
        cached = self._placements.get(job.index)
        if cached is not None and cached[0] is job.devices:
            return cached[1]
        placements = tuple(
            Placement(sim.nodes[sim.dev_node[d]].name, sim.gpus[sim.dev_gpu[d]].uuid, int(sim.dev_mig_id[d]) or None)
            for d in job.devices
        )
        self._placements[job.index] = (job.devices, placements)
        return placements

    def _state(self, job: SimJob) -> WorkloadState:
        attained = job.attained_gpu_seconds(self.sim.now_s)
        cached = self._states.get(job.index)
        # what makes a new state (its progress and service move every round while it runs)
        if cached is not None and cached[0] is job.phase and cached[1] is job.priority \
                and cached[2] == job.preemptions and cached[3] == job.last_started_s and cached[4] is job.devices:
            last = cached[5]
            if last.progress_seconds == job.progress_s and last.attained_gpu_seconds == attained:
                return last
            cached[5] = state = last.progressed(job.progress_s, attained)
            return state
        origin = self.sim.origin
        last = cached[5] if cached is not None else None  # its times are reused where they still hold
        submitted_at = last.submitted_at if last else origin + timedelta(seconds=float(job.spec.submit_s))
        if job.last_started_s is None:
            started_at = None
        elif last is not None and cached is not None and cached[3] == job.last_started_s:
            started_at = last.started_at
        else:
            started_at = origin + timedelta(seconds=float(job.last_started_s))
        workload = job.spec.workload
        held = self.dra.held_request(job) if self.dra is not None else None
        if held is not None:  # a running pod holds what its claims hold
            workload = dataclasses.replace(workload, gpus=held)
        state = WorkloadState(
            workload=workload, phase=job.phase, submitted_at=submitted_at,
            started_at=started_at, placements=self._placements_of(job), progress_seconds=job.progress_s,
            duration_seconds=job.spec.duration_s, preemptions=job.preemptions,
            priority_override=None if job.priority == job.spec.workload.priority_class else job.priority.value,
            attained_gpu_seconds=attained, annotations=job.annotations,
        )
        self._states[job.index] = [job.phase, job.priority, job.preemptions, job.last_started_s, job.devices, state]
        return state

    # -- acting --------------------------------------------------------------------------------
    def apply(self, action: Action) -> ActionResult:
        handler = HANDLERS[action.kind]
        if isinstance(handler, str):
            return ActionResult(action, False, f"{action.kind.value} is not supported by the simulated cluster: {handler}")
        with self.sim.lock:
            try:
                message = handler(self, action)
            except (LookupError, TypeError, ValueError) as error:  # bad target or params: refused, not raised
                return ActionResult(action, False, f"{action.kind.value} {action.target}: {error}")
            self.sim._capacity_changed = self.sim.acted = True
        return ActionResult(action, True, message)

    def _node(self, name: str) -> int:
        for i, node in enumerate(self.sim.nodes):
            if node.name == name:
                return i
        raise LookupError(f"node {name!r} not found")

    def _job(self, target: str) -> SimJob:
        job = self.sim.job_by_name.get(target.split("/", 1)[-1])
        if job is not None and job.phase in _LIVE:
            return job
        raise LookupError(f"workload {target!r} not found or already finished")

    def _do_cordon(self, action: Action) -> str:
        self.sim.node_cordoned[self._node(action.target)] = True
        return f"cordoned {action.target}"

    def _do_uncordon(self, action: Action) -> str:
        self.sim.node_cordoned[self._node(action.target)] = False
        return f"uncordoned {action.target}"

    def _do_taint(self, action: Action) -> str:
        node = self._node(action.target)
        taint = str(action.params.get("taint", "gpuwarden.io/unhealthy=true:NoSchedule"))
        current = self.sim.node_taints.get(node, ())
        if taint not in current:
            self.sim.node_taints[node] = current + (taint,)
        return f"tainted {action.target} with {taint}"

    def _do_untaint(self, action: Action) -> str:
        node = self._node(action.target)
        taint = action.params.get("taint")
        remaining = tuple(t for t in self.sim.node_taints.get(node, ()) if taint is not None and t != taint)
        if remaining:
            self.sim.node_taints[node] = remaining
        else:
            self.sim.node_taints.pop(node, None)
        return f"removed taint(s) from {action.target}"

    def _do_drain(self, action: Action) -> str:
        sim = self.sim
        node = self._node(action.target)
        sim.node_cordoned[node] = True
        jobs = np.unique(sim.dev_job[(sim.dev_node == node) & (sim.dev_job >= 0)])
        for job_index in jobs:
            job = sim.jobs[int(job_index)]
            sim._stop(job, keep_checkpoint=True, graceful=True)
            job.preemptions += 1
            sim.counts["preempted"] += 1
        return f"drained {action.target}: {len(jobs)} workload(s) evicted"

    def _do_evict(self, action: Action) -> str:
        job = self._job(action.target)
        if job.phase != WorkloadPhase.RUNNING:
            raise LookupError(f"workload {action.target!r} is {job.phase.value}, not running")
        self.sim._stop(job, keep_checkpoint=True, graceful=True)
        job.preemptions += 1
        self.sim.counts["preempted"] += 1
        return f"evicted {action.target} (requeued)"

    def _do_suspend(self, action: Action) -> str:
        job = self._job(action.target)
        if job.phase == WorkloadPhase.SUSPENDED:
            return f"{action.target} already suspended"
        if job.phase == WorkloadPhase.RUNNING:
            job.preemptions += 1
            self.sim.counts["preempted"] += 1
        self.sim._stop(job, keep_checkpoint=True, graceful=True, to_phase=WorkloadPhase.SUSPENDED)
        if job in self.sim.queue:
            self.sim.queue.remove(job)
        return f"suspended {action.target} at {job.progress_s:.0f} s of progress"

    def _do_preempt(self, action: Action) -> str:
        job = self._job(action.target)
        if job.spec.workload.checkpointable:
            return self._do_suspend(action)
        return self._do_evict(action)

    def _do_resume(self, action: Action) -> str:
        """Back to the queue; with ``params['placements']`` (the scheduler's resume) straight onto them.
        A preempted job that was requeued (pending) may also be resumed onto placements."""
        job = self._job(action.target)
        placements = action.params.get("placements")
        if job.phase != WorkloadPhase.SUSPENDED and not (placements and job.phase == WorkloadPhase.PENDING):
            raise LookupError(f"workload {action.target!r} is {job.phase.value}, not suspended")
        if placements:
            return f"resumed {action.target} on {self._bind_onto(action, job, placements)} device(s)"
        job.phase = WorkloadPhase.PENDING
        self.sim.suspended.discard(job.index)
        if job not in self.sim.queue:
            self.sim.queue.append(job)
        return f"resumed {action.target} (queued)"

    def _do_set_priority(self, action: Action) -> str:
        job = self._job(action.target)
        value = action.params.get("priority_class")
        try:
            job.priority = PriorityClass(value)
        except ValueError:
            allowed = ", ".join(p.value for p in PriorityClass)
            raise LookupError(f"priority_class {value!r} is not one of: {allowed}") from None
        return f"{action.target} priority set to {job.priority.value}"

    def _do_notify(self, action: Action) -> str:
        """A notice changes nothing in the simulation; it is kept so a test can see it was given."""
        self._job(action.target)
        self.notices = getattr(self, "notices", []) + [action]
        return f"notified the owner of {action.target}"

    def _bind_onto(self, action: Action, job: SimJob, placements: Any) -> int:
        """Start ``job`` on the devices its planner ``placements`` name and take it off the queue;
        returns how many devices."""
        devices = self._devices(action, job, placements)
        self.sim._bind(job, devices, self.sim.now_s)
        if job in self.sim.queue:
            self.sim.queue.remove(job)
        return len(devices)

    def _do_bind(self, action: Action) -> str:
        """Place a pending workload: on ``params['placements']`` as the scheduler's planner writes them
        (node, gpu_uuid, and milli or mig_profile per pod), or on the whole GPUs named in
        ``params['gpu_uuids']``."""
        sim = self.sim
        job = self._job(action.target)
        if job.phase != WorkloadPhase.PENDING:
            raise LookupError(f"workload {action.target!r} is {job.phase.value}, not pending")
        placements = action.params.get("placements")
        if placements:
            return f"bound {action.target} to {self._bind_onto(action, job, placements)} device(s)"
        uuids = list(action.params.get("gpu_uuids", ()))
        index_of = sim.gpu_index_of
        unknown = [u for u in uuids if u not in index_of]
        if unknown:
            raise LookupError(f"GPU {unknown[0]!r} not found")
        wanted = np.array([index_of[u] for u in uuids])
        devices = np.flatnonzero(np.isin(sim.dev_gpu, wanted) & ~sim.dev_is_mig)
        needed = job.spec.workload.gpus.count * job.spec.workload.gang_size
        free = sim.available(sim.now_s)
        if devices.size != needed or not free[devices].all():
            raise LookupError(f"cannot bind {action.target}: needs {needed} free whole GPU(s), got {devices.size} named")
        sim._bind(job, devices, sim.now_s)
        if job in sim.queue:
            sim.queue.remove(job)
        return f"bound {action.target} to {len(devices)} GPU(s)"

    def _devices(self, action: Action, job: SimJob, placements: Any) -> np.ndarray:
        """The free devices the placements name: a whole GPU, or a free MIG instance of the named
        profile on it. A fraction on a whole GPU takes the GPU (a simulated GPU is never shared)."""
        sim = self.sim
        free = sim.available(sim.now_s)
        index_of = sim.gpu_index_of
        devices: list[int] = []
        for placement in placements:
            uuid = placement["gpu_uuid"]
            if uuid not in index_of:
                raise LookupError(f"GPU {uuid!r} not found")
            on_gpu = np.flatnonzero((sim.dev_gpu == index_of[uuid]) & free)
            on_gpu = on_gpu[~np.isin(on_gpu, devices)]
            profile = placement.get("mig_profile")
            if profile is not None:
                on_gpu = on_gpu[sim.dev_mig_profile[on_gpu] == profile]
            else:
                on_gpu = on_gpu[~sim.dev_is_mig[on_gpu]]
            if not on_gpu.size:
                what = f"MIG instance {profile}" if profile else "whole GPU"
                raise LookupError(f"cannot place {action.target}: no free {what} on {uuid}")
            devices.append(int(on_gpu[0]))
        return np.array(devices)


HANDLERS = handler_table("SimCluster", {
    ActionKind.CORDON: SimCluster._do_cordon, ActionKind.UNCORDON: SimCluster._do_uncordon,
    ActionKind.TAINT: SimCluster._do_taint, ActionKind.UNTAINT: SimCluster._do_untaint,
    ActionKind.DRAIN: SimCluster._do_drain, ActionKind.EVICT: SimCluster._do_evict,
    ActionKind.SUSPEND: SimCluster._do_suspend, ActionKind.RESUME: SimCluster._do_resume,
    ActionKind.PREEMPT: SimCluster._do_preempt, ActionKind.SET_PRIORITY: SimCluster._do_set_priority,
    ActionKind.BIND: SimCluster._do_bind, ActionKind.NOTIFY: SimCluster._do_notify,
    ActionKind.SET_MIG_CONFIG: "its GPUs' MIG layouts are fixed when the fleet is built",
})
