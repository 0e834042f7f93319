"""The nodes of a ``State`` as arrays, so a placement scorer weighs every node in a few numpy operations.

Built once from the ``NodeState``s and then booked beside them by ``State`` (the one place free
capacity changes); ``state_id[n]`` names node ``n``'s current state (see ``_intern``), so scorers
score each state once. Rows pad nodes with fewer GPUs with zeros (a GPU with nothing free is never used);
a MIG GPU's row entry is 0 too (its capacity lives in its instances).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

MILLI = 1000  # milli-GPU in one GPU (state.MILLI; state imports this module)
NO_PRIORITY = -(2**31)  # top_priority of a node running nothing: below every priority
NodeKey = tuple[int, int, int, tuple[int, ...]]  # kind, CPU milli free, memory bytes free, milli free per GPU



class NodeRow(Protocol):
    """What the arrays read of a node (``state.NodeState`` has it). A protocol, not an import of
    ``state``: ``state`` builds the arrays, so importing it back would make an import circle."""

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def gpu_free(self) -> list[int]: ...
    @property
    def cpu_free(self) -> int: ...
    @property
    def mem_free(self) -> int: ...
    @property
    def cpu_capacity(self) -> int: ...
    @property
    def mem_capacity(self) -> int: ...


Node = TypeVar("Node", bound=NodeRow)  # the node type the arrays were built from, handed back by nodes and admitted


@dataclass(frozen=True, slots=True)
class Admitted:
    """The nodes a static rule admits (``NodeArrays.admitted``)."""

    mask: np.ndarray  # (nodes,) bool
    largest_gpus: int  # the most GPUs on one admitted node; -1: none admitted
    everywhere: bool  # every node admitted: no mask to apply


class NodeArrays(Generic[Node]):
    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)
        self.names = tuple(n.name for n in nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.models = tuple(sorted({n.model for n in nodes}))
        model_index = {m: i for i, m in enumerate(self.models)}
        self.model = np.array([model_index[n.model] for n in nodes], dtype=np.int32)
        self.gpu_count = np.array([n.gpu_count for n in nodes], dtype=np.int32)
        self.width = max(1, int(self.gpu_count.max(initial=1)))
        self.free = np.zeros((len(nodes), self.width), dtype=np.int32)
        for i, n in enumerate(nodes):
            self.free[i, : n.gpu_count] = n.gpu_free
        self.cpu_free = np.array([n.cpu_free for n in nodes], dtype=np.int64)
        self.mem_free = np.array([n.mem_free for n in nodes], dtype=np.int64)
        self.cpu_cap = np.maximum(np.array([n.cpu_capacity for n in nodes], dtype=np.int64), 1)
        self.mem_cap = np.maximum(np.array([n.mem_capacity for n in nodes], dtype=np.int64), 1)
        # per node: the most milli free on one GPU and the whole GPUs free, so "does a one-GPU pod /
        # k whole GPUs fit" is one comparison per node instead of one per GPU
        self.max_free = self.free.max(axis=1)
        self.whole_free = (self.free == MILLI).sum(axis=1)
        # the highest priority among the jobs running on each node (State books it)
        self.top_priority = np.full(len(nodes), NO_PRIORITY, dtype=np.int64)
        # per node: how many times it was booked, so a cached answer can tell that no node it read changed
        self.version = np.zeros(len(nodes), dtype=np.int64)
        # nodes of one kind (model, GPUs, CPU and memory capacity) in the same free state score the same
        statics = np.column_stack([self.model, self.gpu_count, self.cpu_cap, self.mem_cap]).reshape(len(nodes), 4)
        self.kind = np.unique(statics, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
        self._admitted: dict[Hashable, Admitted] = {}
        self._fits, self._scratch = np.empty(len(nodes), dtype=bool), np.empty(len(nodes), dtype=bool)  # see fitting
        # every distinct node state met (kind, CPU and memory free, milli free per GPU) gets an id, and
        # state_id[n] is node n's current one: scorers keep scores per state id, so a node is rescored
        # only in a state never met before (in a replay most changes lead to one met already)
        self._kinds = self.kind.tolist()
        self.state_keys: list[NodeKey] = []
        self._state_ids: dict[NodeKey, int] = {}
        self.state_id = np.array([self._intern(i) for i in range(len(nodes))], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.names)

    def book(self, name: str, gpus: Iterable[int] | None = None) -> None:
        """Node ``name``'s row again from its ``NodeState`` (``State._book`` changed it there first); only
        GPUs ``gpus`` changed, when given."""
        i = self.index[name]
        node = self.nodes[i]
        row = node.gpu_free
        if gpus is None:
            self.free[i, : len(row)] = row
        else:
            free = self.free
            for g in gpus:
                free[i, g] = row[g]
        self.max_free[i], self.whole_free[i] = max(row, default=0), row.count(MILLI)
        self.cpu_free[i], self.mem_free[i] = node.cpu_free, node.mem_free
        self.state_id[i] = self._intern(i)
        self.version[i] += 1

    def fitting(self, k: int, milli: int, cpu: int, mem: int, allowed: np.ndarray | None = None) -> np.ndarray:
        """Indices of the nodes (of those ``allowed`` marks) with ``cpu`` and ``mem`` free and ``k`` GPUs
        with ``milli`` free each, in node order. Computed in two kept buffers: a placement asks this for
        every pod, and the arrays it would allocate cost as much as the comparisons."""
        fits, scratch = self._fits, self._scratch
        np.greater_equal(self.cpu_free, cpu, out=fits)
        fits &= np.greater_equal(self.mem_free, mem, out=scratch)
        if allowed is not None:
            fits &= allowed
        if k == 1:
            fits &= np.greater_equal(self.max_free, milli, out=scratch)
        elif k and milli == MILLI:
            fits &= np.greater_equal(self.whole_free, k, out=scratch)
        elif k:
            fits &= self.gpus_fit(k, milli)
        return fits.nonzero()[0]

    def gpus_fit(self, k: int, milli: int) -> np.ndarray:
        """(nodes,) bool: which have ``k`` GPUs with ``milli`` free each."""
        fits: np.ndarray
        if k == 1:
            fits = self.max_free >= milli
        elif milli == MILLI:
            fits = self.whole_free >= k
        else:
            fits = (self.free >= milli).sum(axis=1) >= k
        return fits

    def _intern(self, i: int) -> int:
        node = self.nodes[i]  # the same numbers as the arrays' row, without numpy scalars
        key = (self._kinds[i], node.cpu_free, node.mem_free, tuple(node.gpu_free))
        found = self._state_ids.get(key)
        if found is None:
            found = self._state_ids[key] = len(self.state_keys)
            self.state_keys.append(key)
        return found

    def admitted(self, key: Hashable, allowed: Callable[[Node], bool]) -> Admitted:
        """The nodes ``allowed`` admits, computed once per ``key`` (what does not change while the state
        lives: schedulable, GPU model, pool, price tier)."""
        found = self._admitted.get(key)
        if found is None:
            mask = np.array([allowed(n) for n in self.nodes], dtype=bool)
            largest = int(self.gpu_count[mask].max()) if mask.any() else -1
            found = self._admitted[key] = Admitted(mask, largest, bool(mask.all()))
        return found
