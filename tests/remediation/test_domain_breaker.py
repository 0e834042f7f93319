"""Failure domains (issue 35 item 2): repairs budgeted per pool, rack and NVLink domain, with a
breaker per domain that opens on the limit, lets one probe through after its cool-down, closes on
evidence and is never silent. The gate is pure: these tests drive it round after round the way the
applier does (records folded back, cordons landing in the next snapshot)."""

from __future__ import annotations

from datetime import timedelta

from builders import NOW, node, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.fleet import Action, ActionKind, Topology
from gpuwarden.remediation.domains import (CLOSED, DOMAIN_BREAKER_KIND, HALF_OPEN, OPEN, DomainPolicy, closing,
                                           domain_states, domain_verdict, domains_of)

# 3 racks of 5 nodes in one pool of 15; rack r2's nodes share one NVLink domain
NODES = [node(f"n{i:02d}", topology=Topology("nvl-r2" if i >= 10 else f"n{i:02d}", "leaf", f"r{i // 5}"))
         for i in range(15)]


def cordon(target: str) -> Action:
    return Action(ActionKind.CORDON, target, "test")


class Applier:
    """What the applier does with the gate: ask, record transitions, apply (a cordon lands in the
    next snapshot), and close domains back within their share at the start of a round."""

    def __init__(self, policy: DomainPolicy | None = None) -> None:
        policy = policy or DomainPolicy()
        self.policy, self.records, self.cordoned, self.allowed_log = policy, [], set(), []
        self.probes: list = []  # (when, node, domain) of every probe let through

    def record(self, transitions, at):
        self.records += [{"kind": DOMAIN_BREAKER_KIND, "at": at.isoformat(), "params": t.params()} for t in transitions]

    def round(self, targets, at, repaired=()):
        self.cordoned -= set(repaired)
        snap = snapshot(NODES, taken_at=at, cordoned=frozenset(self.cordoned))
        self.record(closing(snap, domain_states(self.records), self.policy), at)
        taken: list[str] = []
        for target in targets:
            answer = domain_verdict(cordon(target), (), snap, at, domain_states(self.records), self.policy, taken)
            self.record(answer.transitions, at)
            if answer.verdict.allowed:
                taken.append(target)
                self.allowed_log.append((at, target, [t.state for t in answer.transitions]))
                self.probes += [(at, target, t.domain) for t in answer.transitions if t.state == HALF_OPEN]
            else:
                states = domain_states(self.records)
                assert any(states.get(d) and states[d].state == OPEN for d in domains_of(by_name(target))), \
                    "a hold always leaves its domain's breaker open in the log (never silent)"
        self.cordoned |= set(taken)


def by_name(name):
    return next(n for n in NODES if n.name == name)


def test_a_rack_event_takes_one_node_then_holds_then_probes_after_the_cool_down_and_closes_on_repair():
    applier = Applier(DomainPolicy(max_unhealthy_ratio=0.2, cooldown_seconds=1800))
    rack0 = [f"n{i:02d}" for i in range(5)]
    applier.round(rack0, NOW)  # rack r0: 20% of 5 = 1 node
    assert [t for _, t, _ in applier.allowed_log] == ["n00"]
    assert domain_states(applier.records)["rack:r0"].state == OPEN
    applier.round(rack0[1:], NOW + timedelta(minutes=10))  # still cooling down: nothing
    assert len(applier.allowed_log) == 1
    applier.round(rack0[1:], NOW + timedelta(minutes=31))  # one probe, and open again
    assert [t for _, t, _ in applier.allowed_log] == ["n00", "n01"]
    assert applier.allowed_log[-1][2] == [HALF_OPEN, OPEN]
    assert domain_states(applier.records)["rack:r0"].state == OPEN
    applier.round([], NOW + timedelta(minutes=40), repaired=["n00", "n01"])  # repaired: within its share
    assert domain_states(applier.records)["rack:r0"].state == CLOSED
    applier.round(rack0[2:], NOW + timedelta(minutes=41))
    assert [t for _, t, _ in applier.allowed_log][-1] == "n02"


def test_other_racks_are_not_held_by_one_racks_event():
    applier = Applier()
    applier.round([f"n{i:02d}" for i in range(5)] + ["n05", "n06"], NOW)
    # r0 gives one node; r1 one; the pool of 15 allows 3 in all
    assert [t for _, t, _ in applier.allowed_log] == ["n00", "n05"]
    assert domain_states(applier.records)["rack:r1"].state == OPEN  # n06 went over r1's share


def test_a_node_already_down_is_never_held():
    applier = Applier()
    applier.cordoned = {"n00"}
    applier.round(["n00"], NOW)
    assert [t for _, t, _ in applier.allowed_log] == ["n00"]


def test_policy_refuses_nonsense():
    import pytest

    for bad in ({"max_unhealthy_ratio": 1.5}, {"max_unhealthy_ratio": float("nan")}, {"cooldown_seconds": -1},
                {"cooldown_seconds": float("inf")}):
        with pytest.raises(ValueError):
            DomainPolicy(**bad)


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(st.tuples(st.lists(st.sampled_from([n.name for n in NODES]), max_size=6),
                                 st.integers(0, 3600), st.lists(st.sampled_from([n.name for n in NODES]), max_size=3)),
                       min_size=1, max_size=12),
       ratio=st.sampled_from([0.0, 0.2, 0.34, 0.5]), cooldown=st.sampled_from([0.0, 600.0, 1800.0]))
def test_no_domain_goes_over_its_share_but_by_its_probes(rounds, ratio, cooldown):
    """Whatever is asked when: in every domain, the nodes the gate let down at once are at most its
    share plus the probes it let through since the domain was last within its share; and at most one
    probe per domain per cool-down."""
    policy = DomainPolicy(max_unhealthy_ratio=ratio, cooldown_seconds=cooldown)
    applier = Applier(policy)
    at = NOW
    for targets, step, repaired in rounds:
        at += timedelta(seconds=step)
        applier.round(targets, at, repaired)
        for domain in {d for n in NODES for d in domains_of(n)}:
            group = {n.name for n in NODES if domain in domains_of(n)}
            probed = {node for _, node, d in applier.probes if d == domain}
            assert len((applier.cordoned & group) - probed) <= policy.allowed(len(group)), domain
            times = sorted(when for when, _, d in applier.probes if d == domain)
            assert all((b - a).total_seconds() >= cooldown for a, b in zip(times, times[1:])), domain
