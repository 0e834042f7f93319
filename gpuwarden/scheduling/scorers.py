"""Placement scorers: named plugins that pick the node (and GPUs) for one pod among the feasible ones.

A policy names its scorer in ``PlacementOptions.scorer`` (KAI-Scheduler's named plugins are the
model), a name in the ``SCORERS`` registry (``parts.Registry``: a new scorer is one ``register``
call); ``find_placement`` filters the nodes (model, pool, tier, CPU, memory, GPUs that fit) and
hands the rest to the scorer, which works on the state's ``NodeArrays``:

- ``fgd``: least growth of expected fragmentation (``packing``), scored as FGD's kube-scheduler
  plugin scores it, plus ``cpu_weight`` per unit of CPU/memory-starvation growth; equal scores go
  by the ``ties`` rule. The shipped ``gpuwarden`` policy's scorer.
- ``bestfit``: the node left with the least GPU share plus CPU share free (the FGD paper's BestFit).
- ``firstfit``: the first node in order, its lowest-index GPUs.
- ``random``: a random node and random GPUs that fit (the paper's Random), from the state's seed.
- ``leastallocated``: kube-scheduler's default spreading (NodeResourcesFit, LeastAllocated): the node
  left with the most CPU, memory and GPUs free, each as a share of what it offers (``kube-default``).

GPUs on the chosen node: a shared-GPU pod takes the GPU its scorer picked (FGD: the lowest-index one
of the best score; otherwise the tightest); whole GPUs go tightest first, keeping untouched GPUs whole.
"""

from __future__ import annotations

import math
import weakref
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .errors import SchedulingError
from .nodearrays import NodeKey
from .parts import Registry
from .packing import TargetWorkload, fgd_score, whole_gpus
from .state import MILLI, Shape

if TYPE_CHECKING:
    from .state import State

Choice = tuple[int, tuple[int, ...]]  # node index in the arrays, GPU indices on it
TIE_RULES = ("random", "first", "tightest_cpu")


class Scorer:
    name = "scorer"

    def __init__(self, state: State, cpu_weight: float = 0.0, ties: str = "random") -> None:
        """``cpu_weight`` and ``ties``: the placement options every scorer is made with; a scorer that
        does not weigh them ignores them."""
        # a proxy: the state keeps its scorers (State.scorers), so a strong reference back would make a
        # cycle that only the garbage collector's full passes could free
        self.state = weakref.proxy(state)
        self.arrays = state.arrays  # built once per state, never replaced

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        """The node among ``nodes`` (indices where the pod fits, in node order; never empty) and its GPUs."""
        raise NotImplementedError

    def _gpus_on(self, node: int, shape: Shape) -> tuple[int, ...]:
        return whole_gpus(self.arrays.nodes[node].gpu_free, shape.gpus, shape.milli) if shape.gpus else ()


class FirstFit(Scorer):
    name = "firstfit"

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        node = int(nodes[0])
        fits = np.flatnonzero(self.arrays.free[node] >= shape.milli)
        return node, tuple(int(g) for g in fits[: shape.gpus])


class BestFit(Scorer):
    name = "bestfit"

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        a = self.arrays
        gpu_left = (a.free[nodes].sum(axis=1) - shape.gpus * shape.milli) / (np.maximum(a.gpu_count[nodes], 1) * MILLI)
        cpu_left = (a.cpu_free[nodes] - shape.cpu_milli) / a.cpu_cap[nodes]
        node = int(nodes[np.argmin(gpu_left + cpu_left)])
        return node, self._gpus_on(node, shape)


class RandomFit(Scorer):
    name = "random"

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        rng = self.state.rng()
        node = int(rng.choice(nodes))
        if shape.gpus == 0:
            return node, ()
        fits = np.flatnonzero(self.arrays.free[node] >= shape.milli)
        return node, tuple(int(g) for g in rng.choice(fits, size=shape.gpus, replace=False))


class LeastAllocated(Scorer):
    """kube-scheduler's NodeResourcesFit score with its default LeastAllocated strategy, on CPU, memory and
    GPUs (``nvidia.com/gpu`` added to its resources, weight 1 each): per resource ``(free - asked) * 100 //
    allocatable`` in integers (milli-CPU, bytes, milli-GPU), as kube-scheduler computes it; the node's score
    is their mean rounded down (a node without GPUs is scored on CPU and memory only). The highest score
    wins; equal scores go to the first node in node order (the rule of ``tests/fake_kube_scheduler.py``;
    kube-scheduler picks one of them at random). Not modelled: the 100m CPU / 200 MB a pod asking none
    counts as when scored, and the other default score plugins (BalancedAllocation, ImageLocality, ...)."""

    name = "leastallocated"

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        a = self.arrays
        cpu = (a.cpu_free[nodes] - shape.cpu_milli) * 100 // a.cpu_cap[nodes]
        mem = (a.mem_free[nodes] - shape.mem_bytes) * 100 // a.mem_cap[nodes]
        gpus = a.gpu_count[nodes].astype(np.int64)
        has_gpus = gpus > 0
        gpu_free = a.free[nodes].sum(axis=1, dtype=np.int64) - shape.gpus * shape.milli
        gpu = np.where(has_gpus, gpu_free * 100 // np.maximum(gpus * MILLI, 1), 0)
        score = (cpu + mem + gpu) // np.where(has_gpus, 3, 2)
        node = int(nodes[int(score.argmax())])  # argmax: the first in node order among equals
        return node, self._gpus_on(node, shape)


@dataclass
class _Scores:
    """One pod shape's scores by node state id (``NodeArrays.state_id``; NaN: not scored yet) and the GPU
    a fraction takes in each."""

    score: np.ndarray
    best_gpu: np.ndarray

    def grow(self, states: int) -> None:
        size = max(states, 2 * len(self.score))
        extra = size - len(self.score)
        self.score = np.concatenate([self.score, np.full(extra, np.nan)])
        self.best_gpu = np.concatenate([self.best_gpu, np.zeros(extra, dtype=np.int16)])


_Facts = tuple[int, tuple[int, ...], float, int, float]  # see Fgd._facts
_Figures = tuple[float, int]  # score, the GPU a fraction takes: see _Scores


@dataclass
class _Memo:
    """What scoring remembers for one target and fleet of node kinds, from one ``State`` to the next with
    them (the seeds of a replayed list): a node's score depends only on its state (kind, free CPU, memory
    and GPUs), the pod shape and the target. Node states are numbered here once (``ids``), so the memos
    are keyed by small numbers instead of hashing a state's numbers on every lookup."""

    target: TargetWorkload
    ids: dict[NodeKey, int] = field(default_factory=dict)
    facts: dict[int, _Facts] = field(default_factory=dict)  # by id
    # by a shape's numbers (each state has its own Shape objects: a tuple compares without a Python call), then id
    figures: dict[tuple[int, int, int, int, tuple[str, ...]], dict[int, _Figures]] = field(default_factory=dict)

    def id_of(self, key: NodeKey) -> int:
        return self.ids.setdefault(key, len(self.ids))


_MEMOS: dict[object, _Memo] = {}  # bounded: one target's


class Fgd(Scorer):
    """FGD (Weng et al., ATC'23) with gpuwarden's CPU term and tie rule; the one FGD scorer.

    ``cpu_weight`` adds, per unit, the growth of the node's CPU/memory starvation: how much the GPU
    share left free exceeds the CPU share and the memory share left free (CPU-starved GPUs are
    stranded GPUs), after the pod minus before it. ``ties``: ``random`` picks uniformly among the
    best-scored nodes (kube-scheduler's selectHost, plain FGD); ``first`` takes the first in node
    order; ``tightest_cpu`` the one the pod leaves with the least CPU share free, then node order,
    so nodes with CPU to spare stay open for the CPU-heavy pods only they can take.
    Scores are kept per (node state, pod shape): a node is scored only in a state not scored before.
    """

    name = "fgd"

    def __init__(self, state: State, cpu_weight: float = 0.0, ties: str = "random") -> None:
        if ties not in TIE_RULES:
            raise SchedulingError(f"placement ties {ties!r} is not one of: {', '.join(TIE_RULES)}")
        super().__init__(state)
        self.cpu_weight = cpu_weight
        self.ties = ties
        self._demand_version = -1
        self._fallback: Shape | None = None
        # what a node's kind fixes (model, GPUs, CPU and memory capacity), by kind, for scoring node states
        a = state.arrays
        first = np.unique(a.kind, return_index=True)[1]
        self._model, self._gpus = a.model[first].tolist(), a.gpu_count[first].tolist()
        self._cpu_cap, self._mem_cap = a.cpu_cap[first].tolist(), a.mem_cap[first].tolist()

    def _target_for(self, shape: Shape) -> None:
        """The expected shapes: the state's demand, or this pod's own shape when the state knows none."""
        demand = self.state.demand()
        fallback = None if demand else shape
        if self._demand_version != self.state.demand_version or fallback != self._fallback:
            wanted = demand or {shape: 1.0}
            # node kinds are numbered per state: the memo holds for states whose kinds are the same
            kinds = tuple(zip(self._model, self._gpus, self._cpu_cap, self._mem_cap))
            key = (tuple(wanted.items()), self.arrays.models, kinds, self.cpu_weight)
            if key not in _MEMOS:
                _MEMOS.clear()
                _MEMOS[key] = _Memo(TargetWorkload.shared(wanted, self.arrays.models))
            self.memo = _MEMOS[key]
            self.target = self.memo.target
            self.cache: dict[Shape, _Scores] = {}
            self._ids: list[int] = []  # the memo's id of each of the arrays' state ids met so far
            self._demand_version, self._fallback = self.state.demand_version, fallback

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        a = self.arrays
        if self._demand_version != self.state.demand_version or self._fallback is not None:
            self._target_for(shape)
        cached = self.cache.get(shape)
        if cached is None:
            size = 2 * len(a.state_keys)  # room to grow before the first copy
            cached = self.cache[shape] = _Scores(np.full(size, np.nan), np.zeros(size, dtype=np.int16))
        if len(cached.score) < len(a.state_keys):
            cached.grow(len(a.state_keys))
        states = a.state_id[nodes]
        score = cached.score[states]
        low = score[score.argmin()]  # argmin: faster than min, and it stops at a NaN too
        if low != low:  # NaN: some nodes are in states not scored yet
            unscored = np.isnan(score).nonzero()[0]
            new = states[unscored]
            self._score(set(new.tolist()), shape, cached)
            score[unscored] = cached.score[new]
            low = score[score.argmin()]
        if self.ties == "first":
            at = int(score.argmin())
        else:
            best = (score == low).nonzero()[0]
            if len(best) == 1:
                at = int(best[0])
            elif self.ties == "random":
                at = int(best[self.state.rng().integers(len(best))])
            else:  # tightest_cpu: the least CPU share left; argmin: the first in node order among equals
                tied = nodes[best]
                left = a.cpu_free[tied]
                left -= shape.cpu_milli
                at = int(best[(left / a.cpu_cap[tied]).argmin()])
        node = int(nodes[at])
        if shape.gpus == 1 and shape.milli < MILLI:
            return node, (int(cached.best_gpu[states[at]]),)
        return node, self._gpus_on(node, shape)

    def _score(self, states: set[int], shape: Shape, cached: _Scores) -> None:
        """Score node states never scored for ``shape`` in this state (most were, in an earlier one)."""
        keys, ids = self.arrays.state_keys, self._ids
        for state in range(len(ids), len(keys)):
            ids.append(self.memo.id_of(keys[state]))
        numbers = (shape.gpus, shape.milli, shape.cpu_milli, shape.mem_bytes, shape.models)
        memo = self.memo.figures.get(numbers)
        if memo is None:
            memo = self.memo.figures[numbers] = {}
        score, best_gpu = cached.score, cached.best_gpu
        for state in states:
            known = ids[state]
            value = memo.get(known)
            if value is None:
                value = memo[known] = self._node_score(known, keys[state], numbers)
            score[state], best_gpu[state] = value

    def _facts(self, known: int, key: NodeKey) -> _Facts:
        """What scoring a node state (memo id ``known``) for any shape starts from: its model, free GPUs
        ascending, F, free milli in all, and its CPU/memory starvation (see the class)."""
        kind, cpu, mem, free = key
        model, ordered, total = self._model[kind], tuple(sorted(free)), sum(free)
        share = total / (max(self._gpus[kind], 1) * MILLI)
        starved = _over(share - cpu / self._cpu_cap[kind]) + _over(share - mem / self._mem_cap[kind])
        base = self.target.fragmentation_at(self.target.host_key(model, cpu, mem), ordered)
        facts = self.memo.facts[known] = (model, ordered, base, total, starved)
        return facts

    def _node_score(self, known: int, key: NodeKey, shape: tuple[int, int, int, int, tuple[str, ...]]) -> _Figures:
        """The score of a node state (kind, CPU and memory free, milli free per GPU) for a pod of ``shape``
        (GPUs, milli, CPU, memory, models) and the GPU a fraction takes there: the lowest-index one of the
        best score (0 when none fits)."""
        kind, cpu, mem, free = key
        model, ordered, base, total, starved_before = self.memo.facts.get(known) or self._facts(known, key)
        k, milli, cpu_ask, mem_ask, _ = shape
        cpu_after, mem_after = cpu - cpu_ask, mem - mem_ask
        target = self.target
        after, fragmentation = target.host_key(model, cpu_after, mem_after), target.fragmentation_at
        if k == 1 and milli < MILLI:
            score, best = math.inf, 0
            tried: dict[int, float] = {}  # GPUs with the same milli free leave the same node state
            for gpu, left in enumerate(free):
                if left < milli:
                    continue
                value = tried.get(left)
                if value is None:
                    taken = list(ordered)
                    taken[ordered.index(left)] = left - milli
                    taken.sort()
                    value = tried[left] = fgd_score(fragmentation(after, tuple(taken)) - base)
                if value < score:
                    score, best = value, gpu
        else:
            # whole GPUs take the tightest that fit (whole_gpus): on the ascending free, the first k that fit
            best = 0
            if k:
                taken = list(ordered)
                first = bisect_left(ordered, milli)
                for gpu in range(first, min(first + k, len(ordered))):
                    taken[gpu] -= milli
                taken.sort()
                ordered = tuple(taken)
            score = fgd_score(fragmentation(after, ordered) - base)
        if self.cpu_weight:
            gpu_after = (total - k * milli) / (max(self._gpus[kind], 1) * MILLI)
            starved_after = _over(gpu_after - cpu_after / self._cpu_cap[kind]) + _over(gpu_after - mem_after / self._mem_cap[kind])
            score = score + self.cpu_weight * (starved_after - starved_before)
        return score, best


def _over(share: float) -> float:
    """How far a share of GPU left free exceeds a share of CPU or memory left free (0 when it does not)."""
    return share if share > 0 else 0.0


SCORERS: Registry[type[Scorer]] = Registry("placement scorer", "scorer")
for _scorer in (Fgd, BestFit, FirstFit, RandomFit, LeastAllocated):
    SCORERS.register(_scorer.name, _scorer)


def make_scorer(state: State, name: str, cpu_weight: float = 0.0, ties: str = "random") -> Scorer:
    return SCORERS[name](state, cpu_weight, ties)
