"""The maintenance window ("no disruptive action outside Tue/Thu 02:00-05:00"): an APScheduler
``CronTrigger`` asked with the ``now`` of a ``FakeClock``, and the actuator (on the real
``SimCluster``) holding cordons back outside it and applying them inside it, without tripping the
circuit breaker; the hourly action limit moves with the same fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuwarden.remediation import Actuator, AuditLog, Mode, Outcome, SafetyLimits, plan_from_findings
from gpuwarden.remediation.maintenance import DISRUPTIVE, MaintenanceWindow
from gpuwarden.cli import main
from gpuwarden.fleet import Action, ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.cli.simfleet import simulated_fleet
from gpuwarden.sim import SimConfig
from gpuwarden.sim.cluster import SimCluster

MONDAY_NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TUESDAY = datetime(2026, 12, 1, tzinfo=UTC)
WINDOW = "tue,thu 02:00-05:00"


def at(day: datetime, hh_mm: str) -> datetime:
    hours, minutes = map(int, hh_mm.split(":"))
    return day + timedelta(hours=hours, minutes=minutes)


@pytest.mark.parametrize("when, open_", [
    (at(TUESDAY, "01:59"), False), (at(TUESDAY, "02:00"), True), (at(TUESDAY, "04:59"), True),
    (at(TUESDAY, "05:00"), False), (at(TUESDAY + timedelta(days=1), "03:00"), False),  # Wednesday
    (at(TUESDAY + timedelta(days=2), "03:00"), True), (MONDAY_NOON, False),  # Thursday; Monday
])
def test_the_window_is_open_from_its_opening_for_its_length(when: datetime, open_: bool) -> None:
    assert MaintenanceWindow.parse(WINDOW).is_open(when) is open_


def test_a_window_that_ends_at_or_before_it_starts_runs_past_midnight() -> None:
    window = MaintenanceWindow.parse("sat 22:00-02:00")
    saturday = TUESDAY + timedelta(days=4)
    assert window.length == timedelta(hours=4)
    assert window.is_open(at(saturday, "23:30")) and window.is_open(at(saturday, "25:59"))  # Sunday 01:59
    assert not window.is_open(at(saturday, "26:00")) and not window.is_open(at(saturday, "21:59"))
    assert window.next_open(MONDAY_NOON) == at(saturday, "22:00")


@pytest.mark.parametrize("text, words", [
    ("tuesday 2-5", "expected DAYS HH:MM-HH:MM in UTC, e.g. 'tue,thu 02:00-05:00'"),
    ("02:00-05:00", "expected DAYS HH:MM-HH:MM"),
    ("tue,thu 25:00-05:00", "25:00-05:00 is not a time of day"),
    ("someday 02:00-05:00", "maintenance window 'someday 02:00-05:00': cron day_of_week='someday'"),
])
def test_a_bad_window_names_the_text_and_the_form_allowed(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        MaintenanceWindow.parse(text)


def test_the_actuator_flag_refuses_a_bad_window_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["actuator", "plan", "--maintenance-window", "tue 2am"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--maintenance-window" in err and "expected DAYS HH:MM-HH:MM" in err
    assert "Traceback" not in err


@pytest.fixture
def cluster(data_dir):
    return SimCluster(simulated_fleet(SimConfig(nodes=8, warmup_days=0.05, fault_rate_scale=0.0, data_dir=data_dir)))


def lost_gpu(node: str) -> Finding:
    return Finding(FindingKind.OFF_THE_BUS, Severity.CRITICAL, node, f"GPU-{node}", {"xid": 79}, ActionKind.CORDON,
                   0.99, MONDAY_NOON, MONDAY_NOON)


def test_a_cordon_waits_outside_the_window_and_is_applied_inside_it(cluster: SimCluster) -> None:
    clock = FakeClock(at(TUESDAY, "01:00"))
    actuator = Actuator(cluster, Mode.AUTO, SafetyLimits(max_cordoned_node_ratio=1.0), AuditLog(), clock=clock,
                        window=MaintenanceWindow.parse(WINDOW))
    node = cluster.snapshot().nodes[0].name
    entries = actuator.execute(plan_from_findings([lost_gpu(node)], cluster.snapshot()))
    assert [e.outcome for e in entries] == [Outcome.BLOCKED]
    assert "outside the maintenance window (tue,thu 02:00-05:00 UTC)" in entries[0].message
    assert "until it opens at Tue 2026-12-01 02:00 UTC" in entries[0].message
    assert not actuator.breaker_open and node not in cluster.snapshot().cordoned  # a schedule, not a fault
    clock.advance(timedelta(minutes=59))
    assert actuator.execute(plan_from_findings([lost_gpu(node)], cluster.snapshot())) == []  # recorded once
    clock.advance(timedelta(minutes=1))  # 02:00: open
    entries = actuator.execute(plan_from_findings([lost_gpu(node)], cluster.snapshot()))
    assert [e.outcome for e in entries] == [Outcome.APPLIED] and node in cluster.snapshot().cordoned
    # Undoing takes nothing away: an uncordon is never held back, open or shut.
    clock.advance(timedelta(hours=3))
    assert actuator.window is not None and not actuator.window.is_open(clock.now())
    assert actuator.window.holds_back(Action(ActionKind.UNCORDON, node, "undo"), clock.now()) is None
    assert actuator.undo(entries[0].entry_id, by="ops").outcome == Outcome.UNDONE


def test_observe_mode_says_what_the_window_would_hold_back_without_a_breaker_after_it(cluster: SimCluster) -> None:
    clock = FakeClock(MONDAY_NOON)
    actuator = Actuator(cluster, Mode.OBSERVE, SafetyLimits(max_cordoned_node_ratio=1.0), clock=clock,
                        window=MaintenanceWindow.parse(WINDOW))
    a, b = (n.name for n in cluster.snapshot().nodes[:2])
    entries = actuator.execute(plan_from_findings([lost_gpu(a), lost_gpu(b)], cluster.snapshot()))
    assert [e.outcome for e in entries] == [Outcome.BLOCKED] * 2
    # Each is held by the window; neither reads "circuit breaker open", as one after a limit would.
    assert all(e.message.startswith("would be blocked: outside the maintenance window") for e in entries)
    assert actuator.window is not None and actuator.window.holds_back(Action(ActionKind.NOTIFY, a, "idle"), clock.now()) is None
    assert {ActionKind.PREEMPT, ActionKind.EVICT, ActionKind.SUSPEND, ActionKind.DRAIN} <= DISRUPTIVE


def test_an_approved_cordon_waits_for_the_window_and_stays_approved(cluster: SimCluster) -> None:
    clock = FakeClock(MONDAY_NOON)
    actuator = Actuator(cluster, Mode.APPROVE, SafetyLimits(max_cordoned_node_ratio=1.0), AuditLog(), clock=clock,
                        window=MaintenanceWindow.parse(WINDOW))
    node = cluster.snapshot().nodes[0].name
    (waiting,) = actuator.execute(plan_from_findings([lost_gpu(node)], cluster.snapshot()))
    assert waiting.outcome == Outcome.AWAITING_APPROVAL
    held = actuator.approve(str(waiting.approval_id), by="ops")
    assert held.outcome == Outcome.BLOCKED and "applied at the first round inside it" in held.message
    assert actuator.execute(plan_from_findings([], cluster.snapshot())) == []  # Monday: still held
    clock.advance(at(TUESDAY, "02:30") - MONDAY_NOON)
    (applied,) = actuator.execute(plan_from_findings([], cluster.snapshot()))
    assert applied.outcome == Outcome.APPLIED and applied.approval_id == waiting.approval_id and applied.by == "ops"
    assert node in cluster.snapshot().cordoned


def test_the_hourly_action_limit_moves_with_the_fake_clock(cluster: SimCluster) -> None:
    """One action an hour, counted from the audit log's times against the clock's ``now``; observe
    mode evaluates the limit without tripping the breaker."""
    clock = FakeClock(MONDAY_NOON)
    audit = AuditLog()
    auto = Actuator(cluster, Mode.AUTO, SafetyLimits(max_actions_per_hour=1, max_cordoned_node_ratio=1.0), audit,
                    clock=clock)
    watch = Actuator(cluster, Mode.OBSERVE, auto.limits, audit, clock=clock)
    a, b = (n.name for n in cluster.snapshot().nodes[:2])
    assert [e.outcome for e in auto.execute(plan_from_findings([lost_gpu(a)], cluster.snapshot()))] == [Outcome.APPLIED]
    clock.advance(timedelta(minutes=30))
    (entry,) = watch.execute(plan_from_findings([lost_gpu(b)], cluster.snapshot()))
    assert entry.outcome == Outcome.BLOCKED and "1 actions in the last hour; limit 1" in entry.message
    clock.advance(timedelta(minutes=29, seconds=59))
    assert watch.applied_in_last_hour() == 1
    clock.advance(timedelta(seconds=1))  # the applied cordon is an hour old: out of the window
    assert watch.applied_in_last_hour() == 0
    (entry,) = watch.execute(plan_from_findings([lost_gpu(b)], cluster.snapshot()))
    assert entry.outcome == Outcome.PLANNED and not auto.breaker_open
