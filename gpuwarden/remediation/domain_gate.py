"""The failure-domain breaker (:mod:`.domains`) as the applier asks it, with what it records.

Each round starts by closing the domains that have room again; then every disruptive action gets the
domains' verdict, asked after the pace and before the budget. A transition (open, half-open, closed) is
an audit entry (kind ``domain-breaker``, outcome ``paced``), so a restart folds the log back into the
same states, and a ``FailureDomainBreaker`` Event where the cluster takes Events. Observe mode asks the
same question and records nothing of the breaker: it reports "would be held" and the log stays the
record of what was done.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gpuwarden.fleet import Action, ClusterSnapshot
from gpuwarden.fleet.capabilities import EventSink

from .audit import AuditEntry, AuditLog, Outcome
from .domains import DOMAIN_BREAKER_KIND, DomainPolicy, Transition, closing, domain_states, domain_verdict
from .pacing import DISRUPTIVE, FindingLike, pace_key
from .verdict import Verdict

log = logging.getLogger(__name__)


class DomainGate:
    """One actuator's failure-domain breaker: its policy, the audit log its states live in, and the
    nodes the current round has taken (not yet in the snapshot)."""

    def __init__(self, policy: DomainPolicy, audit: AuditLog, events: object = None, name: str = "actuator") -> None:
        self.policy, self.audit, self.events, self.name = policy, audit, events, name
        self._taken: set[str] = set()
        self.written: list[AuditEntry] = []  # this round's transitions, for the round's answer

    def begin(self, snapshot: ClusterSnapshot, now: datetime, mode: Any, record: bool = True) -> None:
        """A new round: nothing taken yet; domains with room again close (on this snapshot's evidence)."""
        self._taken, self.written = set(), []
        if record:
            for transition in closing(snapshot, domain_states(self.audit.records()), self.policy):
                self._record(transition, now, mode)

    def verdict(self, action: Action, findings: Sequence[FindingLike], snapshot: ClusterSnapshot, now: datetime,
                mode: Any, record: bool = True) -> Verdict:
        """The domains' verdict on ``action``; an allowed disruptive action counts as taken this round
        (a drain waiting for its checkpoint too: it goes soon, and holding one more is the safe side)."""
        answer = domain_verdict(action, findings, snapshot, now, domain_states(self.audit.records()), self.policy,
                                self._taken)
        if record:
            for transition in answer.transitions:
                self._record(transition, now, mode)
        if answer.verdict.allowed and action.kind in DISRUPTIVE:
            self._taken.add(pace_key(action.kind, findings, action.target, snapshot)[1])
        return answer.verdict

    def _record(self, transition: Transition, now: datetime, mode: Any) -> None:
        message = f"failure-domain breaker {transition.state}: {transition.why}"
        entry = AuditEntry(now, mode, Outcome.PACED, DOMAIN_BREAKER_KIND, transition.domain, transition.why, message,
                           params=transition.params(), by=self.name)
        self.audit.record(entry)  # the record first: the Event is a courtesy
        self.written.append(entry)
        log.warning("actuator: %s", message)
        if isinstance(self.events, EventSink):
            try:
                self.events.record_event("FailureDomainBreaker", message)
            except Exception as error:  # noqa: BLE001 the audit entry is the record
                log.warning("actuator: could not post the failure-domain Event: %s", error)
