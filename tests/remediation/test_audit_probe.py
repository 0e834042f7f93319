"""Issue 35 item 6, the audit log's bad-input rules (``remediation/audit.py``), each with several cases:

1. a torn last line (a crash mid-write) is fenced before anything is appended: an approval, a
   rejection, an undo or a reset appended after it reads back, and no earlier complete record is
   lost, whatever bytes the torn line holds (hypothesis);
2. wrong-typed lines (valid JSON that is not an object, or fields of the wrong type) are counted and
   said, never crash a read, and never change a verdict (breaker, budget, pace, approvals, undo)
   unless they are said: junk lines leave every verdict as it was; a record whose incidental field
   is wrong keeps its meaning; a record missing what its outcome needs is skipped and said;
3. a command given an audit path that does not exist creates nothing (no folder, no lock file)
   unless it writes a new record there; the read-only ones say "no audit log at PATH".
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.cli import main
from gpuwarden.cli.metrics_inputs import actuator_figures
from gpuwarden.fleet import Action, ActionKind, Finding, FindingKind, Severity
from gpuwarden.fleet.clock import FakeClock
from gpuwarden.remediation import AuditEntry, AuditLog, Mode, Outcome
from gpuwarden.remediation import audit_report as av
from gpuwarden.remediation.approvals import already_asked, approved_not_applied, decide, pending_from
from gpuwarden.remediation.audit import action_entry, append_line, finding_record
from gpuwarden.remediation.breaker import breaker_verdict
from gpuwarden.remediation.limits import budget_use
from gpuwarden.remediation.pacing import PACE_KIND, pace_from_records, pace_rows
from gpuwarden.remediation.repair import held_by_gpuwarden
from gpuwarden.remediation.undo import undo_applied

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def _finding(node: str) -> Finding:
    return Finding(FindingKind.OFF_THE_BUS, Severity.CRITICAL, node, f"GPU-{node}", {"xid": 79}, ActionKind.CORDON,
                   0.99, ago(60), ago(55))


def _base() -> list[dict]:
    """A log the actuator and people wrote: two applied actions (one undoable), a pace event, three
    approvals (one waiting, one approved, one rejected) and an open breaker."""
    cordon = Action(ActionKind.CORDON, "n1", "off the bus")
    taint = Action(ActionKind.TAINT, "n2", "off the bus", {"taint": "gpuwarden.io/unhealthy=true:NoSchedule"})
    pace = {"pool": "default", "detector": "off-the-bus", "node": "n1", "verdict": "started", "window": 1,
            "next_at": ago(-5).isoformat()}
    rows = [
        action_entry(ago(50), Mode.AUTO, Outcome.APPLIED, cordon, "cordoned", by="actuator",
                     findings=(finding_record(_finding("n1")),), undo=Action(ActionKind.UNCORDON, "n1", "undo cordon")),
        action_entry(ago(40), Mode.AUTO, Outcome.APPLIED, taint, "tainted", by="actuator"),
        AuditEntry(ago(50), Mode.AUTO, Outcome.PACED, PACE_KIND, "n1", "cordon started", params=pace, by="actuator"),
        AuditEntry(ago(30), Mode.APPROVE, Outcome.AWAITING_APPROVAL, "cordon", "n3", "off the bus", approval_id="a1",
                   findings=(finding_record(_finding("n3")),)),
        AuditEntry(ago(29), Mode.APPROVE, Outcome.AWAITING_APPROVAL, "drain", "n4", "off the bus", approval_id="a2"),
        AuditEntry(ago(28), Mode.APPROVE, Outcome.AWAITING_APPROVAL, "cordon", "n5", "off the bus", approval_id="a3"),
    ]
    records = [r.as_dict() for r in rows]
    records.append({"outcome": "approved", "approval_id": "a2", "by": "dana", "comment": "", "at": ago(20).isoformat()})
    records.append({"outcome": "rejected", "approval_id": "a3", "by": "dana", "comment": "", "at": ago(19).isoformat()})
    records.append(AuditEntry(ago(10), Mode.AUTO, Outcome.BREAKER_OPEN, "circuit-breaker", "actuator", "limit",
                              "circuit breaker opened", by="actuator").as_dict())
    return records


BASE = _base()
APPLIED_CORDON_ID = BASE[0]["entry_id"]


def lines(records: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def verdicts(records: list[dict]) -> dict:
    """Every verdict and state the audit log decides."""
    return {
        "breaker": breaker_verdict(records), "budget": budget_use(records, NOW), "pace": pace_from_records(records),
        "pending": [p.approval_id for p in pending_from(records)],
        "approved": [str(a["approval_id"]) for a, _ in approved_not_applied(records)],
        "asked": already_asked(records, NOW), "held": held_by_gpuwarden(records),
        "figures": actuator_figures(records, NOW.timestamp()),
    }


BASE_VERDICTS = verdicts(BASE)


def test_the_base_log_decides_what_the_probe_compares():
    assert not BASE_VERDICTS["breaker"].allowed and BASE_VERDICTS["budget"].applied_last_hour == 2
    assert BASE_VERDICTS["pending"] == ["a1"] and BASE_VERDICTS["approved"] == ["a2"]
    assert BASE_VERDICTS["held"] == {"n1": {"cordon"}, "n2": {"gpuwarden.io/unhealthy=true:NoSchedule"}}
    assert BASE_VERDICTS["pace"].windows == {("default", "off-the-bus"): 1}


# -- 1. a torn last line is fenced before anything is appended ----------------------------------------
TORN = {
    "half-an-object": b'{"outcome": "approved", "approval_id": "a9", "by": "s',
    "half-a-utf8-char": b'{"reason": "\xe2\x80',
    "complete-without-newline": b'{"outcome": "planned", "kind": "cordon", "target": "n9"}',
    "carriage-return": b'{"outc\r',
    "nul-bytes": b"\x00\x00\x00\x00",
    "a-bare-word": b"approved",
    "spaces": b"   ",
}


@pytest.mark.parametrize("tail", TORN.values(), ids=TORN.keys())
def test_an_approval_after_a_torn_line_is_kept(tail, tmp_path, capsys):
    path = write(tmp_path / "audit.jsonl", lines(BASE) + tail)
    assert main(["actuator", "approve", "a1", "--by", "erin", "--audit", str(path)]) == 0
    assert "approved a1" in capsys.readouterr().out  # the command says it was made...
    records = AuditLog.read(path)
    assert records[:len(BASE)] == BASE  # ...nothing before it is lost...
    assert sorted(str(a["approval_id"]) for a, _ in approved_not_applied(records)) == ["a1", "a2"]  # ...and it was


@pytest.mark.parametrize("tail", list(TORN.values())[:4], ids=list(TORN)[:4])
def test_a_rejection_after_a_torn_line_is_kept(tail, tmp_path):
    path = write(tmp_path / "audit.jsonl", lines(BASE) + tail)
    assert main(["actuator", "reject", "a1", "--by", "erin", "--audit", str(path)]) == 0
    records = AuditLog.read(path)
    assert pending_from(records) == [] and records[-1]["outcome"] == "rejected" and records[-1]["by"] == "erin"


@pytest.mark.parametrize("tail", list(TORN.values())[:4], ids=list(TORN)[:4])
def test_a_reset_after_a_torn_line_closes_the_breaker(tail, tmp_path, capsys):
    path = write(tmp_path / "audit.jsonl", lines(BASE) + tail)
    assert main(["actuator", "reset", "--by", "ops", "--audit", str(path)]) == 0
    assert "reset by ops" in capsys.readouterr().out
    records = AuditLog.read(path)
    assert breaker_verdict(records).allowed and records[:len(BASE)] == BASE


class _Uncordons:
    """The one part of a ``Cluster`` an undo touches (``apply``): it says yes and keeps the actions."""

    def __init__(self) -> None:
        self.applied: list[Action] = []

    def apply(self, action: Action):
        from gpuwarden.fleet import ActionResult

        self.applied.append(action)
        return ActionResult(action, True, "uncordoned")


@pytest.mark.parametrize("tail", list(TORN.values())[:4], ids=list(TORN)[:4])
def test_an_undo_after_a_torn_line_is_recorded_and_not_repeated(tail, tmp_path):
    path = write(tmp_path / "audit.jsonl", lines(BASE) + tail)
    cluster = _Uncordons()
    entry = undo_applied(AuditLog(path), cluster, APPLIED_CORDON_ID, "ops", clock=FakeClock(NOW), mode=Mode.AUTO)
    assert entry.outcome == Outcome.UNDONE
    assert AuditLog.read(path)[-1]["undo_of"] == APPLIED_CORDON_ID
    with pytest.raises(ValueError, match="already undone"):  # read back from the file: a second undo is refused
        undo_applied(AuditLog(path), cluster, APPLIED_CORDON_ID, "ops", clock=FakeClock(NOW), mode=Mode.AUTO)
    assert len(cluster.applied) == 1


@pytest.mark.parametrize("tail", list(TORN.values())[:4], ids=list(TORN)[:4])
def test_the_actuators_own_entry_after_a_torn_line_reads_back(tail, tmp_path):
    path = write(tmp_path / "audit.jsonl", lines(BASE) + tail)
    entry = AuditEntry(NOW, Mode.AUTO, Outcome.BREAKER_RESET, "circuit-breaker", "actuator", "looked", by="ops")
    AuditLog(path).record(entry)
    assert AuditLog(path).records()[-1] == entry.as_dict()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(earlier=st.integers(0, len(BASE)), tail=st.binary(max_size=120),
       approve=st.booleans(), by=st.text(min_size=1, max_size=12).filter(str.strip))
def test_whatever_bytes_the_last_line_holds_an_appended_record_reads_back(tmp_path_factory, earlier, tail, approve, by):
    path = write(tmp_path_factory.mktemp("torn") / "audit.jsonl", lines(BASE[:earlier]) + tail)
    record = {"outcome": "approved" if approve else "rejected", "approval_id": "a1", "by": by, "comment": "",
              "at": NOW.isoformat()}
    append_line(path, record)
    read = AuditLog.read(path)
    assert read[:earlier] == BASE[:earlier]  # no earlier complete record is lost
    assert read[-1] == record  # and the appended one is whole, on its own line


def test_a_torn_line_is_said_once_it_is_fenced(tmp_path, caplog):
    path = write(tmp_path / "audit.jsonl", lines(BASE) + TORN["half-an-object"])
    decide(path, "a1", True, "erin", clock=FakeClock(NOW))
    with caplog.at_level(logging.WARNING, "gpuwarden.actuator"):
        AuditLog.read(path)
    assert "1 line(s)" in caplog.text and f"{path}:{len(BASE) + 1}" in caplog.text
    _, problems = av.read_entries(path)
    assert [p.split(": ")[0] for p in problems] == [f"{path}:{len(BASE) + 1}"]


# -- 2. wrong-typed lines: counted, said, never a crash, never a silent change of a verdict --------------
JUNK = {  # lines that mean nothing the actuator can use
    "a-list": "[1, 2]", "a-string": '"applied"', "a-number": "42", "null": "null", "true": "true",
    "no-outcome": '{"kind": "cordon", "target": "n9"}',
    "outcome-a-number": '{"outcome": 5, "kind": "cordon", "target": "n9"}',
    "outcome-a-list": '{"outcome": ["applied"], "kind": "cordon", "target": "n9"}',
    "time-a-number": '{"outcome": "applied", "at": 5}',
    "time-not-a-time": '{"outcome": "applied", "at": "yesterday"}',
    "undo-a-string": '{"outcome": "applied", "undo": "uncordon"}',
    "undo-of-unknown-kind": '{"outcome": "applied", "entry_id": "e9", "undo": {"kind": "explode", "target": "n"}}',
    "approval-id-a-list": '{"outcome": "awaiting-approval", "approval_id": ["a"], "kind": "cordon", "target": "n9"}',
    "approval-of-unknown-kind": '{"outcome": "awaiting-approval", "approval_id": "z", "kind": "explode", "target": "n"}',
    "approval-target-a-number": '{"outcome": "awaiting-approval", "approval_id": "z", "kind": "cordon", "target": 7}',
    "decision-without-who": '{"outcome": "approved", "approval_id": "a1", "by": 5}',
    "decision-id-an-object": '{"outcome": "approved", "approval_id": {"id": "a1"}, "by": "x"}',
    "undone-of-an-object": '{"outcome": "undone", "undo_of": {"x": 1}}',
    "findings-a-string": '{"outcome": "applied", "findings": "xid"}',
    "findings-of-numbers": '{"outcome": "applied", "findings": [5]}',
    "pace-window-a-word": '{"kind": "pace", "outcome": "paced", "params": {"window": "two"}}',
    "pace-next-at-a-number": '{"kind": "pace", "outcome": "paced", "params": {"next_at": 7}}',
    "params-a-list": '{"outcome": "applied", "params": [1]}',
    "entry-id-a-list": '{"entry_id": ["x"], "outcome": "applied"}',
    "reset-by-nobody": '{"outcome": "breaker-reset", "kind": "circuit-breaker", "by": ["ops"]}',
    "finding-kind-a-list": '{"outcome": "applied", "findings": [{"kind": ["x"], "node": "n"}]}',
}


def _with(line: str, position: int = 3) -> bytes:
    return lines(BASE[:position]) + line.encode() + b"\n" + lines(BASE[position:])


@pytest.mark.parametrize("line", JUNK.values(), ids=JUNK.keys())
def test_a_wrong_typed_line_changes_no_verdict_and_is_counted(line, tmp_path):
    path = write(tmp_path / "audit.jsonl", _with(line))
    records = AuditLog.read(path)
    assert verdicts(records) == BASE_VERDICTS
    entries, problems = av.read_entries(path)
    assert [p.split(": ")[0] for p in problems] == [f"{path}:4"]  # counted, with its line
    frame = av.load_audit(path, entries)
    assert av.limit_check(None, frame, "cordon", "n9").startswith("unknown")  # 2 applied: under the hourly limit
    assert [row["window"] for row in pace_rows(records)] == [1]


@pytest.mark.parametrize("line", JUNK.values(), ids=JUNK.keys())
def test_the_commands_read_past_a_wrong_typed_line_and_say_it(line, tmp_path, capsys):
    path = write(tmp_path / "audit.jsonl", _with(line))
    assert main(["actuator", "list", "--audit", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "waiting for approval: 1" in out and "circuit breaker OPEN" in out
    assert "1 line(s)" in out + err and f"{path}:4" in out + err
    assert main(["actuator", "approve", "a1", "--by", "erin", "--audit", str(path)]) == 0
    assert main(["actuator", "reset", "--by", "ops", "--audit", str(path)]) == 0
    assert breaker_verdict(AuditLog.read(path)).allowed


@pytest.mark.parametrize("line", [JUNK["undo-a-string"], JUNK["undo-of-unknown-kind"], JUNK["entry-id-a-list"],
                                  JUNK["undone-of-an-object"]], ids=["undo-string", "undo-kind", "id-list", "undone-of"])
def test_undo_reads_past_a_wrong_typed_line(line, tmp_path):
    path = write(tmp_path / "audit.jsonl", _with(line, len(BASE)))
    with pytest.raises(ValueError, match="no applied action with id e9|cannot be undone"):
        undo_applied(AuditLog(path), _Uncordons(), "e9", "ops", clock=FakeClock(NOW), mode=Mode.AUTO)
    entry = undo_applied(AuditLog(path), _Uncordons(), APPLIED_CORDON_ID, "ops", clock=FakeClock(NOW), mode=Mode.AUTO)
    assert entry.outcome == Outcome.UNDONE


def test_a_time_without_an_offset_is_read_as_utc_never_a_crash(tmp_path):
    line = json.dumps({"outcome": "applied", "kind": "cordon", "target": "n7", "at": ago(5).replace(tzinfo=None).isoformat()})
    records = AuditLog.read(write(tmp_path / "audit.jsonl", _with(line)))
    assert budget_use(records, NOW).applied_last_hour == 3  # counted in the last hour, as UTC
    assert held_by_gpuwarden(records)["n7"] == {"cordon"}


INCIDENTAL = {  # a record that means something, with a field its meaning does not rest on of the wrong type
    "breaker-open, message a number": ({"outcome": "breaker-open", "kind": "circuit-breaker", "message": 5},
                                       lambda v: not v["breaker"].allowed),
    "applied cordon, findings a string": ({"outcome": "applied", "kind": "cordon", "target": "n8",
                                           "at": ago(1).isoformat(), "findings": "xid"},
                                          lambda v: v["budget"].applied_last_hour == 3 and "n8" in v["held"]),
    "awaiting, reason a list": ({"outcome": "awaiting-approval", "approval_id": "a7", "kind": "cordon",
                                 "target": "n8", "reason": ["x"], "at": ago(1).isoformat()},
                                lambda v: "a7" in v["pending"]),
    "applied, undo a number": ({"outcome": "applied", "kind": "cordon", "target": "n8", "at": ago(1).isoformat(),
                                "undo": 3}, lambda v: "n8" in v["held"]),
}


@pytest.mark.parametrize("record, holds", INCIDENTAL.values(), ids=INCIDENTAL.keys())
def test_a_record_with_a_wrong_incidental_field_keeps_its_meaning_and_is_said(record, holds, tmp_path, caplog):
    closed = [r for r in BASE if r["outcome"] != "breaker-open"]  # so a breaker-open line has something to change
    path = write(tmp_path / "audit.jsonl", lines(closed) + json.dumps(record).encode() + b"\n")
    with caplog.at_level(logging.WARNING, "gpuwarden.actuator"):
        records = AuditLog.read(path)
    assert holds(verdicts(records))
    assert "1 line(s)" in caplog.text and f"{path}:{len(closed) + 1}" in caplog.text


_NOISE = st.one_of(
    st.sampled_from(sorted(JUNK.values())),
    st.one_of(st.integers(), st.text(max_size=8), st.none(), st.booleans(),
              st.lists(st.integers(), max_size=3)).map(json.dumps),
    st.fixed_dictionaries({"outcome": st.one_of(st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2))},
                          optional={"kind": st.text(max_size=5), "at": st.integers()}).map(json.dumps),
    st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b and b"\r" not in b and b.strip() != b"")
    .filter(lambda b: not b.lstrip().startswith(b"{")).map(lambda b: b.decode("latin-1")),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(BASE)), _NOISE), max_size=6))
def test_junk_lines_anywhere_change_no_verdict_and_each_is_counted(noise):
    by_position: dict[int, list[str]] = {}
    for position, line in noise:
        by_position.setdefault(position, []).append(line)
    data = b""
    for index in range(len(BASE) + 1):
        data += b"".join(line.encode("latin-1") + b"\n" for line in by_position.get(index, []))
        data += lines(BASE[index:index + 1])
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder) / "audit.jsonl", data)
        assert verdicts(AuditLog.read(path)) == BASE_VERDICTS
        _, problems = av.read_entries(path)
        assert len(problems) == len(noise)


def test_a_line_past_the_line_bound_is_skipped_not_loaded(tmp_path):
    huge = '{"outcome": "breaker-reset", "by": "ops", "comment": "' + "x" * (17 << 20) + '"}'
    path = write(tmp_path / "audit.jsonl", _with(huge, len(BASE)))
    records = AuditLog.read(path)
    assert verdicts(records) == BASE_VERDICTS  # the breaker stays open
    _, problems = av.read_entries(path)
    assert len(problems) == 1 and re.search(r"longer than", problems[0])


# -- 3. a path that does not exist: nothing created unless a record is written ---------------------------
READERS = {
    "list": (["actuator", "list"], 0),
    "approve": (["actuator", "approve", "a1", "--by", "erin"], 2),
    "reject": (["actuator", "reject", "a1", "--by", "erin"], 2),
    "undo": (["actuator", "undo", "e1", "--by", "erin"], 2),
    "reset": (["actuator", "reset", "--by", "ops"], 0),
}


@pytest.mark.parametrize("argv, code", READERS.values(), ids=READERS.keys())
def test_a_command_on_a_missing_audit_log_creates_nothing_and_says_so(argv, code, tmp_path, capsys):
    path = tmp_path / "not" / "here" / "audit.jsonl"
    assert main([*argv, "--audit", str(path)]) == code
    out, err = capsys.readouterr()
    assert f"no audit log at {path}" in out + err
    assert list(tmp_path.iterdir()) == []  # no folder, no log, no lock file
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_missing_log_beside_existing_files_gets_no_lock_file(tmp_path, capsys):
    (tmp_path / "other.txt").write_text("x")
    path = tmp_path / "audit.jsonl"
    assert main(["actuator", "approve", "a1", "--by", "erin", "--audit", str(path)]) == 2
    assert "no action awaits approval" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt"]


def test_the_library_reads_of_a_missing_log_create_nothing(tmp_path):
    path = tmp_path / "a" / "b" / "audit.jsonl"
    log = AuditLog(path)
    assert log.records() == [] and breaker_verdict(log.records()).allowed
    with pytest.raises(ValueError, match=f"no audit log at {re.escape(str(path))}"):
        decide(path, "a1", True, "erin", clock=FakeClock(NOW))
    assert av.read_entries(path) == ([], [])
    assert list(tmp_path.iterdir()) == []


def test_the_writer_creates_the_log_and_its_folders_when_it_writes(tmp_path):
    path = tmp_path / "a" / "b" / "audit.jsonl"
    log = AuditLog(path)
    assert not (tmp_path / "a").exists()  # opening it is not writing it
    entry = AuditEntry(NOW, Mode.AUTO, Outcome.BREAKER_OPEN, "circuit-breaker", "actuator", "limit", by="actuator")
    log.record(entry)
    assert AuditLog.read(path) == [entry.as_dict()]
