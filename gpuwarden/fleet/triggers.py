"""APScheduler 3's triggers, started on the injected clock, for the :class:`~gpuwarden.fleet.runner.Runner`.

``IntervalTrigger`` takes its start from ``datetime.now()`` unless given one, so :func:`every` always
gives it the clock's ``now``; ``CronTrigger`` needs no start. Both compute fire times from the ``now``
they are handed, which is what lets a ``FakeClock`` drive them. The exporter never imports this
module (an import-linter contract forbids it APScheduler): it uses :class:`~gpuwarden.fleet.runner.Every`.
"""

from __future__ import annotations

import math
from datetime import UTC, timedelta

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from .clock import Clock


def every(seconds: float, clock: Clock) -> IntervalTrigger:
    """Fire every ``seconds`` on ``clock``, the first time one interval from now (APScheduler's
    default start, taken from ``clock``); ``Runner.add(..., at_once=True)`` adds a run now."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"interval seconds: {seconds!r} must be a finite number > 0")
    return IntervalTrigger(seconds=seconds, start_date=clock.now() + timedelta(seconds=seconds), timezone=UTC)


def cron(*, day_of_week: str = "*", hour: str | int = "*", minute: str | int = 0) -> CronTrigger:
    """A ``CronTrigger`` in UTC; ValueError naming the field and value APScheduler refused."""
    try:
        return CronTrigger(day_of_week=day_of_week, hour=hour, minute=minute, timezone=UTC)
    except ValueError as error:
        raise ValueError(f"cron day_of_week={day_of_week!r} hour={hour!r} minute={minute!r}: {error} "
                         "(days: mon..sun, ranges mon-fri, lists tue,thu, or *)") from None
