"""Remediation paced by outcome (Karpenter's node-repair slow start), inside the circuit breaker.

Per node pool and per detector (the finding kind that asked for the action), at most ``window``
disruptive actions (cordon, drain, taint, evict) are in flight. The window starts at one, doubles
after each proven success and falls back to one after a failure, and a jittered cooldown separates
two rounds that start actions of the same pool and detector (the starts of one round are one batch):
- **in flight**: applied (or left cordoned and waiting to retry, a drain's PDB or pods allowed to
  finish) and not yet judged;
- **proven**: the node Ready (no ``node.kubernetes.io/not-ready`` or ``unreachable`` taint, which
  the node lifecycle controller sets) with no open health finding for ``proven_after_seconds``;
- **failed**: the action was refused or errored, the finding came back after the node had gone
  quiet (a flapping detector), or nothing was proven within ``give_up_after_seconds``.
The breaker and the hourly and node-share limits stay the outer limit: pacing only holds actions
back, never trips the breaker, and a held action is applied at a later round once the pace allows.

State lives in the audit log, like the rest of the actuator's: every start and verdict is a
``paced`` entry carrying the pool, detector, node, window and the cooldown's end, so a restart
folds the log back into the same windows (:func:`pace_from_records`; the Actions page reads the
same fold). Only how long an in-flight node has been quiet is kept in memory: after a restart the
proving time starts again, which can only make the pace slower. Whether the pace holds an action
back is :func:`pace_verdict`, a function of that state, the policy, the snapshot and ``now``; the
:class:`Pacer` keeps the state between rounds and makes the events the applier records.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any


from gpuwarden.fleet import Action, ActionKind, ClusterSnapshot, Finding

from .audit import AuditEntry, Outcome, parse_at
from .metrics import RemediationMetrics
from .verdict import ALLOWED, Verdict, refused

DISRUPTIVE = (ActionKind.CORDON, ActionKind.DRAIN, ActionKind.TAINT, ActionKind.EVICT)
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
PACE_KIND = "pace"  # the audit entries' kind; their outcome is Outcome.PACED



@dataclass(frozen=True)
class PacingPolicy:
    """How fast remediation may go. Durations are the proof and the patience asked of each repair."""

    initial_in_flight: int = 1
    max_in_flight: int = 32
    proven_after_seconds: float = 300.0  # Ready with no open finding this long: the repair held
    give_up_after_seconds: float = 3600.0  # not proven this long after it started: a failure
    cooldown_seconds: float = 60.0  # between two rounds that start actions of one pool and detector
    jitter_ratio: float = 0.5  # the cooldown is stretched by a random 0..jitter_ratio of itself
    seed: int | None = None  # the jitter's random_state (tests); None: from the system

    def __post_init__(self) -> None:
        if not 1 <= self.initial_in_flight <= self.max_in_flight:
            raise ValueError(f"initial_in_flight: {self.initial_in_flight} must be in 1..max_in_flight "
                             f"({self.max_in_flight})")
        for name in ("proven_after_seconds", "give_up_after_seconds", "cooldown_seconds", "jitter_ratio"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be >= 0")


Key = tuple[str, str]  # (pool, detector)


@dataclass
class Flight:
    key: Key
    started_at: datetime
    quiet_since: datetime | None = None  # first round seen Ready and with no open finding (memory only)


@dataclass
class PaceState:
    """The pace the audit log leaves: windows, what is in flight (by node), cooldowns."""

    windows: dict[Key, int] = field(default_factory=dict)
    in_flight: dict[str, Flight] = field(default_factory=dict)
    next_at: dict[Key, datetime] = field(default_factory=dict)

    def window(self, key: Key, policy: PacingPolicy) -> int:
        return self.windows.get(key, policy.initial_in_flight)

    def flying(self, key: Key) -> int:
        return sum(1 for f in self.in_flight.values() if f.key == key)

    def keys(self) -> list[Key]:
        return sorted(set(self.windows) | {f.key for f in self.in_flight.values()})

    def apply(self, record: Mapping[str, Any]) -> None:
        """Fold one ``paced`` audit record in."""
        params = record.get("params") or {}
        key = (str(params.get("pool", "")), str(params.get("detector", "")))
        at = parse_at(record.get("at"))
        node = str(params.get("node", ""))
        if "window" in params:
            self.windows[key] = int(params["window"])
        if (next_at := parse_at(params.get("next_at"))) is not None:
            self.next_at[key] = next_at
        if params.get("verdict") == "started" and at is not None:
            self.in_flight[node] = Flight(key, at)
        elif params.get("verdict") in ("proven", "failed"):
            self.in_flight.pop(node, None)


def pace_from_records(records: Iterable[Mapping[str, Any]]) -> PaceState:
    state = PaceState()
    for record in records:
        if record.get("kind") == PACE_KIND:
            state.apply(record)
    return state


FindingLike = Finding | Mapping[str, Any]  # a finding, or its audit record (approve mode reads those back)


def _first(findings: Sequence[FindingLike], field_name: str) -> str | None:
    if not findings:
        return None
    first = findings[0]
    value = first.get(field_name) if isinstance(first, Mapping) else getattr(first, field_name)
    return None if value is None else str(value)


def pace_key(kind: ActionKind, findings: Sequence[FindingLike], target: str,
             snapshot: ClusterSnapshot) -> tuple[Key, str]:
    """(pool, detector) and the node an action disrupts: the first finding is the one that chose
    the action (the plan puts the strongest first)."""
    node = (_first(findings, "node") or target) if kind == ActionKind.EVICT else target
    pools = {n.name: n.pool for n in snapshot.nodes}
    return (pools.get(node, "default"), _first(findings, "kind") or "unknown"), node


def ready(snapshot: ClusterSnapshot, node: str) -> bool:
    names = {n.name for n in snapshot.nodes}
    taints = snapshot.taints.get(node, ())
    return node in names and not any(t.split("=", 1)[0].split(":", 1)[0] in NOT_READY_TAINTS for t in taints)


@dataclass(frozen=True)
class PaceEvent:
    """A pace event to record: a start or a judgement, with the window it leaves."""

    key: Key
    node: str
    verdict: str  # started | proven | failed
    window: int
    in_flight: int
    next_at: datetime | None
    why: str

    def params(self) -> dict[str, Any]:
        return {"pool": self.key[0], "detector": self.key[1], "node": self.node, "verdict": self.verdict,
                "window": self.window, "in_flight": self.in_flight,
                "next_at": self.next_at.isoformat() if self.next_at else None}

    def entry(self, at: datetime, mode: Any, by: str) -> AuditEntry:
        """The audit entry that records it (kind ``pace``, target ``POOL/DETECTOR``)."""
        return AuditEntry(at, mode, Outcome.PACED, PACE_KIND, f"{self.key[0]}/{self.key[1]}", self.why,
                          f"{self.verdict} on {self.node}: window {self.window}, {self.in_flight} in flight",
                          params=self.params(), by=by)


def why_held(state: PaceState, policy: PacingPolicy, kind: ActionKind, key: Key, node: str, now: datetime,
             extra: int = 0, batch: Set[Key] = frozenset()) -> str | None:
    """Why the pace holds a disruptive action on ``node`` back now (None: it may go). ``extra``:
    starts counted this round that are not in the state (observe mode); ``batch``: keys that
    started actions this round, which share one cooldown."""
    if kind not in DISRUPTIVE or node in state.in_flight:
        return None  # not disruptive, or the same repair going on (a drain's retry)
    window, flying = state.window(key, policy), state.flying(key) + extra
    pool, detector = key
    if flying >= window:
        return f"pace: {flying} of {window} in flight for {detector} in pool {pool} (slow start)"
    until = state.next_at.get(key)
    if until is not None and now < until and not extra and key not in batch:
        return f"pace: cooldown for {detector} in pool {pool} until {until.isoformat()}"
    return None


def pace_verdict(action: Action, findings: Sequence[FindingLike], snapshot: ClusterSnapshot, now: datetime,
                 state: PaceState, policy: PacingPolicy, *, batch: Set[Key] = frozenset(),
                 extra_starts: int = 0) -> Verdict:
    """The pace's verdict on ``action`` at ``now``: a disruptive action is held while its pool and
    detector have their window's worth in flight, or until the cooldown after their last batch.
    ``state`` is the pace the audit history leaves (:func:`pace_from_records`)."""
    if action.kind not in DISRUPTIVE:
        return ALLOWED
    key, node = pace_key(action.kind, findings, action.target, snapshot)
    why = why_held(state, policy, action.kind, key, node, now, extra_starts, batch)
    return ALLOWED if why is None else refused(Outcome.HELD, why)


class Pacer:
    """The slow start over the audit log's pace state. Not thread-safe: the actuator's lock holds."""

    def __init__(self, policy: PacingPolicy, records: Iterable[Mapping[str, Any]] = (),
                 metrics: RemediationMetrics | None = None) -> None:
        self.policy = policy
        self.metrics = metrics
        self.state = pace_from_records(records)
        self._random = random.Random(policy.seed)
        self._batch: set[Key] = set()  # keys that started actions this round: one cooldown for the batch
        self.export()

    def _cooldown(self, now: datetime) -> datetime:
        stretch = 1.0 + self._random.uniform(0.0, self.policy.jitter_ratio)
        return now + timedelta(seconds=self.policy.cooldown_seconds * stretch)

    def _event(self, key: Key, node: str, verdict: str, now: datetime, why: str) -> PaceEvent:
        state, policy = self.state, self.policy
        window = state.window(key, policy)
        if verdict == "proven":
            window = min(policy.max_in_flight, window * 2)
        elif verdict == "failed":
            window = policy.initial_in_flight
        fresh = verdict == "failed" or (verdict == "started" and key not in self._batch)
        next_at = self._cooldown(now) if fresh else state.next_at.get(key)
        if verdict == "started":
            self._batch.add(key)
            state.in_flight[node] = Flight(key, now)
        else:
            state.in_flight.pop(node, None)
        state.windows[key] = window
        if next_at is not None:
            state.next_at[key] = next_at
        return PaceEvent(key, node, verdict, window, state.flying(key), next_at, why)

    # -- each round -----------------------------------------------------------------------------
    def observe(self, snapshot: ClusterSnapshot, open_by_node: Mapping[str, Sequence[Finding]],
                now: datetime) -> list[PaceEvent]:
        """Judge what is in flight on this round's snapshot and open findings (a new round begins)."""
        self._batch.clear()
        out = []
        proof = timedelta(seconds=self.policy.proven_after_seconds)
        for node, flight in sorted(self.state.in_flight.items()):
            is_ready, findings = ready(snapshot, node), open_by_node.get(node, ())
            if is_ready and not findings:
                flight.quiet_since = flight.quiet_since or now
                if now - flight.quiet_since >= proof:
                    out.append(self._event(flight.key, node, "proven", now, f"{node} Ready with no open finding for "
                                           f"{(now - flight.quiet_since).total_seconds():.0f} s"))
                continue
            if flight.quiet_since is not None and findings:
                kinds = ", ".join(sorted({str(f.kind) for f in findings}))
                out.append(self._event(flight.key, node, "failed", now,
                                       f"{kinds} back on {node} after it had gone quiet (a flapping detector?)"))
                continue
            flight.quiet_since = None
            if (now - flight.started_at).total_seconds() >= self.policy.give_up_after_seconds:
                why = "not Ready" if not is_ready else f"{len(findings)} finding(s) still open"
                out.append(self._event(flight.key, node, "failed", now, f"{node} not proven within "
                                       f"{self.policy.give_up_after_seconds:.0f} s ({why})"))
        self.export()
        return out

    def verdict(self, action: Action, findings: Sequence[FindingLike], snapshot: ClusterSnapshot, now: datetime,
                starts: dict[Key, int] | None = None) -> Verdict:
        """:func:`pace_verdict` on this pace and round; ``starts`` counts observe mode's would-be
        starts (one more for each action allowed)."""
        if action.kind not in DISRUPTIVE:
            return ALLOWED
        key, _ = pace_key(action.kind, findings, action.target, snapshot)
        extra = starts.get(key, 0) if starts is not None else 0
        verdict = pace_verdict(action, findings, snapshot, now, self.state, self.policy, batch=self._batch,
                               extra_starts=extra)
        if starts is not None and verdict.allowed:
            starts[key] = extra + 1
        return verdict

    def outcome(self, action: Action, findings: Sequence[FindingLike], snapshot: ClusterSnapshot, now: datetime,
                took: bool, what: str) -> PaceEvent | None:
        """A disruptive action's start (``took``: applied, or a drain left cordoned to retry) or failure."""
        if action.kind not in DISRUPTIVE:
            return None
        key, node = pace_key(action.kind, findings, action.target, snapshot)
        why = f"{action.kind.value} {action.target}: {what}"
        return self.started(key, node, now, why) if took else self.failed(key, node, now, why)

    def started(self, key: Key, node: str, now: datetime, why: str) -> PaceEvent | None:
        if node in self.state.in_flight:
            return None
        event = self._event(key, node, "started", now, why)
        self.export()
        return event

    def failed(self, key: Key, node: str, now: datetime, why: str) -> PaceEvent:
        event = self._event(key, node, "failed", now, why)
        self.export()
        return event

    def export(self) -> None:
        for key in self.state.keys():
            if self.metrics is not None:
                self.metrics.pace.labels(*key).set(self.state.window(key, self.policy))
                self.metrics.in_flight.labels(*key).set(self.state.flying(key))



def pace_rows(records: Sequence[Mapping[str, Any]], policy: PacingPolicy = PacingPolicy()) -> list[dict[str, Any]]:
    """The pace per pool and detector as the audit log leaves it (the Actions page's table): the
    window, what is in flight (nodes), the cooldown's end and the last start or verdict."""
    state = pace_from_records(records)
    last: dict[Key, str] = {}
    for record in records:
        params = record.get("params") or {}
        if record.get("kind") == PACE_KIND:
            last[(str(params.get("pool", "")), str(params.get("detector", "")))] = (
                f"{params.get('verdict')} on {params.get('node')} at {record.get('at')}")
    rows = []
    for key in state.keys():
        pool, detector = key
        until = state.next_at.get(key)
        rows.append({"pool": pool, "detector": detector, "window": state.window(key, policy),
                     "in_flight": state.flying(key),
                     "nodes_in_flight": ", ".join(sorted(n for n, f in state.in_flight.items() if f.key == key)),
                     "cooldown_until": until.isoformat() if until else "", "last": last.get(key, "")})
    return rows
