"""The injected clock (``gpuwarden.fleet.clock``): the fake one moves only when told and wakes the
waits it passes; the loops that take it run one round per tick."""

from __future__ import annotations

import threading
from pathlib import Path

import pandas as pd
import pytest
from builders import START
from polling import tick, wait_for

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock, FakeClock, Repeater
from gpuwarden.store import LocalStore
from gpuwarden.store.scraper import Scraper


def test_both_clocks_speak_the_protocol() -> None:
    assert isinstance(SYSTEM_CLOCK, Clock) and isinstance(FakeClock(), Clock)
    assert not isinstance(lambda: 0.0, Clock)
    event = threading.Event()
    event.set()
    assert SYSTEM_CLOCK.wait(event, 0) and FakeClock().wait(event, None)  # a set event: no waiting at all


def test_fake_time_moves_only_by_advance_and_never_back() -> None:
    clock = FakeClock(1_000.0)
    assert (clock.time(), clock.monotonic()) == (1_000.0, 0.0)
    clock.advance(2.5)
    assert (clock.time(), clock.monotonic()) == (1_002.5, 2.5)
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)


def test_a_wait_ends_when_the_clock_passes_its_deadline_or_its_event_is_set() -> None:
    clock = FakeClock()
    stop = threading.Event()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(clock.wait(stop, 10)))
    waiter.start()
    wait_for(lambda: clock.waiting == 1, what="the thread to park")
    clock.advance(9.5)
    assert clock.waiting == 1  # not yet
    clock.advance(0.5)
    assert clock.waiting == 0  # passed: it no longer counts, even before its thread runs
    waiter.join(5)
    assert woke == [False]
    forever = threading.Thread(target=lambda: woke.append(clock.wait(stop, None)))
    forever.start()
    wait_for(lambda: clock.waiting == 1, what="the thread to park")
    stop.set()
    forever.join(5)
    assert woke == [False, True] and clock.waiting == 0


def test_a_reconcile_round_that_overruns_delays_the_next_one_and_never_doubles_it() -> None:
    from gpuwarden.actuator.loop import Reconciler, RoundReport
    from gpuwarden.actuator.plan import Plan

    clock = FakeClock()
    release = threading.Event()
    rounds: list[float] = []

    class SlowReconciler(Reconciler):
        def reconcile_once(self) -> RoundReport:
            rounds.append(clock.monotonic())
            if len(rounds) == 1:
                release.wait(10)  # the first round overruns three intervals
            return RoundReport(0, Plan(()), ())

    reconciler = SlowReconciler(actuator=None, find=lambda snapshot: [], interval_seconds=60, clock=clock)  # type: ignore[arg-type]
    reconciler.start()
    try:
        tick(clock, 60)
        wait_for(lambda: rounds == [60.0], what="the first round")
        clock.advance(200)  # while it runs: the rounds due at 120 and 180 are missed
        release.set()
        tick(clock, 59)  # the next round is one interval after the slow one ended (at 260), not at once
        assert rounds == [60.0]
        tick(clock, 1)
        wait_for(lambda: len(rounds) == 2, what="the round after the slow one")
    finally:
        reconciler.stop()
    assert rounds == [60.0, 320.0]


def test_scraper_takes_a_plain_callable_as_the_time_its_rows_carry(tmp_path: Path) -> None:
    """The form the demo uses (simulated time): the loop waits on the system clock."""
    scraper = Scraper(["http://127.0.0.1:9/metrics"], LocalStore(tmp_path / "store"), clock=lambda: START)
    assert scraper._clock is SYSTEM_CLOCK and scraper._now() == pd.Timestamp(START)


def test_a_failed_call_is_logged_and_the_repeater_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    calls: list[float] = []

    def work() -> None:
        calls.append(clock.monotonic())
        if len(calls) == 1:
            raise RuntimeError("store full")

    repeater = Repeater("test-repeater", work, 15, clock)
    repeater.start()
    try:
        tick(clock, 15)
        wait_for(lambda: len(calls) == 2, what="the call after the failed one")
    finally:
        assert repeater.stop()
    assert calls == [0.0, 15.0] and not repeater.running
    assert any("test-repeater: the call failed" in r.getMessage() and r.exc_info and str(r.exc_info[1]) == "store full"
               for r in caplog.records)
    with pytest.raises(ValueError, match="interval_seconds"):
        Repeater("bad", work, 0.0)
