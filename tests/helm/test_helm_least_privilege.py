"""Least privilege (issue 24 item 5), rendered by the real helm 3 and checked in the dashboard:
observe mode grants no write verb but ``nodes/status`` patch (the GPUHealthy condition) and
``events`` create, and runs one replica without a Lease; the dashboard asks viewers to sign in (an
auth proxy's e-mail header or OIDC) unless ``dashboard.auth.public=true``."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest
from test_helm import CHART, NAMESPACE, RELEASE, helm, render, run_helm  # noqa: F401  (helm: a fixture)
from test_helm_remediation import one, writes

from gpuwarden.dashboards import auth
from gpuwarden.dashboards.launch import APP_PATH

ALL_ACTIONS = ["remediation.actions.health=true", "remediation.actions.idle=true", "remediation.actions.scheduling=true",
               "remediation.kueue=true"]


def test_observe_mode_grants_only_the_condition_and_the_event_whatever_actions_are_on(helm):  # noqa: F811
    docs = render(helm, "remediation.enabled=true", *ALL_ACTIONS)  # mode observe is the default
    assert writes(docs) == {("ClusterRole", "nodes/status"): {"patch"}, ("Role", "events"): {"create"}}
    deployment = one(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 1 and "--leader-elect" not in container["args"]
    assert "--mode=observe" in container["args"]
    # The same switches in auto mode grant the action verbs, leases and leader election back.
    acting = render(helm, "remediation.enabled=true", "remediation.mode=auto", *ALL_ACTIONS)
    granted = writes(acting)
    assert granted[("ClusterRole", "nodes")] == {"patch"} and granted[("Role", "leases")] == {"create", "patch"}
    assert granted[("ClusterRole", "nodes/status")] == {"patch"}
    assert one(acting, "Deployment")["spec"]["replicas"] == 2


def _dashboard_container(docs: list[dict]) -> dict:
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-dashboard"))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_the_dashboard_asks_for_a_sign_in_unless_the_operator_makes_it_public(helm):  # noqa: F811
    env = {e["name"]: e.get("value") for e in _dashboard_container(render(helm, "dashboard.enabled=true"))["env"]}
    assert env["GPUWARDEN_VIEW_AUTH"] == "proxy" and "GPUWARDEN_VIEWERS" not in env
    public = _dashboard_container(render(helm, "dashboard.enabled=true", "dashboard.auth.public=true",
                                         "dashboard.auth.mode=oidc"))
    assert {e["name"]: e.get("value") for e in public["env"]}["GPUWARDEN_VIEW_AUTH"] == "public"
    assert not [a for a in public["args"] if a.startswith("--secrets.files")]
    oidc = render(helm, "dashboard.enabled=true", "dashboard.auth.mode=oidc", "dashboard.auth.oidcSecret=gw-oidc",
                  "dashboard.auth.viewers=@example.com")
    container = _dashboard_container(oidc)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["GPUWARDEN_VIEW_AUTH"], env["GPUWARDEN_VIEWERS"]) == ("oidc", "@example.com")
    assert "--secrets.files=/var/run/secrets/gpuwarden/oidc/secrets.toml" in container["args"]
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["oidc"] == "/var/run/secrets/gpuwarden/oidc"


@pytest.mark.parametrize("sets, words", [
    (["dashboard.auth.mode=oidc"], "dashboard.auth.mode=oidc needs dashboard.auth.oidcSecret"),
    (["dashboard.auth.mode=basic"], "dashboard.auth.mode"),
])
def test_a_sign_in_that_cannot_work_is_refused_at_install(helm, sets, words):  # noqa: F811
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "dashboard.enabled=true"]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode != 0 and words in result.stderr, result.stderr


# -- the dashboard's side --------------------------------------------------------------------------

def test_proxy_headers_name_the_viewer_and_viewers_narrow_who_may_look():
    assert auth.proxy_email({"x-forwarded-email": "ana@example.com"}) == "ana@example.com"
    assert auth.proxy_email({"X-Auth-Request-Email": "bo@example.com", "X-Forwarded-Email": " "}) == "bo@example.com"
    assert auth.proxy_email({"X-Forwarded-User": "ana"}) is None  # a user name is not the e-mail it signs in with
    assert auth.may_view("Ana@Example.com", "@example.com, ops@other.org")
    assert auth.may_view("ops@other.org", "@example.com, ops@other.org")
    assert not auth.may_view("eve@example.com.evil", "@example.com")
    assert auth.may_view("anyone@anywhere", "")


@pytest.mark.parametrize("mode, title", [("proxy", "Sign in to view gpuwarden"), (None, None)])
def test_every_page_needs_a_viewer_when_a_sign_in_is_asked_for(tmp_path, monkeypatch, mode, title):
    monkeypatch.setenv("GPUWARDEN_STORE", str(tmp_path))
    monkeypatch.delenv("GPUWARDEN_DEMO_APPROVER", raising=False)
    if mode:
        monkeypatch.setenv(auth.VIEW_AUTH_ENV, mode)
    else:
        monkeypatch.delenv(auth.VIEW_AUTH_ENV, raising=False)
    app = AppTest.from_file(str(APP_PATH), default_timeout=60).run()
    assert not app.exception
    titles = [t.value for t in app.title]
    if title:
        assert titles == [title]  # nothing of the fleet is drawn for a request without a viewer
        assert "X-Forwarded-Email or X-Auth-Request-Email" in app.info[0].value
    else:
        assert "Sign in to view gpuwarden" not in titles


def test_a_misconfigured_view_mode_is_said_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUWARDEN_STORE", str(tmp_path))
    monkeypatch.setenv(auth.VIEW_AUTH_ENV, "password")
    app = AppTest.from_file(str(APP_PATH), default_timeout=60).run()
    assert "GPUWARDEN_VIEW_AUTH='password' is not one of: public, proxy, oidc" in app.error[0].value


def test_pacing_and_repair_reach_the_actuator_as_arguments_it_accepts(helm):  # noqa: F811
    from gpuwarden.cli import build_parser

    docs = render(helm, "remediation.enabled=true", "remediation.mode=auto", "remediation.repairAfterHealthySeconds=900",
                  "remediation.pacing.provenAfterSeconds=600")
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = [a.replace("$(POD_NAME)", "actuator-0") for a in container["args"]]
    parsed = build_parser().parse_args(args)
    assert (parsed.pace_proven_after, parsed.pace_cooldown, parsed.repair_after) == (600.0, 60.0, 900.0)
    (default,) = one(render(helm, "remediation.enabled=true"), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert build_parser().parse_args(default["args"]).repair_after is None  # opt-in
    defaults = build_parser().parse_args(default["args"])
    assert (defaults.max_unhealthy_ratio_per_domain, defaults.domain_cooldown) == (0.2, 1800.0)
    assert (defaults.checkpoint_timeout_critical, defaults.checkpoint_timeout_warning) == (300.0, 900.0)
    tuned = one(render(helm, "remediation.enabled=true", "remediation.limits.maxUnhealthyRatioPerDomain=1",
                       "remediation.checkpointTimeoutSeconds.critical=0"), "Deployment")
    (container,) = tuned["spec"]["template"]["spec"]["containers"]
    parsed = build_parser().parse_args(container["args"])
    assert (parsed.max_unhealthy_ratio_per_domain, parsed.checkpoint_timeout_critical) == (1.0, 0.0)
