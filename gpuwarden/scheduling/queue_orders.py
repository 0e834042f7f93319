"""Queue orders: the registered parts that rank waiting jobs, and the service levels they rank by.

``QUEUE_ORDERS[name]`` is a class a scheduler makes once with its policy (``QueuePolicy.order``
names it). Every order ranks by priority class first, then by the order's level, then (with
``guarantee_first``) jobs of teams under their guarantee, then submit time and name.

- ``fifo``: level 0 for every job: priority, then submit time.
- ``las``: least attained service first: the level is how many of ``las_thresholds`` (GPU-seconds)
  the job's attained service reached, less one per ``aging_seconds`` waited.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Protocol

from .parts import Registry
from .quotas import Quotas
from .state import Job, JobState

SortKey = tuple[int, int, int, float, str] | tuple[int, int, float, str]


class OrderKnobs(Protocol):
    """What a queue order reads of its policy (``QueuePolicy`` has it; a protocol, so that the policy
    module can import the registry to check names)."""

    @property
    def las_thresholds(self) -> tuple[float, ...]: ...
    @property
    def aging_seconds(self) -> float: ...
    @property
    def guarantee_first(self) -> bool: ...
    @property
    def quotas(self) -> bool: ...


class QueueOrdering:
    """``fifo``, and the base of every queue order: subclasses give ``level`` and ``service_level``."""

    reads_service = False  # whether the order changes as running jobs attain service (replays re-rank on ticks)

    def __init__(self, policy: OrderKnobs) -> None:
        self.edges = tuple(sorted(policy.las_thresholds))  # level edges, ascending
        self.aging_seconds = policy.aging_seconds
        self.guarantee_first = policy.guarantee_first
        self.quotas = policy.quotas

    def service_level(self, attained: float) -> int:
        """The level of a running job with ``attained`` GPU-seconds (no aging); 0 for a order without levels."""
        return 0

    def level(self, job: Job, now: float, aging: bool = True) -> int:
        """``job``'s level: lower goes first. Aging lifts waiting jobs in the order only; preemption
        compares levels without it."""
        return 0

    def sort_key(self, job: Job, now: float, quotas: Quotas | None) -> SortKey:
        """Where ``job`` goes in the queue; ``quotas``: the state's, for ``guarantee_first``."""
        if self.guarantee_first:
            within = self.quotas and quotas is not None and quotas.within_guarantee(job)
            return (-job.priority, self.level(job, now), -1 if within else 0, job.submitted, job.name)
        return (-job.priority, self.level(job, now), job.submitted, job.name)


class LeastAttainedService(QueueOrdering):
    """``las``: Tiresias's discretised least attained service."""

    reads_service = True

    def service_level(self, attained: float) -> int:
        return bisect_right(self.edges, attained)  # the edges at or below attained service

    def level(self, job: Job, now: float, aging: bool = True) -> int:
        level = bisect_right(self.edges, job.attained)
        if aging and self.aging_seconds and job.state != JobState.RUNNING:
            level -= int((now - job.submitted) // self.aging_seconds)
        return level


QUEUE_ORDERS: Registry[type[QueueOrdering]] = Registry("queue order", "order")
QUEUE_ORDERS.register("fifo", QueueOrdering)
QUEUE_ORDERS.register("las", LeastAttainedService)
