"""Who is looking at the dashboard: may they view it, approve actions or edit team priorities?

Viewing (every page, :func:`require_viewer`) follows ``GPUWARDEN_VIEW_AUTH``:
- ``public``: anyone who reaches the dashboard (the default when unset: a dashboard on a laptop;
  the Helm chart always sets it, and sets ``public`` only when ``dashboard.auth.public=true``);
- ``proxy``: an auth proxy in front (oauth2-proxy) says who signed in with ``X-Forwarded-Email`` or
  ``X-Auth-Request-Email`` (a user name alone, ``X-Forwarded-User``, signs nobody in) and, for the
  portal, their groups (``X-Forwarded-Groups`` or ``X-Auth-Request-Groups``); a request with neither
  e-mail header sees only how to sign in (so the dashboard must be reachable only through the proxy,
  which strips these headers from what clients send);
- ``oidc``: Streamlit's ``st.login`` (``[auth]`` in ``secrets.toml``); the portal reads the groups
  from the ID token's claim the portal file names (``groupsClaim``, default ``groups``).
``GPUWARDEN_VIEWERS`` (comma-separated e-mails or ``@domain``) narrows who may view; empty: anyone
signed in. A signed-in viewer listed in ``GPUWARDEN_APPROVERS`` or ``GPUWARDEN_ADMINS`` holds those roles.

Roles (approver, admin), three ways, first that applies wins:

1. **OIDC** through Streamlit's ``st.login`` when ``[auth]`` is configured in
   ``.streamlit/secrets.toml``: the signed-in e-mail is the name; it is an approver if listed in
   ``GPUWARDEN_APPROVERS`` (comma-separated), an admin if listed in ``GPUWARDEN_ADMINS``.
2. **A token** from a Kubernetes Secret mounted as a file (``GPUWARDEN_APPROVER_TOKEN_FILE``,
   ``GPUWARDEN_ADMIN_TOKEN_FILE``) or an environment variable (``GPUWARDEN_APPROVER_TOKEN``,
   ``GPUWARDEN_ADMIN_TOKEN``). Each line of a file is ``name:token`` (the token names its holder)
   or a bare token (the holder types their name). Tokens are compared in constant time.
3. **The demo's local approver**: ``GPUWARDEN_DEMO_APPROVER=name`` makes that local user an
   approver and admin without a token (only for a dashboard on a laptop).

Without any of these nobody can approve: the page says how to configure it.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from gpuwarden.portal.access import Requester, groups_from_claim, groups_from_headers
from gpuwarden.portal.submit import PortalError

DEMO_APPROVER_ENV = "GPUWARDEN_DEMO_APPROVER"
TOKEN_SOURCES = {
    "approver": ("GPUWARDEN_APPROVER_TOKEN_FILE", "GPUWARDEN_APPROVER_TOKEN"),
    "admin": ("GPUWARDEN_ADMIN_TOKEN_FILE", "GPUWARDEN_ADMIN_TOKEN"),
}
LIST_ENVS = {"approver": "GPUWARDEN_APPROVERS", "admin": "GPUWARDEN_ADMINS"}
SESSION_KEY = "_gpuwarden_identity"
VIEW_AUTH_ENV = "GPUWARDEN_VIEW_AUTH"
VIEWERS_ENV = "GPUWARDEN_VIEWERS"
VIEW_MODES = ("public", "proxy", "oidc")
PROXY_HEADERS = ("X-Forwarded-Email", "X-Auth-Request-Email")  # oauth2-proxy's, with and without --set-xauthrequest


@dataclass(frozen=True)
class Identity:
    name: str
    roles: frozenset[str]
    how: str  # "oidc" | "proxy" | "token" | "demo" | "public"

    def can(self, role: str) -> bool:
        return role in self.roles


def tokens(role: str) -> list[tuple[str | None, str]]:
    """(holder name or None, token) pairs configured for ``role``; a missing file gives none."""
    file_env, value_env = TOKEN_SOURCES[role]
    pairs: list[tuple[str | None, str]] = []
    file_name = os.environ.get(file_env, "").strip()
    if file_name:
        try:
            lines = Path(file_name).read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, token = line.partition(":")
            pairs.append((name.strip(), token.strip()) if sep else (None, line))
    value = os.environ.get(value_env, "").strip()
    if value:
        pairs.append((None, value))
    return [(n, t) for n, t in pairs if t]


def check_token(role: str, name: str, token: str) -> str | None:
    """The name to audit if ``token`` grants ``role`` (the holder's name where the file gives one)."""
    matched = None
    for holder, expected in tokens(role):
        if hmac.compare_digest(expected.encode(), token.encode()):
            matched = holder or name.strip() or None
    return matched


def oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # noqa: BLE001 - no secrets.toml at all
        return False


def _listed(role: str, email: str) -> bool:
    names = {n.strip().lower() for n in os.environ.get(LIST_ENVS[role], "").split(",") if n.strip()}
    return email.lower() in names


def configured() -> bool:
    return bool(os.environ.get(DEMO_APPROVER_ENV, "").strip()) or oidc_configured() or any(tokens(r) for r in TOKEN_SOURCES)


def view_mode() -> str:
    """``GPUWARDEN_VIEW_AUTH``, checked: ValueError naming it and the allowed values."""
    mode = os.environ.get(VIEW_AUTH_ENV, "").strip().lower() or "public"
    if mode not in VIEW_MODES:
        raise ValueError(f"{VIEW_AUTH_ENV}={mode!r} is not one of: {', '.join(VIEW_MODES)}")
    return mode


def proxy_email(headers: Mapping[str, str]) -> str | None:
    """The signed-in e-mail an auth proxy put in the request headers (names are case-insensitive)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in PROXY_HEADERS:
        value = (lowered.get(name.lower()) or "").strip()
        if value:
            return value
    return None


def requester(who: Identity, groups_claim: str) -> Requester:
    """``who`` as the portal's submitter: their groups from the proxy's header or their OIDC claim
    ``groups_claim``, read on the server for this request; none for a token or demo sign-in. A value
    the portal refuses leaves no group and says why."""
    try:
        if who.how == "proxy":
            groups = groups_from_headers(dict(st.context.headers))
        elif who.how == "oidc":
            groups = groups_from_claim(st.user.get(groups_claim), groups_claim)
        else:
            groups = frozenset()
    except PortalError as error:
        return Requester(who.name, frozenset(), str(error))
    return Requester(who.name, groups)


def may_view(email: str, viewers: str) -> bool:
    """Whether ``email`` is in ``viewers`` (comma-separated e-mails or ``@domain``; empty: anyone)."""
    allowed = [v.strip().lower() for v in viewers.split(",") if v.strip()]
    email = email.strip().lower()
    return not allowed or any(email == v or (v.startswith("@") and email.endswith(v)) for v in allowed)


def _signed_in(email: str, how: str) -> Identity:
    return Identity(email, frozenset(r for r in LIST_ENVS if _listed(r, email)), how)


def viewer() -> Identity | None:
    """Who views the page under :func:`view_mode` (public: an anonymous viewer), or None."""
    mode = view_mode()
    if mode == "public":
        return identity() or Identity("anyone", frozenset(), "public")
    if mode == "proxy":
        email = proxy_email(dict(st.context.headers))
        return _signed_in(email, "proxy") if email else None
    if getattr(st.user, "is_logged_in", False):
        return _signed_in(str(st.user.get("email") or st.user.get("name") or ""), "oidc")
    return None


def require_viewer() -> Identity:
    """The viewer, or the page says how to sign in and stops (every page, before it draws)."""
    try:
        who = viewer()
    except ValueError as error:
        st.error(f"The dashboard's sign-in is misconfigured: {error}.", icon=":material/error:")
        st.stop()
    open_to_all = view_mode() == "public" or (who is not None and who.how == "demo")
    if who is not None and (open_to_all or may_view(who.name, os.environ.get(VIEWERS_ENV, ""))):
        return who
    st.title("Sign in to view gpuwarden")
    if who is not None:
        st.error(f"{who.name} is signed in but is not among this dashboard's viewers ({VIEWERS_ENV}).")
    elif view_mode() == "proxy":
        st.info(f"This dashboard is viewed through its sign-in proxy, which sets {' or '.join(PROXY_HEADERS)}; "
                "this request came without one. Open it through the proxy's address.", icon=":material/lock:")
    elif oidc_configured():
        st.button("Log in", on_click=st.login, help="Sign in with your organisation's identity provider.")
    else:
        st.error("OIDC sign-in is asked for but Streamlit has no [auth] section in secrets.toml.")
    st.stop()
    raise AssertionError("unreachable")  # st.stop ends the script run


def identity() -> Identity | None:
    """The current user, if any way of signing in has said who they are."""
    demo = os.environ.get(DEMO_APPROVER_ENV, "").strip()
    if demo:
        return Identity(demo, frozenset({"approver", "admin"}), "demo")
    if os.environ.get(VIEW_AUTH_ENV, "").strip().lower() == "proxy":
        email = proxy_email(dict(st.context.headers))
        if email:
            return _signed_in(email, "proxy")
    if oidc_configured() and getattr(st.user, "is_logged_in", False):
        return _signed_in(str(st.user.get("email") or st.user.get("name") or ""), "oidc")
    return st.session_state.get(SESSION_KEY)


def sign_in(role: str) -> Identity | None:
    """Draw what it takes to become ``role`` and return the identity once it holds that role."""
    who = identity()
    if who is not None and who.can(role):
        if who.how == "demo":
            st.caption(f"Signed in as **{who.name}** (the demo's local approver).")
        else:
            st.caption(f"Signed in as **{who.name}** ({who.how}).")
            if who.how == "oidc":
                st.button("Log out", on_click=st.logout)
            elif who.how == "token":
                st.button("Sign out", on_click=lambda: st.session_state.pop(SESSION_KEY, None))
        return who
    if oidc_configured() and who is None:
        st.button("Log in", on_click=st.login, help="Sign in with your organisation's identity provider.")
    if tokens(role):
        with st.form(f"sign_in_{role}"):
            name = st.text_input("Your name (recorded in the audit log)")
            token = st.text_input(f"{role.capitalize()} token", type="password")
            if st.form_submit_button("Sign in"):
                holder = check_token(role, name, token)
                if holder is None:
                    st.error("That token does not grant this role (or the name is missing).")
                else:
                    roles = frozenset(r for r in TOKEN_SOURCES if check_token(r, holder, token))
                    st.session_state[SESSION_KEY] = Identity(holder, roles, "token")
                    st.rerun()
    elif who is not None:
        st.caption(f"Signed in as **{who.name}**, who does not hold the {role} role.")
    if not configured():
        st.caption(f"Nobody can sign in as {role}: configure OIDC (`st.login`), a token file "
                   f"(`{TOKEN_SOURCES[role][0]}`) or, for a local demo, `{DEMO_APPROVER_ENV}`.")
    return None
