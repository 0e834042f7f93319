"""The Actions page over a real audit log written by the actuator (observe and auto mode entries)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from streamlit.testing.v1 import AppTest

from gpuwarden.remediation import AuditEntry, AuditLog, Mode, Outcome
from gpuwarden.remediation import audit_report as av
from gpuwarden.dashboards.launch import APP_PATH

PAGE = APP_PATH.parent / "views" / "actions.py"


def write_log(path):
    log = AuditLog(path)
    at = datetime(2026, 11, 23, 12, tzinfo=UTC)
    for minute, (outcome, kind, target) in enumerate([
        (Outcome.PLANNED, "cordon", "node-a"),
        (Outcome.PLANNED, "drain", "node-b"),
        (Outcome.APPLIED, "cordon", "node-c"),
        (Outcome.BLOCKED, "cordon", "node-d"),
    ]):
        log.record(AuditEntry(at.replace(minute=minute), Mode.OBSERVE if outcome == Outcome.PLANNED else Mode.AUTO,
                              outcome, kind, target, f"xid79 on GPU-{target}"))


def test_load_audit_is_newest_first_and_counts_outcomes(tmp_path):
    path = tmp_path / "actuator" / "audit.jsonl"
    write_log(path)
    frame = av.load_audit(path)
    assert list(frame["target"]) == ["node-d", "node-c", "node-b", "node-a"]
    counts = av.outcome_counts(frame)
    assert counts.loc["cordon", "planned"] == 1 and counts.loc["cordon", "applied"] == 1
    assert counts.loc["drain", "planned"] == 1
    assert av.load_audit(tmp_path / "missing.jsonl").empty


def test_audit_path_defaults_beside_the_store_and_env_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv(av.AUDIT_ENV, raising=False)
    assert av.audit_path(str(tmp_path)) == tmp_path / "actuator" / "audit.jsonl"
    monkeypatch.setenv(av.AUDIT_ENV, str(tmp_path / "x.jsonl"))
    assert av.audit_path(None) == tmp_path / "x.jsonl"


def test_actions_page_shows_the_log(tmp_path, monkeypatch):
    write_log(tmp_path / "actuator" / "audit.jsonl")
    monkeypatch.delenv(av.AUDIT_ENV, raising=False)
    monkeypatch.setenv("GPUWARDEN_STORE", str(tmp_path))
    app = AppTest.from_file(str(PAGE), default_timeout=30).run()
    assert not app.exception
    metrics = {m.label: m.value for m in app.metric}
    assert metrics == {"Awaiting approval": "0", "Planned (observe)": "2", "Applied": "1", "Blocked or refused": "1"}


@pytest.mark.parametrize("store", [None, "empty"])
def test_actions_page_without_a_log_explains_itself(tmp_path, monkeypatch, store):
    monkeypatch.delenv(av.AUDIT_ENV, raising=False)
    if store is None:
        monkeypatch.delenv("GPUWARDEN_STORE", raising=False)
    else:
        monkeypatch.setenv("GPUWARDEN_STORE", str(tmp_path))
    app = AppTest.from_file(str(PAGE), default_timeout=30).run()
    assert not app.exception
    assert "never run" in app.info[0].value


def test_an_empty_log_means_it_ran_and_planned_nothing(tmp_path, monkeypatch):
    (tmp_path / "actuator").mkdir()
    (tmp_path / "actuator" / "audit.jsonl").write_text("")
    monkeypatch.delenv(av.AUDIT_ENV, raising=False)
    monkeypatch.setenv("GPUWARDEN_STORE", str(tmp_path))
    app = AppTest.from_file(str(PAGE), default_timeout=30).run()
    assert not app.exception and not app.info
    assert "ran and planned nothing" in app.success[0].value


def test_a_truncated_line_is_skipped_and_named(tmp_path, monkeypatch):
    path = tmp_path / "actuator" / "audit.jsonl"
    write_log(path)
    with path.open("a") as handle:
        handle.write('{"at": "2026-11-23T12:09:00+00:00", "mode": "obs')  # a crash mid-write
    monkeypatch.delenv(av.AUDIT_ENV, raising=False)
    monkeypatch.setenv("GPUWARDEN_STORE", str(tmp_path))
    app = AppTest.from_file(str(PAGE), default_timeout=30).run()
    assert not app.exception
    assert f"{path}:5: skipped" in app.warning[0].value
    assert {m.label: m.value for m in app.metric}["Applied"] == "1"
