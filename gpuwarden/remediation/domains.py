"""Failure domains: disruptive repairs budgeted per node pool, rack and NVLink domain.

A rack's power or switch event makes many nodes look faulty at once. The fleet-wide limits (the
hourly count, the node share) see a fleet; this gate sees each failure domain of the node an action
disrupts: its pool, its rack and its NVLink domain (``Node.topology``, from the node labels the
inventory reads; a node's NVLink domain that is only its own name is no domain). In each, at most
``max_unhealthy_ratio`` of the nodes (Karpenter's 20% per NodePool by default; at least one node)
may be out of scheduling or not Ready, counting the ones this round takes.

An action that would go over is held (``held-by-pace``) and the domain's breaker **opens**; after
``cooldown_seconds`` it is **half-open**: one probe action in the domain is allowed, then it is open
again for another cool-down; it **closes** on evidence, once the domain has room again (fewer of its
nodes down than its share, so none where the share is one node). Every transition is an audit entry
(kind ``domain-breaker``, outcome ``paced``, its ``params`` naming the domain, the state, the nodes down and the limit), so it is never
silent and a restart folds the log back into the same states (:func:`domain_states`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from gpuwarden.fleet import Action, ClusterSnapshot, Node

from .audit import Outcome, parse_at
from .limits import out_of_scheduling
from .pacing import DISRUPTIVE, FindingLike, pace_key, ready
from .verdict import ALLOWED, Verdict, refused

DOMAIN_BREAKER_KIND = "domain-breaker"  # its audit entries' kind; their target is the domain
OPEN, HALF_OPEN, CLOSED = "open", "half-open", "closed"


@dataclass(frozen=True)
class DomainPolicy:
    max_unhealthy_ratio: float = 0.2  # Karpenter's node-repair default per NodePool
    cooldown_seconds: float = 1800.0  # open this long before one probe action is allowed

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_unhealthy_ratio <= 1.0 or math.isnan(self.max_unhealthy_ratio):
            raise ValueError(f"max_unhealthy_ratio: {self.max_unhealthy_ratio} not in 0..1")
        if not 0.0 <= self.cooldown_seconds < math.inf:
            raise ValueError(f"cooldown_seconds: {self.cooldown_seconds} must be a finite number >= 0")

    def allowed(self, members: int) -> int:
        """Nodes of a domain of ``members`` that may be down at once (at least one)."""
        return max(1, math.floor(self.max_unhealthy_ratio * members + 1e-9))


def domains_of(node: Node) -> list[str]:
    """The failure domains ``node`` belongs to, as ``pool:``, ``rack:`` and ``nvlink:`` names."""
    out = [f"pool:{node.pool}"]
    if node.topology.rack:
        out.append(f"rack:{node.topology.rack}")
    if node.topology.nvlink_domain and node.topology.nvlink_domain != node.name:
        out.append(f"nvlink:{node.topology.nvlink_domain}")
    return out


def members(snapshot: ClusterSnapshot) -> dict[str, set[str]]:
    """Each failure domain's nodes."""
    out: dict[str, set[str]] = {}
    for node in snapshot.nodes:
        for domain in domains_of(node):
            out.setdefault(domain, set()).add(node.name)
    return out


def down_nodes(snapshot: ClusterSnapshot) -> set[str]:
    """Out of scheduling (cordoned, a gpuwarden taint) or not Ready."""
    return out_of_scheduling(snapshot) | {n.name for n in snapshot.nodes if not ready(snapshot, n.name)}


@dataclass(frozen=True)
class DomainState:
    state: str
    at: datetime  # when it entered the state


def domain_states(records: Iterable[Mapping[str, Any]]) -> dict[str, DomainState]:
    """Each domain's breaker as the audit log leaves it (absent: closed, never opened)."""
    out: dict[str, DomainState] = {}
    for record in records:
        if record.get("kind") != DOMAIN_BREAKER_KIND:
            continue
        params = record.get("params") or {}
        at = parse_at(record.get("at"))
        if at is not None and params.get("state") in (OPEN, HALF_OPEN, CLOSED) and isinstance(params.get("domain"), str):
            out[params["domain"]] = DomainState(params["state"], at)
    return out


@dataclass(frozen=True)
class Transition:
    """A domain breaker's change, for the applier to record (and post as an Event)."""

    domain: str
    state: str
    down: int
    members: int
    allowed: int
    why: str

    def params(self) -> dict[str, Any]:
        return {"domain": self.domain, "state": self.state, "down": self.down, "members": self.members,
                "allowed": self.allowed}


@dataclass(frozen=True)
class DomainVerdict:
    verdict: Verdict
    transitions: tuple[Transition, ...] = ()  # what recording the verdict changes


def domain_verdict(action: Action, findings: Sequence[FindingLike], snapshot: ClusterSnapshot, now: datetime,
                   states: Mapping[str, DomainState], policy: DomainPolicy, taken: Iterable[str] = ()) -> DomainVerdict:
    """The failure domains' verdict on ``action`` (see the module docstring). ``taken``: the nodes this
    round already took out of scheduling (not yet in ``snapshot``)."""
    if action.kind not in DISRUPTIVE:
        return DomainVerdict(ALLOWED)
    _, node_name = pace_key(action.kind, findings, action.target, snapshot)
    node = next((n for n in snapshot.nodes if n.name == node_name), None)
    if node is None:
        return DomainVerdict(ALLOWED)
    groups = members(snapshot)
    down = down_nodes(snapshot) | set(taken)
    if node.name in down:  # already down: acting on it takes nothing more out
        return DomainVerdict(ALLOWED)
    over: list[tuple[Transition, DomainState | None]] = []
    for domain in domains_of(node):
        group = groups[domain]
        after, allowed = len((down | {node.name}) & group), policy.allowed(len(group))
        if after > allowed:
            why = (f"domain {domain}: {after} of {len(group)} nodes would be out of scheduling or not Ready; "
                   f"limit {allowed} ({policy.max_unhealthy_ratio:.0%})")
            over.append((Transition(domain, OPEN, after, len(group), allowed, why), states.get(domain)))
    cooled = [t for t, state in over if state is not None and state.state in (OPEN, HALF_OPEN)
              and now - state.at >= timedelta(seconds=policy.cooldown_seconds)]
    if len(cooled) == len(over):  # within every share, or a probe in every domain it is over in
        probes = tuple(replace(t, state=HALF_OPEN, why=t.why + "; one probe after the cool-down") for t in cooled)
        return DomainVerdict(ALLOWED, probes + tuple(replace(t, why=t.why + " (probed: open again)") for t in cooled))
    waiting = [(t, state) for t, state in over if t not in cooled]
    first, state = waiting[0]
    since = state.at if state is not None and state.state in (OPEN, HALF_OPEN) else now
    reopen = since + timedelta(seconds=policy.cooldown_seconds)
    opening = tuple(t for t, state in waiting if state is None or state.state == CLOSED)
    return DomainVerdict(refused(Outcome.HELD, f"{first.why}; breaker open, a probe after {reopen.isoformat()}"), opening)


def closing(snapshot: ClusterSnapshot, states: Mapping[str, DomainState], policy: DomainPolicy) -> list[Transition]:
    """Open or half-open domains with room again (fewer nodes down than their share allows; with a
    share of one node, none): they close on that evidence."""
    groups = members(snapshot)
    down = down_nodes(snapshot)
    out = []
    for domain, state in sorted(states.items()):
        if state.state == CLOSED:
            continue
        group = groups.get(domain, set())
        now_down = len(down & group)
        if now_down < policy.allowed(len(group)) or not group:
            out.append(Transition(domain, CLOSED, now_down, len(group), policy.allowed(len(group)),
                                  f"domain {domain}: {now_down} of {len(group)} nodes down: room again"))
    return out
