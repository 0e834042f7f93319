"""The gpuwarden dashboard: the entry file for ``streamlit run`` (``gpuwarden demo`` starts it
through :func:`gpuwarden.dashboards.launch.launch_dashboard`).

Environment:

``GPUWARDEN_STORE``
    Directory of the embedded store (:class:`gpuwarden.store.LocalStore`) to show. When it is
    unset, or the store holds no samples, each page says how to fill it (``gpuwarden demo``)
    instead of failing.
``GPUWARDEN_AUDIT``, ``GPUWARDEN_CLUSTER_STATE``, ``GPUWARDEN_APPROVER_TOKEN_FILE``...
    See :mod:`gpuwarden.remediation.audit_report`, :mod:`~gpuwarden.fleet.cluster_state` and
    :mod:`~gpuwarden.dashboards.auth`.

This file is only a router: ``st.navigation`` over pages grouped in sections, plus what every
page shares in the sidebar: the window (presets or a custom range), "data as of" and the
auto-refresh. A page is a script under ``views/`` (not ``pages/``: Streamlit would list that
folder on its own, beside the router). Pages only draw: their numbers come from analytics report
bundles through ``data.py`` (computed once per window, kept beside the store, refreshed in the
background when new samples arrive).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import streamlit as st

from gpuwarden.dashboards import auth, data

PAGES_DIR = Path(__file__).resolve().parent / "views"
log = logging.getLogger("gpuwarden.dashboards")

# section title -> [(script under views/, page title, material icon)]; the first page is the default.
SECTIONS: dict[str, list[tuple[str, str, str]]] = {
    "Fleet": [
        ("fleet.py", "Fleet overview", ":material/dns:"),
        ("gpu.py", "GPU detail", ":material/memory:"),
        ("idle.py", "Idle GPUs", ":material/hourglass_empty:"),
        ("cost.py", "Cost & chargeback", ":material/payments:"),
    ],
    "Health": [
        ("health.py", "GPU health", ":material/health_and_safety:"),
    ],
    "Scheduling": [
        ("queue.py", "Queue & quotas", ":material/format_list_numbered:"),
        ("portal.py", "Request GPUs", ":material/add_task:"),
        ("whatif.py", "What-if", ":material/compare_arrows:"),
    ],
    "Actions": [
        ("actions.py", "Actuator actions", ":material/gavel:"),
    ],
}


def build_pages() -> dict[str, list[st.Page]]:
    pages: dict[str, list[st.Page]] = {}
    first = True
    for section, entries in SECTIONS.items():
        pages[section] = []
        for script, title, icon in entries:
            pages[section].append(st.Page(str(PAGES_DIR / script), title=title, icon=icon, default=first))
            first = False
    return pages


def window_sidebar() -> None:
    """The one window selector every page reads (kept in session state across pages)."""
    info = data.store_info()
    with st.sidebar:
        choices = [*data.PRESETS, "custom"]
        st.session_state.setdefault(data.WINDOW_KEY, data.DEFAULT_PRESET)
        st.selectbox("Window", choices, key=data.WINDOW_KEY, format_func=data.PRESET_LABELS.get,
                     help="Ends at the newest sample in the store (sample time, simulated in the demo), not the wall clock.")
        if info is not None and st.session_state[data.WINDOW_KEY] == "custom":
            first, last = info.oldest.date(), info.newest.date()
            st.session_state.setdefault(data.CUSTOM_KEY, (max(first, last), last))
            st.date_input("Days (UTC)", key=data.CUSTOM_KEY, min_value=first, max_value=last)
        st.toggle("Auto-refresh", key="auto_refresh", value=True,
                  help=f"Reload every {data.REFRESH_EVERY_S} s when the store has new samples.")
        if info is not None:
            drawn = datetime.now(UTC)
            st.caption(f"Data as of **{info.newest:%Y-%m-%d %H:%M:%S} UTC** (newest sample; simulated time in the demo) · "
                       f"page drawn {drawn:%H:%M:%S} UTC (wall clock)")


@st.fragment(run_every=data.REFRESH_EVERY_S)
def refresh_when_new_samples() -> None:
    """Rerun the whole page when the source has new samples since the last run (cheap: folder
    mtimes, or Prometheus' newest sample asked once per interval)."""
    if not st.session_state.get("auto_refresh", True):
        return
    version = data.current_version()
    if version is None:
        return
    seen = st.session_state.setdefault("_store_version", version)
    if version != seen:
        st.session_state["_store_version"] = version
        st.rerun(scope="app")


st.set_page_config(page_title="gpuwarden", page_icon=":material/memory:", layout="wide")
auth.require_viewer()  # issue 24: signed in to view unless the operator made it public
navigation = st.navigation(build_pages())
window_sidebar()
with st.sidebar:
    refresh_when_new_samples()
try:
    navigation.run()
except data.StoreUnreadable as error:
    st.error(f"The store could not be read: {error}.", icon=":material/error:")
except Exception as error:
    log.exception("dashboard page failed")
    st.error(f"This page could not be drawn ({type(error).__name__}). The dashboard log has the details.",
             icon=":material/error:")
