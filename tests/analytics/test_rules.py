"""The shipped Prometheus rules (rules/*.rules.yml): valid, unit-tested with promtool, and covered.

``promtool test rules`` runs rules/tests/*.test.yml: every recording rule is checked against
hand-computed values and every alert has a case where it fires and one where it must not. The
tests here also check that the test files really cover every rule, that the rules read metric
names the exporter serves, and that the expressions PrometheusSource uses without rules are the
ones the rules record.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuwarden.exporter import ExporterSnapshot, build_families, load_catalogue
from gpuwarden.store import prometheus as prom

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"
RULE_FILES = sorted(RULES.glob("*.rules.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*.test.yml"))


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        reason = "promtool not installed (Debian package 'prometheus'; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}; CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(reason)
    return path


def _rules(kind: str) -> dict[str, dict]:
    found = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if kind in rule:
                    found[rule[kind]] = rule
    return found


def test_rule_files_exist():
    assert {p.name for p in RULE_FILES} == {"gpuwarden-recording.rules.yml", "gpuwarden-alerts.rules.yml"}
    assert {p.name for p in TEST_FILES} == {"recording.test.yml", "alerts.test.yml", "state.test.yml"}


def test_recording_rules_are_generated_from_the_analytics_parameters():
    """One definition of idle: the committed rules, their helm copy and the generator agree byte
    for byte, and the state test's expectations are what the engine computes today."""
    from gpuwarden.analytics.promrules import HELM_COPY, RULE_FILE, render_recording_rules
    from rules_scenario import render as render_state_test

    text = render_recording_rules()
    assert (ROOT / RULE_FILE).read_text() == text, "run: python -m gpuwarden.analytics.promrules --write"
    assert (ROOT / HELM_COPY).read_bytes() == (ROOT / RULE_FILE).read_bytes()
    assert (ROOT / "helm/gpuwarden/files/rules/gpuwarden-alerts.rules.yml").read_bytes() == \
        (RULES / "gpuwarden-alerts.rules.yml").read_bytes()
    assert (RULES / "tests" / "state.test.yml").read_text() == render_state_test(), \
        "run: python tests/rules_scenario.py > rules/tests/state.test.yml"


def test_changed_parameters_change_the_rules():
    from gpuwarden.analytics import IdleParams
    from gpuwarden.analytics.promrules import render_recording_rules

    text = render_recording_rules(IdleParams(idle_activity=0.05, fake_busy_util=0.2))
    assert "DCGM_FI_PROF_SM_ACTIVE < bool 0.05" in text and "DCGM_FI_DEV_GPU_UTIL >= bool 20" in text
    assert text != render_recording_rules()


def test_promtool_check_rules():
    result = subprocess.run([_promtool(), "check", "rules", *map(str, RULE_FILES)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_FILES)


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file):
    result = subprocess.run([_promtool(), "test", "rules", test_file.name], cwd=test_file.parent,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_recording_rule_is_unit_tested():
    tested = set()
    for name in ("recording.test.yml", "state.test.yml"):
        for test in yaml.safe_load((RULES / "tests" / name).read_text())["tests"]:
            tested |= {case["expr"] for case in test.get("promql_expr_test", [])}
    internal = {"gpu:gpuwarden_activity:ratio", "gpu:gpuwarden_plain_idle:bool"}  # checked through gpu:gpuwarden_state:code
    assert set(_rules("record")) - internal <= tested


def test_every_alert_has_a_firing_and_a_must_not_fire_case():
    cases: dict[str, set[str]] = {}
    for test in yaml.safe_load((RULES / "tests" / "alerts.test.yml").read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add("fires" if case.get("exp_alerts") else "silent")
    alerts = set(_rules("alert"))
    assert {"GpuCriticalXid", "GpuXid94", "GpuUncorrectableEccError", "GpuRowRemapFailure", "GpuRowRemapPending",
            "GpuRecoveryActionRequired", "GpuThermalThrottling", "GpuPowerBrakeThrottling", "GpuIdleWhileAllocated",
            "GpuExporterDown", "GpuExporterStale", "GpuExporterCollectionFailing"} <= alerts
    for alert in alerts:
        assert cases.get(alert) == {"fires", "silent"}, f"{alert}: cases {cases.get(alert)}"


def test_xid_alerts_cover_the_issue_codes():
    critical = _rules("alert")["GpuCriticalXid"]
    assert critical["labels"]["severity"] == "critical"
    codes = set(re.search(r'xid=~"([0-9|]+)"', critical["expr"]).group(1).split("|"))
    assert codes == {"48", "62", "64", "74", "79", "95", "119", "120"}
    warning = _rules("alert")["GpuXid94"]
    assert warning["labels"]["severity"] == "warning" and 'xid="94"' in warning["expr"]


def test_rules_read_metrics_the_exporter_serves():
    snapshot = ExporterSnapshot(success=True, timestamp_seconds=1.0, duration_seconds=0.1, last_success_timestamp_seconds=1.0)
    served = {spec.metric for spec in load_catalogue()}
    served |= {sample.name for family in build_families(snapshot, ()) for sample in family.samples}
    recorded = set(_rules("record"))
    for rule in [*_rules("record").values(), *_rules("alert").values()]:
        for name in re.findall(r"\b(DCGM_FI_\w+|gpuwarden_\w+|gpu:\w+:\w+|namespace:\w+:\w+)", rule["expr"]):
            assert name in served or name in recorded, f"{name} in {rule.get('record') or rule.get('alert')} is not served"


def test_source_expressions_match_the_recording_rules():
    """read_rollup(use_rules=False) computes what the rules record."""
    from gpuwarden.analytics.promrules import raw_expressions

    raw = raw_expressions()
    assert prom.IDLE_EXPR == raw["idle"]
    assert prom.FAKE_BUSY_EXPR == raw["fake_busy"]
    assert prom.HOARDED_EXPR == raw["hoarded"]
    from gpuwarden.analytics.promrules import ROLLUP_LABELS, ROLLUP_METRICS

    assert prom.STATE_ROLLUPS == ROLLUP_METRICS  # what reports read is what the rules record
    assert prom.ROLLUP_LABELS == ROLLUP_LABELS and "pod" not in ROLLUP_LABELS
    intervals = {group["name"]: group.get("interval") for path in RULE_FILES if "recording" in path.name
                 for group in yaml.safe_load(path.read_text())["groups"]}
    assert intervals == {"gpuwarden-usage": "1m", "gpuwarden-rollup": "5m"}
    assert prom.PrometheusSource("http://x").rule_interval == 60


def test_the_common_increase_form_misses_the_first_xid(tmp_path):
    """Why the XID alert is not just increase() > 0: a series born with 1 never 'increases'."""
    naive = {"groups": [{"name": "naive", "rules": [{
        "alert": "NaiveXid", "expr": 'increase(gpuwarden_xid_errors_total{xid="79"}[10m]) > 0'}]}]}
    (tmp_path / "naive.yml").write_text(yaml.safe_dump(naive))
    case = {"rule_files": ["naive.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": 'gpuwarden_xid_errors_total{UUID="GPU-0",xid="79"}', "values": "_x13 1x20"}],
        "alert_rule_test": [{"alertname": "NaiveXid", "eval_time": "13m", "exp_alerts": []},
                            {"alertname": "NaiveXid", "eval_time": "20m", "exp_alerts": []}],
    }]}
    (tmp_path / "naive.test.yml").write_text(yaml.safe_dump(case))
    result = subprocess.run([_promtool(), "test", "rules", "naive.test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr  # the naive alert stayed silent
