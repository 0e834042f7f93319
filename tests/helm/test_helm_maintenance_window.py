"""The chart's ``remediation.maintenanceWindow`` reaches ``gpuwarden actuator run`` as
``--maintenance-window``, the values schema refuses what the actuator would, and leaving it empty
renders no flag (any time, as before). Rendered by the real helm 3 (``tests/helm/test_helm.py``'s fixture)."""

from __future__ import annotations

import pytest
from test_helm import CHART, NAMESPACE, RELEASE, helm, one, render, run_helm  # noqa: F401 (helm is a fixture)

from gpuwarden.remediation.maintenance import MaintenanceWindow
from gpuwarden.cli import build_parser


def actuator_args(docs: list[dict]) -> list[str]:
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return [a.replace("$(POD_NAME)", "actuator-0") for a in container["args"]]


def test_the_window_value_becomes_the_actuators_flag(helm: str) -> None:  # noqa: F811
    args = actuator_args(render(helm, "remediation.enabled=true", r"remediation.maintenanceWindow=tue\,thu 02:00-05:00"))
    assert "--maintenance-window=tue,thu 02:00-05:00" in args
    parsed = build_parser().parse_args(args)
    assert isinstance(parsed.maintenance_window, MaintenanceWindow) and str(parsed.maintenance_window) == "tue,thu 02:00-05:00"
    plain = actuator_args(render(helm, "remediation.enabled=true"))
    assert not any(a.startswith("--maintenance-window") for a in plain)
    assert build_parser().parse_args(plain).maintenance_window is None


@pytest.mark.parametrize("value", ["tuesday", "tue 2am-5am"])
def test_the_values_schema_refuses_a_window_that_is_not_days_and_times(helm: str, value: str) -> None:  # noqa: F811
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "remediation.enabled=true",
                      "--set", f"remediation.maintenanceWindow={value}")
    assert result.returncode != 0 and "maintenanceWindow" in result.stderr
