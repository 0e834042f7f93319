"""Which teams a signed-in identity may submit for, and the one submit path that enforces it.

The portal file (helm values ``portal``, rendered into the ConfigMap ``GPUWARDEN_PORTAL_TEMPLATES``
names) maps the identity provider's groups to teams::

    teams: {research: {...}, vision: {...}}     # the templates (.submit)
    groups:                                      # group -> a team, or a list of teams
      ml-research: research
      platform-admins: [research, vision]
    groupsClaim: groups                          # the OIDC claim holding the groups (default: groups)

With ``groups`` set, an identity may submit for exactly the teams its groups map to (none: it may
submit for none); without it, any signed-in identity may submit for any team (the page says so).
An identity's groups come from its OIDC claim (:func:`groups_from_claim`) or from the auth
proxy's header (:func:`groups_from_headers`: oauth2-proxy's ``X-Forwarded-Groups`` or
``X-Auth-Request-Groups``, comma-separated); a value too long, too many or nested is refused and
the identity then holds no group. Group names match exactly, as the identity provider spells them.

:func:`submit_as` is the production submit path: the rule is checked there, on the server, before
the submitter sees the request, and every outcome is logged (``gpuwarden.portal.audit``, one JSON
object a line) beside the ``gpuwarden.io/requested-by`` annotation the Job carries.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .submit import PortalError, PortalRequest, TeamTemplate, parse_templates, read_document
from .submitters import Submitter

GROUP_HEADERS = ("X-Forwarded-Groups", "X-Auth-Request-Groups")  # oauth2-proxy's, with and without --set-xauthrequest
DEFAULT_GROUPS_CLAIM = "groups"
MAX_GROUPS_VALUE_CHARS = 16 * 1024  # a proxy's header lines stop near 8-16 KiB; beyond that it is not a proxy's
MAX_GROUPS = 512
MAX_GROUP_CHARS = 256
NESTING_CHARS = frozenset('[]{}"')  # a JSON list, object or quoted name where a plain list of names belongs
SHOWN_GROUPS = 8  # groups named in one message or log line; the rest are counted
AUDIT = logging.getLogger("gpuwarden.portal.audit")


@dataclass(frozen=True)
class Requester:
    """Who submits: the signed-in name written on the Job, the groups the sign-in vouched for, and
    why its groups could not be read (then it holds none)."""

    name: str
    groups: frozenset[str] = frozenset()
    groups_problem: str | None = None


@dataclass(frozen=True)
class TeamAccess:
    """group -> the teams its members may submit for; empty: anyone signed in, any team."""

    groups: Mapping[str, frozenset[str]] = field(default_factory=dict)
    groups_claim: str = DEFAULT_GROUPS_CLAIM

    @property
    def enforced(self) -> bool:
        return bool(self.groups)

    def teams_for(self, requester: Requester, teams: Iterable[str]) -> tuple[str, ...]:
        """The rule, written once: the teams of ``teams`` that ``requester`` may submit for, sorted."""
        if not self.enforced:
            return tuple(sorted(teams))
        mapped = {team for group in requester.groups for team in self.groups.get(group, ())}
        return tuple(sorted(team for team in teams if team in mapped))

    def refusal(self, requester: Requester, team: str, teams: Iterable[str]) -> str | None:
        """None when ``requester`` may submit for ``team``, else the one line that says why not."""
        known = sorted(teams)
        allowed = self.teams_for(requester, known)
        if team in allowed:
            return None
        if team not in known:
            return f"team {team!r}: no portal template; teams: {', '.join(known)}"
        if requester.groups_problem:
            return f"team {team!r}: {requester.name}'s groups could not be read ({requester.groups_problem})"
        held = f"groups {_shown(requester.groups)}" if requester.groups else "no groups"
        may = f"may submit for {', '.join(allowed)} only" if allowed else "may submit for no team"
        return (f"team {team!r}: {requester.name} ({held}) {may}; an admin maps a group to team {team} in the "
                "chart's portal.groups")


@dataclass(frozen=True)
class PortalConfig:
    """The portal file: the teams' templates and who may submit for which."""

    templates: Mapping[str, TeamTemplate]
    access: TeamAccess = field(default_factory=TeamAccess)


def load_portal(path: str | os.PathLike[str]) -> PortalConfig:
    """The portal file at ``path``; PortalError naming the file and the key when it is wrong."""
    return parse_portal(read_document(path), str(path))


def parse_portal(document: object, source: str = "portal templates") -> PortalConfig:
    templates = parse_templates(document, source)
    assert isinstance(document, Mapping)  # parse_templates refused anything else
    return PortalConfig(templates, parse_access(document.get("groups"), document.get("groupsClaim"), templates, source))


def parse_access(groups: object, claim: object, teams: Iterable[str], source: str = "portal templates") -> TeamAccess:
    """``groups`` (group -> team or list of teams; None or {}: no mapping) checked against ``teams``."""
    claim = DEFAULT_GROUPS_CLAIM if claim is None else claim
    if not isinstance(claim, str) or not claim.strip():
        raise PortalError(f"{source}: groupsClaim {claim!r}: the name of the OIDC claim holding the groups")
    if groups is None:
        return TeamAccess({}, claim.strip())
    if not isinstance(groups, Mapping):
        raise PortalError(f"{source}: groups: a mapping of group -> team (or a list of teams); got {groups!r}")
    known, out = set(teams), {}
    for group, mapped in groups.items():
        where = f"{source}: groups {str(group)[:MAX_GROUP_CHARS]!r}"
        problem = _group_name_problem(group) if isinstance(group, str) else "a group name is a string"
        if problem:
            raise PortalError(f"{where}: {problem}")
        names = [mapped] if isinstance(mapped, str) else mapped
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise PortalError(f"{where}: a team, or a list of teams; got {mapped!r}")
        unknown = sorted(set(names) - known)
        if unknown:
            raise PortalError(f"{where}: team {unknown[0]!r} has no template; teams: {', '.join(sorted(known))}")
        out[str(group)] = frozenset(names)
    return TeamAccess(out, claim.strip())


# -- an identity's groups ------------------------------------------------------------------------------


def parse_groups(value: str, where: str) -> frozenset[str]:
    """The groups in one comma-separated value (``where`` names its header or claim): each name
    stripped, empty ones dropped. PortalError when it is too long, too many, or nested or quoted."""
    if len(value) > MAX_GROUPS_VALUE_CHARS:
        raise PortalError(f"{where}: {len(value)} characters; at most {MAX_GROUPS_VALUE_CHARS}")
    return _checked((part.strip() for part in value.split(",")), where)


def groups_from_headers(headers: Mapping[str, str]) -> frozenset[str]:
    """The groups an auth proxy put in the request (the first of :data:`GROUP_HEADERS` present,
    names case-insensitive); none without either. PortalError naming the header when refused."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in GROUP_HEADERS:
        value = lowered.get(name.lower())
        if value is not None and value.strip():
            return parse_groups(value, name)
    return frozenset()


def groups_from_claim(value: object, claim: str = DEFAULT_GROUPS_CLAIM) -> frozenset[str]:
    """The groups in an OIDC claim: a list of names, or one comma-separated string; none when absent.
    PortalError naming the claim for anything nested (a list of lists, an object) or too large."""
    where = f"OIDC claim {claim!r}"
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return parse_groups(value, where)
    if not isinstance(value, (list, tuple)):
        raise PortalError(f"{where}: a list of group names; got a {type(value).__name__}")
    if not all(isinstance(item, str) for item in value):
        raise PortalError(f"{where}: a list of group names; got a nested or non-text item")
    if sum(len(item) for item in value) > MAX_GROUPS_VALUE_CHARS:
        raise PortalError(f"{where}: more than {MAX_GROUPS_VALUE_CHARS} characters of group names")
    return _checked((item.strip() for item in value), where)


def _checked(names: Iterable[str], where: str) -> frozenset[str]:
    out: set[str] = set()
    for name in names:
        if not name:
            continue
        problem = _group_name_problem(name)
        if problem:
            raise PortalError(f"{where}: {problem}")
        out.add(name)
        if len(out) > MAX_GROUPS:
            raise PortalError(f"{where}: more than {MAX_GROUPS} groups")
    return frozenset(out)


def _group_name_problem(name: str) -> str | None:
    if not name.strip() or name != name.strip():
        return "a group name is non-empty text without surrounding spaces"
    if len(name) > MAX_GROUP_CHARS:
        return f"a group name of {len(name)} characters; at most {MAX_GROUP_CHARS}"
    if any(c in NESTING_CHARS for c in name):
        return "a nested or quoted value ([, ], {, } or \"); send a plain comma-separated list of group names"
    if not name.isprintable():
        return "a group name holds a control character"
    return None


def _shown(groups: Iterable[str]) -> str:
    names = sorted(groups)
    more = len(names) - SHOWN_GROUPS
    return ", ".join(names[:SHOWN_GROUPS]) + (f" and {more} more" if more > 0 else "")


# -- the submit path -------------------------------------------------------------------------------------


def submit_as(submitter: Submitter, config: PortalConfig, requester: Requester, request: PortalRequest,
              held_gpus: float = 0.0) -> tuple[str, str]:
    """Submit ``request`` for ``requester``: refused (PortalError, one line, logged) for a team its
    groups do not map to, before the submitter sees it; then the submitter's own checks and call.
    Returns (workload key, one line to show)."""
    refused = config.access.refusal(requester, request.team, config.templates)
    if refused is not None:
        _audit(logging.WARNING, "refused", requester, request, reason=refused)
        raise PortalError(refused)
    try:
        key, message = submitter.submit(request, config.templates[request.team], requester.name, held_gpus)
    except PortalError as error:
        _audit(logging.INFO, "not submitted", requester, request, reason=str(error))
        raise
    _audit(logging.INFO, "submitted", requester, request, workload=key)
    return key, message


def _audit(level: int, outcome: str, requester: Requester, request: PortalRequest, **more: str) -> None:
    groups = sorted(requester.groups)
    entry = {"outcome": outcome, "identity": requester.name, "team": request.team, "name": request.name,
             "groups": groups[:SHOWN_GROUPS], "groups_count": len(groups), **more}
    AUDIT.log(level, "portal submission %s: %s", outcome, json.dumps(entry, sort_keys=True))


def log_to_stderr() -> None:
    """Where nothing else handles the audit logger (a dashboard run by Streamlit), write its lines to
    stderr, the container's log; once."""
    if not AUDIT.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        AUDIT.addHandler(handler)
        AUDIT.setLevel(logging.INFO)
