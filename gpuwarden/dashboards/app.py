"""The gpuwarden dashboard: the entry file for ``streamlit run`` (``gpuwarden demo`` starts it
through :func:`gpuwarden.dashboards.launch.launch_dashboard`).

Environment:

``GPUWARDEN_STORE``
    Directory of the embedded store (:class:`gpuwarden.store.LocalStore`) to show. When it is
    unset, or the store holds no samples, each page says how to fill it (``gpuwarden demo``)
    instead of failing.

This file is only a router: ``st.navigation`` over pages grouped in sections. A page is a script
under ``views/`` (not ``pages/``: Streamlit would list that folder on its own, beside the router);
to add one (queue, portal...), write the script and add an entry to :data:`SECTIONS`. Pages keep their computations in pure modules next to this file
(``fleet_view.py`` for the fleet page) and use ``data.py`` for the store.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

PAGES_DIR = Path(__file__).resolve().parent / "views"

# section title -> [(script under views/, page title, material icon)]; the first page is the default.
SECTIONS: dict[str, list[tuple[str, str, str]]] = {
    "Fleet": [
        ("fleet.py", "Fleet overview", ":material/dns:"),
        ("idle.py", "Idle GPUs", ":material/hourglass_empty:"),
        ("cost.py", "Cost & chargeback", ":material/payments:"),
    ],
    "Health": [
        ("health.py", "GPU health", ":material/health_and_safety:"),
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


st.set_page_config(page_title="gpuwarden", page_icon=":material/memory:", layout="wide")
navigation = st.navigation(build_pages())
navigation.run()
