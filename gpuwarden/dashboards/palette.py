"""One colour per idle state and per severity, used by every page and chart (pure: no Streamlit).

Colours are fixed so a state reads the same on the Idle, Cost and Fleet pages: warm colours for
capacity paid for and wasted, greens for work, grey for what nobody measured.
"""

from __future__ import annotations

from gpuwarden.analytics import STATES

STATE_LABELS: dict[str, str] = {
    "unallocated": "Unallocated",
    "idle_unattributed": "Idle, owner unknown (no pod attribution)",
    "allocated_idle": "Allocated, idle",
    "hoarded": "Hoarded (memory held, idle)",
    "fake_busy": "Fake busy (util without SM activity)",
    "starved": "Starved (bursts, long gaps)",
    "underutilized": "Underutilised",
    "busy": "Busy",
    "unmeasured": "Unmeasured",
}

STATE_COLOURS: dict[str, str] = {
    "unallocated": "#9e9e9e",
    "idle_unattributed": "#757575",
    "allocated_idle": "#e53935",
    "hoarded": "#8e24aa",
    "fake_busy": "#fb8c00",
    "starved": "#fdd835",
    "underutilized": "#81c784",
    "busy": "#2e7d32",
    "unmeasured": "#cfd8dc",
}
# tests/dashboards/test_dashboard_views.py checks every state of the taxonomy has a colour and a label; a state
# added without one still draws (label_colour falls back to its name in grey) instead of crashing.

SEVERITY_COLOURS: dict[str, str] = {"critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}
SEVERITY_ORDER: tuple[str, ...] = ("critical", "warning", "info")


def label_colour(state: str) -> tuple[str, str]:
    """(label, colour) of a state; an unknown state is shown by name in grey."""
    return STATE_LABELS.get(state, state), STATE_COLOURS.get(state, "#bdbdbd")


def by_size(totals: dict[str, float]) -> list[str]:
    """State names largest first (ties in taxonomy order), for legends and stacking order."""
    order = {s: i for i, s in enumerate(STATES)}
    return sorted(totals, key=lambda s: (-float(totals[s]), order.get(s, len(order))))
