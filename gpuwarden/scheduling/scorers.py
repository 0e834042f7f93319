"""Placement scorers: named plugins that pick the node (and GPUs) for one pod among the feasible ones.

A policy names its scorer in ``PlacementOptions.scorer`` (KAI-Scheduler's named plugins are the
model); ``find_placement`` filters the nodes (model, pool, tier, CPU, memory, GPUs that fit) and
hands the rest to the scorer, which works on the state's ``NodeArrays``:

- ``fgd``: least growth of expected fragmentation (``packing``), scored as FGD's kube-scheduler
  plugin scores it, plus ``cpu_weight`` per unit of CPU/memory-starvation growth; equal scores go
  by the ``ties`` rule. The shipped ``gpuwarden`` policy's scorer.
- ``bestfit``: the node left with the least GPU share plus CPU share free (the FGD paper's BestFit).
- ``firstfit``: the first node in order, its lowest-index GPUs.
- ``random``: a random node and random GPUs that fit (the paper's Random), from the state's seed.

GPUs on the chosen node: a shared-GPU pod takes the GPU its scorer picked (FGD: the lowest-index one
of the best score; otherwise the tightest); whole GPUs go tightest first, keeping untouched GPUs whole.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .errors import SchedulingError
from .nodearrays import NodeKey
from .packing import TargetWorkload, fgd_score, whole_gpus
from .state import MILLI, Shape

if TYPE_CHECKING:
    from .state import State

Choice = tuple[int, tuple[int, ...]]  # node index in the arrays, GPU indices on it
TIE_RULES = ("random", "first", "tightest_cpu")


class Scorer:
    name = "scorer"

    def __init__(self, state: State) -> None:
        self.state = state

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        """The node among ``nodes`` (indices where the pod fits, in node order; never empty) and its GPUs."""
        raise NotImplementedError

    def _gpus_on(self, node: int, shape: Shape) -> tuple[int, ...]:
        return whole_gpus(self.state.arrays.free[node].tolist(), shape.gpus, shape.milli) if shape.gpus else ()


class FirstFit(Scorer):
    name = "firstfit"

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        node = int(nodes[0])
        fits = np.flatnonzero(self.state.arrays.free[node] >= shape.milli)
        return node, tuple(int(g) for g in fits[: shape.gpus])


class BestFit(Scorer):
    name = "bestfit"

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        a = self.state.arrays
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
        fits = np.flatnonzero(self.state.arrays.free[node] >= shape.milli)
        return node, tuple(int(g) for g in rng.choice(fits, size=shape.gpus, replace=False))


@dataclass
class _Scores:
    """One pod shape's scores by node state id (``NodeArrays.state_id``); NaN: not scored yet."""

    score: np.ndarray
    best_gpu: np.ndarray

    def grow(self, states: int) -> None:
        if len(self.score) < states:
            size = max(states, 2 * len(self.score))
            self.score = np.concatenate([self.score, np.full(size - len(self.score), np.nan)])
            self.best_gpu = np.concatenate([self.best_gpu, np.zeros(size - len(self.best_gpu), dtype=np.int16)])


# A node's score depends only on its state (kind, free CPU, memory and GPUs), the pod shape and the
# target: memoised by those, so a state is scored once in this state and in the next one with the same
# target (replays of the same list, whose target keeps its own memo of F). Bounded: one target's memo.
_Facts = tuple[int, tuple[int, ...], float, int, float]  # see Fgd._facts
_MEMOS: dict[object, tuple[TargetWorkload, dict[Shape, dict[NodeKey, tuple[float, int]]], dict[NodeKey, _Facts]]] = {}


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
            key = (tuple(wanted.items()), self.state.arrays.models, kinds, self.cpu_weight)
            if key not in _MEMOS:
                _MEMOS.clear()
                _MEMOS[key] = (TargetWorkload.from_demand(wanted, self.state.arrays.models), {}, {})
            self.target, self.memo, self.facts = _MEMOS[key]
            self.cache: dict[Shape, _Scores] = {}
            self._demand_version, self._fallback = self.state.demand_version, fallback

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        a = self.state.arrays
        self._target_for(shape)
        cached = self.cache.get(shape)
        if cached is None:
            cached = self.cache[shape] = _Scores(np.full(0, np.nan), np.zeros(0, dtype=np.int16))
        cached.grow(len(a.state_keys))
        states = a.state_id[nodes]
        score = cached.score[states]
        low = score.min()
        if math.isnan(low):  # some nodes are in states not scored yet (NaN wins min)
            self._score(set(states[np.isnan(score)].tolist()), shape, cached)
            score = cached.score[states]
            low = score.min()
        if self.ties == "random":
            best = np.flatnonzero(score == low)
            rng = self.state.rng()
            node = int(nodes[best[rng.integers(len(best))]] if len(best) > 1 else nodes[best[0]])
        elif self.ties == "tightest_cpu":
            tied = nodes[score == low]
            if len(tied) == 1:
                node = int(tied[0])
            else:
                cpu_share_left = (a.cpu_free[tied] - shape.cpu_milli) / a.cpu_cap[tied]
                node = int(tied[np.argmin(cpu_share_left)])  # argmin: the first in node order among equals
        else:
            node = int(nodes[np.argmin(score)])
        if shape.gpus == 1 and shape.milli < MILLI:
            return node, (int(cached.best_gpu[a.state_id[node]]),)
        return node, self._gpus_on(node, shape)

    def _score(self, states: set[int], shape: Shape, cached: _Scores) -> None:
        """Score node states never scored for ``shape`` in this state (most were, in an earlier one)."""
        keys = self.state.arrays.state_keys
        memo = self.memo.setdefault(shape, {})
        for state in states:
            key = keys[state]
            value = memo.get(key)
            if value is None:
                value = memo[key] = self._node_score(key, shape)
            cached.score[state], cached.best_gpu[state] = value

    def _facts(self, key: NodeKey) -> _Facts:
        """What scoring a node state for any shape starts from: its model, free GPUs ascending, F, free
        milli in all, and its CPU/memory starvation (see the class)."""
        facts = self.facts.get(key)
        if facts is None:
            kind, cpu, mem, free = key
            model, ordered, total = self._model[kind], tuple(sorted(free)), sum(free)
            share = total / (max(self._gpus[kind], 1) * MILLI)
            starved = _over(share - cpu / self._cpu_cap[kind]) + _over(share - mem / self._mem_cap[kind])
            base = self.target.fragmentation_at(self.target.host_key(model, cpu, mem), ordered)
            facts = self.facts[key] = (model, ordered, base, total, starved)
        return facts

    def _node_score(self, key: NodeKey, shape: Shape) -> tuple[float, int]:
        """The score of a node state (kind, CPU and memory free, milli free per GPU) for ``shape``, and
        the GPU a fraction takes there: the lowest-index one of the best score (0 when none fits)."""
        kind, cpu, mem, free = key
        model, ordered, base, total, starved_before = self._facts(key)
        k, milli = shape.gpus, shape.milli
        cpu_after, mem_after = cpu - shape.cpu_milli, mem - shape.mem_bytes
        after, fragmentation = self.target.host_key(model, cpu_after, mem_after), self.target.fragmentation_at
        score, best = math.inf, 0
        if k == 1 and milli < MILLI:
            tried: dict[int, float] = {}  # GPUs with the same milli free leave the same node state
            for gpu, left in enumerate(free):
                if left < milli:
                    continue
                value = tried.get(left)
                if value is None:
                    taken = list(ordered)
                    taken[ordered.index(left)] = left - milli
                    value = tried[left] = fgd_score(fragmentation(after, tuple(sorted(taken))) - base)
                if value < score:
                    score, best = value, gpu
        else:
            # whole GPUs take the tightest that fit (whole_gpus): on the ascending free, the first k that fit
            taken = list(ordered)
            first = bisect_left(ordered, milli) if k else len(ordered)
            for gpu in range(first, min(first + k, len(ordered))):
                taken[gpu] -= milli
            score = fgd_score(fragmentation(after, tuple(sorted(taken))) - base)
        if self.cpu_weight:
            cpu_cap, mem_cap = self._cpu_cap[kind], self._mem_cap[kind]
            gpu_after = (total - k * milli) / (max(self._gpus[kind], 1) * MILLI)
            starved_after = _over(gpu_after - cpu_after / cpu_cap) + _over(gpu_after - mem_after / mem_cap)
            score = score + self.cpu_weight * (starved_after - starved_before)
        return score, best


def _over(share: float) -> float:
    """How far a share of GPU left free exceeds a share of CPU or memory left free (0 when it does not)."""
    return share if share > 0 else 0.0


SCORERS = ("fgd", "bestfit", "firstfit", "random")


def make_scorer(state: State, name: str, cpu_weight: float = 0.0, ties: str = "random") -> Scorer:
    if name == "fgd":
        return Fgd(state, cpu_weight, ties)
    for cls in (BestFit, FirstFit, RandomFit):
        if cls.name == name:
            return cls(state)
    raise SchedulingError(f"placement scorer {name!r} is not one of: {', '.join(SCORERS)}")
