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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .errors import SchedulingError
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
        return whole_gpus(self.state.arrays.free[node], shape.gpus, shape.milli) if shape.gpus else ()


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
    """One pod shape's cached scores per node, valid while the node's version is ``version``."""

    score: np.ndarray
    best_gpu: np.ndarray
    version: np.ndarray


# A node's score depends only on its kind, its free CPU, memory and GPUs, the pod shape and the target:
# memoised by those (bytes of one row), so identical node states are scored once, in this state and in
# the next one with the same target (replays of the same list). Bounded: one target's memo at a time.
_MEMOS: dict[object, dict[object, dict[bytes, tuple[float, int]]]] = {}


class Fgd(Scorer):
    """FGD (Weng et al., ATC'23) with gpuwarden's CPU term and tie rule; the one FGD scorer.

    ``cpu_weight`` adds, per unit, the growth of the node's CPU/memory starvation: how much the GPU
    share left free exceeds the CPU share and the memory share left free (CPU-starved GPUs are
    stranded GPUs), after the pod minus before it. ``ties``: ``random`` picks uniformly among the
    best-scored nodes (kube-scheduler's selectHost, plain FGD); ``first`` takes the first in node
    order; ``tightest_cpu`` the one the pod leaves with the least CPU share free, then node order,
    so nodes with CPU to spare stay open for the CPU-heavy pods only they can take.
    Scores are cached per (node, pod shape) and recomputed only for nodes changed since.
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

    def _target_for(self, shape: Shape) -> None:
        """The expected shapes: the state's demand, or this pod's own shape when the state knows none."""
        demand = self.state.demand()
        fallback = None if demand else shape
        if self._demand_version != self.state.demand_version or fallback != self._fallback:
            a = self.state.arrays
            wanted = demand or {shape: 1.0}
            self.target = TargetWorkload.from_demand(wanted, a.models)
            key = (tuple(wanted.items()), a.models, self.cpu_weight)
            if key not in _MEMOS:
                _MEMOS.clear()
                _MEMOS[key] = {}
            self.memo = _MEMOS[key]
            self.cache: dict[Shape, _Scores] = {}
            self._demand_version, self._fallback = self.state.demand_version, fallback

    def choose(self, nodes: np.ndarray, shape: Shape) -> Choice:
        a = self.state.arrays
        self._target_for(shape)
        cached = self.cache.get(shape)
        if cached is None:
            n = len(a)
            cached = self.cache[shape] = _Scores(np.zeros(n), np.zeros(n, dtype=np.int16), np.full(n, -1, dtype=np.int64))
        stale = nodes[cached.version[nodes] != a.version[nodes]]
        if len(stale):
            self._score(stale, shape, cached)
        score = cached.score[nodes]
        if self.ties == "random":
            best = np.flatnonzero(score == score.min())
            rng = self.state.rng()
            node = int(nodes[best[rng.integers(len(best))]] if len(best) > 1 else nodes[best[0]])
        elif self.ties == "tightest_cpu":
            best = nodes[score == score.min()]
            cpu_share_left = (a.cpu_free[best] - shape.cpu_milli) / a.cpu_cap[best]
            node = int(best[np.argmin(cpu_share_left)])  # argmin: the first in node order among equals
        else:
            node = int(nodes[np.argmin(score)])
        if shape.gpus == 1 and shape.milli < MILLI:
            return node, (int(cached.best_gpu[node]),)
        return node, self._gpus_on(node, shape)

    def _score(self, nodes: np.ndarray, shape: Shape, cached: _Scores) -> None:
        a = self.state.arrays
        memo = self.memo.setdefault(shape, {})
        rows = np.column_stack([a.kind[nodes], a.cpu_free[nodes], a.mem_free[nodes], a.free[nodes]])
        keys = [row.tobytes() for row in rows]
        missing: dict[bytes, int] = {}
        for key, node in zip(keys, nodes.tolist()):
            if key not in memo and key not in missing:
                missing[key] = node
        if missing:
            rep = np.fromiter(missing.values(), dtype=np.int64, count=len(missing))
            score, best = self._compute(rep, shape)
            for key, value, gpu in zip(missing, score.tolist(), best.tolist()):
                memo[key] = (value, gpu)
        found = [memo[key] for key in keys]
        cached.score[nodes] = [value for value, _ in found]
        cached.best_gpu[nodes] = [gpu for _, gpu in found]
        cached.version[nodes] = a.version[nodes]

    def _compute(self, rep: np.ndarray, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
        """Scores and best GPUs (fractions) of nodes ``rep`` for ``shape``."""
        a, target = self.state.arrays, self.target
        k, milli = shape.gpus, shape.milli
        cpu = a.cpu_free[rep] - shape.cpu_milli
        mem = a.mem_free[rep] - shape.mem_bytes
        free = a.free[rep]
        model = a.model[rep]
        if k == 1 and milli < MILLI:
            width = a.width
            cand = np.repeat(free[:, None, :], width, axis=1)  # (U, G, G): candidate g takes the pod
            idx = np.arange(width)
            cand[:, idx, idx] -= milli
            after = cand.reshape(-1, width)
            after_cpu, after_mem, after_model = np.repeat(cpu, width), np.repeat(mem, width), np.repeat(model, width)
        else:
            after = free.copy()
            if k:
                for row in range(len(rep)):
                    for g in whole_gpus(free[row], k, milli):
                        after[row, g] -= milli
            after_cpu, after_mem, after_model = cpu, mem, model
        # the nodes before and after in one pass (one call's overhead, not two)
        frag = target.fragmentation(np.concatenate([free, after]), np.concatenate([a.cpu_free[rep], after_cpu]),
                                    np.concatenate([a.mem_free[rep], after_mem]), np.concatenate([model, after_model]))
        base, grown = frag[: len(rep)], frag[len(rep):]
        if k == 1 and milli < MILLI:
            scores = np.where(free >= milli, fgd_score(grown.reshape(-1, a.width) - base[:, None]), np.inf)
            best = np.argmin(scores, axis=1)
            score = scores[np.arange(len(rep)), best]
        else:
            best = np.zeros(len(rep), dtype=np.int64)
            score = fgd_score(grown - base)
        if self.cpu_weight:
            gpus = np.maximum(a.gpu_count[rep], 1) * MILLI
            gpu_before = free.sum(axis=1) / gpus
            gpu_after = (free.sum(axis=1) - k * milli) / gpus
            cpu_cap, mem_cap = a.cpu_cap[rep], a.mem_cap[rep]
            starved_before = (np.maximum(gpu_before - a.cpu_free[rep] / cpu_cap, 0)
                              + np.maximum(gpu_before - a.mem_free[rep] / mem_cap, 0))
            starved_after = np.maximum(gpu_after - cpu / cpu_cap, 0) + np.maximum(gpu_after - mem / mem_cap, 0)
            score = score + self.cpu_weight * (starved_after - starved_before)
        return score, best


SCORERS = ("fgd", "bestfit", "firstfit", "random")


def make_scorer(state: State, name: str, cpu_weight: float = 0.0, ties: str = "random") -> Scorer:
    if name == "fgd":
        return Fgd(state, cpu_weight, ties)
    for cls in (BestFit, FirstFit, RandomFit):
        if cls.name == name:
            return cls(state)
    raise SchedulingError(f"placement scorer {name!r} is not one of: {', '.join(SCORERS)}")
