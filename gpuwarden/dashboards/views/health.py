"""Health: findings of :func:`gpuwarden.analytics.health.scan` over the shared window: known faults
(XID catalogue, NVML recovery action, row remapping, ECC) and early warnings (peer comparison
within model and node pool), with the XID / ECC / row-remap timeline of each node. Findings never
act; the actuator decides."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from gpuwarden.dashboards import data
from gpuwarden.dashboards.palette import SEVERITY_COLOURS, SEVERITY_ORDER


def _colour(value: str) -> str:
    colour = SEVERITY_COLOURS.get(value)
    return f"background-color: {colour}; color: white; font-weight: 600" if colour else ""


info = data.require_store()
st.title("GPU health")
window = data.current_window(info)
bucket = data.bucket_for(window.span)
health = data.bundle("health", info, window)
table, events = health["findings"], health["events"]
data.window_caption(info, window, ". Application XIDs (13, 31, 43, 45, 68) are the workload's own faults and never "
                    "recommend a cordon.", bundles=(health,))
active_only = st.toggle("Active findings only", value=True, help="Seen in the last 10 minutes of the window.")
shown = table[table["active"]] if active_only else table

c1, c2, c3, c4 = st.columns(4)
c1.metric("Findings", len(shown))
c2.metric("Critical", int((shown["severity"] == "critical").sum()))
c3.metric("Cordon / drain recommended", int(shown["cordons"].sum()))
c4.metric("GPUs affected", int(shown.loc[shown["gpu_uuid"] != "", "gpu_uuid"].nunique()))

if shown.empty:
    st.success("No active health findings." if active_only else "No health findings in this window.")
else:
    st.subheader("Findings")
    main = shown[["severity", "kind", "node", "gpu_index", "gpu_uuid", "action", "confidence", "last_seen", "first_seen"]]
    st.dataframe(
        main.style.map(_colour, subset=["severity"]), hide_index=True, width="stretch",
        column_config={
            "severity": st.column_config.TextColumn("Severity"), "kind": st.column_config.TextColumn("Finding"),
            "node": st.column_config.TextColumn("Node"), "gpu_index": st.column_config.NumberColumn("GPU", format="%d"),
            "gpu_uuid": st.column_config.TextColumn("GPU UUID"), "action": st.column_config.TextColumn("Recommended action"),
            "confidence": st.column_config.ProgressColumn("Confidence (%)", min_value=0.0, max_value=1.0, format="percent"),
            "first_seen": st.column_config.DatetimeColumn("First seen (UTC)", format="YYYY-MM-DD HH:mm"),
            "last_seen": st.column_config.DatetimeColumn("Last seen (UTC)", format="YYYY-MM-DD HH:mm"),
        },
    )
    with st.expander("Evidence and notes"):
        st.dataframe(shown[["kind", "node", "gpu_index", "evidence", "note", "model"]], hide_index=True, width="stretch")
    counts = shown.groupby(["kind", "severity"], as_index=False).size()
    st.altair_chart(alt.Chart(counts).mark_bar().encode(
        x=alt.X("size:Q", title="findings"), y=alt.Y("kind:N", title=None, sort="-x"),
        color=alt.Color("severity:N", scale=alt.Scale(domain=list(SEVERITY_ORDER), range=[SEVERITY_COLOURS[s] for s in SEVERITY_ORDER]))),
        width="stretch")

st.subheader("XID / ECC / row-remap events per node")
if events.empty:
    st.caption("No XID, ECC or row-remap event in this window.")
else:
    busiest = events.groupby("node")["count"].sum().sort_values(ascending=False)
    node = st.selectbox("Node", list(busiest.index), format_func=lambda n: f"{n} ({int(busiest[n])} events)")
    part = events[events["node"] == node].assign(time=lambda f: pd.DatetimeIndex(f["time"]).tz_convert(None))
    st.altair_chart(alt.Chart(part).mark_circle().encode(
        x=alt.X("time:T", title=f"UTC (sample time), {bucket} buckets"), y=alt.Y("gpu:N", title=None),
        size=alt.Size("count:Q", title="events"), color=alt.Color("event:N", title="Event"),
        tooltip=["time:T", "gpu:N", "event:N", "count:Q"]), width="stretch")
