"""One base class for every error a user can cause: ``gpuwarden.fleet.errors.UserError``.

The CLI prints a UserError on one line and exits 2; anything else is a bug (exit 1). These tests
walk the whole package for exception classes, so a new error class must be classified here: a
user error subclasses UserError, anything else is listed below with the reason it is not one.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path

import pytest

import gpuwarden
from gpuwarden.cli import COMMANDS, main
from gpuwarden.fleet.errors import UserError

PACKAGE = Path(gpuwarden.__file__).parent

# Every error class a user can cause (a flag, a config key, a file, a store, an environment
# variable they set), by module and name.
USER_ERRORS = {
    "gpuwarden.fleet.vocabulary.FleetValueError", "gpuwarden.fleet.traces.TraceError",
    "gpuwarden.fleet.catalogue.CatalogueError", "gpuwarden.fleet.gpu_catalogue.GpuCatalogueError",
    "gpuwarden.fleet.durations.DurationError", "gpuwarden.store.schema.SamplesError",
    "gpuwarden.store.prometheus.client.PrometheusError", "gpuwarden.store.prometheus.client.PrometheusUnavailable",
    "gpuwarden.store.prometheus.client.PrometheusQueryError", "gpuwarden.analytics.params.AnalyticsError",
    "gpuwarden.analytics.pricebook.PriceBookError", "gpuwarden.scheduling.errors.SchedulingError",
    "gpuwarden.fleet.mig_geometry.UnknownMigProfile", "gpuwarden.scheduling.errors.QuotaError",
    "gpuwarden.scheduling.errors.TraceOrderError", "gpuwarden.scheduling.whatif.WhatIfError",
    "gpuwarden.sim.config.ConfigError", "gpuwarden.exporter.main.ExporterError",
    "gpuwarden.exporter.replay.files.ReplayError", "gpuwarden.cli.demo.DemoError", "gpuwarden.cli.demo.DashboardError",
    "gpuwarden.dashboards.sources.StoreUnreadable", "gpuwarden.dashboards.sources.SourceMisconfigured",
    "gpuwarden.cli.actuator_cmd.SchedulingMoved", "gpuwarden.portal.submit.PortalError",
    "gpuwarden.cli.queue_cmd.SchedulerUnreachable",
    "gpuwarden.fleet.inputs.InputFileError", "gpuwarden.cli.storemark.StorePathError",
    "gpuwarden.fleet.cluster_state.ClusterStateError",
    "gpuwarden.remediation.audit.AuditLogMissing", "gpuwarden.kube.webhook_tls.WebhookCertificateError",
}
# Exception classes that are not the user's to fix, and why.
NOT_USER_ERRORS = {
    "gpuwarden.scheduling.savings._SloBroken": "a replay's team already broke the wait SLO: control flow that ends the replay early, never raised to a user",
    "gpuwarden.exporter.nvml.query.NvmlUnavailable": "the host has no NVML; the exporter turns it into an ExporterError naming --backend",
    "gpuwarden.exporter.nvml.query.GpuLost": "a GPU fell off the bus: the exporter marks it lost and carries on",
    "gpuwarden.exporter.podresources.processes._Vanished": "a process exited while it was read; internal control flow",
    "gpuwarden.kube.failure.KubeFailure": "the API server's answer (retryable or not); the actuator decides per call",
    # Its kinds (gpuwarden/kube/failure.py): each the cluster's answer, never the user's input. A
    # command that cannot reach or may not use the cluster exits 1 naming it (the actuator's run_plan).
    "gpuwarden.kube.failure._Kind": "the base of the kinds below: a status and temporary-or-not per class",
    "gpuwarden.kube.failure.PermanentFailure": "an API answer a retry cannot change (any other 4xx); recorded, not retried",
    "gpuwarden.kube.failure.TemporaryFailure": "an API answer a later try may change; retried now or next round",
    "gpuwarden.kube.failure.NotFound": "404: the object is gone (often the outcome wanted); the caller decides",
    "gpuwarden.kube.failure.Forbidden": "403: the chart's RBAC lacks a verb; the message names it for the operator",
    "gpuwarden.kube.failure.Unauthorized": "401: the cluster refused the credentials of the pod's service account",
    "gpuwarden.kube.failure.Invalid": "422: the API server refused a change gpuwarden built; a bug or a cluster rule",
    "gpuwarden.kube.failure.Conflict": "409: someone else wrote first; the caller re-reads and retries",
    "gpuwarden.kube.failure.TooManyRequests": "429: throttled or a PodDisruptionBudget; retried after Retry-After",
    "gpuwarden.kube.failure.ServerFailure": "5xx: the API server failed; retried with back-off",
    "gpuwarden.kube.failure.Unreachable": "no HTTP answer (refused, reset, timed out); retried with back-off",
    "gpuwarden.kube.failure.UnexpectedAnswer": "an API answer of the wrong shape; the round acts on nothing, retried",
    "gpuwarden.cli.demo.Stopped": "a signal ending the demo (a BaseException, never an error)",
    "gpuwarden.dashboards.live_queue.QueueUnavailable": "the scheduler's /queue did not answer; the Queue page says so in one line",
    "gpuwarden.store.http_fetch.DeadlineExceeded": "a server too slow; each client says which (PrometheusUnavailable, a failed scrape)",
    "gpuwarden.store.http_fetch.AnswerTooLarge": "a server's answer too large; each client says which (PrometheusError, a failed scrape)",
    "gpuwarden.scheduling.errors.PlanRefused": "a replay's pass broke an invariant: a bug in the engine (exit 1), never input",
    "gpuwarden.fleet.capabilities.IncompleteHandlerTable": "a Cluster implementation left an ActionKind unhandled: "
                                                           "a bug, raised at import",
    "gpuwarden.kube.team_quotas._Refusal": "a quota annotation that cannot be read; internal control flow: the team "
                                                    "is refused with an Event and a line in /queue",
    "gpuwarden.kube.transport.AnswerRefused": "an API answer past the cap or cut at the deadline; internal control "
                                              "flow: KubeApi.call raises it as an UnexpectedAnswer or Unreachable",
    "gpuwarden.kube.kubeconfig._Refused": "a kubeconfig that cannot be used; internal control flow: load_client "
                                          "re-raises it as one line (ValueError, exit 2)",
}


def _declared_classes() -> dict[str, str]:
    """Every class declared at module level in the package: qualified name -> module name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "api_pb2.py":  # protoc output
            continue
        tree = ast.parse(path.read_text(), str(path))
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found[f"{module}.{node.name}"] = module
    return found


def _exception_classes() -> dict[str, type[BaseException]]:
    out = {}
    for qualified, module in _declared_classes().items():
        kind = getattr(importlib.import_module(module), qualified.rsplit(".", 1)[1])
        if isinstance(kind, type) and issubclass(kind, BaseException):
            out[qualified] = kind
    return out


@pytest.fixture(scope="module")
def exception_classes() -> dict[str, type[BaseException]]:
    return _exception_classes()


def test_every_exception_class_is_classified(exception_classes):
    declared = set(exception_classes) - {"gpuwarden.fleet.errors.UserError"}
    assert declared - USER_ERRORS - set(NOT_USER_ERRORS) == set(), "classify the new exception class here"
    assert (USER_ERRORS | set(NOT_USER_ERRORS)) - declared == set(), "a listed class no longer exists"


def test_user_errors_subclass_user_error(exception_classes):
    assert not [name for name in USER_ERRORS if not issubclass(exception_classes[name], UserError)]
    assert not [name for name in NOT_USER_ERRORS if issubclass(exception_classes[name], UserError)]


def test_every_class_named_error_is_a_user_error(exception_classes):
    named = {name for name in exception_classes if name.endswith("Error")} - {"gpuwarden.fleet.errors.UserError"}
    assert named <= USER_ERRORS


def test_user_errors_keep_their_old_base(exception_classes):
    """Code that caught one by its old base (``except ValueError``) still does."""
    for name in ("gpuwarden.fleet.traces.TraceError", "gpuwarden.store.schema.SamplesError",
                 "gpuwarden.sim.config.ConfigError", "gpuwarden.analytics.params.AnalyticsError",
                 "gpuwarden.scheduling.errors.QuotaError", "gpuwarden.exporter.replay.files.ReplayError"):
        assert issubclass(exception_classes[name], ValueError), name
    assert issubclass(exception_classes["gpuwarden.cli.demo.DemoError"], RuntimeError)


@pytest.fixture
def failing_command(monkeypatch):
    """A ``fail`` command whose run raises the exception it is given."""
    module = types.ModuleType("gpuwarden_test_fail_cmd")
    module.error = None

    def add_parser(subparsers):
        parser = subparsers.add_parser("fail")

        def run(args):
            raise module.error

        parser.set_defaults(run=run)

    module.add_parser = add_parser
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(COMMANDS, "fail", (module.__name__, "raise an error"))
    return module


@pytest.mark.parametrize("name", sorted(USER_ERRORS))
def test_cli_prints_each_user_error_on_one_line_with_exit_2(failing_command, capsys, exception_classes, name):
    kind = exception_classes[name]
    failing_command.error = kind("--flag 'x' is not allowed;\n  choose from a, b")
    assert main(["fail"]) == 2
    assert capsys.readouterr().err == "gpuwarden: error: --flag 'x' is not allowed; choose from a, b\n"


@pytest.mark.parametrize("error", [ValueError("a plain ValueError is a bug"), KeyError("column"), RuntimeError("boom")])
def test_cli_calls_any_other_error_a_bug_with_exit_1(failing_command, capsys, error):
    failing_command.error = error
    assert main(["fail"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gpuwarden: error: {type(error).__name__}: ") and "this is a bug" in err
