"""The job model of a replay: what a restart costs and what a kill loses, and fresh job copies.

One rule for every replay (Philly queue, mixed fleet, what-if):

- a *resumed* job (after a suspend or a kill) holds its GPUs ``resume_overhead_seconds`` (pod
  start, checkpoint load) before it computes again; a first start computes at once;
- a *suspended* job (checkpoint signal, grace period) keeps all its progress;
- a *killed* checkpointable job keeps the progress of its last periodic checkpoint, taken every
  ``checkpoint_interval_seconds`` of computing since it (re)started; a killed job that cannot
  checkpoint restarts from scratch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..state import Job

# What a replay's job is asked for (the request and the trace's facts), never what happened to it.
REQUEST_FIELDS = ("name", "team", "priority", "pods", "gpus_per_pod", "milli", "mig_profile", "gpu_model", "cpu_milli",
                  "mem_bytes", "kind", "checkpointable", "submitted", "duration", "flavour", "pools")


def fresh_copy(job: Job, **changes: Any) -> Job:
    """``job``'s request as a new job that never ran (each replay of one trace starts from these)."""
    request: dict[str, Any] = {name: getattr(job, name) for name in REQUEST_FIELDS}
    return Job(**{**request, **changes})


@dataclass(frozen=True)
class JobModel:
    resume_overhead_seconds: float = 0.0
    checkpoint_interval_seconds: float = math.inf  # inf: a killed job keeps only what it had at its start

    def __post_init__(self) -> None:
        if not self.resume_overhead_seconds >= 0:
            raise ValueError(f"resume_overhead_seconds {self.resume_overhead_seconds!r} must be >= 0")
        if not self.checkpoint_interval_seconds > 0:
            raise ValueError(f"checkpoint_interval_seconds {self.checkpoint_interval_seconds!r} must be > 0")

    def progress_after_kill(self, job: Job, progress_at_start: float) -> float:
        """Progress a killed ``job`` keeps: its last periodic checkpoint since it (re)started at
        ``progress_at_start``, or nothing when it cannot checkpoint."""
        if not job.checkpointable:
            return 0.0
        computed = max(job.progress - progress_at_start, 0.0)
        if math.isinf(self.checkpoint_interval_seconds):
            return progress_at_start
        return progress_at_start + (computed // self.checkpoint_interval_seconds) * self.checkpoint_interval_seconds
