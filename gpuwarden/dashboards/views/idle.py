"""Idle GPUs and why: every GPU-hour of the window in one state of the idle taxonomy, what idle time
costs, the pods hoarding memory, and where SM activity was missing. Numbers come from
:mod:`gpuwarden.dashboards.idle_cost_view` (analytics underneath)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from gpuwarden.dashboards import fleet_view as fv
from gpuwarden.dashboards import idle_cost_view as icv
from gpuwarden.dashboards.data import CACHE_TTL_S, read_window, require_store


@st.cache_data(ttl=CACHE_TTL_S, show_spinner="Classifying GPU time…")
def ledger(path: str, span: pd.Timedelta):
    return icv.ledger_for(read_window(path, span, icv.COLUMNS))


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


path, (oldest, newest) = require_store()
st.title("Idle GPUs and why")
window = st.radio("Window", list(fv.WINDOWS), index=2, format_func=fv.WINDOW_LABELS.get, horizontal=True,
                  help="Relative to the newest sample in the store.")
data = ledger(path, fv.WINDOWS[window])
head = icv.idle_headline(data)
st.caption(f"Store `{path}` · {data.start:%Y-%m-%d %H:%M} → {data.end:%Y-%m-%d %H:%M} UTC · "
           f"{head.gpu_hours:,.0f} GPU-hours")

c1, c2, c3, c4 = st.columns(4)
c1.metric("Idle GPU-hours", f"{head.idle_gpu_hours:,.0f}", help="Unallocated plus allocated-idle, hoarded, fake busy and starved.")
c2.metric("Idle share", _percent(head.idle_share))
c3.metric("Idle cost", f"{head.idle_cost:,.0f} {head.currency}")
c4.metric("Efficiency score", _percent(head.efficiency_score), help="Useful SM-time over allocated GPU-time.")
if head.fallback_gpus:
    st.caption(f"{head.fallback_gpus} GPU(s) do not measure SM activity (GPM): the classifier fell back to NVML "
               "utilisation there, and cannot see fake-busy GPUs among them (see the table at the bottom).")

st.subheader("GPU-hours by state")
states = icv.state_hours(data)
st.bar_chart(states.set_index("label")["gpu_hours"], horizontal=True, x_label="GPU-hours", y_label="")
st.dataframe(states[["label", "gpu_hours", "share", "cost"]], hide_index=True, width="stretch",
             column_config={"label": st.column_config.TextColumn("State"),
                            "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.1f"),
                            "share": st.column_config.ProgressColumn("Share", min_value=0.0, max_value=1.0, format="percent"),
                            "cost": st.column_config.NumberColumn(f"Cost ({head.currency})", format="%.2f")})

st.subheader("Over time")
timeline = icv.states_timeline(data)
if not timeline.empty:
    st.area_chart(timeline, y_label="GPU-hours per hour", x_label="UTC")

left, right = st.columns(2)
with left:
    st.subheader("By pool")
    st.dataframe(icv.idle_by(data, "pool"), hide_index=True, width="stretch")
with right:
    st.subheader("By team")
    st.dataframe(icv.idle_by(data, "team"), hide_index=True, width="stretch")

st.subheader("Pods hoarding GPU memory")
pods = icv.hoarding_pods(data)
if pods.empty:
    st.caption("No pod spent half or more of its time holding GPU memory with nothing running.")
else:
    st.dataframe(pods, hide_index=True, width="stretch",
                 column_config={"hoarded_share": st.column_config.ProgressColumn("Hoarded share", min_value=0.0,
                                                                                 max_value=1.0, format="percent")})

fallback = icv.fallback_gpus(data)
if not fallback.empty:
    with st.expander(f"GPUs classified from NVML utilisation ({len(fallback)})"):
        st.dataframe(fallback, hide_index=True, width="stretch")
