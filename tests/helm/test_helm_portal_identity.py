"""The chart's group -> team mapping for the portal (``portal.groups``, ``portal.groupsClaim``),
rendered by the real helm 3 from a values file as an operator writes one: it reaches the ConfigMap
the dashboard reads, which ``gpuwarden.portal.access.load_portal`` reads back as the same mapping;
without it the file says so (no mapping: anyone signed in, any team); a group naming a team the chart
does not define, a mapping without teams and a nested group name are refused at install, naming the
key. Skips with the reason without helm (fails under CI=true)."""

from __future__ import annotations

import pytest
import yaml
from test_helm import CHART, NAMESPACE, RELEASE, run_helm
from test_helm import helm  # noqa: F401  (fixture)

from gpuwarden.portal.access import load_portal

CONFIGMAP = f"{RELEASE}-gpuwarden-portal"
TEAMS = {name: {"namespace": name, "images": [f"{name}:1"], "shapes": [{"gpus": 1}], "priorityClasses": ["normal"]}
         for name in ("research", "vision")}
GROUPS = {"ml-research": "research", "platform admins": ["research", "vision"], "/org/ml.vision": "vision"}
BASE = {"scheduling": {"enabled": True}, "dashboard": {"enabled": True}, "portal": {"teams": TEAMS}}


def with_portal(**portal) -> dict:
    return {**BASE, "portal": {**BASE["portal"], **portal}}


def template(helm: str, values: dict, tmp_path, *extra: str):  # noqa: F811
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(path), *extra)


def portal_file(helm: str, values: dict, tmp_path):  # noqa: F811
    """The ConfigMap's portal file, written where the dashboard would mount it, read as the dashboard reads it."""
    result = template(helm, values, tmp_path)
    assert result.returncode == 0, result.stderr
    [configmap] = [d for d in yaml.safe_load_all(result.stdout)
                   if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIGMAP]
    path = tmp_path / "templates.yaml"
    path.write_text(configmap["data"]["templates.yaml"])
    return yaml.safe_load(path.read_text()), load_portal(path)


def test_the_mapping_renders_into_the_file_the_dashboard_reads(helm, tmp_path):  # noqa: F811
    document, config = portal_file(helm, with_portal(groups=GROUPS, groupsClaim="roles"), tmp_path)
    assert document["groups"] == GROUPS and document["groupsClaim"] == "roles"
    assert config.access.enforced and config.access.groups_claim == "roles"
    assert dict(config.access.groups) == {"ml-research": {"research"}, "platform admins": {"research", "vision"},
                                          "/org/ml.vision": {"vision"}}
    assert sorted(config.templates) == ["research", "vision"]
    path = tmp_path / "values.yaml"
    lint = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(path))
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_without_a_mapping_the_file_maps_nothing(helm, tmp_path):  # noqa: F811
    document, config = portal_file(helm, with_portal(groupsClaim="roles"), tmp_path)
    assert document == {"teams": TEAMS}  # the file as before the mapping existed
    assert not config.access.enforced  # anyone signed in, any team: the page says so


@pytest.mark.parametrize(("values", "words"), [
    (with_portal(groups={"ml": "speech"}), "portal.groups.ml maps to team speech, which portal.teams does not define "
                                           "(teams: research, vision)"),
    (with_portal(groups={"ml": ["research", "speech"]}), "portal.groups.ml maps to team speech"),
    ({**BASE, "portal": {"groups": {"ml": "research"}}}, "portal.groups needs portal.teams"),
    (with_portal(groups={'["ml"]': "research"}), 'Property name of "["ml"]" does not match'),
    (with_portal(groups={"ml": {"team": "research"}}), "portal.groups.ml"),
    (with_portal(groups={"ml": []}), "portal.groups.ml"),
    (with_portal(groupsClaim=""), "portal.groupsClaim"),
], ids=["unknown-team", "unknown-team-in-list", "no-teams", "nested-name", "object", "empty-list", "empty-claim"])
def test_a_wrong_mapping_is_refused_at_install_naming_the_key(helm, tmp_path, values, words):  # noqa: F811
    result = template(helm, values, tmp_path)
    assert result.returncode != 0 and words in result.stderr, result.stderr
