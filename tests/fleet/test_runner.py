"""The one runner (``gpuwarden.fleet.runner``) on a ``FakeClock``, fired by APScheduler 3's own
triggers: their next-fire-time computation takes the ``now`` the runner reads from the clock, so
interval and cron jobs run at the fake clock's times, a slow job never runs twice at once, and
missed fire times coalesce into one run."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from apscheduler.triggers.interval import IntervalTrigger
from polling import tick, wait_for

from gpuwarden.fleet.clock import FakeClock
from gpuwarden.fleet.runner import Every, Runner
from gpuwarden.fleet.triggers import cron, every

MONDAY_NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def started(clock: FakeClock) -> Runner:
    return Runner(clock).start()


def test_an_interval_job_runs_at_once_and_then_on_its_grid_of_fake_time() -> None:
    clock = FakeClock(MONDAY_NOON)
    runner = started(clock)
    ran: list[datetime] = []
    job = runner.add("collect", lambda: ran.append(clock.now()), every(15, clock), at_once=True)
    assert isinstance(job.trigger, IntervalTrigger)  # APScheduler's own trigger
    try:
        wait_for(lambda: job.runs == 1, what="the first run, at once")
        for n in (2, 3):
            tick(clock, 15)
            wait_for(lambda: job.runs == n, what=f"run {n}")  # noqa: B023
        tick(clock, 14)  # one second short of the next fire time: nothing
        assert job.runs == 3 and job.next_fire_at == MONDAY_NOON + timedelta(seconds=45)
    finally:
        assert runner.stop()
    assert ran == [MONDAY_NOON + timedelta(seconds=s) for s in (0, 15, 30)]


def test_a_cron_job_fires_at_the_cron_times_of_the_fake_clock() -> None:
    clock = FakeClock(MONDAY_NOON)
    runner = started(clock)
    ran: list[datetime] = []
    job = runner.add("maintenance", lambda: ran.append(clock.now()), cron(day_of_week="tue,thu", hour=2))
    tuesday_two = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
    assert job.next_fire_at == tuesday_two
    try:
        tick(clock, tuesday_two - MONDAY_NOON - timedelta(seconds=1))
        assert job.runs == 0
        tick(clock, 1)
        wait_for(lambda: job.runs == 1, what="Tuesday 02:00")
        assert job.next_fire_at == tuesday_two + timedelta(days=2)  # Thursday
    finally:
        runner.stop()
    assert ran == [tuesday_two]


def test_a_slow_job_never_runs_twice_at_once_and_other_jobs_keep_their_times() -> None:
    clock = FakeClock(MONDAY_NOON)
    runner = started(clock)
    release = threading.Event()
    inside, most_inside, fast = [0], [0], []
    lock = threading.Lock()

    def slow() -> None:
        with lock:
            inside[0] += 1
            most_inside[0] = max(most_inside[0], inside[0])
        release.wait(10)
        with lock:
            inside[0] -= 1

    slow_job = runner.add("slow", slow, every(10, clock), at_once=True)
    fast_job = runner.add("fast", lambda: fast.append(clock.monotonic()), every(10, clock), at_once=True)
    try:
        wait_for(lambda: slow_job.running and fast_job.runs == 1, what="both first runs")
        for n in (2, 3, 4):
            tick(clock, 10)
            wait_for(lambda: fast_job.runs == n, what=f"fast run {n}")  # noqa: B023
        assert slow_job.skipped == 3 and slow_job.runs == 0 and most_inside[0] == 1
        release.set()
        wait_for(lambda: slow_job.runs == 1, what="the slow run to end")
        tick(clock, 10)
        wait_for(lambda: slow_job.runs == 2 and fast_job.runs == 5, what="both at 40 s")
    finally:
        runner.stop()
    assert fast == [0.0, 10.0, 20.0, 30.0, 40.0] and most_inside[0] == 1


def test_missed_fire_times_coalesce_into_one_run_on_the_grid() -> None:
    clock = FakeClock(MONDAY_NOON)
    runner = started(clock)
    ran: list[float] = []
    job = runner.add("compact", lambda: ran.append(clock.monotonic()), every(60, clock))
    try:
        tick(clock, 60 * 10 + 5)  # the process was away for ten fire times
        wait_for(lambda: job.runs == 1, what="one run for the ten missed")
        assert job.coalesced == 9 and job.next_fire_at == MONDAY_NOON + timedelta(minutes=11)
        tick(clock, 55)
        wait_for(lambda: job.runs == 2, what="the next fire time")
    finally:
        runner.stop()
    assert ran == [605.0, 660.0]


def test_a_failed_run_is_logged_and_the_job_runs_again(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    runner = started(clock)
    calls: list[float] = []

    def work() -> None:
        calls.append(clock.monotonic())
        if len(calls) == 1:
            raise RuntimeError("store full")

    job = runner.add("scrape", work, every(15, clock), at_once=True)
    try:
        wait_for(lambda: job.runs == 1, what="the failed run")
        tick(clock, 15)
        wait_for(lambda: job.runs == 2, what="the run after the failed one")
    finally:
        assert runner.stop()
    assert calls == [0.0, 15.0] and job.failures == 1
    assert any("scrape: the run failed" in r.getMessage() and r.exc_info and str(r.exc_info[1]) == "store full"
               for r in caplog.records)


def test_a_job_name_is_registered_once_and_intervals_must_be_positive() -> None:
    clock = FakeClock()
    runner = Runner(clock)
    runner.add("reconcile", lambda: None, every(60, clock))
    with pytest.raises(ValueError, match="job 'reconcile' is already registered; jobs: reconcile"):
        runner.add("reconcile", lambda: None, every(60, clock))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            every(bad, clock)
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            Every(bad, clock.now())
    with pytest.raises(ValueError, match="day_of_week='someday'.*mon-fri"):
        cron(day_of_week="someday", hour=2)


@pytest.mark.parametrize("seconds, start_offset", [(15.0, 0.0), (7.5, 3.0), (3600.0, -100.0)])
def test_the_exporters_interval_trigger_fires_when_apschedulers_does(seconds: float, start_offset: float) -> None:
    """``Every`` is for the exporter's image, which has no APScheduler: same fire times as
    ``IntervalTrigger``, from the first (previous None, ``now`` before, at or after the start) on."""
    start = MONDAY_NOON + timedelta(seconds=start_offset)
    ours, theirs = Every(seconds, start), IntervalTrigger(seconds=seconds, start_date=start, timezone=UTC)
    for now_offset in (-50.0, 0.0, 1.0, seconds, 2.5 * seconds + 1):
        now = MONDAY_NOON + timedelta(seconds=now_offset)
        previous_ours = previous_theirs = None
        for _ in range(4):
            previous_ours = ours.get_next_fire_time(previous_ours, now)
            previous_theirs = theirs.get_next_fire_time(previous_theirs, now)
            assert previous_ours == previous_theirs, (now_offset, previous_ours, previous_theirs)


def test_the_first_fire_time_is_one_interval_after_the_trigger_was_made_or_now_when_asked() -> None:
    """As APScheduler: an interval job first fires one interval out, and ``at_once`` is its
    ``next_run_time=now``; time passing between making the trigger and adding the job moves neither."""
    clock = FakeClock(MONDAY_NOON)
    runner = Runner(clock)
    later, soon = every(15, clock), every(15, clock)
    clock.advance(0.25)
    assert runner.add("later", lambda: None, later).next_fire_at == MONDAY_NOON + timedelta(seconds=15)
    assert runner.add("soon", lambda: None, soon, at_once=True).next_fire_at == clock.now()
