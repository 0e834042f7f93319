"""Polling with a deadline, never fixed sleeps: shared by the tests that wait on threads and servers."""

from __future__ import annotations

import time


def wait_for(condition, timeout: float = 5.0, what: str = "condition", interval: float = 0.01,
             tolerate_errors: bool = False):
    """Return ``condition()``'s first truthy value; fail naming ``what`` (and the last error) on timeout."""
    deadline = time.monotonic() + timeout
    last_error = None
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
