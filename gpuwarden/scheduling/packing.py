"""Fragmentation-aware (FGD) packing: the fragmentation measure and score, and the array cluster the
openb replay runs on.

``TargetWorkload.fragmentation`` and ``fgd_score`` are the one FGD implementation: the scheduling
engine scores fractional placements with them when ``PlacementOptions.fragmentation`` names a
target workload (``placement._place_fraction_by_fragmentation``), and the openb replay's
``FragmentationGradient`` uses them over all nodes at once. The openb replay holds a cluster as arrays (``free_milli[n, g]`` per GPU, free CPU and memory per node) so a
score is computed for every node in a few numpy operations.

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
the step lets near-equal growths tie and the tie-break then packs. Scores are cached per (node,
pod shape) and recomputed only for nodes that changed since the shape was last scored; identical
node states are scored once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MILLI = 1000
SCORE_SCALE = 1000.0  # milli-GPU of fragmentation growth per unit of the sigmoid's argument (FGD's plugin)


def fgd_score(delta: np.ndarray) -> np.ndarray:
    """FGD's integer node score for a fragmentation growth ``delta`` (milli-GPU), as a cost: lower is better."""
    with np.errstate(over="ignore"):
        return -np.floor(100.0 / (1.0 + np.exp(delta / SCORE_SCALE)))


@dataclass(frozen=True)
class PodShapes:
    """Distinct pod shapes: GPUs (0 = CPU-only), milli-GPU per GPU, CPU milli, memory MiB, allowed models."""

    gpus: np.ndarray  # (S,) int
    milli: np.ndarray  # (S,) int, 1..1000 per GPU (0 for CPU-only)
    cpu: np.ndarray  # (S,) int64
    mem: np.ndarray  # (S,) int64
    model_ok: np.ndarray  # (S, models) bool

    def __len__(self) -> int:
        return len(self.gpus)

    @property
    def gpu_milli_total(self) -> np.ndarray:
        total: np.ndarray = self.gpus * self.milli
        return total


@dataclass(frozen=True)
class TargetWorkload:
    """The shapes expected to arrive and their popularity (sums to 1): what fragmentation is measured against."""

    need: np.ndarray  # (T,) per-GPU milli needed (0 for CPU-only)
    count: np.ndarray  # (T,) GPUs needed
    cpu: np.ndarray
    mem: np.ndarray
    model_ok: np.ndarray  # (models, T) bool
    weight: np.ndarray  # (T,) float, sums to 1

    @classmethod
    def from_shapes(cls, shapes: PodShapes, popularity: np.ndarray) -> TargetWorkload:
        weight = np.asarray(popularity, dtype=float)
        weight = weight / weight.sum()
        need = np.where(shapes.gpus > 0, shapes.milli, 0)
        return cls(need=need.astype(np.int32), count=shapes.gpus.astype(np.int32), cpu=shapes.cpu,
                   mem=shapes.mem, model_ok=shapes.model_ok.T.copy(), weight=weight)

    def fragmentation(self, free: np.ndarray, cpu: np.ndarray, mem: np.ndarray, model: np.ndarray) -> np.ndarray:
        """``F`` for a batch of node states: free (B, G), cpu (B,), mem (B,), model (B,) -> (B,) milli-GPU."""
        usable = free[:, :, None] >= self.need[None, None, :]  # (B, G, T)
        fits_gpu = usable.sum(axis=1) >= self.count[None, :]
        usable_milli = np.einsum("bg,bgt->bt", free.astype(np.float64), usable)
        host = (
            fits_gpu
            & (cpu[:, None] >= self.cpu[None, :])
            & (mem[:, None] >= self.mem[None, :])
            & self.model_ok[model]
            & (self.count[None, :] > 0)  # a CPU-only shape uses no GPU: all free GPU is a fragment for it
        )
        total = free.sum(axis=1).astype(np.float64)
        fragmented: np.ndarray = total - (host * usable_milli) @ self.weight
        return fragmented


class ArrayCluster:
    """Nodes as arrays. ``free_milli`` pads nodes with fewer GPUs with zeros (a zero GPU is never used)."""

    def __init__(self, names: Sequence[str], model_index: npt.ArrayLike, model_names: Sequence[str],
                 gpu_count: npt.ArrayLike, cpu_milli: npt.ArrayLike, memory_mib: npt.ArrayLike,
                 max_gpus: int | None = None) -> None:
        self.names = tuple(names)
        self.model = np.asarray(model_index, dtype=np.int32)
        self.model_names = tuple(model_names)
        self.gpu_count = np.asarray(gpu_count, dtype=np.int32)
        self.cpu_cap = np.asarray(cpu_milli, dtype=np.int64)
        self.mem_cap = np.asarray(memory_mib, dtype=np.int64)
        width = int(max_gpus or max(1, int(self.gpu_count.max(initial=1))))
        self.width = width
        self.free = np.zeros((len(self.names), width), dtype=np.int32)
        for index, count in enumerate(self.gpu_count):
            self.free[index, :count] = MILLI
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.version = np.zeros(len(self.names), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI

    @property
    def allocated_milli(self) -> int:
        return self.total_milli - int(self.free.sum())

    def feasible(self, shapes: PodShapes, s: int) -> np.ndarray:
        """Nodes where shape ``s`` fits: model, CPU, memory and GPUs."""
        ok: np.ndarray = shapes.model_ok[s][self.model] & (self.cpu_free >= shapes.cpu[s]) & (self.mem_free >= shapes.mem[s])
        k = int(shapes.gpus[s])
        if k == 0:
            return ok
        milli = int(shapes.milli[s])
        fits: np.ndarray = (self.free.max(axis=1) >= milli) if k == 1 else ((self.free >= milli).sum(axis=1) >= k)
        feasible: np.ndarray = ok & fits
        return feasible

    def bind(self, node: int, gpus: tuple[int, ...], milli: int, cpu: int, mem: int) -> None:
        for g in gpus:
            if self.free[node, g] < milli:
                raise ValueError(f"GPU {g} of {self.names[node]} has {self.free[node, g]} milli free, needs {milli}")
            self.free[node, g] -= milli
        self.cpu_free[node] -= cpu
        self.mem_free[node] -= mem
        self.version[node] += 1

    def unbind(self, node: int, gpus: tuple[int, ...], milli: int, cpu: int, mem: int) -> None:
        for g in gpus:
            self.free[node, g] += milli
        self.cpu_free[node] += cpu
        self.mem_free[node] += mem
        self.version[node] += 1

    def fragmented_milli(self, target: TargetWorkload) -> float:
        """Cluster fragmentation against ``target`` (milli-GPU that the expected pods could not use)."""
        return float(target.fragmentation(self.free, self.cpu_free, self.mem_free, self.model).sum())


def whole_gpus(free_row: np.ndarray, k: int, milli: int) -> tuple[int, ...]:
    """The first ``k`` GPUs of a node with ``milli`` free, tightest first (keeps untouched GPUs whole)."""
    candidates = np.flatnonzero(free_row >= milli)
    order = candidates[np.argsort(free_row[candidates], kind="stable")]
    return tuple(int(g) for g in order[:k])


# ---------------------------------------------------------------------------------------------
# Policies: each picks (node, gpus) for a shape among feasible nodes, or None.


class PackingPolicy:
    name = "policy"

    def reset(self, cluster: ArrayCluster, shapes: PodShapes, rng: np.random.Generator) -> None:
        self.cluster, self.shapes, self.rng = cluster, shapes, rng

    def choose(self, s: int) -> tuple[int, tuple[int, ...]] | None:
        raise NotImplementedError

    def _gpus_on(self, node: int, s: int) -> tuple[int, ...]:
        k = int(self.shapes.gpus[s])
        return whole_gpus(self.cluster.free[node], k, int(self.shapes.milli[s])) if k else ()


class RandomFit(PackingPolicy):
    """A random feasible node, a random GPU that fits (the paper's Random baseline)."""

    name = "random"

    def choose(self, s: int) -> tuple[int, tuple[int, ...]] | None:
        nodes = np.flatnonzero(self.cluster.feasible(self.shapes, s))
        if not len(nodes):
            return None
        node = int(self.rng.choice(nodes))
        k, milli = int(self.shapes.gpus[s]), int(self.shapes.milli[s])
        if k == 0:
            return node, ()
        fits = np.flatnonzero(self.cluster.free[node] >= milli)
        return node, tuple(int(g) for g in self.rng.choice(fits, size=k, replace=False))


class BestFit(PackingPolicy):
    """The node left with the least free CPU and GPU share after the pod (the paper's BestFit baseline)."""

    name = "bestfit"

    def choose(self, s: int) -> tuple[int, tuple[int, ...]] | None:
        c = self.cluster
        nodes = np.flatnonzero(c.feasible(self.shapes, s))
        if not len(nodes):
            return None
        gpu_total = np.maximum(c.gpu_count[nodes], 1) * MILLI
        gpu_left = (c.free[nodes].sum(axis=1) - int(self.shapes.gpu_milli_total[s])) / gpu_total
        cpu_left = (c.cpu_free[nodes] - self.shapes.cpu[s]) / c.cpu_cap[nodes]
        node = int(nodes[np.argmin(gpu_left + cpu_left)])
        return node, self._gpus_on(node, s)


TIE_BREAKS = ("random", "first", "tightest_cpu")


class FragmentationGradient(PackingPolicy):
    """Least growth of expected fragmentation (FGD idea), scored as FGD's plugin scores it (``fgd_score``).

    ``ties``: ``"random"`` picks uniformly among the best-scored nodes (kube-scheduler's selectHost,
    plain FGD); ``"first"`` takes the first of them in node order; ``"tightest_cpu"`` takes the one
    the pod leaves with the least CPU share free (best fit on CPU, then node order), so nodes with
    CPU to spare stay open for the CPU-heavy pods that only they can take.
    ``packing_weight`` (our extension, 0 = off) prefers, among equal scores, the node that ends up
    fuller. ``cpu_weight`` (our extension) adds, per unit, the growth of the node's CPU/memory
    starvation: how much the GPU share left free exceeds the CPU share and the memory share left
    free (CPU-starved GPUs are stranded GPUs), after the pod minus before it.
    """

    name = "fgd"

    def __init__(self, target: TargetWorkload, packing_weight: float = 0.0, cpu_weight: float = 0.0,
                 ties: str = "random") -> None:
        if ties not in TIE_BREAKS:
            raise ValueError(f"ties must be one of {', '.join(TIE_BREAKS)}, not {ties!r}")
        self.target = target
        self.packing_weight = packing_weight
        self.cpu_weight = cpu_weight
        self.ties = ties

    def reset(self, cluster: ArrayCluster, shapes: PodShapes, rng: np.random.Generator) -> None:
        super().reset(cluster, shapes, rng)
        n, s = len(cluster), len(shapes)
        self.base = self.target.fragmentation(cluster.free, cluster.cpu_free, cluster.mem_free, cluster.model)
        self.base_version = cluster.version.copy()
        self.score = np.zeros((n, s))
        self.best_gpu = np.zeros((n, s), dtype=np.int16)
        self.scored_version = np.full((n, s), -1, dtype=np.int64)

    def _refresh_base(self, nodes: np.ndarray) -> None:
        c = self.cluster
        self.base[nodes] = self.target.fragmentation(c.free[nodes], c.cpu_free[nodes], c.mem_free[nodes], c.model[nodes])
        self.base_version[nodes] = c.version[nodes]

    def _score(self, nodes: np.ndarray, s: int) -> None:
        c, shapes = self.cluster, self.shapes
        stale_base = nodes[self.base_version[nodes] != c.version[nodes]]
        if len(stale_base):
            self._refresh_base(stale_base)
        # identical node states score identically: score each distinct state once
        state = np.column_stack([c.model[nodes], c.cpu_free[nodes], c.mem_free[nodes], c.free[nodes]])
        unique, first, inverse = np.unique(state, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        rep = nodes[first]
        k, milli = int(shapes.gpus[s]), int(shapes.milli[s])
        cpu = c.cpu_free[rep] - shapes.cpu[s]
        mem = c.mem_free[rep] - shapes.mem[s]
        free = c.free[rep]
        if k == 1 and milli < MILLI:
            width = c.width
            cand = np.repeat(free[:, None, :], width, axis=1)  # (U, G, G): candidate g takes the pod
            idx = np.arange(width)
            cand[:, idx, idx] -= milli
            flat = cand.reshape(-1, width)
            frag = self.target.fragmentation(
                flat, np.repeat(cpu, width), np.repeat(mem, width), np.repeat(c.model[rep], width)
            ).reshape(-1, width)
            frag = np.where(free >= milli, fgd_score(frag - self.base[rep][:, None]), np.inf)
            if self.packing_weight:
                # prefer the tightest GPU among near-equal choices
                frag = frag + self.packing_weight * 1e-3 * (free - milli)
            best = np.argmin(frag, axis=1)
            score = frag[np.arange(len(rep)), best]
        else:
            after_free = free.copy()
            best = np.zeros(len(rep), dtype=np.int16)
            if k:
                for row in range(len(rep)):
                    for g in whole_gpus(free[row], k, milli):
                        after_free[row, g] -= milli
            after = self.target.fragmentation(after_free, cpu, mem, c.model[rep])
            score = fgd_score(after - self.base[rep])
        delta = score
        if self.packing_weight:
            left = (free.sum(axis=1) - k * milli) / np.maximum(c.gpu_count[rep], 1) / MILLI
            delta = delta + self.packing_weight * left * 1.0
        if self.cpu_weight:
            gpus = np.maximum(c.gpu_count[rep], 1) * MILLI
            gpu_before = free.sum(axis=1) / gpus
            gpu_after = (free.sum(axis=1) - k * milli) / gpus
            cpu_cap, mem_cap = c.cpu_cap[rep], c.mem_cap[rep]
            before = (np.maximum(gpu_before - c.cpu_free[rep] / cpu_cap, 0)
                      + np.maximum(gpu_before - c.mem_free[rep] / mem_cap, 0))
            after_short = np.maximum(gpu_after - cpu / cpu_cap, 0) + np.maximum(gpu_after - mem / mem_cap, 0)
            delta = delta + self.cpu_weight * (after_short - before)
        self.score[nodes, s] = delta[inverse]
        self.best_gpu[nodes, s] = best[inverse]
        self.scored_version[nodes, s] = c.version[nodes]

    def choose(self, s: int) -> tuple[int, tuple[int, ...]] | None:
        c = self.cluster
        nodes = np.flatnonzero(c.feasible(self.shapes, s))
        if not len(nodes):
            return None
        stale = nodes[self.scored_version[nodes, s] != c.version[nodes]]
        if len(stale):
            self._score(stale, s)
        score = self.score[nodes, s]
        if self.ties == "random":
            best = np.flatnonzero(score == score.min())
            node = int(nodes[best[self.rng.integers(len(best))]] if len(best) > 1 else nodes[best[0]])
        elif self.ties == "tightest_cpu":
            best = nodes[score == score.min()]
            cpu_share_left = (c.cpu_free[best] - self.shapes.cpu[s]) / np.maximum(c.cpu_cap[best], 1)
            node = int(best[np.argmin(cpu_share_left)])  # argmin: the first in node order among equals
        else:
            node = int(nodes[np.argmin(score)])
        k, milli = int(self.shapes.gpus[s]), int(self.shapes.milli[s])
        if k == 1 and milli < MILLI:
            return node, (int(self.best_gpu[node, s]),)
        return node, self._gpus_on(node, s)
