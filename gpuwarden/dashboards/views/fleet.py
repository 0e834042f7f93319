"""Fleet overview: what the fleet has, who holds it, how busy it is, over a window ending at the
newest sample. The numbers come from :mod:`gpuwarden.dashboards.fleet_view`."""

from __future__ import annotations

import streamlit as st

from gpuwarden.dashboards import fleet_view as fv
from gpuwarden.dashboards.data import read_window, require_store


def _percent(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.0%}"


path, (oldest, newest) = require_store()

st.title("Fleet overview")
window = st.radio(
    "Window",
    list(fv.WINDOWS),
    index=2,
    format_func=fv.WINDOW_LABELS.get,
    horizontal=True,
    help="Relative to the newest sample in the store, not the wall clock (the demo's clock is simulated).",
)
span = fv.WINDOWS[window]
frame = read_window(path, span, fv.FLEET_COLUMNS)
start = fv.window_start(newest, span)
note = " (the store holds less than that)" if oldest > start else ""
st.caption(
    f"Store `{path}` · {fv.WINDOW_LABELS[window].lower()} before the newest sample, "
    f"{max(start, oldest):%Y-%m-%d %H:%M} → {newest:%Y-%m-%d %H:%M} UTC{note}"
)

snapshot = fv.latest_snapshot(frame)
head = fv.headline(frame, snapshot)

c1, c2, c3, c4, c5 = st.columns(5)
c1.metric("GPUs", head.gpus)
c2.metric("Nodes", head.nodes)
c3.metric(
    "GPUs allocated now",
    fv.format_gpus(head.allocated_gpus),
    help="GPUs whose latest sample names a pod; a MIG instance counts as its share of the GPU.",
)
c4.metric("Mean GPU utilisation", _percent(head.mean_util), help="NVML utilisation.gpu: share of time any kernel ran.")
c5.metric(
    "Mean SM activity",
    _percent(head.mean_sm_active),
    help="GPM SM activity, averaged over the GPUs that measure it (Hopper and newer).",
)
if head.mean_sm_active is None:
    st.caption("SM activity is not measured on any GPU in this window (it needs NVML GPM, Hopper or newer).")
elif head.sm_measured_gpus < head.gpus:
    st.caption(f"SM activity is measured on {head.sm_measured_gpus} of {head.gpus} GPUs; the mean covers those only.")

st.subheader("Utilisation over time")
bucket = fv.bucket_for(span)
series = fv.utilisation_over_time(frame, bucket) * 100
series = series.rename(columns={"gpu_util_ratio": "GPU utilisation %", "sm_active_ratio": "SM activity %"})
series.index = series.index.tz_convert(None)
st.line_chart(series.dropna(axis=1, how="all"), y_label="%", x_label=f"UTC, {bucket} buckets")

left, right = st.columns(2)
with left:
    st.subheader("Allocated now, by team")
    teams = fv.allocation_by_team(snapshot)
    if teams.empty:
        st.caption("No GPU is allocated now.")
    else:
        st.bar_chart(teams.set_index("team")["gpus"], horizontal=True, x_label="", y_label="GPUs")
with right:
    st.subheader("By GPU model")
    models = fv.allocation_by_model(snapshot)
    st.bar_chart(models.set_index("model")[["allocated", "free"]], horizontal=True, x_label="", y_label="GPUs")

st.subheader("Nodes")
xids = fv.xid_events(frame)
nodes = fv.node_table(frame, snapshot, xids)
st.dataframe(
    nodes,
    hide_index=True,
    width="stretch",
    column_config={
        "node": st.column_config.TextColumn("Node"),
        "model": st.column_config.TextColumn("Model"),
        "gpus": st.column_config.NumberColumn("GPUs"),
        "allocated": st.column_config.NumberColumn("Allocated now", format="%.4g"),
        "mean_util": st.column_config.ProgressColumn("Mean utilisation", min_value=0.0, max_value=1.0, format="percent"),
        "max_temperature_celsius": st.column_config.NumberColumn("Max temperature", format="%.0f °C"),
        "xid_events": st.column_config.NumberColumn("XID events", help="XID events in the window, all codes (counter resets handled)."),
    },
)
xids = xids[xids["total"] > 0]
if not xids.empty:
    with st.expander(f"XID events by GPU and code ({int(xids['total'].sum())} in the window)"):
        codes = [c for c in xids.columns if c != "total" and xids[c].sum() > 0]
        table = xids[codes + ["total"]].rename(columns=lambda c: c.removeprefix("xid_").removesuffix("_total").replace("other", "other codes"))
        st.dataframe(table.rename_axis("GPU"), width="stretch")
