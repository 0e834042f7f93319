"""Waiting in tests without fixed sleeps and without timing anything.

``wait_for`` polls a condition up to a deadline (for real threads and servers). ``tick`` moves a
``FakeClock`` on once the loops that wait on it are parked, so that each tick is one round of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from gpuwarden.fleet.clock import FakeClock

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 5.0, what: str = "condition", interval: float = 0.01,
             tolerate_errors: bool = False) -> T:
    """Return ``condition()``'s first truthy value; fail naming ``what`` (and the last error) on timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as error:  # noqa: BLE001 (only when asked: keep polling, report the last error)
            if not tolerate_errors:
                raise
            last_error = error
        else:
            if value:
                return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


def tick(clock: FakeClock, seconds: float, waiters: int = 1, timeout: float = 10.0) -> None:
    """Advance ``clock`` by ``seconds`` once ``waiters`` threads wait on it (their loops are idle)."""
    wait_for(lambda: clock.waiting >= waiters, timeout, f"{waiters} thread(s) to wait on the fake clock")
    clock.advance(seconds)
