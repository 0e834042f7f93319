"""Placement: where all pods of a job fit on a ``State``, or why they do not.

A one-pod request (whole GPUs, a fraction, or CPU only) goes where the policy's scorer puts it
(``scorers``: ``fgd`` for the shipped policy, ``bestfit``, ``firstfit``, ``random``) among the nodes
it fits on. Gangs (several pods) go under one leaf switch and into as few NVLink domains as possible
(topology decides there, not a scorer); with ``gang`` off (``kube-default``) each pod of a whole-GPU
job goes where the scorer puts it, in turn, as kube-scheduler places pods. On fleets that cannot share a GPU a fraction takes the
smallest free MIG instance that holds it, else a whole GPU. MIG requests take a free instance of
their profile on the fullest MIG GPU; with the ``fgd`` scorer its tie rule then orders equal GPUs
(FGD's GPU term and the CPU-starvation term do not apply to MIG: a MIG GPU has no shareable
milli-GPU free, so neither term changes whichever instance is taken).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from collections.abc import Callable

import numpy as np

from gpuwarden.fleet import PriceTier, WorkloadKind

from . import mig
from .scorers import SCORERS, TIE_RULES, Scorer, make_scorer
from .errors import SchedulingError
from .nodearrays import NO_PRIORITY
from .state import MILLI, Job, NodeState, Shape, Slot, State

Placement = tuple[list[Slot] | None, str]


class FractionMode(StrEnum):
    """How a fractional request (``milli`` < 1000) is served."""

    SHARE = "share"  # several fractions share one GPU (time-slicing / a sharing device plugin)
    MIG_OR_WHOLE = "mig-or-whole"  # the smallest free MIG instance that holds it, else a whole GPU


def _spot_ok(job: Job) -> bool:
    """Whether ``job`` may run on spot capacity: checkpointable work that is not inference."""
    return job.kind != WorkloadKind.INFERENCE and job.checkpointable


def _tier_ok(job: Job, node: NodeState) -> bool:
    return node.tier != PriceTier.SPOT or _spot_ok(job)


def allowed_key(job: Job) -> tuple[object, ...]:
    """What :func:`node_allowed` reads of a job: jobs with equal keys may use the same nodes (the key of
    every cache of allowed nodes, and part of every cache of a placement's answer)."""
    return job.gpu_model, job.gpu_models, job.pools, job.avoid_nodes, _spot_ok(job)


def node_allowed(job: Job, node: NodeState) -> bool:
    """Whether ``job`` may ever run on ``node`` (schedulable, GPU model, price tier, pool), free room aside."""
    return (
        node.schedulable
        and (not job.pools or node.pool in job.pools) and node.name not in job.avoid_nodes
        and _model_ok(job, node)
        and _tier_ok(job, node)
    )


def _model_ok(job: Job, node: NodeState) -> bool:
    models = job.gpu_models or ((job.gpu_model,) if job.gpu_model else ())
    return not models or any(node.model == m or mig.MODEL_ALIASES.get(m) == node.model for m in models)


def _node_ok(job: Job, node: NodeState) -> bool:
    return node_allowed(job, node) and node.cpu_free >= job.cpu_milli and node.mem_free >= job.mem_bytes


@dataclass(frozen=True)
class PlacementOptions:
    """How a policy places. ``scorer`` (one of ``scorers.SCORERS``) picks the node for a one-pod request;
    ``cpu_weight`` and ``ties`` configure the ``fgd`` scorer; gangs pack tightly unless ``firstfit``."""

    topology: bool = True  # NVLink-domain and leaf-switch packing for gangs
    scorer: str = "bestfit"
    cpu_weight: float = 0.0  # fgd: score steps per unit of CPU/memory-starvation growth
    ties: str = "first"  # fgd: among equal scores (scorers.TIE_RULES)
    # a one-pod request avoids nodes running only lower-priority work while another node takes it, so
    # those stay clearable by preemption for a higher-priority arrival (see _keep_clear)
    keep_clear: bool = False
    mig: bool = True  # use MIG instances for MIG requests (else a whole GPU per request)
    fractions: FractionMode = FractionMode.SHARE
    spot_first: bool = True  # jobs allowed on spot (checkpointable training) fill it before other tiers
    # False: no gang (kube-default); each pod of a multi-pod whole-GPU job goes where the scorer puts it,
    # in turn, as kube-scheduler places pods; a replay then schedules such a job's pods as jobs of their
    # own, and the job holds what its placed pods hold while the rest wait (``replay.pods``)
    gang: bool = True

    def __post_init__(self) -> None:
        for name, value, allowed in (("scorer", self.scorer, SCORERS), ("ties", self.ties, TIE_RULES)):
            if value not in allowed:
                raise SchedulingError(f"placement {name} {value!r} is not one of: {', '.join(allowed)}")

    @property
    def best_fit(self) -> bool:
        return self.scorer != "firstfit"


DEFAULT_OPTIONS = PlacementOptions()


def find_placement(state: State, job: Job, options: PlacementOptions = DEFAULT_OPTIONS) -> Placement:
    """All pods of ``job`` or nothing: returns (placements, '') or (None, reason). Nodes it should spare
    (``job.spare_nodes``: work that can go nowhere else needs them) are tried only where no other fits."""
    if job.spare_nodes and not job.spare_nodes <= frozenset(job.avoid_nodes):
        kept = job.avoid_nodes
        job.avoid_nodes = frozenset(kept) | job.spare_nodes
        try:
            placements, reason = _find_placement(state, job, options)
        finally:
            job.avoid_nodes = kept
        if placements is not None:
            return placements, reason
    return _find_placement(state, job, options)


def _find_placement(state: State, job: Job, options: PlacementOptions) -> Placement:
    if job.pods == 1 and not job.mig_profile and (job.milli == MILLI or options.fractions == FractionMode.SHARE):
        return _place_one(state, job, options, job.milli)
    if not options.gang and job.whole:
        return _place_pods(state, job, options)
    nodes = [n for n in state.nodes.values() if _node_ok(job, n)]
    if not nodes:
        return None, _no_node_reason(state, job)
    if job.mig_profile:
        return _place_mig(nodes, job, options)
    if job.milli < MILLI:
        if options.fractions == FractionMode.MIG_OR_WHOLE:
            if job.pods > 1:  # each pod of the gang takes a whole GPU (every pod, or none)
                return _place_whole(nodes, job, options)
            placements, reason = _place_fraction_on_mig(nodes, job)
            return (placements, reason) if placements is not None else _place_one(state, job, options, MILLI)
        return None, "fractional gangs are not supported; submit pods separately"
    return _place_whole(nodes, job, options)


def _scorer(state: State, options: PlacementOptions) -> Scorer:
    key = (options.scorer, options.cpu_weight, options.ties)
    scorer = state.scorers.get(key)
    if scorer is None:
        scorer = state.scorers[key] = make_scorer(state, options.scorer, options.cpu_weight, options.ties)
    assert isinstance(scorer, Scorer)
    return scorer


_SPOT = ("spot",)  # NodeArrays.admitted key of the spot nodes


def _place_one(state: State, job: Job, options: PlacementOptions, milli: int) -> Placement:
    """One pod by the policy's scorer, among the nodes where it fits (``milli`` per GPU: a fraction
    shares a GPU; ``MILLI`` takes whole GPUs). A CPU-only pod's slot is (node, 0, 0): no GPU, the node
    its CPU and memory are booked on."""
    a = state.arrays
    spot_ok = _spot_ok(job)
    allowed = a.admitted(("allowed", *allowed_key(job)), lambda n: node_allowed(job, n))
    k = job.gpus_per_pod
    if allowed.largest_gpus < 0:
        return None, _no_node_reason(state, job)
    if k > allowed.largest_gpus:
        return None, f"asks for {k} GPUs per pod; the largest node has {allowed.largest_gpus}"
    # the usual case: every node allowed, no mask to apply
    nodes = a.fitting(k, milli, job.cpu_milli, job.mem_bytes, None if allowed.everywhere else allowed.mask)
    if options.spot_first and spot_ok:
        on_spot = a.admitted(_SPOT, lambda n: n.tier == PriceTier.SPOT)
        if on_spot.largest_gpus >= 0:  # the fleet has spot nodes
            spot = nodes[on_spot.mask[nodes]]
            nodes = spot if len(spot) else nodes
    if options.keep_clear and len(nodes) > 1 and state.runs_below(job.priority):
        nodes = _keep_clear(a.top_priority, nodes, job.priority)
    if not len(nodes):
        host = (a.cpu_free >= job.cpu_milli) & (a.mem_free >= job.mem_bytes)
        if not allowed.everywhere:
            host &= allowed.mask
        if not host.any():
            return None, "no node has the CPU and memory free"
        if milli < MILLI:
            return None, f"capacity: no GPU has {milli} milli-GPU free"
        return None, f"capacity: needs {k} whole GPUs, {int(a.whole_free[host].sum())} free on allowed nodes"
    shape_key = (k, milli, job.cpu_milli, job.mem_bytes)
    shape = state.shapes.get(shape_key) or state.shapes.setdefault(shape_key, Shape(*shape_key))
    node, gpus = _scorer(state, options).choose(nodes, shape)
    name = a.names[node]
    return ([(name, g, milli) for g in gpus] or [(name, 0, 0)]), ""


def _place_pods(state: State, job: Job, options: PlacementOptions) -> Placement:
    """No gang: each pod of ``job`` in turn where the scorer puts it, the pods before it booked (as
    kube-scheduler binds the pods of a job one by one). A pass starts a job whole, so here all of them
    or none; a replay gives a non-gang job's pods to the scheduler one by one (``replay.pods``)."""
    pod = replace(job, name=f"{job.name}/pod", pods=1)
    placed: list[list[Slot]] = []
    try:
        for _ in range(job.pods):
            slots, reason = _place_one(state, pod, options, MILLI)
            if slots is None:
                return None, reason
            state.occupy(pod, slots)
            placed.append(slots)
    finally:
        for slots in reversed(placed):
            state.release(pod, slots)
    return [slot for slots in placed for slot in slots], ""


def _keep_clear(top_priority: np.ndarray, nodes: np.ndarray, priority: int) -> np.ndarray:
    """``nodes`` less those running only work of a lower priority than ``priority``, when one already
    running work of ``priority`` or higher is among them: a pod on a node of lower-priority work makes
    a node that a higher-priority arrival could clear by preemption one it cannot (a priority order
    preempts only lower priorities), so work of one priority gathers. Empty nodes stay: FGD weighs them."""
    top = top_priority[nodes]
    lower = (top < priority) & (top != NO_PRIORITY)
    return nodes[~lower] if lower.any() and (top >= priority).any() else nodes


def _no_node_reason(state: State, job: Job) -> str:
    allowed = [n for n in state.nodes.values() if (job.gpu_model is None or n.model == job.gpu_model
               or mig.MODEL_ALIASES.get(job.gpu_model) == n.model) and (not job.pools or n.pool in job.pools)]
    if not allowed:
        return f"no node has GPU model {job.gpu_model}" if job.gpu_model else f"no node in pools {', '.join(job.pools)}"
    open_to_it = [n for n in allowed if n.schedulable and n.name not in job.avoid_nodes]
    if not open_to_it:
        return f"the {len(allowed)} node(s) it may use are cordoned (or their taints keep it off)"
    if all(not _tier_ok(job, n) for n in open_to_it):
        return "only spot capacity is open to it, and the job is not checkpointable training"
    whole = max(n.mig_layout.count(None) for n in open_to_it)
    if job.whole and job.gpus_per_pod > whole:
        return f"asks for {job.gpus_per_pod} whole GPUs per pod; the largest node open to it has {whole}"
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


def _place_mig(nodes: list[NodeState], job: Job, options: PlacementOptions) -> Placement:
    profile = job.mig_profile
    assert profile is not None
    tightest_cpu = options.scorer == "fgd" and options.ties == "tightest_cpu"
    placements: list[Slot] = []
    taken: dict[tuple[str, int], list[str]] = {}
    pods_on: dict[str, int] = {}  # pods of this gang placed on each node so far: their CPU and memory too
    for _ in range(job.pods):
        best = None
        for n in nodes:
            table = mig.mig_table(n.model)
            if profile not in table:
                continue
            more = pods_on.get(n.name, 0) + 1
            if n.cpu_free < job.cpu_milli * more or n.mem_free < job.mem_bytes * more:
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
                # fill the fullest GPU first; the fgd scorer's CPU tie rule then keeps CPU-roomy nodes open
                cpu_left = (n.cpu_free - job.cpu_milli) / max(n.cpu_capacity, 1) if tightest_cpu else 0.0
                key = (len(free_slots), cpu_left, n.name, g)
                if best is None or key < best[0]:
                    best = (key, n.name, g)
        if best is None:
            if not any(profile in mig.mig_table(n.model) for n in nodes):
                return None, f"no allowed node offers MIG profile {profile}"
            return None, f"capacity: no free {profile} MIG instance (MIG layouts may need changing)"
        taken.setdefault((best[1], best[2]), []).append(profile)
        pods_on[best[1]] = pods_on.get(best[1], 0) + 1
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
