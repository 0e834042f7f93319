"""The replay backend: the real NVML backend over a recorded H200 (:mod:`.recorded`), so a replay
exercises the same query gate, field batching, GPM windows and NotSupported handling as a real GPU.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from gpuwarden.fleet import GpuReading
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from ..nvml import NvmlBackend
from .files import load_probe, load_trace
from .recorded import RecordedNvml


class ReplayBackend(NvmlBackend):
    """The NVML backend over a recorded H200: plays one trace row per collection.

    ``gpus`` GPUs (each shifted along the trace), each with ``mig_profiles`` MIG instances when
    given (only the GPUs in ``mig_gpus`` when that is given); ``latency=True`` makes each NVML call
    cost its recorded median on the H200.
    """

    name = "replay"

    def __init__(self, node: str, trace: str | Path, probe: str | Path, *, gpus: int = 1,
                 mig_profiles: Sequence[str] = (), latency: bool = False, loop: bool = True,
                 clock: Clock = SYSTEM_CLOCK, xid_events: bool = True, xid_wait_ms: int = 15000,
                 processes: bool = True, mig_gpus: Collection[int] | None = None):
        rows = load_trace(trace)
        self.recorded = RecordedNvml(load_probe(probe), rows, gpus=gpus, mig_profiles=mig_profiles, latency=latency,
                                     mig_gpus=mig_gpus)
        self.loop = loop
        self.plays = 0
        super().__init__(node, nvml=self.recorded, clock=clock, xid_events=xid_events, xid_wait_ms=xid_wait_ms,
                         processes=processes)

    def read(self) -> tuple[GpuReading, ...]:
        readings = super().read()
        self.plays += 1
        if self.loop or self.recorded.cursor + 1 < len(self.recorded.rows):
            self.recorded.advance()
        return readings

    @property
    def phase(self) -> str:
        """The phase GPU 0 plays next."""
        return self.recorded.row(0).phase
