"""Placement: where all pods of a job fit on a ``State``, or why they do not.

Whole GPUs go best-fit (or first-fit) by node, gangs under one leaf switch and as few NVLink
domains as possible; fractions share a GPU (tightest first) or, on fleets that cannot share a GPU,
take the smallest free MIG instance that holds them, else a whole GPU; MIG requests take a free
instance of their profile on the fullest MIG GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from collections.abc import Callable

from gpuwarden.fleet import PriceTier, WorkloadKind

from . import mig
from .packing import TargetWorkload, fgd_score
from .state import MILLI, Job, NodeState, Slot, State

Placement = tuple[list[Slot] | None, str]


class FractionMode(StrEnum):
    """How a fractional request (``milli`` < 1000) is served."""

    SHARE = "share"  # several fractions share one GPU (time-slicing / a sharing device plugin)
    MIG_OR_WHOLE = "mig-or-whole"  # the smallest free MIG instance that holds it, else a whole GPU


def _tier_ok(job: Job, node: NodeState) -> bool:
    if node.tier == PriceTier.SPOT:
        return job.kind != WorkloadKind.INFERENCE and job.checkpointable
    return True


def node_allowed(job: Job, node: NodeState) -> bool:
    """Whether ``job`` may ever run on ``node`` (schedulable, GPU model, price tier, pool), free room aside."""
    return (
        node.schedulable
        and (not job.pools or node.pool in job.pools) and node.name not in job.avoid_nodes
        and (job.gpu_model is None or node.model == job.gpu_model or mig.MODEL_ALIASES.get(job.gpu_model) == node.model)
        and _tier_ok(job, node)
    )


def _node_ok(job: Job, node: NodeState) -> bool:
    return node_allowed(job, node) and node.cpu_free >= job.cpu_milli and node.mem_free >= job.mem_bytes


@dataclass(frozen=True)
class PlacementOptions:
    topology: bool = True  # NVLink-domain and leaf-switch packing for gangs
    best_fit: bool = True  # pack tightly (else first fit)
    mig: bool = True  # use MIG instances for MIG requests (else a whole GPU per request)
    fractions: FractionMode = FractionMode.SHARE
    spot_first: bool = True  # jobs allowed on spot (checkpointable training) fill it before other tiers
    # Fragmentation-aware placement of fractions (FGD): the pod shapes expected to arrive; a fraction
    # goes where the expected fragmentation grows least (``packing``). None: tightest GPU first.
    fragmentation: TargetWorkload | None = None


DEFAULT_OPTIONS = PlacementOptions()


def find_placement(state: State, job: Job, options: PlacementOptions = DEFAULT_OPTIONS) -> Placement:
    """All pods of ``job`` or nothing: returns (placements, '') or (None, reason)."""
    nodes = [n for n in state.nodes.values() if _node_ok(job, n)]
    if not nodes:
        return None, _no_node_reason(state, job)
    if job.mig_profile:
        return _place_mig(nodes, job, options)
    if job.milli < MILLI:
        if options.fractions == FractionMode.MIG_OR_WHOLE:
            placements, reason = _place_fraction_on_mig(nodes, job)
            return (placements, reason) if placements is not None else _place_whole(nodes, job, options)
        return _place_fraction(nodes, job, options)
    return _place_whole(nodes, job, options)


def _no_node_reason(state: State, job: Job) -> str:
    allowed = [n for n in state.nodes.values() if (job.gpu_model is None or n.model == job.gpu_model
               or mig.MODEL_ALIASES.get(job.gpu_model) == n.model) and (not job.pools or n.pool in job.pools)]
    if not allowed:
        return f"no node has GPU model {job.gpu_model}" if job.gpu_model else f"no node in pools {', '.join(job.pools)}"
    if all(not _tier_ok(job, n) for n in allowed):
        return "only spot capacity, and the job is not checkpointable training"
    if job.gpus_per_pod > max(n.gpu_count for n in allowed):
        return f"asks for {job.gpus_per_pod} GPUs per pod; the largest node has {max(n.gpu_count for n in allowed)}"
    return "no node has the CPU and memory free"


def _place_whole(nodes: list[NodeState], job: Job, options: PlacementOptions) -> Placement:
    need = job.gpus_per_pod
    biggest = max(n.gpu_count for n in nodes)
    if need > biggest:
        return None, f"asks for {need} GPUs per pod; the largest node has {biggest}"
    cap = {n.name: min(n.whole_free() // need if need else job.pods,
                       (n.cpu_free // job.cpu_milli) if job.cpu_milli else job.pods,
                       (n.mem_free // job.mem_bytes) if job.mem_bytes else job.pods) for n in nodes}
    if sum(cap.values()) < job.pods:
        free = sum(n.whole_free() for n in nodes)
        if job.pods > 1 and free >= need * job.pods:
            return None, f"gang: {job.pods} pods x {need} GPUs do not fit together (free GPUs are scattered)"
        return None, f"capacity: needs {need * job.pods} whole GPUs, {free} free on allowed nodes"
    by_node = {n.name: n for n in nodes}

    def tightness(n: NodeState) -> tuple[int, int, str]:
        # spot capacity first for the jobs allowed there (checkpointable training: the cheapest
        # GPUs, and on-demand ones stay free for work that cannot be reclaimed), then best fit
        tier = 0 if options.spot_first and n.tier == PriceTier.SPOT else 1
        left = n.whole_free() - need
        return (tier, left if options.best_fit else 0, n.name if not options.best_fit else "")

    if job.pods == 1 or not options.topology:
        chosen: list[str] = []
        order = sorted((n for n in nodes if cap[n.name] > 0), key=tightness) if options.best_fit else \
            [n for n in nodes if cap[n.name] > 0]
        for n in order:
            take = min(cap[n.name], job.pods - len(chosen))
            chosen += [n.name] * take
            if len(chosen) == job.pods:
                break
    else:
        gang = _gang_by_topology(nodes, cap, job.pods, lambda n: n.whole_free())
        if gang is None:
            return None, f"topology: no leaf switch holds all {job.pods} pods x {need} GPUs"
        chosen = gang
    placements: list[Slot] = []
    used: dict[str, set[int]] = {}
    for name in chosen:
        node = by_node[name]
        taken = used.setdefault(name, set())
        gpus = [g for g, free in enumerate(node.gpu_free)
                if free == MILLI and node.mig_layout[g] is None and g not in taken][:need]
        taken.update(gpus)
        placements += [(name, g, MILLI) for g in gpus]
    return placements, ""


def _gang_by_topology(nodes: list[NodeState], cap: dict[str, int], pods: int,
                     free_of: Callable[[NodeState], int]) -> list[str] | None:
    """Pods of a gang under one leaf switch, packed into as few NVLink domains (and nodes) as possible."""
    leaves: dict[str, list[NodeState]] = {}
    for n in nodes:
        if cap[n.name] > 0:
            leaves.setdefault(n.leaf_switch, []).append(n)
    best = None
    for leaf, members in leaves.items():
        room = sum(cap[n.name] for n in members)
        if room >= pods and (best is None or room < best[0]):
            best = (room, leaf, members)
    if best is None:
        return None
    members = best[2]
    domains: dict[str, list[NodeState]] = {}
    for n in members:
        domains.setdefault(n.nvlink_domain, []).append(n)
    # domains that hold the whole gang, tightest first; else the fullest domains first
    ordered = sorted(domains.values(), key=lambda ms: (sum(cap[n.name] for n in ms) < pods,
                                                       sum(cap[n.name] for n in ms)))
    chosen: list[str] = []
    for members in ordered:
        for n in sorted(members, key=lambda n: -cap[n.name]):
            take = min(cap[n.name], pods - len(chosen))
            chosen += [n.name] * take
            if len(chosen) == pods:
                return chosen
    return None


def _place_fraction(nodes: list[NodeState], job: Job, options: PlacementOptions) -> Placement:
    if options.fragmentation is not None and job.pods == 1:
        return _place_fraction_by_fragmentation(nodes, job, options.fragmentation)
    best = None
    for n in nodes:
        for g, free in enumerate(n.gpu_free):
            if n.mig_layout[g] is not None or free < job.milli:
                continue
            # tightest GPU first; a GPU already shared before an untouched one
            key = (free - job.milli if options.best_fit else 0, free == MILLI, n.name, g)
            if best is None or key < best[0]:
                best = (key, n.name, g)
            if not options.best_fit:
                break
        if best is not None and not options.best_fit:
            break
    if best is None:
        return None, f"capacity: no GPU has {job.milli} milli-GPU free"
    if job.pods > 1:
        return None, "fractional gangs are not supported; submit pods separately"
    return [(best[1], best[2], job.milli)], ""


def _place_mig(nodes: list[NodeState], job: Job, options: PlacementOptions) -> Placement:
    profile = job.mig_profile
    assert profile is not None
    placements: list[Slot] = []
    taken: dict[tuple[str, int], list[str]] = {}
    for _ in range(job.pods):
        best = None
        for n in nodes:
            table = mig.mig_table(n.model)
            if profile not in table:
                continue
            for g, layout in enumerate(n.mig_layout):
                if layout is None:
                    continue
                in_use = n.mig_used[g] + taken.get((n.name, g), [])
                free_slots = list(layout)
                for used in in_use:
                    if used in free_slots:
                        free_slots.remove(used)
                if profile not in free_slots:
                    continue
                key = (len(free_slots), n.name, g)  # fill the fullest GPU first
                if best is None or key < best[0]:
                    best = (key, n.name, g)
        if best is None:
            if not any(profile in mig.mig_table(n.model) for n in nodes):
                return None, f"no allowed node offers MIG profile {profile}"
            return None, f"capacity: no free {profile} MIG instance (MIG layouts may need changing)"
        taken.setdefault((best[1], best[2]), []).append(profile)
        placements.append((best[1], best[2], profile))
    return placements, ""


def _place_fraction_on_mig(nodes: list[NodeState], job: Job) -> Placement:
    """The smallest free MIG instance with at least the fraction's share of compute slices
    (rounded to the GPU's slices), on the fullest MIG GPU."""
    if job.pods > 1:
        return None, "fractional gangs are not supported; submit pods separately"
    best: tuple[tuple[int, int, str, int], str, int, str] | None = None
    for n in nodes:
        table = mig.mig_table(n.model)
        for g, layout in enumerate(n.mig_layout):
            if layout is None:
                continue
            free_slots = list(layout)
            for used in n.mig_used[g]:
                if used in free_slots:
                    free_slots.remove(used)
            for profile in free_slots:
                spec = table.get(profile)
                size = spec.compute_slices if spec else 0
                if size < mig.fraction_slices(job.milli / MILLI, n.model):
                    continue
                key = (size, len(free_slots), n.name, g)
                if best is None or key < best[0]:
                    best = (key, n.name, g, profile)
    if best is None:
        return None, f"capacity: no free MIG instance with {job.milli} milli-GPU of compute"
    return [(best[1], best[2], best[3])], ""


def _place_fraction_by_fragmentation(nodes: list[NodeState], job: Job, target: TargetWorkload) -> Placement:
    """FGD as a scorer of the one engine: every (node, GPU) that holds the fraction is scored by how
    much it grows the node's fragmentation against ``target`` (``packing.fgd_score``, lower is
    better); among equal scores the tightest GPU, then node order. ``target``'s model constraints
    are not applied here (one model column)."""
    width = max((n.gpu_count for n in nodes), default=0)
    rows: list[tuple[NodeState, int]] = [(n, g) for n in nodes for g, free in enumerate(n.gpu_free)
                                         if n.mig_layout[g] is None and free >= job.milli]
    if not rows:
        return None, f"capacity: no GPU has {job.milli} milli-GPU free"
    before = np.zeros((len(nodes), width), dtype=np.int32)
    for i, n in enumerate(nodes):
        before[i, : n.gpu_count] = n.gpu_free
    index = {n.name: i for i, n in enumerate(nodes)}
    cpu = np.array([n.cpu_free for n in nodes], dtype=np.int64)
    mem = np.array([n.mem_free for n in nodes], dtype=np.int64)
    model = np.zeros(len(nodes), dtype=np.int32)
    base = target.fragmentation(before, cpu, mem, model)
    after = np.array([before[index[n.name]] for n, _ in rows])
    at = np.array([index[n.name] for n, _ in rows])
    after[np.arange(len(rows)), [g for _, g in rows]] -= job.milli
    grown = target.fragmentation(after, cpu[at] - job.cpu_milli, mem[at] - job.mem_bytes, model[at]) - base[at]
    score = fgd_score(grown)
    order = min(range(len(rows)), key=lambda k: (float(score[k]), rows[k][0].gpu_free[rows[k][1]], at[k], rows[k][1]))
    node, gpu = rows[order]
    return [(node.name, gpu, job.milli)], ""
