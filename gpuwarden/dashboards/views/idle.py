"""Idle GPUs and why: every GPU-hour of the window in one state of the idle taxonomy, what idle time
costs, the pods hoarding memory, and where SM activity was missing. One idle report per window
(:mod:`gpuwarden.dashboards.data`), read by :mod:`gpuwarden.dashboards.idle_cost_view`."""

from __future__ import annotations

import streamlit as st

from gpuwarden.dashboards import data, fmt, show
from gpuwarden.dashboards import idle_cost_view as icv

info = data.require_store()
st.title("Idle GPUs and why")
window = data.current_window(info)
report = data.idle(info.path, window.start, window.end, info.version)
head = icv.idle_headline(report)
currency = head.currency
data.window_caption(info, window, f" · {fmt.gpu_hours(head.gpu_hours)} in the window")

c1, c2, c3, c4 = st.columns(4)
c1.metric("Idle cost", fmt.money(head.idle_cost, currency))
c2.metric("Idle GPU-hours", fmt.gpu_hours(head.idle_gpu_hours),
          help="Unallocated plus allocated-idle, hoarded, fake busy and starved.")
c3.metric("Idle share", fmt.percent(head.idle_share))
c4.metric("Efficiency score", fmt.percent(head.efficiency_score), help="Useful SM-time over allocated GPU-time.")
if head.fallback_gpus:
    st.caption(f"{head.fallback_gpus} GPU(s) do not measure SM activity (GPM): the classifier fell back to NVML "
               "utilisation there, and cannot see fake-busy GPUs among them (see the diagnostics at the bottom).")

st.subheader("GPU-hours by state")
states = icv.state_hours(report)
left, right = st.columns([2, 3])
with left:
    show.state_bars(states, "gpu_hours", "GPU-hours")
with right:
    show.table(states[["label", "cost", "gpu_hours", "share"]].rename(columns={"label": "state"}), currency,
               key_columns=["state"])

st.subheader("GPU-hours by state over time")
show.stacked_states(icv.states_timeline(report.ledger), "GPU-hours per bucket", key="idle_states_over_time")

left, right = st.columns(2)
with left:
    st.subheader("By pool")
    show.table(icv.idle_by(report, "pool"), currency, key_columns=["pool"])
with right:
    st.subheader("By team")
    show.table(icv.idle_by(report, "team"), currency, key_columns=["team"])

st.subheader("Pods hoarding GPU memory")
pods = icv.hoarding_pods(report)
if pods.empty:
    st.caption("No pod spent half or more of its time holding GPU memory with nothing running.")
else:
    show.table(pods, currency, key_columns=["namespace", "pod", "team"])

fallback = icv.fallback_gpus(report)
if not fallback.empty:
    with st.expander(f"GPUs classified from NVML utilisation ({len(fallback)})"):
        st.dataframe(fallback, hide_index=True, width="stretch")
