"""The injected clock (``gpuwarden.fleet.clock``): the fake one moves only when told and wakes the
waits it passes; the jobs of a runner on it run one round per tick (``tests/fleet/test_runner.py`` has the
runner's own rules)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from builders import START
from polling import tick, wait_for

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock, FakeClock
from gpuwarden.fleet.runner import Runner
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
    assert clock.now() == datetime(1970, 1, 1, 0, 16, 42, 500000, tzinfo=UTC)
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)


def test_now_is_an_aware_utc_datetime_that_moves_with_the_clock() -> None:
    start = datetime(2026, 12, 1, 2, 59, tzinfo=UTC)
    clock = FakeClock(start)
    assert clock.now() == start and clock.time() == start.timestamp()
    clock.advance(timedelta(minutes=2))
    assert clock.now() == start + timedelta(minutes=2) and clock.monotonic() == 120.0
    real = SYSTEM_CLOCK.now()
    assert real.tzinfo is UTC and abs(real.timestamp() - SYSTEM_CLOCK.time()) < 5
    with pytest.raises(ValueError, match="no timezone"):
        FakeClock(datetime(2026, 12, 1))


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


def test_a_reconcile_round_that_overruns_is_never_doubled_and_the_next_keeps_to_the_grid() -> None:
    """APScheduler's rules (max_instances=1, coalesce): the fire times at 120, 180 and 240 come while
    the first round runs and are skipped; the next round is at 300, on the interval's grid."""
    from gpuwarden.remediation.loop import Reconciler, RoundReport
    from gpuwarden.remediation.plan import Plan

    clock = FakeClock()
    release = threading.Event()
    rounds: list[float] = []

    class SlowReconciler(Reconciler):
        def reconcile_once(self) -> RoundReport:
            rounds.append(clock.monotonic())
            if len(rounds) == 1:
                release.wait(10)  # the first round overruns three intervals
            return RoundReport(0, Plan(()), ())

    reconciler = SlowReconciler(actuator=None, find=lambda snapshot: [], interval_seconds=60)  # type: ignore[arg-type]
    runner = Runner(clock)
    job = reconciler.register(runner, at_once=False)
    runner.start()
    try:
        tick(clock, 60)
        wait_for(lambda: rounds == [60.0], what="the first round")
        for _ in range(3):
            tick(clock, 60)  # 120, 180, 240: each fire time finds the round still running
        wait_for(lambda: job.skipped == 3, what="three skipped fire times")
        clock.advance(20)
        release.set()  # the slow round ends at 260
        wait_for(lambda: not job.running, what="the slow round to end")
        tick(clock, 39)  # 299: nothing yet, the grid is kept
        assert rounds == [60.0]
        tick(clock, 1)
        wait_for(lambda: len(rounds) == 2, what="the round at 300")
    finally:
        runner.stop()
    assert rounds == [60.0, 300.0] and job.runs == 2


def test_the_scraper_stamps_rows_with_the_time_it_is_given(tmp_path: Path) -> None:
    """The demo's form: the runner waits on the real clock; the rows carry the simulated fleet's time."""
    scraper = Scraper(["http://127.0.0.1:9/metrics"], LocalStore(tmp_path / "store"), sample_time=lambda: START)
    assert scraper.clock is SYSTEM_CLOCK and scraper._now() == pd.Timestamp(START)
    clock = FakeClock(datetime(2026, 12, 1, tzinfo=UTC))
    assert Scraper(["http://x/metrics"], LocalStore(tmp_path / "store"), clock=clock)._now() == pd.Timestamp(clock.now())
