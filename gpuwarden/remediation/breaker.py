"""The circuit breaker: opened when a safety limit is reached, closed only by a person.

Its state is the audit log's (:func:`.audit.breaker_open_in`: open after the last ``breaker-open``
entry until a ``breaker-reset``), so a restart does not close it. The verdict reads that state;
tripping and resetting write it, and need the audit log and the time, never the applier: the
``gpuwarden actuator reset`` command resets with nothing but the log.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gpuwarden.fleet.capabilities import EventSink
from gpuwarden.fleet.clock import Clock

from .audit import AuditEntry, AuditLog, Outcome, breaker_open_in
from .metrics import RemediationMetrics
from .verdict import ALLOWED, Verdict, refused

log = logging.getLogger("gpuwarden.actuator")

BREAKER_KIND = "circuit-breaker"  # its audit entries' kind; their target is the actuator's name
WAITING = "circuit breaker open: waiting for a person"
OPEN = refused(Outcome.BLOCKED, f"{WAITING} (gpuwarden actuator reset)")


def breaker_verdict(records: Iterable[Mapping[str, Any]]) -> Verdict:
    """Open (nothing is applied) after the history's last trip until a reset after it."""
    return OPEN if breaker_open_in(records) else ALLOWED


def record_breaker_trip(audit: AuditLog, why: str, *, clock: Clock, mode: Any, name: str,
                        events: object = None, metrics: RemediationMetrics | None = None) -> AuditEntry:
    """Open the breaker for ``why``: the metric, a warning, an Event where ``events`` takes one
    (an :class:`EventSink`), then the audit entry that keeps it open across restarts."""
    if metrics is not None:
        metrics.breaker_open.set(1)
    message = f"circuit breaker opened: {why}; nothing more is applied until a person resets it"
    log.warning("actuator: %s", message)
    if isinstance(events, EventSink):
        try:
            events.record_event("CircuitBreakerOpen", message)
        except Exception as error:  # noqa: BLE001 the Event is a courtesy; the audit entry and metric are the record
            log.warning("actuator: could not post the breaker Event: %s", error)
    entry = AuditEntry(clock.now(), mode, Outcome.BREAKER_OPEN, BREAKER_KIND, name, why, message, by=name)
    audit.record(entry)
    return entry


def record_breaker_reset(audit: AuditLog, by: str, comment: str = "", *, at: datetime, mode: Any,
                         name: str = "actuator", metrics: RemediationMetrics | None = None) -> AuditEntry:
    """Close the breaker: ``by`` (a person) looked at what tripped it, at ``at``."""
    if metrics is not None:
        metrics.breaker_open.set(0)
    entry = AuditEntry(at, mode, Outcome.BREAKER_RESET, BREAKER_KIND, name, comment or "reset", f"reset by {by}", by=by)
    audit.record(entry)
    return entry
