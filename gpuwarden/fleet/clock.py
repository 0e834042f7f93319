"""The one clock the long-running loops read and wait on: injected, so tests advance time.

:class:`Clock` is what the exporter service, the scraper and the actuator's reconcile loop take:
the wall-clock time (for timestamps), a monotonic time (for ages and deadlines), and a wait on a
stop/wake event that ends early when the event is set. :data:`SYSTEM_CLOCK` is the real one.
:class:`FakeClock` is time that moves only when told (:meth:`FakeClock.advance`): a thread that
waits on it is woken when the clock passes its deadline, so a test runs an interval loop one round
at a time, with no sleeps and no timing in its assertions (kueue's injected ``clock.Clock`` and
its fake clock are the model). :class:`Repeater` is the one interval loop on a clock: a thread
calling its work every interval (the exporter's collections, the scraper's rounds, the
reconciler's rounds).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

log = logging.getLogger("gpuwarden")

# How often (real seconds) a thread waiting on a FakeClock looks at its event: Event.set() cannot
# notify the clock, so a set event is seen within this much real time.
_FAKE_POLL_SECONDS = 0.005


@runtime_checkable
class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (what timestamps carry)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (what ages and deadlines are measured on)."""
        ...

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        """Block until ``event`` is set or ``seconds`` (None: no limit) have passed on this clock;
        returns whether the event is set."""
        ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and ``Event.wait``."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        return event.wait(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()


class FakeClock:
    """Time that moves only by :meth:`advance`; waits on it end when it passes their deadline.

    ``start_seconds`` is the wall-clock time it shows first (the monotonic time starts at 0).
    ``waiting`` is how many threads are parked in :meth:`wait`: a test waits for a loop to park
    before advancing, so that each advance is one round."""

    def __init__(self, start_seconds: float = 1_700_000_000.0):
        self._offset = float(start_seconds)
        self._monotonic = 0.0
        self._changed = threading.Condition()
        self._parked: dict[int, tuple[float, threading.Event]] = {}  # wait -> (deadline or inf, its event)
        self._waits = itertools.count()

    def time(self) -> float:
        with self._changed:
            return self._offset + self._monotonic

    def monotonic(self) -> float:
        with self._changed:
            return self._monotonic

    @property
    def waiting(self) -> int:
        """Threads parked in :meth:`wait` that will stay parked until time moves: a wait whose
        deadline an advance has passed, or whose event is set, counts no more even before its
        thread wakes."""
        with self._changed:
            return sum(1 for deadline, event in self._parked.values()
                       if deadline > self._monotonic and not event.is_set())

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` (>= 0) and wake the waits whose deadline it passed."""
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward: advance({seconds!r})")
        with self._changed:
            self._monotonic += seconds
            self._changed.notify_all()

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        with self._changed:
            deadline = math.inf if seconds is None else self._monotonic + max(0.0, seconds)
            key = next(self._waits)
            self._parked[key] = (deadline, event)
            try:
                while not event.is_set() and self._monotonic < deadline:
                    self._changed.wait(_FAKE_POLL_SECONDS)
            finally:
                del self._parked[key]
        return event.is_set()

    def __repr__(self) -> str:
        return f"FakeClock(monotonic={self.monotonic():g})"


class Repeater:
    """Call ``work`` on a daemon thread every ``interval_seconds`` of ``clock`` until :meth:`stop`.

    The first call is at :meth:`start` (``first_at_once``) or one interval after it; then the
    calls keep to that grid. One that overruns its interval delays the next one to one interval
    after it ended: calls never overlap and missed ones collapse into one. An exception from
    ``work`` is logged and the loop goes on (a DaemonSet's loop must outlive one bad round)."""

    def __init__(self, name: str, work: Callable[[], object], interval_seconds: float, clock: Clock = SYSTEM_CLOCK,
                 *, first_at_once: bool = True):
        if not (math.isfinite(interval_seconds) and interval_seconds > 0):
            raise ValueError(f"interval_seconds: {interval_seconds} must be a finite number > 0")
        self.name = name
        self.work = work
        self.interval_seconds = float(interval_seconds)
        self.clock = clock
        self.first_at_once = first_at_once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        due = self.clock.monotonic() + (0.0 if self.first_at_once else self.interval_seconds)
        while not self.clock.wait(self._stop, max(0.0, due - self.clock.monotonic())):
            try:
                self.work()
            except Exception:  # noqa: BLE001 (one failed call never ends the loop)
                log.exception("%s: the call failed; trying again next interval", self.name)
            now = self.clock.monotonic()
            due += self.interval_seconds
            if due <= now:  # overran: the missed calls collapse into the next one
                due = now + self.interval_seconds

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_seconds: float = 10.0) -> bool:
        """Stop after the running call (if any), waiting up to ``timeout_seconds`` (real time) for
        it; returns whether the thread has ended (a warning is logged when not). Safe to call twice."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout_seconds)
        if thread.is_alive():
            log.warning("%s still running after stop (a call that never returned?)", self.name)
            return False
        return True
