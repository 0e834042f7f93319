"""Idle GPUs and why: every GPU-hour of the window in one state of the idle taxonomy, what idle time
costs, the pods hoarding memory, and where SM activity was missing. One ledger per window, shared
with the Cost and Queue pages (the ledger bundle of :mod:`gpuwarden.analytics.idle_cost_report`)."""

from __future__ import annotations

import streamlit as st

from gpuwarden.dashboards import data, fmt, show
from gpuwarden.dashboards.palette import STATE_LABELS

info = data.require_store()
st.title("Idle GPUs and why")
window = data.current_window(info)
ledger = data.bundle("ledger", info, window)
head = ledger["idle_headline"]
currency = head["currency"]
data.window_caption(info, window, f" · {fmt.gpu_hours(head['gpu_hours'])} in the window", bundles=(ledger,))

c1, c2, c3, c4 = st.columns(4)
c1.metric("Idle cost", fmt.money(head["idle_cost"], currency), help=f"Priced by {data.price_book_name(ledger)}.")
c2.metric("Idle GPU-hours", fmt.gpu_hours(head["idle_gpu_hours"]),
          help="Unallocated plus allocated-idle, hoarded, fake busy and starved.")
c3.metric("Idle share", fmt.percent(head["idle_share"]))
c4.metric("Efficiency score", fmt.percent(head["efficiency_score"]), help="Useful SM-time over allocated GPU-time.")
if head["fallback_gpus"]:
    st.caption(f"{head['fallback_gpus']} GPU(s) do not measure SM activity (GPM): the classifier fell back to NVML "
               "utilisation there, and cannot see fake-busy GPUs among them (see the diagnostics at the bottom).")

st.subheader("GPU-hours by state")
states = ledger["states"]
states = states.assign(label=states["state"].map(STATE_LABELS).fillna(states["state"]))
left, right = st.columns([2, 3])
with left:
    show.state_bars(states, "gpu_hours", "GPU-hours")
with right:
    show.table(states[["label", "cost", "gpu_hours", "share"]].rename(columns={"label": "state"}), currency,
               key_columns=["state"])

st.subheader("GPU-hours by state over time")
show.stacked_states(ledger["states_timeline"], "GPU-hours per bucket", key="idle_states_over_time")

left, right = st.columns(2)
with left:
    st.subheader("By pool")
    show.table(ledger["idle_by_pool"], currency, key_columns=["pool"])
with right:
    st.subheader("By team")
    show.table(ledger["idle_by_team"], currency, key_columns=["team"])

st.subheader("Pods hoarding GPU memory")
pods = ledger["hoarding_pods"]
if pods.empty:
    st.caption("No pod spent half or more of its time holding GPU memory with nothing running.")
else:
    show.table(pods, currency, key_columns=["namespace", "pod", "claim", "team"])  # claim: only where DRA claims held GPUs

fallback = ledger["fallback_gpus"]
if not fallback.empty:
    with st.expander(f"GPUs classified from NVML utilisation ({len(fallback)})"):
        st.dataframe(fallback, hide_index=True, width="stretch")
