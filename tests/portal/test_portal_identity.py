"""Who may submit for which team (gpuwarden.portal.access): the rule, property-based through the
production submit path (the proxy's header parsed, ``submit_as``, the Kubernetes submitter, the
official client, the fake API server): a Job is created only for a team the identity's groups map
to, or any team where no mapping is configured, and every refusal is one line, logged, with nothing
sent to the API. Then the header and claim parsing cases and the portal file's ``groups`` key."""

from __future__ import annotations

import json
import logging
import re

import pytest
import yaml
from fake_kube_api import FakeKubeAPI
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuwarden.kube import KubeApi, load_client
from gpuwarden.portal import access
from gpuwarden.portal.access import Requester, groups_from_claim, groups_from_headers, parse_portal, submit_as
from gpuwarden.portal.submit import DEMO_TEMPLATES_PATH, PortalError, PortalRequest, Shape
from gpuwarden.portal.submitters import KubeSubmitter

TEAM_POOL = ("research", "vision", "speech", "infra")
# Group names as identity providers spell them: spaces inside, slashes, colons, any script; never
# the comma that separates them in a header, nor a bracket or quote (refused as nested).
GROUP_CHARS = st.characters(categories=("L", "N", "P", "S"), exclude_characters=",[]{}\"") | st.just(" ")
GROUP = st.text(GROUP_CHARS, min_size=1, max_size=24).map(str.strip).filter(bool)


def template(team: str) -> dict:
    return {"namespace": f"ns-{team}", "images": [f"{team}:1"], "shapes": [{"gpus": 1}], "priorityClasses": ["normal"]}


def request_for(team: str) -> PortalRequest:
    return PortalRequest(team, "job", f"{team}:1", Shape(gpus=1), "normal")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def entries(self) -> list[tuple[int, str, dict]]:
        return [(r.levelno, r.args[0], json.loads(r.args[1])) for r in self.records]


@pytest.fixture(scope="module")
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def kube(api, tmp_path_factory):
    client = load_client(api.kubeconfig(tmp_path_factory.mktemp("kc") / "kubeconfig.json"), timeout_seconds=2.0)
    return KubeSubmitter(KubeApi(client, attempts=1))


@pytest.fixture
def audit():
    lines = Lines()
    access.AUDIT.addHandler(lines)
    level = access.AUDIT.level
    access.AUDIT.setLevel(logging.INFO)
    yield lines
    access.AUDIT.removeHandler(lines)
    access.AUDIT.setLevel(level)


@st.composite
def cases(draw):
    teams = draw(st.lists(st.sampled_from(TEAM_POOL), min_size=1, unique=True))
    groups = draw(st.dictionaries(GROUP, st.lists(st.sampled_from(teams), min_size=1, max_size=3, unique=True),
                                  max_size=5))
    held = draw(st.lists(st.sampled_from(sorted(groups)) | GROUP, max_size=6, unique=True) if groups
                else st.lists(GROUP, max_size=4, unique=True))
    spaced = [draw(st.sampled_from(["", " ", "  "])) + g + draw(st.sampled_from(["", " "])) for g in held]
    header = ",".join(spaced + draw(st.lists(st.just(" "), max_size=2)))  # empty items: dropped
    identity = draw(st.emails() | st.text(st.characters(categories=("L", "N")), min_size=1, max_size=30))
    team = draw(st.sampled_from((*TEAM_POOL, "nobody")))
    mapped = {"teams": {t: template(t) for t in teams}} | ({"groups": {g: v if len(v) > 1 else v[0]
                                                                        for g, v in groups.items()}} if groups else {})
    return mapped, header, identity, team


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_a_job_is_created_only_for_a_team_the_identitys_groups_map_to(kube, api, case):
    document, header, identity, team = case
    config = parse_portal(document, "case")
    requester = Requester(identity, groups_from_headers({"X-Forwarded-Groups": header}))
    mapping = document.get("groups", {})
    if mapping:
        wanted = {t for g in requester.groups for t in ([mapping[g]] if isinstance(mapping.get(g), str)
                                                        else mapping.get(g, []))}
    else:
        wanted = set(document["teams"])
    expected = team in wanted and team in document["teams"]  # the rule, restated from the contract
    event(f"{'mapped' if mapping else 'no mapping'}, {'accepted' if expected else 'refused'}")
    assert set(config.access.teams_for(requester, config.templates)) == wanted & set(document["teams"])
    lines, level = Lines(), access.AUDIT.level
    access.AUDIT.addHandler(lines)
    access.AUDIT.setLevel(logging.INFO)
    before = len(api.calls("POST"))
    try:
        key, _ = submit_as(kube, config, requester, request_for(team))
    except PortalError as error:
        assert not expected, f"{identity} refused for mapped team {team}: {error}"
        assert "\n" not in str(error) and f"team {team!r}" in str(error)
        assert len(api.calls("POST")) == before  # refused before anything reached the API
        [(level, outcome, entry)] = lines.entries()
        assert (level, outcome, entry["identity"], entry["team"]) == (logging.WARNING, "refused", identity, team)
    else:
        assert expected, f"{identity} with groups {sorted(requester.groups)} submitted for unmapped team {team}"
        [post] = api.calls("POST")[before:]
        assert post.path == f"/apis/batch/v1/namespaces/ns-{team}/jobs" and key.startswith(f"ns-{team}/job-")
        assert post.body["metadata"]["annotations"]["gpuwarden.io/requested-by"] == identity
        [(level, outcome, entry)] = lines.entries()
        assert (level, outcome, entry["workload"]) == (logging.INFO, "submitted", key)
    finally:
        access.AUDIT.removeHandler(lines)
        access.AUDIT.setLevel(level)


DOCUMENT = {"teams": {t: template(t) for t in ("research", "vision", "speech")},
            "groups": {"ml-research": "research", "platform admins": ["research", "vision"]}}


def test_several_teams_groups_offer_only_those_and_refusals_say_what_the_identity_may(kube, api, audit):
    config = parse_portal(DOCUMENT)
    bo = Requester("bo@example.com", frozenset({"platform admins", "sales"}))
    assert config.access.teams_for(bo, config.templates) == ("research", "vision")
    with pytest.raises(PortalError, match=re.escape(
            "team 'speech': bo@example.com (groups platform admins, sales) may submit for research, vision only; "
            "an admin maps a group to team speech in the chart's portal.groups")):
        submit_as(kube, config, bo, request_for("speech"))
    eve = Requester("eve@example.com", frozenset(), "X-Forwarded-Groups: more than 512 groups")
    with pytest.raises(PortalError, match=re.escape("team 'research': eve@example.com's groups could not be read "
                                                    "(X-Forwarded-Groups: more than 512 groups)")):
        submit_as(kube, config, eve, request_for("research"))
    with pytest.raises(PortalError, match="may submit for no team"):
        submit_as(kube, config, Requester("ana@example.com"), request_for("research"))
    # a mapped team still answers to its template: refused by the submitter, logged as not submitted
    with pytest.raises(PortalError, match="image 'x'"):
        submit_as(kube, config, bo, PortalRequest("vision", "job", "x", Shape(gpus=1), "normal"))
    assert [(level, outcome) for level, outcome, _ in audit.entries()] == [
        (logging.WARNING, "refused"), (logging.WARNING, "refused"), (logging.WARNING, "refused"),
        (logging.INFO, "not submitted")]
    first = audit.entries()[0][2]
    assert first.pop("reason").startswith("team 'speech': bo@example.com (groups platform admins, sales)")
    assert first == {"outcome": "refused", "identity": "bo@example.com", "team": "speech", "name": "job",
                     "groups": ["platform admins", "sales"], "groups_count": 2}


@pytest.mark.parametrize(("headers", "groups"), [
    ({"X-Forwarded-Groups": "a,b"}, {"a", "b"}),
    ({"X-Forwarded-Groups": " a , b ,, ,"}, {"a", "b"}),
    ({"x-forwarded-groups": "Domain Users,ml/research, org:team"}, {"Domain Users", "ml/research", "org:team"}),
    ({"X-Forwarded-Groups": "a,a, A"}, {"a", "A"}),  # exact names: case is kept, repeats collapse
    ({"X-Auth-Request-Groups": "b"}, {"b"}),
    ({"X-Forwarded-Groups": " ", "X-Auth-Request-Groups": "b"}, {"b"}),  # the first header that says something
    ({"X-Forwarded-Groups": "a", "X-Auth-Request-Groups": "b"}, {"a"}),
    ({"X-Forwarded-Groups": ""}, set()),
    ({}, set()),
    ({"X-Forwarded-Groups": ",".join(f"g{i}" for i in range(512))}, {f"g{i}" for i in range(512)}),
], ids=["two", "spaces-and-empties", "case-insensitive-name", "exact", "x-auth-request", "blank-first",
        "first-wins", "empty", "absent", "512"])
def test_the_proxys_groups_header_reads_as_names(headers, groups):
    assert groups_from_headers(headers) == groups


@pytest.mark.parametrize(("value", "message"), [
    ("a" * 16385, "X-Forwarded-Groups: 16385 characters; at most 16384"),
    ("x," * 8200 + "y", "X-Forwarded-Groups: 16401 characters"),
    (",".join(f"g{i}" for i in range(513)), "X-Forwarded-Groups: more than 512 groups"),
    ("ok," + "g" * 257, "X-Forwarded-Groups: a group name of 257 characters; at most 256"),
    ('["a","b"]', "X-Forwarded-Groups: a nested or quoted value"),
    ('a,{"b": ["c"]}', "X-Forwarded-Groups: a nested or quoted value"),
    ('"a", "b"', "X-Forwarded-Groups: a nested or quoted value"),
    ("a,b\x00c", "X-Forwarded-Groups: a group name holds a control character"),
    ("a\tb", "X-Forwarded-Groups: a group name holds a control character"),
], ids=["too-long", "long-repeats", "too-many", "long-name", "json-list", "json-object", "quoted", "nul", "tab"])
def test_an_absurd_or_nested_groups_header_is_refused_naming_it(value, message):
    with pytest.raises(PortalError, match=re.escape(message)) as raised:
        groups_from_headers({"X-Forwarded-Groups": value})
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 200


@pytest.mark.parametrize(("claim", "groups"), [
    (["a", " b ", ""], {"a", "b"}),
    ("a, b", {"a", "b"}),
    (None, set()),
    ([], set()),
    (["cn=ml,ou=groups,dc=example"], {"cn=ml,ou=groups,dc=example"}),  # a list item is one name, commas and all
])
def test_an_oidc_groups_claim_reads_as_names(claim, groups):
    assert groups_from_claim(claim) == groups


@pytest.mark.parametrize(("claim", "message"), [
    ([["a"]], "OIDC claim 'groups': a list of group names; got a nested or non-text item"),
    ([{"name": "a"}], "a nested or non-text item"),
    ([1, 2], "a nested or non-text item"),
    ({"a": 1}, "OIDC claim 'groups': a list of group names; got a dict"),
    (7, "got a int"),
    ([f"g{i}" for i in range(513)], "more than 512 groups"),
    (["g" * 9000, "h" * 9000], "more than 16384 characters of group names"),
    (["[a]"], "a nested or quoted value"),
])
def test_a_nested_or_absurd_oidc_claim_is_refused_naming_it(claim, message):
    with pytest.raises(PortalError, match=re.escape(message)):
        groups_from_claim(claim)


def test_the_portal_files_groups_name_known_teams():
    config = parse_portal({**DOCUMENT, "groupsClaim": "roles"})
    assert config.access.enforced and config.access.groups_claim == "roles"
    assert dict(config.access.groups) == {"ml-research": {"research"}, "platform admins": {"research", "vision"}}
    plain = parse_portal({"teams": DOCUMENT["teams"], "groups": {}})
    assert not plain.access.enforced and plain.access.groups_claim == "groups"
    anyone = Requester("anyone")
    assert plain.access.teams_for(anyone, plain.templates) == ("research", "speech", "vision")
    demo = access.load_portal(DEMO_TEMPLATES_PATH)  # the demo maps nothing: anyone, any team, as documented
    assert not demo.access.enforced and demo.access.teams_for(anyone, demo.templates) == tuple(sorted(demo.templates))


@pytest.mark.parametrize(("change", "message"), [
    ({"groups": {"ml": "nope"}}, "groups 'ml': team 'nope' has no template; teams: research, speech, vision"),
    ({"groups": {"ml": ["research", "nope"]}}, "team 'nope' has no template"),
    ({"groups": {"ml": []}}, "groups 'ml': a team, or a list of teams; got []"),
    ({"groups": {"ml": {"team": "research"}}}, "groups 'ml': a team, or a list of teams"),
    ({"groups": ["ml"]}, "groups: a mapping of group -> team"),
    ({"groups": {" ml": "research"}}, "a group name is non-empty text without surrounding spaces"),
    ({"groups": {"[ml]": "research"}}, "a nested or quoted value"),
    ({"groups": {7: "research"}}, "a group name is a string"),
    ({"groupsClaim": ""}, "groupsClaim '': the name of the OIDC claim"),
    ({"groupsClaim": ["groups"]}, "groupsClaim ['groups']"),
    ({"group": {}}, "unknown key 'group'; allowed keys: teams, groups, groupsClaim"),
])
def test_a_wrong_groups_key_is_refused_naming_it(tmp_path, change, message):
    path = tmp_path / "portal.yaml"
    path.write_text(yaml.safe_dump({**DOCUMENT, **change}))
    with pytest.raises(PortalError, match=re.escape(message)) as raised:
        access.load_portal(path)
    assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)
