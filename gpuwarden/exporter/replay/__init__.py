"""The replay backend: a recorded H200 answered through the pynvml API, in six parts:

- :mod:`.files`: reading and checking ``phase_trace.csv`` and ``nvml_probe.json``;
- :mod:`.recorded`: :class:`RecordedNvml`, the recorded NVML (calls, readings, MIG, GPM, events);
- :mod:`.state`: its GPM sample buffers and XID event sets;
- :mod:`.identity`: its minor numbers and MIG placements (the NVIDIA DRA driver's device names);
- :mod:`.latency`: what each call cost on the H200, spent again when asked (``latency=True``);
- :mod:`.backend`: :class:`ReplayBackend`, the real NVML backend over it, one trace row per collection.

The names below are the package's public API (``gpuwarden.exporter.replay.X`` as before the split).
"""

from __future__ import annotations

from .backend import ReplayBackend
from .files import TRACE_COLUMNS, ReplayError, TraceRow, load_probe, load_trace
from .latency import LATENCY_FUNCTIONS
from .recorded import GPM_COLUMNS, MIB, RecordedHandle, RecordedNvml

__all__ = [
    "GPM_COLUMNS", "LATENCY_FUNCTIONS", "MIB", "TRACE_COLUMNS", "RecordedHandle", "RecordedNvml", "ReplayBackend",
    "ReplayError", "TraceRow", "load_probe", "load_trace",
]
