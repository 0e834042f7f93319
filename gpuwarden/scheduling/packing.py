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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .mig import MODEL_ALIASES
from .state import Shape

SCORE_SCALE = 1000.0  # milli-GPU of fragmentation growth per unit of the sigmoid's argument (FGD's plugin)


def fgd_score(delta: np.ndarray) -> np.ndarray:
    """FGD's integer node score for a fragmentation growth ``delta`` (milli-GPU), as a cost: lower is better."""
    with np.errstate(over="ignore"):
        return -np.floor(100.0 / (1.0 + np.exp(delta / SCORE_SCALE)))


@dataclass(frozen=True)
class TargetWorkload:
    """The shapes expected to arrive and their popularity (sums to 1): what fragmentation is measured against."""

    need: np.ndarray  # (T,) per-GPU milli needed (0 for CPU-only)
    count: np.ndarray  # (T,) GPUs needed
    cpu: np.ndarray
    mem: np.ndarray
    model_ok: np.ndarray  # (models, T) bool
    weight: np.ndarray  # (T,) float, sums to 1
    _needs: np.ndarray = field(init=False, repr=False, compare=False)  # (D,) distinct per-GPU needs
    _need_index: np.ndarray = field(init=False, repr=False, compare=False)  # (T,) index into _needs
    _gpu_shape: np.ndarray = field(init=False, repr=False, compare=False)  # (T,) asks for a GPU

    @classmethod
    def from_demand(cls, demand: Mapping[Shape, float], models: Sequence[str]) -> TargetWorkload:
        """The target for a fleet whose GPU models are ``models`` (the arrays' model index)."""
        shapes = list(demand)
        weight = np.array([demand[s] for s in shapes], dtype=float)
        weight = weight / weight.sum() if weight.sum() > 0 else weight
        model_ok = np.ones((len(models), len(shapes)), dtype=bool)
        for t, shape in enumerate(shapes):
            if shape.models:
                allowed = set(shape.models) | {MODEL_ALIASES.get(m, m) for m in shape.models}
                model_ok[:, t] = [m in allowed for m in models]
        return cls(need=np.array([s.milli if s.gpus > 0 else 0 for s in shapes], dtype=np.int32),
                   count=np.array([s.gpus for s in shapes], dtype=np.int32),
                   cpu=np.array([s.cpu_milli for s in shapes], dtype=np.int64),
                   mem=np.array([s.mem_bytes for s in shapes], dtype=np.int64), model_ok=model_ok, weight=weight)

    def __post_init__(self) -> None:
        # shapes share few per-GPU needs (22 among the default list's 151): usable GPUs are counted
        # per distinct need, then spread to the shapes
        needs, index = np.unique(self.need, return_inverse=True)
        object.__setattr__(self, "_needs", needs)
        object.__setattr__(self, "_need_index", index.reshape(-1))
        object.__setattr__(self, "_gpu_shape", self.count > 0)

    def fragmentation(self, free: np.ndarray, cpu: np.ndarray, mem: np.ndarray, model: np.ndarray) -> np.ndarray:
        """``F`` for a batch of node states: free (B, G), cpu (B,), mem (B,), model (B,) -> (B,) milli-GPU."""
        usable = free[:, :, None] >= self._needs[None, None, :]  # (B, G, D)
        fits_gpu = usable.sum(axis=1)[:, self._need_index] >= self.count[None, :]
        usable_milli = np.einsum("bg,bgd->bd", free.astype(np.float64), usable)[:, self._need_index]
        host = (
            fits_gpu
            & (cpu[:, None] >= self.cpu[None, :])
            & (mem[:, None] >= self.mem[None, :])
            & self.model_ok[model]
            & self._gpu_shape[None, :]  # a CPU-only shape uses no GPU: all free GPU is a fragment for it
        )
        total = free.sum(axis=1).astype(np.float64)
        fragmented: np.ndarray = total - (host * usable_milli) @ self.weight
        return fragmented


def whole_gpus(free_row: np.ndarray, k: int, milli: int) -> tuple[int, ...]:
    """The first ``k`` GPUs of a node with ``milli`` free, tightest first (keeps untouched GPUs whole)."""
    candidates = np.flatnonzero(free_row >= milli)
    order = candidates[np.argsort(free_row[candidates], kind="stable")]
    return tuple(int(g) for g in order[:k])
