"""The maintenance window: disruptive actions only while it is open ("Tue/Thu 02:00-05:00").

A window is written ``DAYS HH:MM-HH:MM`` in UTC (``tue,thu 02:00-05:00``; DAYS as cron has them:
``mon-fri``, ``sat,sun``, ``*``); an end at or before the start runs past midnight. Its openings are
an APScheduler ``CronTrigger`` and whether it is open is asked of that trigger's own next-fire-time
computation with the ``now`` of the injected clock: the window is open at ``now`` when it opened in
the last window length. Outside it the actuator holds back cordon, taint, drain, evict, suspend and
preempt (uncordon, untaint, resume, notify and priority changes take nothing away and go on); a
held action is not a fault, so it never trips the circuit breaker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from apscheduler.triggers.cron import CronTrigger

from gpuwarden.fleet import Action, ActionKind
from gpuwarden.fleet.triggers import cron

from .audit import Outcome
from .verdict import ALLOWED, Verdict, refused

DISRUPTIVE = frozenset({ActionKind.CORDON, ActionKind.TAINT, ActionKind.DRAIN, ActionKind.EVICT,
                        ActionKind.SUSPEND, ActionKind.PREEMPT})
_FORM = re.compile(r"^\s*(?P<days>\S+)\s+(?P<h1>\d{1,2}):(?P<m1>\d{2})\s*-\s*(?P<h2>\d{1,2}):(?P<m2>\d{2})\s*$")
_TINY = timedelta(microseconds=1)  # the window is [open, open + length): at its end it is closed


@dataclass(frozen=True)
class MaintenanceWindow:
    text: str
    opens: CronTrigger
    length: timedelta

    @classmethod
    def parse(cls, text: str) -> MaintenanceWindow:
        """``tue,thu 02:00-05:00`` -> a window; ValueError naming the text and the form allowed."""
        form = "expected DAYS HH:MM-HH:MM in UTC, e.g. 'tue,thu 02:00-05:00' (DAYS: mon..sun, mon-fri, tue,thu or *)"
        match = _FORM.match(text or "")
        if match is None:
            raise ValueError(f"maintenance window {text!r}: {form}")
        h1, m1, h2, m2 = (int(match[k]) for k in ("h1", "m1", "h2", "m2"))
        if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2):
            raise ValueError(f"maintenance window {text!r}: {h1:02d}:{m1:02d}-{h2:02d}:{m2:02d} is not a time of day; {form}")
        length = timedelta(hours=h2 - h1, minutes=m2 - m1)
        if length <= timedelta(0):  # runs past midnight
            length += timedelta(days=1)
        try:
            opens = cron(day_of_week=match["days"].lower(), hour=h1, minute=m1)
        except ValueError as error:
            raise ValueError(f"maintenance window {text!r}: {error}") from None
        return cls(text.strip(), opens, length)

    def is_open(self, now: datetime) -> bool:
        opened = self.next_open(now - self.length + _TINY)
        return opened is not None and opened <= now

    def next_open(self, now: datetime) -> datetime | None:
        """The first opening at or after ``now`` (the trigger's next fire time)."""
        opens: datetime | None = self.opens.get_next_fire_time(None, now)
        return opens

    def holds_back(self, action: Action, now: datetime) -> str | None:
        """Why ``action`` waits at ``now`` (a disruptive action outside the window), or None."""
        if action.kind not in DISRUPTIVE or self.is_open(now):
            return None
        opens = self.next_open(now)
        return (f"outside the maintenance window ({self.text} UTC): a {action.kind.value} waits"
                + (f" until it opens at {opens:%a %Y-%m-%d %H:%M} UTC" if opens else ""))

    def __str__(self) -> str:
        return self.text


def window_verdict(action: Action, now: datetime, window: MaintenanceWindow | None) -> Verdict:
    """The maintenance window's verdict on ``action`` at ``now``: a disruptive action outside the
    window waits (blocked, recorded once by the applier; never a fault); no window, no wait."""
    why = window.holds_back(action, now) if window is not None else None
    return ALLOWED if why is None else refused(Outcome.BLOCKED, why)
