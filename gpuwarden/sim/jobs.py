"""A simulated job: its spec, and where it is in its life (phase, progress, the devices it holds,
its preemptions and the service it received). The engine runs it; ``SimCluster`` shows it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpuwarden.fleet import PriorityClass, WorkloadPhase

from .workloads import JobSpec


# eq=False: a job is itself (the queue finds and removes it by identity, not by comparing fields);
# slots: its fields are read for every live job every round and every running job every step
@dataclass(eq=False, slots=True)
class SimJob:
    spec: JobSpec
    index: int
    phase: WorkloadPhase = WorkloadPhase.PENDING
    priority: PriorityClass = PriorityClass.NORMAL
    progress_s: float = 0.0
    started_s: float | None = None
    finished_s: float | None = None
    devices: np.ndarray | None = None
    preemptions: int = 0
    restarts: int = 0
    last_started_s: float | None = None  # the latest (re)start: what a pod's start time says
    attained_before_s: float = 0.0  # GPU-seconds of service received up to its latest start
    gpu_equivalents: float = 0.0
    annotations: dict[str, str] = field(default_factory=dict)  # what its submitter wrote (the demo's portal)

    def attained_gpu_seconds(self, now_s: float) -> float:
        """Service received by ``now_s``: GPU equivalents x seconds run (counted at each stop)."""
        if self.phase != WorkloadPhase.RUNNING or self.last_started_s is None:
            return self.attained_before_s
        return self.attained_before_s + (now_s - self.last_started_s) * self.gpu_equivalents

    @property
    def name(self) -> str:
        return self.spec.workload.name
