"""A loop's rounds on a runner until SIGTERM, Ctrl-C or ``--rounds``, and what its exit says.

``gpuwarden actuator run`` and ``gpuwarden scheduler run`` run their rounds here. SIGTERM while a
round waits on a slow API server stops the process at once: ``on_stop`` (the API client's abort)
cuts the requests in flight before the runner waits for the round, which is then not counted.
Under ``--rounds`` any failed round makes the exit non-zero (a round that could not read the
cluster acted on nothing); a loop run until stopped fails only when every round did.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuwarden.fleet.runner import Runner


def run_until_stopped(runner: Runner, name: str, work: Callable[[], object], interval_seconds: float,
                      rounds: int | None, on_stop: Callable[[], None] | None = None) -> tuple[int, int]:
    """Run ``work`` on ``runner`` every ``interval_seconds`` (the first at once; a failed one is
    the work's to log, and returns False) until SIGTERM, Ctrl-C or ``rounds`` rounds; the rounds
    run, and those that did not fail. ``on_stop`` (the API client's abort) is called when a signal
    stops it, before the runner waits for the round in flight: a round waiting on a slow API server
    is cut short, and is not counted."""
    from gpuwarden.fleet.triggers import every

    stop = threading.Event()
    signalled = threading.Event()
    started, done, succeeded = [0], [0], [0]

    def round_job() -> None:
        if stop.is_set() or (rounds and started[0] >= rounds):  # fired before the stop took effect
            return
        started[0] += 1  # the runner never runs a job twice at once
        ok = False
        try:
            ok = work() is not False
        finally:
            if ok or not signalled.is_set():
                done[0] += 1
                succeeded[0] += ok
            if rounds and done[0] >= rounds:
                stop.set()

    def on_signal(*_: object) -> None:
        signalled.set()
        stop.set()

    runner.add(name, round_job, every(interval_seconds, runner.clock), at_once=True)
    previous = signal.signal(signal.SIGTERM, on_signal)
    runner.start()
    try:
        stop.wait()
    except KeyboardInterrupt:
        signalled.set()
    finally:
        if signalled.is_set() and on_stop is not None:
            on_stop()
        runner.stop()
        signal.signal(signal.SIGTERM, previous)
    return done[0], succeeded[0]


def failed_rounds(done: int, succeeded: int, rounds: int | None, what: str) -> str | None:
    """Why a loop's exit is non-zero, or None: under ``--rounds`` any failed round (a round that
    could not read the cluster acted on nothing), else every round failed."""
    if not done or succeeded == done or (rounds is None and succeeded):
        return None
    if succeeded == 0:
        return f"every {what} failed ({done} of {done}); see the errors above"
    return f"{done - succeeded} of {done} {what}s failed (--rounds {rounds}); see the errors above"
