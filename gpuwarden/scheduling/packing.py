"""The fragmentation measure (FGD) and its score: what the engine's ``fgd`` placement scorer
(``scorers.Fgd``, the one FGD scorer) ranks candidate nodes by, and what the openb replay reports.

Fragmentation (our implementation of the FGD idea, Weng et al., USENIX ATC'23): for a *target
workload* ``M`` -- the pod shapes we expect to arrive, with their popularity ``p_m`` -- the
fragmentation of a node is the free GPU capacity that an arriving pod of each shape could not use,
weighted by ``p_m``::

    F_n(M) = sum_m p_m * ( S_n - host_n(m) * U_n(m) )

``S_n`` is the node's free milli-GPU, ``U_n(m)`` the part of it on GPUs with at least the shape's
per-GPU demand free, and ``host_n(m)`` is 1 when the shape fits on the node at all (GPU model, CPU,
memory, enough GPUs), else 0 -- then every free GPU on the node is stranded for that shape. A
CPU-only shape can use no GPU, so for it every free GPU is a fragment (``host = 0``), as in the
paper's simulator (its XL/XR cases).

A pod goes where ``F`` grows the least, compared the way FGD's kube-scheduler plugin compares it:
the node score is the integer ``floor(100 * sigmoid(-dF / 1000))`` (``dF`` in milli-GPU), so
growths within one score step tie; a shared-GPU pod takes the lowest-index GPU with the best
score. Without this step (ranking by the exact ``dF``) FGD loses ~0.9 pt on the default openb list:
the step lets near-equal growths tie and the tie-break then packs.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .mig import MODEL_ALIASES
from .state import MILLI, Shape

SCORE_SCALE = 1000.0  # milli-GPU of fragmentation growth per unit of the sigmoid's argument (FGD's plugin)


def fgd_score(delta: float) -> float:
    """FGD's integer node score for a fragmentation growth ``delta`` (milli-GPU), as a cost: lower is better."""
    exponent = delta / SCORE_SCALE
    return -0.0 if exponent > 700 else -float(math.floor(100.0 / (1.0 + math.exp(exponent))))  # exp(>709) overflows


@dataclass(frozen=True)
class TargetWorkload:
    """The shapes expected to arrive and their popularity: what fragmentation is measured against.

    ``F`` is computed as ``total - sum_m c_m * host * usable / sum_m c_m`` with the raw popularity
    counts ``c_m``: with whole counts (pods per shape) the sum is exact in any order, so a node state
    has one ``F`` however it is reached, and a growth of exactly 0 scores exactly 50 (a float sum in
    BLAS order gave +-1 ulp there, depending on the batch a node was scored in).
    """

    need: np.ndarray  # (T,) per-GPU milli needed (0 for CPU-only)
    count: np.ndarray  # (T,) GPUs needed
    cpu: np.ndarray
    mem: np.ndarray
    model_ok: np.ndarray  # (models, T) bool
    popularity: np.ndarray  # (T,) float, pods per shape (any scale)
    _need_levels: list[int] = field(init=False, repr=False, compare=False)  # (D,) distinct per-GPU needs
    _gpu_shape: np.ndarray = field(init=False, repr=False, compare=False)  # (T,) asks for a GPU
    _need_index: np.ndarray = field(init=False, repr=False, compare=False)  # (T,) index into _need_levels
    _cpu_levels: list[int] = field(init=False, repr=False, compare=False)  # distinct CPU asks, ascending
    _mem_levels: list[int] = field(init=False, repr=False, compare=False)
    _cpu_rank: np.ndarray = field(init=False, repr=False, compare=False)  # (T,) index of each ask in the levels
    _mem_rank: np.ndarray = field(init=False, repr=False, compare=False)
    _mass: float = field(init=False, repr=False, compare=False)  # popularity in all (1 when none)
    _most_gpus: int = field(init=False, repr=False, compare=False)  # the most GPUs a shape asks for
    # the GPU shapes' CPU and memory ranks, models, cell in W (row: need level + 1, column: GPUs) and popularity
    _gpu_shapes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] = field(
        init=False, repr=False, compare=False)
    # memos: F per node state; per host key its weights by need level and GPUs (see _weights); per free
    # GPUs the groups of needs that find the same GPUs (see _groups)
    _frag: dict[tuple[int, ...], dict[tuple[int, int, int], float]] = field(init=False, repr=False, compare=False)
    _host_weights: dict[tuple[int, int, int], list[list[float]]] = field(init=False, repr=False, compare=False)
    _free_groups: dict[tuple[int, ...], list[tuple[int, int, int, int]]] = field(init=False, repr=False, compare=False)

    @classmethod
    def shared(cls, demand: Mapping[Shape, float], models: Sequence[str]) -> TargetWorkload:
        """``from_demand``, kept for the next caller with the same demand and models (the FGD scorer and a
        replay's fragmentation summary, seed after seed), so they share its memos. Bounded: the last one."""
        key = (tuple(demand.items()), tuple(models))
        found = _SHARED.get(key)
        if found is None:
            _SHARED.clear()
            found = _SHARED[key] = cls.from_demand(demand, models)
        return found

    @classmethod
    def from_demand(cls, demand: Mapping[Shape, float], models: Sequence[str]) -> TargetWorkload:
        """The target for a fleet whose GPU models are ``models`` (the arrays' model index)."""
        shapes = list(demand)
        model_ok = np.ones((len(models), len(shapes)), dtype=bool)
        for t, shape in enumerate(shapes):
            if shape.models:
                allowed = set(shape.models) | {MODEL_ALIASES.get(m, m) for m in shape.models}
                model_ok[:, t] = [m in allowed for m in models]
        return cls(need=np.array([s.milli if s.gpus > 0 else 0 for s in shapes], dtype=np.int64),
                   count=np.array([s.gpus for s in shapes], dtype=np.int64),
                   cpu=np.array([s.cpu_milli for s in shapes], dtype=np.int64),
                   mem=np.array([s.mem_bytes for s in shapes], dtype=np.int64), model_ok=model_ok,
                   popularity=np.array([demand[s] for s in shapes], dtype=float))

    def __post_init__(self) -> None:
        # shapes share few per-GPU needs (22 among the default list's 151): usable GPUs are counted
        # per distinct need, then spread to the shapes
        needs, index = np.unique(self.need, return_inverse=True)
        cpu_levels, cpu_rank = np.unique(self.cpu, return_inverse=True)
        mem_levels, mem_rank = np.unique(self.mem, return_inverse=True)
        for name, value in (("_need_levels", needs.tolist()), ("_need_index", index.reshape(-1)),
                            ("_gpu_shape", self.count > 0),
                            ("_cpu_levels", cpu_levels.tolist()), ("_cpu_rank", cpu_rank.reshape(-1)),
                            ("_mem_levels", mem_levels.tolist()), ("_mem_rank", mem_rank.reshape(-1)),
                            ("_mass", float(self.popularity.sum()) or 1.0),
                            ("_most_gpus", int(self.count.max(initial=0))), ("_frag", {}),
                            ("_host_weights", {}), ("_free_groups", {})):
            object.__setattr__(self, name, value)
        gpu = self._gpu_shape
        cells = (self._need_index[gpu] + 1) * (self._most_gpus + 1) + self.count[gpu]
        object.__setattr__(self, "_gpu_shapes", (self._cpu_rank[gpu], self._mem_rank[gpu], self.model_ok[:, gpu],
                                                 cells, self.popularity[gpu]))

    def node_fragmentation(self, model: int, cpu: int, mem: int, free: Sequence[int]) -> float:
        """``F`` of one node state (model index, CPU and memory free, milli free per GPU), in milli-GPU."""
        return self.fragmentation_at(self.host_key(model, cpu, mem), tuple(sorted(free)))

    def host_key(self, model: int, cpu: int, mem: int) -> tuple[int, int, int]:
        """What of a node's model, CPU and memory free ``F`` depends on: the model and how many of the
        shapes' distinct CPU and memory asks they meet."""
        return model, bisect_right(self._cpu_levels, cpu), bisect_right(self._mem_levels, mem)

    def fragmentation_at(self, host: tuple[int, int, int], free: tuple[int, ...]) -> float:
        """``F`` of a node with ``host_key`` ``host`` and ``free`` milli free per GPU, ascending. Memoised:
        ``F`` depends on the free GPUs only as a multiset, so the node states a replay meets share a few
        thousand values.

        ``sum_m c_m * host * usable`` is summed by groups of shapes rather than shape by shape: the GPUs
        with at least a shape's per-GPU need free (``g`` of them, ``milli`` in all) serve it when it asks
        for at most ``g`` GPUs, and needs between two neighbouring free values of ``free`` find the same
        GPUs. So the sum is ``sum_groups milli * (W[hi][g] - W[lo][g])``, ``W[d][g]`` being the hosted
        popularity of the GPU shapes of the ``d`` smallest needs asking for at most ``g`` GPUs
        (``_weights``), over at most one group per distinct free value (``_groups``). Every term is a
        whole number with whole counts, so it is the same exact sum."""
        by_host = self._frag.get(free)
        if by_host is None:
            by_host = self._frag[free] = {}
        value = by_host.get(host)
        if value is None:
            weights = self._weights(host)
            used = 0.0
            for lo, hi, gpus, milli in self._groups(free):
                used += milli * (weights[hi][gpus] - weights[lo][gpus])
            value = by_host[host] = sum(free) - used / self._mass
        return value

    def fragmentation(self, free: np.ndarray, cpu: np.ndarray, mem: np.ndarray, model: np.ndarray) -> np.ndarray:
        """``F`` for a batch of node states: free (B, G), cpu (B,), mem (B,), model (B,) -> (B,) milli-GPU."""
        rows = zip(model.tolist(), cpu.tolist(), mem.tolist(), free.tolist())
        return np.array([self.node_fragmentation(*row) for row in rows], dtype=float)

    def _weights(self, host: tuple[int, int, int]) -> list[list[float]]:
        """``W[d][g]``: the popularity of the GPU shapes among the ``d`` smallest per-GPU needs asking for at
        most ``g`` GPUs (up to the most any shape asks) that a node with host key ``host`` could host
        (model, CPU and memory as ranks among the asks)."""
        value = self._host_weights.get(host)
        if value is None:
            model, cpu_rank, mem_rank = host
            cpu_ranks, mem_ranks, model_ok, cells, popularity = self._gpu_shapes
            hosted = (cpu_ranks < cpu_rank) & (mem_ranks < mem_rank) & model_ok[model]
            weights = np.bincount(cells[hosted], weights=popularity[hosted], minlength=(len(self._need_levels) + 1) * (self._most_gpus + 1))
            value = self._host_weights[host] = weights.reshape(-1, self._most_gpus + 1).cumsum(axis=1).cumsum(axis=0).tolist()
        return value

    def _groups(self, free: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
        """The needs that find the same GPUs on a node with ``free`` milli free per GPU (ascending), as
        (lo, hi, g, milli): needs ``lo`` to ``hi - 1`` (in ascending order) find the ``g`` GPUs (at most the
        most a shape asks) with ``milli`` free in all; only groups with milli free. CPU-only shapes use no
        GPU: for them every free GPU is a fragment (they weigh nothing in ``W``)."""
        value = self._free_groups.get(free)
        if value is None:
            value, needs, total, used, lo = [], self._need_levels, sum(free), 0, 0
            for start, left in enumerate(free):
                if start and left == free[start - 1]:
                    used += left
                    continue
                hi = bisect_right(needs, left)  # needs up to this GPU's free find it and every GPU after it
                if hi > lo and total > used:
                    value.append((lo, hi, min(len(free) - start, self._most_gpus), total - used))
                lo, used = max(lo, hi), used + left
            self._free_groups[free] = value
        return value


_SHARED: dict[object, TargetWorkload] = {}


def whole_gpus(free_row: Sequence[int], k: int, milli: int) -> tuple[int, ...]:
    """The first ``k`` GPUs of a node with ``milli`` free, tightest first (keeps untouched GPUs whole)."""
    if milli >= MILLI:  # only untouched GPUs have it: the first k in index order
        if k == 1:
            return (free_row.index(MILLI),) if MILLI in free_row else ()
        return tuple([g for g, free in enumerate(free_row) if free >= milli][:k])
    return tuple(sorted((g for g, free in enumerate(free_row) if free >= milli), key=free_row.__getitem__)[:k])
