"""Who is looking at the dashboard, and may they approve actions or edit team priorities?

Three ways, first that applies wins:

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
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

DEMO_APPROVER_ENV = "GPUWARDEN_DEMO_APPROVER"
TOKEN_SOURCES = {
    "approver": ("GPUWARDEN_APPROVER_TOKEN_FILE", "GPUWARDEN_APPROVER_TOKEN"),
    "admin": ("GPUWARDEN_ADMIN_TOKEN_FILE", "GPUWARDEN_ADMIN_TOKEN"),
}
LIST_ENVS = {"approver": "GPUWARDEN_APPROVERS", "admin": "GPUWARDEN_ADMINS"}
SESSION_KEY = "_gpuwarden_identity"


@dataclass(frozen=True)
class Identity:
    name: str
    roles: frozenset[str]
    how: str  # "oidc" | "token" | "demo"

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


def identity() -> Identity | None:
    """The current user, if any way of signing in has said who they are."""
    demo = os.environ.get(DEMO_APPROVER_ENV, "").strip()
    if demo:
        return Identity(demo, frozenset({"approver", "admin"}), "demo")
    if oidc_configured() and getattr(st.user, "is_logged_in", False):
        email = str(st.user.get("email") or st.user.get("name") or "")
        roles = frozenset(r for r in LIST_ENVS if _listed(r, email))
        return Identity(email, roles, "oidc")
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
            else:
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
