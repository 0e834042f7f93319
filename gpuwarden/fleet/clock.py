"""The one clock every room that reads time takes: injected, so tests advance time.

:class:`Clock` is what the exporter service, the scraper, the runner and the actuator (its limits,
approvals, breaker, lease, ``KubeCluster`` and inventory) take: the wall-clock time as an aware UTC
datetime (:meth:`Clock.now`, what audit entries and snapshots carry) and as epoch seconds
(:meth:`Clock.time`), a monotonic time (for ages and deadlines), and a wait on a stop/wake event
that ends early when the event is set. :data:`SYSTEM_CLOCK` is the real one. :class:`FakeClock`
is time that moves only when told (:meth:`FakeClock.advance`): a thread that waits on it is woken
when the clock passes its deadline, so a test runs a periodic loop one round at a time, with no
sleeps and no timing in its assertions (kueue's injected ``clock.Clock`` and its fake clock are the
model). The periodic loops themselves are one :class:`~gpuwarden.fleet.runner.Runner` per process.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

# How often (real seconds) a thread waiting on a FakeClock looks at its event: Event.set() cannot
# notify the clock, so a set event is seen within this much real time.
_FAKE_POLL_SECONDS = 0.005


@runtime_checkable
class Clock(Protocol):
    def now(self) -> datetime:
        """The wall-clock time as an aware UTC datetime (what audit entries, leases and snapshots carry)."""
        ...

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
    """The real clock: ``datetime.now(UTC)``, ``time.time``, ``time.monotonic`` and ``Event.wait``."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        return event.wait(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()


class ModelClock:
    """The time a stepped model keeps (the simulated fleet's ``now``), as a ``Clock``: rooms that
    stamp or validate samples read it like any other clock; waits take real time."""

    def __init__(self, read_now: Callable[[], datetime]) -> None:
        self._read_now = read_now

    def now(self) -> datetime:
        return self._read_now()

    def time(self) -> float:
        return self.now().timestamp()

    def monotonic(self) -> float:
        return self.time()

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        return event.wait(seconds)


class FakeClock:
    """Time that moves only by :meth:`advance`; waits on it end when it passes their deadline.

    ``start`` is the wall-clock time it shows first, epoch seconds or an aware datetime (the
    monotonic time starts at 0). ``waiting`` is how many threads are parked in :meth:`wait`: a
    test waits for a loop to park before advancing, so that each advance is one round."""

    def __init__(self, start: float | datetime = 1_700_000_000.0):
        if isinstance(start, datetime):
            if start.tzinfo is None:
                raise ValueError(f"FakeClock start {start!r} has no timezone; give an aware datetime (UTC)")
            start = start.timestamp()
        self._offset = float(start)
        self._monotonic = 0.0
        self._changed = threading.Condition()
        self._parked: dict[int, tuple[float, threading.Event]] = {}  # wait -> (deadline or inf, its event)
        self._waits = itertools.count()

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time(), UTC)

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

    def advance(self, seconds: float | timedelta) -> None:
        """Move time on by ``seconds`` (>= 0, or a timedelta) and wake the waits whose deadline it passed."""
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
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
