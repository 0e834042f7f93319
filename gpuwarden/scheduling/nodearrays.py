"""The nodes of a ``State`` as arrays, so a placement scorer weighs every node in a few numpy operations.

Built once from the ``NodeState``s and then booked beside them by ``State`` (the one place free
capacity changes); ``version[n]`` grows with every change to node ``n``, so scorers recompute only
nodes that changed. Rows pad nodes with fewer GPUs with zeros (a GPU with nothing free is never used);
a MIG GPU's row entry is 0 too (its capacity lives in its instances).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

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
        self.version = np.zeros(len(nodes), dtype=np.int64)
        # nodes of one kind (model, GPUs, CPU and memory capacity) in the same free state score the same
        statics = np.column_stack([self.model, self.gpu_count, self.cpu_cap, self.mem_cap]).reshape(len(nodes), 4)
        self.kind = np.unique(statics, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
        self._masks: dict[Hashable, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.names)

    def take_gpu(self, name: str, gpu: int, milli: int) -> None:
        i = self.index[name]
        self.free[i, gpu] -= milli
        self.version[i] += 1

    def take_host(self, name: str, cpu_milli: int, mem_bytes: int) -> None:
        i = self.index[name]
        self.cpu_free[i] -= cpu_milli
        self.mem_free[i] -= mem_bytes
        self.version[i] += 1

    def static_mask(self, key: Hashable, allowed: Callable[[NodeState], bool]) -> np.ndarray:
        """Nodes ``allowed`` admits, computed once per ``key`` (what does not change while the state
        lives: schedulable, GPU model, pool, price tier)."""
        mask = self._masks.get(key)
        if mask is None:
            mask = np.array([allowed(n) for n in self.nodes], dtype=bool)
            self._masks[key] = mask
        return mask

    def model_mask(self, models: tuple[str, ...]) -> np.ndarray:
        """(models of this fleet,) bool: which the allowed ``models`` name (empty: all)."""
        if not models:
            return np.ones(len(self.models), dtype=bool)
        return np.array([m in models for m in self.models], dtype=bool)
