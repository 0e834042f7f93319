"""Health: findings of :func:`gpuwarden.analytics.health.scan` over a window ending at the newest
sample: known faults (XID catalogue, NVML recovery action, row remapping, ECC) and early warnings
(peer comparison within model and node pool). Findings never act; the actuator decides."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from gpuwarden.analytics.health import scan
from gpuwarden.analytics.health.catalogue import CORDONING_ACTIONS
from gpuwarden.analytics.health.features import NEEDED_COLUMNS
from gpuwarden.dashboards.data import CACHE_TTL_S, read_window, require_store

WINDOWS = {"6h": pd.Timedelta(hours=6), "24h": pd.Timedelta(hours=24), "3d": pd.Timedelta(days=3)}


@st.cache_data(ttl=CACHE_TTL_S, show_spinner="Scanning for health findings…")
def findings_table(path: str, window: pd.Timedelta) -> pd.DataFrame:
    frame = read_window(path, window, tuple(NEEDED_COLUMNS))
    rows = []
    for f in scan(frame):
        evidence = {k: v for k, v in f.evidence.items() if k not in ("active", "model", "pool")}
        rows.append({
            "severity": f.severity.value, "kind": f.kind, "node": f.node, "gpu": f.gpu_uuid,
            "action": f.recommended_action.value if f.recommended_action else "",
            "cordons": f.recommended_action in CORDONING_ACTIONS,
            "confidence": f.confidence, "first_seen": pd.Timestamp(f.first_seen).tz_convert(None),
            "last_seen": pd.Timestamp(f.last_seen).tz_convert(None), "active": bool(f.evidence.get("active")),
            "model": f.evidence.get("model", ""),
            "evidence": ", ".join(f"{k}={v}" for k, v in evidence.items() if k != "note"),
            "note": evidence.get("note", ""),
        })
    return pd.DataFrame(rows, columns=["severity", "kind", "node", "gpu", "action", "cordons", "confidence", "first_seen",
                                       "last_seen", "active", "model", "evidence", "note"])


path, (oldest, newest) = require_store()
st.title("GPU health")
window = st.radio("Window", list(WINDOWS), index=1, horizontal=True,
                  help="Relative to the newest sample in the store, not the wall clock.")
table = findings_table(path, WINDOWS[window])
st.caption(f"Store `{path}` · findings over the {window} before {newest:%Y-%m-%d %H:%M} UTC. Application XIDs "
           "(13, 31, 43, 45, 68) are the workload's own faults and never recommend a cordon.")
active_only = st.toggle("Active findings only", value=True, help="Seen in the last 10 minutes of the window.")
shown = table[table["active"]] if active_only else table

c1, c2, c3, c4 = st.columns(4)
c1.metric("Findings", len(shown))
c2.metric("Critical", int((shown["severity"] == "critical").sum()))
c3.metric("Cordon / drain recommended", int(shown["cordons"].sum()))
c4.metric("GPUs affected", int(shown["gpu"].nunique()))

if shown.empty:
    st.success("No health findings in this window." if not active_only else "No active health findings.")
else:
    st.subheader("Findings")
    st.dataframe(
        shown.drop(columns=["cordons", "active"]),
        hide_index=True,
        width="stretch",
        column_config={
            "confidence": st.column_config.ProgressColumn("Confidence", min_value=0.0, max_value=1.0, format="%.2f"),
            "first_seen": st.column_config.DatetimeColumn("First seen (UTC)", format="YYYY-MM-DD HH:mm"),
            "last_seen": st.column_config.DatetimeColumn("Last seen (UTC)", format="YYYY-MM-DD HH:mm"),
        },
    )
    st.subheader("By kind")
    st.bar_chart(shown.groupby("kind").size().rename("findings"), horizontal=True, x_label="findings", y_label="")
