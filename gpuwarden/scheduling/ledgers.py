"""What the plan verifier (:mod:`.verify`) reads, built from a live round's ``ClusterSnapshot`` and
fleet ``Action`` s (:func:`check_actions`: the round's entry point) or from a replay's ``State`` and
``Decision`` s (:func:`ledger_of_state`, :func:`steps_of_decisions`). Either lists only the work a
plan touches and sums each team's GPUs, so a fleet of thousands of workloads judges a plan of a few
dozen actions quickly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, Workload, WorkloadPhase, WorkloadState
from gpuwarden.fleet.semantics_scalar import request_gpu_equivalents

from .state import MILLI, Job, Slot, State
from .verify import Holder, Ledger, Slot3, Step, Violation, violations

# -- the live round: a snapshot and fleet actions -------------------------------------------------------

STARTS = (ActionKind.BIND, ActionKind.RESUME)
STOPS = (ActionKind.SUSPEND, ActionKind.PREEMPT, ActionKind.EVICT)


def ledger_of_snapshot(snapshot: ClusterSnapshot, quotas: bool = True, actions: Sequence[Action] | None = None) -> Ledger:
    """The ledger of a snapshot; with the plan's ``actions``, only the work they touch is listed (the
    workloads they name and the running work on the nodes they start work on) and each team's GPUs
    are summed: a round of 10,000 workloads judges a plan of a few dozen actions."""
    ledger = Ledger(shared_nodes=frozenset(n.name for n in snapshot.nodes if n.shares_gpus))
    profile_of: dict[tuple[str, int], str] = {}
    for gpu in snapshot.gpus:
        ledger.gpus[(gpu.node, gpu.uuid)] = tuple(i.profile for i in gpu.mig_instances) if gpu.mig_enabled else None
        if gpu.mig_enabled:
            profile_of.update(((gpu.uuid, i.gpu_instance_id), i.profile) for i in gpu.mig_instances)
    for node in snapshot.nodes:
        cpu, memory = snapshot.node_overhead.get(node.name, (0, 0))
        ledger.host[node.name] = (node.cpu_milli - cpu, node.memory_bytes - memory)
    named = touched = None
    if actions is not None:
        named = {a.target for a in actions}
        touched = {str(p["node"]) for a in actions if a.kind in STARTS for p in a.params.get("placements", ())}
        ledger.used = {}
    refused, used = snapshot.refused_teams, ledger.used
    for ws in snapshot.workloads:
        w = ws.workload
        in_scope = snapshot.in_queue(w.namespace) and w.team not in refused
        running = ws.phase == WorkloadPhase.RUNNING
        if used is not None and running and in_scope:
            used[w.team] = used.get(w.team, 0.0) + _gpus_of(w)
        if named is not None and touched is not None and w.key not in named and not (
                running and any(p.node in touched for p in ws.placements)):
            continue
        holder = _holder_of(ws, in_scope, profile_of)
        if running:
            ledger.running[holder.key] = holder
        elif ws.phase in (WorkloadPhase.PENDING, WorkloadPhase.SUSPENDED):
            ledger.waiting[holder.key] = dataclasses.replace(holder, slots=())
    if quotas:
        ledger.teams = {t.name: (t.guaranteed_gpus, t.burst_limit_gpus) for t in snapshot.teams}
    return ledger


def _gpus_of(w: Workload) -> float:
    """Whole-GPU equivalents of a workload, as the engine's quotas count them (its model for MIG)."""
    request = w.gpus
    return request_gpu_equivalents(request.mig_profile, w.gang_size * request.count if not request.mig_profile
                                   else w.gang_size, request.fraction_milli, model=request.gpu_model)


def _holder_of(ws: WorkloadState, in_scope: bool, profile_of: Mapping[tuple[str, int], str]) -> Holder:
    w = ws.workload
    request = w.gpus
    slots: list[Slot3] = []
    for p in ws.placements:
        if p.mig_instance_id is not None:
            slots.append((p.node, p.gpu_uuid, profile_of.get((p.gpu_uuid, p.mig_instance_id), request.mig_profile or "")))
        else:
            slots.append((p.node, p.gpu_uuid, request.fraction_milli if request.count else MILLI))
    per_pod = request.count if not request.mig_profile and request.fraction_milli == MILLI else 1
    return Holder(w.key, w.team, _gpus_of(w), w.gang_size, tuple(slots), w.cpu_milli, w.memory_bytes, max(per_pod, 1),
                  in_scope)


def steps_of_actions(actions: Iterable[Action]) -> list[Step]:
    steps = []
    for action in actions:
        if action.kind in STARTS:
            slots = tuple((str(p["node"]), str(p["gpu_uuid"]), p.get("mig_profile") or int(p.get("milli", MILLI)))
                          for p in action.params.get("placements", ()))
            steps.append(Step(True, action.target, slots, deferred=bool(action.params.get("after_stops")),
                              reserved=bool(action.params.get("reserved"))))
        elif action.kind in STOPS:
            steps.append(Step(False, action.target, beneficiary=str(action.params.get("for", ""))))
    return steps


def workload_scope(snapshot: ClusterSnapshot) -> Callable[[str], bool]:
    """Whether an action's target (a workload key) is the scheduler's to act on."""
    def in_scope(key: str) -> bool:
        return snapshot.in_queue(key.partition("/")[0])
    return in_scope


def check_actions(snapshot: ClusterSnapshot, actions: Iterable[Action], quotas: bool = True) -> list[Violation]:
    """The rules on a live round's plan: the snapshot it was made on, the actions it would apply.
    ``quotas``: the policy keeps guarantees and burst limits (the baselines fifo and tiresias do not)."""
    actions = list(actions)
    in_scope = workload_scope(snapshot)
    outside = [Violation("scope", f"{a.kind.value} of {a.target}, outside the queue") for a in actions
               if a.kind == ActionKind.SET_PRIORITY and not in_scope(a.target)]  # a write, though no start or stop
    return outside + violations(ledger_of_snapshot(snapshot, quotas, actions), steps_of_actions(actions), in_scope)


# -- the replays: the engine's state and decisions --------------------------------------------------------

def capacity_of_state(state: State) -> Ledger:
    """What a ``State``'s nodes offer (a replay's stay as they are: worked out once per replay)."""
    ledger = Ledger(shared_nodes=frozenset(state.nodes))  # the engine books fractions as it places them
    for node in state.nodes.values():
        ledger.host[node.name] = (node.cpu_capacity, node.mem_capacity)
        for g, layout in enumerate(node.mig_layout):
            ledger.gpus[(node.name, g)] = tuple(layout) if layout is not None else None
    return ledger


def ledger_of_state(state: State, running: Mapping[str, list[Slot]], decisions: Sequence[Any],
                    quotas: bool = True, capacity: Ledger | None = None) -> Ledger:
    """The ledger a pass's ``decisions`` are judged on, from a ``State`` and ``running``: each running
    job's placements as the pass found them (a pass replaces a job's list, never changes it in place,
    so the lists taken before it are that). It lists the running work the decisions stop or share a
    node with, the waiting work they start, and each team's GPUs (the rest of the thousands of jobs a
    replay holds cannot break a rule of this plan); ``capacity``: :func:`capacity_of_state`, kept.
    ``quotas`` as for :func:`check_actions`."""
    base = capacity or capacity_of_state(state)
    used: dict[str, float] = {}
    ledger = Ledger(gpus=base.gpus, shared_nodes=base.shared_nodes, host=base.host, used=used)
    touched = {node for d in decisions for node, _, _ in d.placements}
    named = {d.job for d in decisions}
    jobs = state.jobs
    for name, placements in running.items():
        job = jobs[name]
        if not job.foreign:
            used[job.team] = used.get(job.team, 0.0) + job.gpu_equivalents
        if name in named or any(node in touched for node, _, _ in placements):
            ledger.running[name] = _holder_of_job(job, placements)
    for name in named - set(running):
        ledger.waiting[name] = _holder_of_job(jobs[name], [])
    if quotas:
        ledger.teams = {team: (spec.guaranteed, spec.burst) for (team, _), spec in state.quotas.specs.items()}
    return ledger


def _holder_of_job(job: Job, placements: list[Slot]) -> Holder:
    return Holder(job.name, job.team, job.gpu_equivalents, job.pods, tuple(placements), job.cpu_milli, job.mem_bytes,
                  job.gpus_per_pod if job.whole else 1, not job.foreign)


def steps_of_decisions(decisions: Iterable[Any]) -> list[Step]:
    """The pass's decisions (``scheduler.Decision``) as steps, GPUs by (node, index) as the engine names
    them; starts land at once in a replay."""
    steps = []
    for d in decisions:
        start = d.kind in ("bind", "resume")
        steps.append(Step(start, d.job, tuple(d.placements) if start else (), deferred=True, beneficiary=d.beneficiary))
    return steps
