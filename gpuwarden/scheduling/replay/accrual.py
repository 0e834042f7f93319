"""What the running jobs of a replay accrue between events, as arrays: progress (seconds computed,
after a resume's overhead) and attained service (GPU-seconds held). One vector step per event
instead of a Python loop over the running jobs (the replay's hottest loop); the figures are written
back to the jobs before anything reads them (:meth:`Accrual.write_back`, :meth:`Accrual.remove`).
The arithmetic is the loop's, element by element, so the figures are the same floats.
"""

from __future__ import annotations

import numpy as np

from ..state import Job


class Accrual:
    """Progress and attained service of the running jobs, slot by slot (slots ``[0, n)`` in use)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self._slot: dict[str, int] = {}
        self._progress, self._attained = np.zeros(64), np.zeros(64)
        self._since, self._share = np.zeros(64), np.zeros(64)  # computes from (s), GPUs held
        self._stale_progress = self._stale_attained = False  # the arrays moved on since the jobs were written

    def add(self, job: Job, computes_from: float) -> None:
        """``job`` runs from now; it computes from ``computes_from`` (after its resume overhead)."""
        slot = self._slot.get(job.name)
        if slot is None:
            slot = self._slot[job.name] = len(self.jobs)
            self.jobs.append(job)
            if slot == len(self._progress):
                self._progress, self._attained, self._since, self._share = (
                    np.concatenate([a, np.zeros(len(a))]) for a in (self._progress, self._attained, self._since, self._share))
        self.jobs[slot] = job
        self._progress[slot], self._attained[slot] = job.progress, job.attained
        self._since[slot], self._share[slot] = computes_from, job.gpu_equivalents

    def remove(self, job: Job) -> None:
        """``job`` stops running: its figures are written back, its slot taken by the last one."""
        slot = self._slot.pop(job.name)
        job.progress, job.attained = float(self._progress[slot]), float(self._attained[slot])
        last = len(self.jobs) - 1
        if slot != last:
            moved = self.jobs[slot] = self.jobs[last]
            self._slot[moved.name] = slot
            for a in (self._progress, self._attained, self._since, self._share):
                a[slot] = a[last]
        self.jobs.pop()

    def advance(self, now: float, to: float) -> None:
        """``[now, to)`` passed: ``progress += seconds if since <= now else max(0, to - since)``
        and ``attained += seconds * share`` for every running job."""
        n = len(self.jobs)
        if not n:
            return
        seconds, since = to - now, self._since[:n]
        self._progress[:n] += np.where(since <= now, seconds, np.maximum(0.0, to - since))
        self._attained[:n] += seconds * self._share[:n]
        self._stale_progress = self._stale_attained = True

    def write_back(self, progress: bool = True) -> None:
        """Every running job's attained service (and progress unless ``progress`` is False) as the
        arrays hold them."""
        n = len(self.jobs)
        if progress and self._stale_progress:
            for job, value in zip(self.jobs, self._progress[:n].tolist()):
                job.progress = value
            self._stale_progress = False
        if self._stale_attained:
            for job, value in zip(self.jobs, self._attained[:n].tolist()):
                job.attained = value
            self._stale_attained = False
