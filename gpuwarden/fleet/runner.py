"""The one runner of a process's periodic jobs, fired by triggers on the injected clock.

A process registers its jobs (the actuator's reconcile round, lease renewal and scheduling round;
the demo's live step, compaction and report precompute; the scraper's rounds; the exporter's
collections) with one :class:`Runner` and starts it. Each job has a trigger: anything with APScheduler
3's trigger method ``get_next_fire_time(previous_fire_time, now)``; the actuator, the demo and the
scraper hand in APScheduler's own ``IntervalTrigger`` and ``CronTrigger``
(:mod:`gpuwarden.fleet.triggers`). The runner asks the trigger for fire times with ``now`` read from
its :class:`~gpuwarden.fleet.clock.Clock`, and waits on that clock, so a ``FakeClock`` drives every
job with no sleeps. APScheduler's own schedulers cannot be driven so: they read ``datetime.now()``
themselves (``BaseScheduler._process_jobs``), so this runner takes their place and keeps their rules
for a job added with ``max_instances=1, coalesce=True``:

- a job never runs twice at once: a fire time that comes while it still runs is skipped (counted
  in ``Job.skipped``), and the next run keeps to the trigger's grid;
- fire times missed (the process was busy, or the clock jumped) coalesce into one run;
- each run is on its own thread, so a slow job delays no other job;
- an exception from a job is logged and the job runs again at its next fire time (a daemon's loop
  must outlive one bad round).

The runner imports nothing heavy (the exporter, which has no APScheduler, uses it with
:class:`Every`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from .clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("gpuwarden.runner")


class Trigger(Protocol):
    """APScheduler 3's trigger contract (``apscheduler.triggers.base.BaseTrigger``)."""

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        """The first fire time after ``previous_fire_time`` (None: the first one at or after ``now``);
        None when the trigger fires no more."""
        ...


class Every:
    """A fixed interval from ``start``, with APScheduler's ``IntervalTrigger`` fire times (no jitter).

    It exists for the exporter alone: the exporter runs on every GPU node from an image that holds
    only what it imports, and APScheduler is not in it. ``tests/fleet/test_runner.py`` checks that its
    fire times are ``IntervalTrigger``'s."""

    def __init__(self, seconds: float, start: datetime) -> None:
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"interval seconds: {seconds!r} must be a finite number > 0")
        if start.tzinfo is None:
            raise ValueError(f"interval start {start!r} has no timezone; give an aware datetime (UTC)")
        self.interval = timedelta(seconds=seconds)
        self.start = start

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        if previous_fire_time is not None:
            return previous_fire_time + self.interval
        if self.start >= now:
            return self.start
        return self.start + self.interval * math.ceil((now - self.start) / self.interval)

    def __repr__(self) -> str:
        return f"Every({self.interval.total_seconds():g} s from {self.start.isoformat()})"


@dataclass
class Job:
    """One periodic job and what it has done (read them; the runner writes them)."""

    name: str
    work: Callable[[], object]
    trigger: Trigger
    next_fire_at: datetime | None
    runs: int = 0  # runs finished, failed ones included
    failures: int = 0
    skipped: int = 0  # fire times that came while it still ran
    coalesced: int = 0  # fire times missed and folded into one run
    running: bool = False
    _thread: threading.Thread | None = field(default=None, repr=False)


class Runner:
    """Run registered jobs at their triggers' fire times on ``clock`` until :meth:`stop`."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, name: str = "gpuwarden-runner") -> None:
        self.clock = clock
        self.name = name
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set by add and stop: the loop looks again at once
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def jobs(self) -> dict[str, Job]:
        with self._lock:
            return dict(self._jobs)

    def add(self, name: str, work: Callable[[], object], trigger: Trigger, *, at_once: bool = False) -> Job:
        """Register ``work`` under ``name`` (unique), first fired at the trigger's first fire time, or
        now (``at_once``, APScheduler's ``next_run_time=now``; the trigger takes over from that run)."""
        with self._lock:
            if name in self._jobs:
                raise ValueError(f"job {name!r} is already registered; jobs: {', '.join(sorted(self._jobs))}")
            now = self.clock.now()
            job = Job(name, work, trigger, now if at_once else trigger.get_next_fire_time(None, now))
            self._jobs[name] = job
        self._wake.set()
        return job

    # -- the loop ------------------------------------------------------------------------------------
    def _next_after(self, job: Job, fired_at: datetime, now: datetime) -> datetime | None:
        """The trigger's first fire time after ``now``; the ones it passes are missed (coalesced)."""
        upcoming = job.trigger.get_next_fire_time(fired_at, now)
        while upcoming is not None and upcoming <= now:
            job.coalesced += 1
            upcoming = job.trigger.get_next_fire_time(upcoming, now)
        return upcoming

    def _fire(self, job: Job, now: datetime) -> None:
        fired_at = job.next_fire_at
        assert fired_at is not None
        job.next_fire_at = self._next_after(job, fired_at, now)
        if job.running:
            job.skipped += 1
            log.info("%s: still running at %s; this run is skipped (a job never runs twice at once)",
                     job.name, fired_at.isoformat())
            return
        job.running = True
        job._thread = threading.Thread(target=self._run, args=(job,), name=f"{self.name}:{job.name}", daemon=True)
        job._thread.start()

    def _run(self, job: Job) -> None:
        failed = False
        try:
            job.work()
        except Exception:  # noqa: BLE001 (one failed run never ends the job)
            failed = True
            log.exception("%s: the run failed; it runs again at its next fire time", job.name)
        finally:
            with self._lock:
                job.running = False
                job.runs += 1
                job.failures += failed

    def _loop(self) -> None:
        while True:
            self._wake.clear()
            with self._lock:
                if self._stopping:
                    return
                now = self.clock.now()
                for job in self._jobs.values():
                    if job.next_fire_at is not None and job.next_fire_at <= now:
                        self._fire(job, now)
                upcoming = [job.next_fire_at for job in self._jobs.values() if job.next_fire_at is not None]
            delay = None if not upcoming else max(0.0, (min(upcoming) - self.clock.now()).total_seconds())
            self.clock.wait(self._wake, delay)

    def start(self) -> Runner:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._stopping = False
        thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        thread.start()
        self._thread = thread  # set once started: a signal between the two must leave nothing to join
        return self

    def stop(self, timeout_seconds: float = 30.0) -> bool:
        """Fire nothing more and wait up to ``timeout_seconds`` (real time) for the running jobs;
        returns whether all have ended (a warning names the ones that have not). Safe to call twice."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread.ident is not None:
            thread.join(timeout_seconds)
        still = []
        for job in self.jobs.values():
            worker = job._thread
            if worker is not None and worker.ident is not None:  # started (a signal may land in between)
                worker.join(timeout_seconds)
                if worker.is_alive():
                    still.append(job.name)
        if still:
            log.warning("%s: still running after stop: %s (a run that never returned?)", self.name, ", ".join(still))
        return not still
