"""The nodes of a ``State`` as arrays, so a placement scorer weighs every node in a few numpy operations.

Built once from the ``NodeState``s and then booked beside them by ``State`` (the one place free
capacity changes); ``state_id[n]`` names node ``n``'s current state (see ``_intern``), so scorers
score each state once. Rows pad nodes with fewer GPUs with zeros (a GPU with nothing free is never used);
a MIG GPU's row entry is 0 too (its capacity lives in its instances).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

MILLI = 1000  # milli-GPU in one GPU (state.MILLI; state imports this module)
NO_PRIORITY = -(2**31)  # top_priority of a node running nothing: below every priority
NodeKey = tuple[int, int, int, tuple[int, ...]]  # kind, CPU milli free, memory bytes free, milli free per GPU

if TYPE_CHECKING:
    from .state import NodeState


class NodeArrays:
    def __init__(self, nodes: Sequence[NodeState]) -> None:
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
        self._masks: dict[Hashable, np.ndarray] = {}
        self._largest: dict[Hashable, int] = {}  # per static mask: the most GPUs on one node it admits
        self._everywhere: dict[Hashable, bool] = {}  # per static mask: it admits every node
        # every distinct node state met (kind, CPU and memory free, milli free per GPU) gets an id, and
        # state_id[n] is node n's current one: scorers keep scores per state id, so a node is rescored
        # only in a state never met before (in a replay most changes lead to one met already)
        self._kinds = self.kind.tolist()
        self.state_keys: list[NodeKey] = []
        self._state_ids: dict[NodeKey, int] = {}
        self.state_id = np.array([self._intern(i) for i in range(len(nodes))], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.names)

    def book(self, name: str) -> None:
        """Node ``name``'s row again from its ``NodeState`` (``State._book`` changed it there first)."""
        i = self.index[name]
        node = self.nodes[i]
        row = node.gpu_free
        self.free[i, : len(row)] = row
        self.max_free[i], self.whole_free[i] = max(row, default=0), row.count(MILLI)
        self.cpu_free[i], self.mem_free[i] = node.cpu_free, node.mem_free
        self.state_id[i] = self._intern(i)
        self.version[i] += 1

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

    def static_mask(self, key: Hashable, allowed: Callable[[NodeState], bool]) -> np.ndarray:
        """Nodes ``allowed`` admits, computed once per ``key`` (what does not change while the state
        lives: schedulable, GPU model, pool, price tier)."""
        mask = self._masks.get(key)
        if mask is None:
            mask = np.array([allowed(n) for n in self.nodes], dtype=bool)
            self._masks[key] = mask
        return mask

    def everywhere(self, key: Hashable) -> bool:
        """Whether ``static_mask(key)`` admits every node; the mask must exist."""
        return self.largest_gpu_count(key) >= 0 and self._everywhere[key]

    def largest_gpu_count(self, key: Hashable) -> int:
        """The most GPUs on one node of ``static_mask(key)`` (-1: no node); the mask must exist."""
        largest = self._largest.get(key)
        if largest is None:
            mask = self._masks[key]
            largest = self._largest[key] = int(self.gpu_count[mask].max()) if mask.any() else -1
            self._everywhere[key] = bool(mask.all())
        return largest
