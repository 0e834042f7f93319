"""The stateful parts of the recorded NVML: GPM sample buffers and XID event sets.

:class:`GpmSamples` holds the sample buffers NVML hands out (``nvmlGpmSampleAlloc``), what each
one was filled with, and answers ``nvmlGpmMetricsGet`` from two of them. :class:`EventSets` holds
the event sets, which GPUs each one listens to, and their queues of pending XID events. Both are
thread-safe: the exporter's XID thread waits on an event set while a collection runs.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py; importing it does not load libnvidia-ml

from ..nvml.codes import NVML_EVENT_TYPE_XID, NVML_NO_INSTANCE

# The one sample a GPM buffer holds: (GPU index, MIG GPU instance or None, the row's values), or
# None while the buffer is allocated but not yet filled.
Filled = tuple[int, int | None, Mapping[str, float]]


def token_of(pointer: Any) -> int:
    """The address a ctypes pointer (a GPM sample handle) carries; 0 for a null pointer."""
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


class GpmSamples:
    """GPM sample buffers, keyed by the address their handle carries."""

    def __init__(self, tokens: Iterator[int]):
        self._tokens = tokens
        self._lock = threading.Lock()
        self._filled: dict[int, Filled | None] = {}

    def alloc(self) -> Any:
        token = next(self._tokens)
        with self._lock:
            self._filled[token] = None
        return ctypes.cast(ctypes.c_void_p(token), pynvml.c_nvmlGpmSample_t)

    def free(self, sample: Any) -> None:
        with self._lock:
            self._filled.pop(token_of(sample), None)

    def fill(self, sample: Any, index: int, instance: int | None, values: Mapping[str, float]) -> Any:
        """Fill an allocated buffer with a GPU's (or MIG instance's) current values."""
        token = token_of(sample)
        with self._lock:
            if token not in self._filled:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._filled[token] = (index, instance, values)
        return sample

    def metrics(self, request: Any, columns: Mapping[int, str]) -> Any:
        """Answer a ``c_nvmlGpmMetricsGet_t`` from its two samples of the same GPU or instance: each
        metric is the second sample's value of its column (NaN stays NaN, as NVML returns it)."""
        with self._lock:
            first = self._filled.get(token_of(request.sample1))
            second = self._filled.get(token_of(request.sample2))
        if first is None or second is None or first[:2] != second[:2]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        values = second[2]
        for i in range(int(request.numMetrics)):
            metric = request.metrics[i]
            column = columns.get(int(metric.metricId))
            value = values.get(column) if column else None
            if value is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            metric.value = value
        return request


class EventSets:
    """NVML event sets: the GPUs registered on each, and a queue of pending XID events per set."""

    def __init__(self, tokens: Iterator[int]):
        self._tokens = tokens
        self._lock = threading.Lock()
        self._queues: dict[int, queue.Queue[SimpleNamespace]] = {}
        self._registered: dict[int, set[int]] = {}  # event set -> GPU indices

    def create(self) -> int:
        token = next(self._tokens)
        with self._lock:
            self._queues[token] = queue.Queue()
            self._registered[token] = set()
        return token

    def register(self, event_set: int, index: int) -> None:
        with self._lock:
            if event_set not in self._registered:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._registered[event_set].add(index)

    def wait(self, event_set: int, timeout_ms: int) -> SimpleNamespace:
        """The next event of the set, or NVML_ERROR_TIMEOUT after ``timeout_ms``."""
        with self._lock:
            events = self._queues.get(event_set)
        if events is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        try:
            return events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def free(self, event_set: int) -> None:
        with self._lock:
            self._queues.pop(event_set, None)
            self._registered.pop(event_set, None)

    def deliver_xid(self, device: Any, index: int, code: int, gpu_instance: int = NVML_NO_INSTANCE) -> int:
        """Queue XID ``code`` of GPU ``index`` on every set registered for it; returns how many."""
        delivered = 0
        with self._lock:
            for event_set, indices in self._registered.items():
                if index in indices:
                    self._queues[event_set].put(SimpleNamespace(
                        device=device, eventType=NVML_EVENT_TYPE_XID, eventData=code,
                        gpuInstanceId=gpu_instance, computeInstanceId=NVML_NO_INSTANCE))
                    delivered += 1
        return delivered
