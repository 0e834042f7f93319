"""The gates of remediation as pure functions: the circuit breaker, the maintenance window, the pace
and the budget of safety limits each answer a verdict from the action, the audit history, the
snapshot, ``now`` and their policy, with no actuator and no cluster. Where an invariant must hold
whatever the history, a hypothesis property says so. Also: ``gpuwarden actuator reset`` closes the
breaker through the audit log alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from builders import node, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.cli import main
from gpuwarden.fleet import Action, ActionKind
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.remediation import AuditLog, Mode, Outcome, SafetyLimits
from gpuwarden.remediation.audit import Record, action_entry
from gpuwarden.remediation.breaker import breaker_verdict, record_breaker_reset, record_breaker_trip
from gpuwarden.remediation.limits import BudgetUse, budget_use, budget_verdict, out_of_scheduling
from gpuwarden.remediation.maintenance import DISRUPTIVE, MaintenanceWindow, window_verdict
from gpuwarden.remediation.pacing import PaceEvent, PacingPolicy, pace_from_records, pace_verdict
from gpuwarden.remediation.verdict import ALLOWED, Verdict

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)  # a Tuesday, noon
NODES = [f"n{i}" for i in range(10)]
FLEET = snapshot([node(name, pool="train") for name in NODES])
DETECTOR = "off-the-bus"
FINDINGS = ({"kind": DETECTOR},)  # the finding that chose the action, as approve mode reads it back


def applied(kind: ActionKind, target: str, at: datetime) -> Record:
    return action_entry(at, Mode.AUTO, Outcome.APPLIED, Action(kind, target, "test"), by="actuator").as_dict()


def cordon(target: str) -> Action:
    return Action(ActionKind.CORDON, target, "test")


def test_a_verdict_names_an_outcome_exactly_when_it_refuses():
    assert ALLOWED.allowed and ALLOWED.outcome is None
    with pytest.raises(ValueError):
        Verdict(True, Outcome.BLOCKED, "allowed yet blocked")
    with pytest.raises(ValueError):
        Verdict(False)


# -- the budget (safety limits) ---------------------------------------------------------------------

def test_the_budget_refuses_once_the_hourly_limit_in_the_history_is_reached_and_names_it():
    limits = SafetyLimits(max_actions_per_hour=3, max_cordoned_node_ratio=1.0)
    history = [applied(ActionKind.CORDON, f"n{i}", NOW - timedelta(minutes=10 * i)) for i in range(1, 4)]
    uncordon = Action(ActionKind.UNCORDON, "n0", "test")
    assert budget_verdict(uncordon, budget_use(history[:2], NOW), limits, FLEET) == ALLOWED
    verdict = budget_verdict(uncordon, budget_use(history, NOW), limits, FLEET)
    assert verdict == Verdict(False, Outcome.BLOCKED, "3 actions in the last hour; limit 3")
    # Once the oldest (30 minutes ago) is an hour old it has left the window: the budget allows again.
    assert not budget_verdict(uncordon, budget_use(history, NOW + timedelta(minutes=29)), limits, FLEET).allowed
    assert budget_verdict(uncordon, budget_use(history, NOW + timedelta(minutes=30)), limits, FLEET).allowed


def test_notices_are_neither_counted_nor_refused_by_the_hourly_limit():
    limits = SafetyLimits(max_actions_per_hour=1, max_cordoned_node_ratio=1.0)
    notices = [applied(ActionKind.NOTIFY, "team/job", NOW - timedelta(minutes=1)) for _ in range(5)]
    assert budget_use(notices, NOW) == BudgetUse(0)
    full = budget_use([applied(ActionKind.CORDON, "n1", NOW)], NOW + timedelta(seconds=1))
    assert budget_verdict(Action(ActionKind.NOTIFY, "team/job", "idle"), full, limits, FLEET).allowed
    assert not budget_verdict(cordon("n2"), full, limits, FLEET).allowed


def test_the_budget_refuses_a_cordon_past_the_node_share_counting_the_rounds_own_cordons():
    fleet = snapshot([node(name) for name in NODES[:4]], cordoned=frozenset({"n0"}),
                     taints={"n1": ("nvidia.com/gpu=present:NoSchedule",)})  # the operator's taint: not counted
    limits = SafetyLimits(max_cordoned_node_ratio=0.5)
    use = budget_use([], NOW)
    assert out_of_scheduling(fleet) == {"n0"}
    assert budget_verdict(cordon("n1"), use, limits, fleet).allowed  # 2 of 4
    after = use.taking(cordon("n1"))
    assert after == BudgetUse(1, frozenset({"n1"}))
    verdict = budget_verdict(cordon("n2"), after, limits, fleet)
    assert verdict == Verdict(False, Outcome.BLOCKED, "would leave 3 of 4 nodes cordoned or tainted (75%); limit 50%")
    tainted = snapshot([node(name) for name in NODES[:4]], taints={"n3": ("gpuwarden.io/unhealthy=true:NoSchedule",)})
    assert out_of_scheduling(tainted) == {"n3"}


def test_the_budget_reads_a_lazy_snapshot_only_when_the_node_share_is_asked():
    reads: list[int] = []

    def read() -> object:
        reads.append(1)
        return FLEET

    limits = SafetyLimits(max_actions_per_hour=1, max_cordoned_node_ratio=1.0)
    assert budget_verdict(Action(ActionKind.UNCORDON, "n1", "t"), BudgetUse(0), limits, read).allowed
    assert not budget_verdict(cordon("n1"), BudgetUse(1), limits, read).allowed  # the hourly limit answers first
    assert reads == []
    assert budget_verdict(cordon("n1"), BudgetUse(0), limits, read).allowed
    assert reads == [1]


KEEP_NODES = [k for k in ActionKind if k not in (ActionKind.CORDON, ActionKind.DRAIN, ActionKind.TAINT)]


@settings(max_examples=200, deadline=None)
@given(minutes_ago=st.lists(st.integers(0, 180), max_size=30), limit=st.integers(0, 12), tries=st.integers(0, 30),
       kinds=st.lists(st.sampled_from(KEEP_NODES), min_size=1, max_size=5))
def test_the_budget_never_allows_more_actions_in_an_hour_than_its_limit(minutes_ago, limit, tries, kinds):
    """Actions that take no node out of scheduling, so that only the hourly limit speaks."""
    history = [applied(ActionKind.UNCORDON, f"h{i}", NOW - timedelta(minutes=m)) for i, m in enumerate(minutes_ago)]
    limits = SafetyLimits(max_actions_per_hour=limit, max_cordoned_node_ratio=1.0)
    use, allowed = budget_use(history, NOW), 0
    for i in range(tries):
        action = Action(kinds[i % len(kinds)], f"t{i}", "test")
        verdict = budget_verdict(action, use, limits, FLEET)
        if verdict.allowed:
            use = use.taking(action)
            allowed += action.kind != ActionKind.NOTIFY
        else:
            assert verdict.outcome == Outcome.BLOCKED and f"limit {limit}" in verdict.reason
    in_the_hour = sum(1 for m in minutes_ago if m < 60)  # exactly an hour ago is out of it
    assert allowed <= max(0, limit - in_the_hour)
    counted = sum(1 for i in range(tries) if kinds[i % len(kinds)] != ActionKind.NOTIFY)
    assert allowed == min(counted, max(0, limit - in_the_hour))  # and up to the limit it does not refuse


@settings(max_examples=200, deadline=None)
@given(cordoned=st.sets(st.sampled_from(NODES)), ratio=st.floats(0.0, 1.0),
       wanted=st.lists(st.sampled_from(NODES), max_size=10))
def test_the_budget_never_lets_the_node_share_past_its_limit(cordoned, ratio, wanted):
    fleet = snapshot([node(name) for name in NODES], cordoned=frozenset(cordoned))
    limits = SafetyLimits(max_actions_per_hour=100, max_cordoned_node_ratio=ratio)
    use = budget_use([], NOW)
    for target in wanted:
        if budget_verdict(cordon(target), use, limits, fleet).allowed:
            use = use.taking(cordon(target))
            assert len(set(cordoned) | use.taken_nodes) / len(NODES) <= ratio


# -- the circuit breaker ----------------------------------------------------------------------------

def test_the_breaker_is_open_after_the_recorded_trip_and_closed_after_a_recorded_reset():
    audit, clock = AuditLog(), FakeClock(NOW)
    assert breaker_verdict(audit.records()) == ALLOWED
    record_breaker_trip(audit, "10 actions in the last hour; limit 10", clock=clock, mode=Mode.AUTO, name="actuator")
    verdict = breaker_verdict(audit.records())
    assert not verdict.allowed and verdict.outcome == Outcome.BLOCKED and "gpuwarden actuator reset" in verdict.reason
    clock.advance(60)
    reset = record_breaker_reset(audit, "ops", "looked at n3", at=clock.now(), mode=Mode.AUTO)
    assert (reset.outcome, reset.kind, reset.target, reset.reason, reset.by) == (
        Outcome.BREAKER_RESET, "circuit-breaker", "actuator", "looked at n3", "ops")
    assert breaker_verdict(audit.records()) == ALLOWED


@given(st.lists(st.sampled_from([Outcome.BREAKER_OPEN, Outcome.BREAKER_RESET, Outcome.APPLIED, Outcome.BLOCKED])))
def test_the_breaker_verdict_is_the_last_trip_or_reset_in_the_history(outcomes):
    history = [{"outcome": o.value, "kind": "circuit-breaker"} for o in outcomes]
    last = [o for o in outcomes if o in (Outcome.BREAKER_OPEN, Outcome.BREAKER_RESET)]
    assert breaker_verdict(history).allowed == (not last or last[-1] == Outcome.BREAKER_RESET)


def test_actuator_reset_closes_the_breaker_through_the_audit_log_alone(tmp_path, capsys):
    path = tmp_path / "audit.jsonl"
    assert main(["actuator", "reset", "--by", "ops", "--audit", str(path)]) == 0
    assert "nothing to reset" in capsys.readouterr().out and not path.exists()  # nothing recorded
    record_breaker_trip(AuditLog(path), "limit", clock=FakeClock(NOW), mode=Mode.AUTO, name="actuator")
    assert main(["actuator", "reset", "--by", "ops", "--comment", "n3 replaced", "--audit", str(path)]) == 0
    assert "reset by ops" in capsys.readouterr().out
    last = AuditLog.read(path)[-1]
    assert {k: last[k] for k in ("outcome", "kind", "target", "reason", "message", "by", "mode")} == {
        "outcome": "breaker-reset", "kind": "circuit-breaker", "target": "actuator", "reason": "n3 replaced",
        "message": "reset by ops", "by": "ops", "mode": "auto"}
    assert breaker_verdict(AuditLog.read(path)).allowed



def test_the_default_audit_log_is_where_earlier_releases_kept_it(tmp_path, monkeypatch, capsys):
    """The log is the actuator's memory: a breaker left open by an earlier release, at its default
    path, is still open after an upgrade (the rooms' move once renamed the default and lost it)."""
    monkeypatch.chdir(tmp_path)
    earlier = tmp_path / ".gpuwarden" / "actuator" / "audit.jsonl"
    earlier.parent.mkdir(parents=True)
    record_breaker_trip(AuditLog(earlier), "limit", clock=FakeClock(NOW), mode=Mode.AUTO, name="actuator")
    assert main(["actuator", "reset", "--by", "ops"]) == 0
    assert "reset by ops" in capsys.readouterr().out
    assert breaker_verdict(AuditLog.read(earlier)).allowed

# -- the maintenance window -------------------------------------------------------------------------

WINDOW = MaintenanceWindow.parse("tue,thu 02:00-05:00")


def test_the_window_defers_a_disruptive_action_outside_it_and_lets_it_go_inside():
    verdict = window_verdict(cordon("n1"), NOW, WINDOW)
    assert not verdict.allowed and verdict.outcome == Outcome.BLOCKED
    assert verdict.reason == ("outside the maintenance window (tue,thu 02:00-05:00 UTC): a cordon waits until it "
                              "opens at Thu 2026-11-26 02:00 UTC")
    assert window_verdict(cordon("n1"), NOW.replace(hour=3), WINDOW) == ALLOWED
    assert window_verdict(Action(ActionKind.UNCORDON, "n1", "t"), NOW, WINDOW) == ALLOWED  # gives capacity back
    assert window_verdict(cordon("n1"), NOW, None) == ALLOWED  # no window: any time


@settings(max_examples=100, deadline=None)
@given(minutes=st.integers(0, 14 * 24 * 60), kind=st.sampled_from(list(ActionKind)))
def test_the_window_holds_exactly_the_disruptive_actions_while_it_is_shut(minutes, kind):
    now = NOW + timedelta(minutes=minutes)
    verdict = window_verdict(Action(kind, "n1", "t"), now, WINDOW)
    assert verdict.allowed == (kind not in DISRUPTIVE or WINDOW.is_open(now))


# -- the pace ---------------------------------------------------------------------------------------

PACE = PacingPolicy(initial_in_flight=1, cooldown_seconds=60.0, seed=1)


def pace_record(node_name: str, verdict: str, window: int = 1, next_at: datetime | None = None) -> Record:
    event = PaceEvent(("train", DETECTOR), node_name, verdict, window, 0, next_at, "test")
    return event.entry(NOW - timedelta(minutes=5), Mode.AUTO, "actuator").as_dict()


def test_the_pace_holds_a_second_cordon_while_the_first_is_in_flight():
    state = pace_from_records([pace_record("n1", "started")])
    verdict = pace_verdict(cordon("n2"), FINDINGS, FLEET, NOW, state, PACE)
    assert verdict == Verdict(False, Outcome.HELD, f"pace: 1 of 1 in flight for {DETECTOR} in pool train (slow start)")
    assert pace_verdict(cordon("n1"), FINDINGS, FLEET, NOW, state, PACE) == ALLOWED  # the same repair (a retry)
    assert pace_verdict(Action(ActionKind.UNCORDON, "n2", "t"), FINDINGS, FLEET, NOW, state, PACE) == ALLOWED
    proven = pace_from_records([pace_record("n1", "started"), pace_record("n1", "proven", window=2)])
    assert pace_verdict(cordon("n2"), FINDINGS, FLEET, NOW, proven, PACE) == ALLOWED
    wider = pace_from_records([pace_record("n1", "started", window=2)])
    assert pace_verdict(cordon("n2"), FINDINGS, FLEET, NOW, wider, PACE) == ALLOWED
    # observe mode's would-be starts of this round count as in flight
    assert not pace_verdict(cordon("n2"), FINDINGS, FLEET, NOW, wider, PACE, extra_starts=1).allowed


def test_the_pace_holds_a_new_batch_until_the_cooldown_ends_but_not_the_batch_that_started_it():
    until = NOW + timedelta(seconds=30)
    state = pace_from_records([pace_record("n1", "started", window=4, next_at=until)])
    verdict = pace_verdict(cordon("n2"), FINDINGS, FLEET, NOW, state, PACE)
    assert not verdict.allowed and verdict.reason.endswith(f"until {until.isoformat()}")
    assert pace_verdict(cordon("n2"), FINDINGS, FLEET, NOW, state, PACE, batch={("train", DETECTOR)}).allowed
    assert pace_verdict(cordon("n2"), FINDINGS, FLEET, until, state, PACE).allowed


@settings(max_examples=300, deadline=None)
@given(in_flight=st.sets(st.sampled_from(NODES[1:]), min_size=1), window=st.integers(1, 9),
       extra=st.integers(0, 3), target=st.sampled_from(NODES))
def test_the_pace_never_lets_more_than_its_window_fly(in_flight, window, extra, target):
    state = pace_from_records([pace_record(n, "started", window=window) for n in sorted(in_flight)])
    verdict = pace_verdict(cordon(target), FINDINGS, FLEET, NOW, state, PACE, extra_starts=extra)
    if target in in_flight:
        assert verdict.allowed  # a retry of a repair already flying
    else:
        assert verdict.allowed == (len(in_flight) + extra < window)
        assert verdict.allowed or verdict.outcome == Outcome.HELD
