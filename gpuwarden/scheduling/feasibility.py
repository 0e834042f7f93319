"""Work that can never start as it is written, and why: the scheduling round holds it out of the
plan (it would block the queue's head and spend its preemption attempts for nothing) and tells its
owner the cause.

A waiting workload never starts when, on the cluster with nothing running, cordons lifted and every
GPU healthy, no node it may use could hold it. The cause is the first of these that leaves it no
node, each counted per resource kind from the nodes' allocatable (a MIG-partitioned or time-sliced
GPU is no whole GPU):
- no node offers its kind: whole GPUs, a time-sliced share, or its MIG profile (unless the MIG
  manager may re-partition a node for it);
- no node of its GPU model, or in its pools;
- its nodeSelector or required node affinity selects none of those nodes;
- every node left carries a taint it does not tolerate;
- only spot capacity is left, and it is no checkpointable training;
- one pod asks more whole GPUs, CPU or memory than the largest node it may use has;
- the gang asks more than all those nodes hold, or fits under no single leaf switch;
- it asks more GPUs than its team's burst limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gpuwarden.fleet import NO_WHOLE_GPU_POOL, ClusterSnapshot, Node, Workload, WorkloadPhase, WorkloadState
from gpuwarden.fleet.node_selection import LabelRequirement, NodeSelection, selects
from gpuwarden.fleet.taints import taint_blocks

from . import mig
from .placement import FractionMode, PlacementOptions, _model_ok, _tier_ok, find_placement
from .planner import _blocked_nodes, _job_of, _layout
from .state import MILLI, Job, NodeState, State

WAITING = (WorkloadPhase.PENDING, WorkloadPhase.SUSPENDED)


def never_fits(snapshot: ClusterSnapshot, workloads: Iterable[WorkloadState], options: PlacementOptions,
               mig_manager: bool = False) -> dict[str, str]:
    """{workload key: why it can never start} for the waiting ones of ``workloads`` (the planner's
    jobs for them, on the snapshot's nodes with nothing running)."""
    empty, known = _kept_for(snapshot, options, mig_manager)
    by_name = {n.name: n for n in snapshot.nodes}
    limits = {t.name: t.burst_limit_gpus for t in snapshot.teams}
    out: dict[str, str] = {}
    for ws in workloads:
        if ws.phase not in WAITING:
            continue
        w = ws.workload
        signature = (w.gpus, w.gang_size, w.pools, w.node_selection, w.tolerations, w.cpu_milli, w.memory_bytes,
                     w.checkpointable, w.kind, w.team)
        if signature not in known and w.gpus.mig_profile and not mig.known_profile(w.gpus.mig_profile):
            known[signature] = f"unknown MIG profile {w.gpus.mig_profile!r} (no GPU model of the catalogue offers it)"
        if signature not in known:
            job = _job_of(ws, w.key, snapshot.taken_at, None)
            job.avoid_nodes = _blocked_nodes(snapshot, w)
            known[signature] = _cause(snapshot, empty, by_name, job, w, options, mig_manager, limits.get(w.team))
        if known[signature] is not None:
            out[w.key] = str(known[signature])
    return out


# The empty cluster and the verdicts of the latest call, with what they were worked out from: a
# cluster whose nodes, taints, labels and teams did not change (most rounds) has them at once.
_kept: tuple[tuple[object, ...], State, dict[tuple[object, ...], str | None]] | None = None


def _kept_for(snapshot: ClusterSnapshot, options: PlacementOptions,
              mig_manager: bool) -> tuple[State, dict[tuple[object, ...], str | None]]:
    global _kept
    key = (snapshot.nodes, snapshot.gpus, tuple(sorted(snapshot.taints.items())),
           tuple(sorted((node, tuple(sorted(labels.items()))) for node, labels in snapshot.node_labels.items())),
           snapshot.teams, options, mig_manager)
    kept = _kept
    if kept is not None and kept[0] == key:
        return kept[1], kept[2]
    layout = _layout(snapshot)
    empty = State(NodeState(**fields, gpu_free=list(free), mig_layout=list(mig_layout), gpu_ids=list(uuids))
                  for fields, free, mig_layout, uuids in layout.nodes)
    _kept = (key, empty, {})
    return empty, _kept[2]


def _cause(snapshot: ClusterSnapshot, empty: State, by_name: Mapping[str, Node], job: Job, w: Workload,
           options: PlacementOptions, mig_manager: bool, burst: float | None) -> str | None:
    nodes = list(empty.nodes.values())
    shares = any(n.shares_gpus for n in snapshot.nodes)
    kind, offering = _offering(nodes, by_name, job, shares)
    if not offering:
        if job.mig_profile and mig_manager and any(mig.mig_table(n.model).get(job.mig_profile) for n in nodes):
            return None  # the MIG manager may lay a node out for it
        return _no_kind(nodes, kind, job)
    allowed = offering
    steps: tuple[tuple[Callable[[NodeState], bool], Callable[[list[NodeState]], str]], ...] = (
        (lambda n: _model_ok(job, n), lambda _: f"no node offering {kind} is of GPU model {job.gpu_model}"),
        (lambda n: not job.pools or n.pool in job.pools, lambda _: _pools_text(kind, job.pools)),
        (lambda n: selects(w.node_selection, snapshot.node_labels.get(n.name, {})),
         lambda _: f"{_selection_text(w.node_selection)} matches none of the {len(offering)} node(s) offering {kind}"),
        (lambda n: not any(taint_blocks(t, w.tolerations) for t in snapshot.taints.get(n.name, ())),
         lambda left: _taint_text(snapshot, left, w)),
        (lambda n: _tier_ok(job, n), lambda _: "only spot capacity is left to it, and it is no checkpointable training"),
    )
    for keep, why in steps:
        narrowed = [n for n in allowed if keep(n)]
        if not narrowed:
            return why(allowed)
        allowed = narrowed
    physical = _too_large(allowed, job, kind) or _by_placement(empty, allowed, job, options)
    if physical is None and burst is not None and job.gpu_equivalents > burst + 1e-9:
        return (f"quota: asks for {job.gpu_equivalents:g} GPUs in all, over its burst limit: team {job.team} may "
                f"hold {burst:g} (it can never start as written)")
    return physical


def _offering(nodes: list[NodeState], by_name: Mapping[str, Node], job: Job,
              shares: bool) -> tuple[str, list[NodeState]]:
    """(what it asks, the nodes that offer that kind at all)."""
    if job.mig_profile:
        return (f"MIG profile {job.mig_profile}",
                [n for n in nodes if any(layout and job.mig_profile in layout for layout in n.mig_layout)])
    if job.milli < MILLI and shares:
        return "time-sliced GPU shares", [n for n in nodes if by_name[n.name].shares_gpus]
    if job.milli < MILLI:
        return "a GPU or a MIG instance", [n for n in nodes if n.gpu_count]
    # a time-sliced node (Kubernetes) offers no whole GPU: its pool keeps whole-GPU work off it
    return "whole GPUs", [n for n in nodes if n.whole_free()]


def _pools_text(kind: str, pools: tuple[str, ...]) -> str:
    if pools == (NO_WHOLE_GPU_POOL,):
        return f"no node offers {kind}: every GPU node is time-sliced (nvidia.com/gpu.shared) or MIG"
    return f"no node offering {kind} is in its pool(s) {', '.join(pools)}"


def _no_kind(nodes: list[NodeState], kind: str, job: Job) -> str:
    if job.mig_profile:
        offered = sorted({p for n in nodes for layout in n.mig_layout if layout for p in layout})
        return (f"no node offers MIG profile {job.mig_profile}"
                + (f" (MIG nodes offer {', '.join(offered)})" if offered else " (no node has MIG GPUs)"))
    return f"no node offers {kind}"


def _selection_text(selection: NodeSelection) -> str:
    """The node selection as a person wrote it (nodeSelector pairs and affinity terms read alike)."""
    def requirement(r: LabelRequirement) -> str:
        if r.operator == "In" and len(r.values) == 1:
            return f"{r.key}={r.values[0]}"
        return f"{r.key} {r.operator} [{', '.join(r.values)}]" if r.values else f"{r.key} {r.operator}"

    terms = " OR ".join(", ".join(requirement(r) for r in term) for term in selection)
    return f"its nodeSelector / required node affinity ({terms})"


def _taint_text(snapshot: ClusterSnapshot, nodes: list[NodeState], w: Workload) -> str:
    blocking: dict[str, int] = {}
    for node in nodes:
        for taint in snapshot.taints.get(node.name, ()):
            if taint_blocks(taint, w.tolerations):
                blocking[taint] = blocking.get(taint, 0) + 1
                break
    listed = ", ".join(f"{taint} on {count} node(s)" for taint, count in sorted(blocking.items()))
    return f"every node it may use carries a taint it does not tolerate: {listed}"


def _too_large(nodes: list[NodeState], job: Job, kind: str) -> str | None:
    if job.cpu_milli and job.cpu_milli > max(n.cpu_capacity for n in nodes):
        return (f"asks for {job.cpu_milli / 1000:g} CPU per pod; the largest node it may use has "
                f"{max(n.cpu_capacity for n in nodes) / 1000:g} allocatable")
    if job.mem_bytes and job.mem_bytes > max(n.mem_capacity for n in nodes):
        return (f"asks for {job.mem_bytes / 2**30:.1f} GiB of memory per pod; the largest node it may use has "
                f"{max(n.mem_capacity for n in nodes) / 2**30:.1f} GiB allocatable")
    if job.mig_profile:
        instances = sum(layout.count(job.mig_profile) for n in nodes for layout in n.mig_layout if layout)
        if job.pods > instances:
            return (f"gang of {job.pods} pods x {job.mig_profile}; the nodes it may use have {instances} such "
                    "MIG instances in all")
        return None
    if not job.whole:
        return None
    largest, total = max(n.whole_free() for n in nodes), sum(n.whole_free() for n in nodes)
    if job.gpus_per_pod > largest:
        return (f"asks for {job.gpus_per_pod} whole GPUs per pod; the largest node it may use offers {largest} "
                f"whole GPUs (nvidia.com/gpu allocatable, or GPUs its DRA driver publishes)")
    if job.pods * job.gpus_per_pod > total:
        return (f"gang of {job.pods} pods x {job.gpus_per_pod} GPUs = {job.pods * job.gpus_per_pod} whole GPUs; the "
                f"nodes it may use offer {total} whole GPUs in all")
    return None


def _by_placement(empty: State, nodes: list[NodeState], job: Job, options: PlacementOptions) -> str | None:
    """The production placement on the empty cluster: None when it places the job there."""
    if not job.whole and options.fractions == FractionMode.SHARE:
        return None  # a share or an instance fits wherever one is offered
    placements, reason = find_placement(empty, job, options)
    if placements is not None:
        return None
    if reason.startswith("topology"):
        leaves: dict[str, int] = {}
        for node in nodes:
            leaves[node.leaf_switch] = leaves.get(node.leaf_switch, 0) + node.whole_free() // max(job.gpus_per_pod, 1)
        most = max(leaves.values(), default=0)
        return (f"gang of {job.pods} pods x {job.gpus_per_pod} GPUs fits under no single leaf switch (the most one "
                f"leaf switch holds is {most} such pod(s))")
    return reason

