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
from bisect import bisect_left, bisect_right
from itertools import accumulate
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .mig import MODEL_ALIASES
from .state import Shape

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
    # memos: F per node state, hosted popularity per (model, CPU rank, memory rank), usable milli per free GPUs
    _frag: dict[tuple[tuple[int, int, int], tuple[int, ...]], float] = field(init=False, repr=False, compare=False)
    _hosts: dict[tuple[int, int, int], np.ndarray] = field(init=False, repr=False, compare=False)
    _usables: dict[tuple[int, ...], np.ndarray] = field(init=False, repr=False, compare=False)

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
                            ("_mass", float(self.popularity.sum()) or 1.0), ("_frag", {}), ("_hosts", {}), ("_usables", {})):
            object.__setattr__(self, name, value)

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
        thousand values."""
        key = (host, free)
        value = self._frag.get(key)
        if value is None:
            value = self._frag[key] = sum(free) - float(self._hosted(host) @ self._usable(free)) / self._mass
        return value

    def fragmentation(self, free: np.ndarray, cpu: np.ndarray, mem: np.ndarray, model: np.ndarray) -> np.ndarray:
        """``F`` for a batch of node states: free (B, G), cpu (B,), mem (B,), model (B,) -> (B,) milli-GPU."""
        rows = zip(model.tolist(), cpu.tolist(), mem.tolist(), free.tolist())
        return np.array([self.node_fragmentation(*row) for row in rows], dtype=float)

    def _hosted(self, key: tuple[int, int, int]) -> np.ndarray:
        """(T,) popularity of the shapes a node's model, CPU and memory (as ranks among the asks) could host."""
        value = self._hosts.get(key)
        if value is None:
            model, cpu_rank, mem_rank = key
            host = (self._cpu_rank < cpu_rank) & (self._mem_rank < mem_rank) & self.model_ok[model]
            value = self._hosts[key] = np.where(host, self.popularity, 0.0)
        return value

    def _usable(self, free: tuple[int, ...]) -> np.ndarray:
        """(T,) milli-GPU each shape could use on GPUs with ``free`` milli free, ascending (0 where too few GPUs have
        its need, and for CPU-only shapes: every free GPU is a fragment for them)."""
        value = self._usables.get(free)
        if value is None:
            # per distinct need: the GPUs with at least that much free (a suffix of ``free``) and their milli
            prefix = [0, *accumulate(free)]
            start = [bisect_left(free, need) for need in self._need_levels]
            gpus = np.array([len(free) - i for i in start])[self._need_index]
            milli = np.array([prefix[-1] - prefix[i] for i in start], dtype=float)[self._need_index]
            value = self._usables[free] = np.where((gpus >= self.count) & self._gpu_shape, milli, 0.0)
        return value


def whole_gpus(free_row: Sequence[int], k: int, milli: int) -> tuple[int, ...]:
    """The first ``k`` GPUs of a node with ``milli`` free, tightest first (keeps untouched GPUs whole)."""
    return tuple(sorted((g for g, free in enumerate(free_row) if free >= milli), key=free_row.__getitem__)[:k])
