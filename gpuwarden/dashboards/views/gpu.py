"""GPU detail: one GPU's memory, power, temperature, SM clock and SM / tensor / DRAM activity over
the shared window, who held it, and its health findings (as dcgm-exporter's Grafana board does).
The GPU is chosen here or given in the URL: ``?gpu=GPU-...``."""

from __future__ import annotations

import streamlit as st

from gpuwarden.dashboards import data
from gpuwarden.dashboards import fleet_view as fv
from gpuwarden.dashboards import health_view as hv

info = data.require_store()
st.title("GPU detail")
window = data.current_window(info)
index = data.read_window(info.path, window.start, window.end, ("timestamp", "node", "gpu_uuid", "gpu_index"), info.version)
if index.empty:
    st.info("No GPU reported in this window; widen the window in the sidebar.", icon=":material/info:")
    st.stop()
gpus = index.drop_duplicates("gpu_uuid", keep="last").sort_values(["node", "gpu_index"])
nodes = list(gpus["node"].astype(str).unique())
wanted = st.query_params.get("gpu")
row = gpus[gpus["gpu_uuid"].astype(str) == wanted]
default_node = str(row["node"].iloc[0]) if len(row) else nodes[0]
left, right = st.columns(2)
node = left.selectbox("Node", nodes, index=nodes.index(default_node))
on_node = gpus[gpus["node"].astype(str) == node]
labels = {str(u): f"GPU {int(i)} · {u}" for u, i in zip(on_node["gpu_uuid"].astype(str), on_node["gpu_index"].fillna(-1))}
choices = list(labels)
uuid = right.selectbox("GPU", choices, index=choices.index(wanted) if wanted in choices else 0, format_func=labels.get)
st.query_params["gpu"] = uuid

frame = data.read_window(info.path, window.start, window.end, fv.GPU_DETAIL_COLUMNS, info.version, nodes=(node,))
frame = frame[frame["gpu_uuid"].astype(str) == uuid]
data.window_caption(info, window, f" · {node}, {labels[uuid]}")
model = frame["model"].dropna().astype(str).iloc[-1] if frame["model"].notna().any() else "unknown model"
holders = frame.dropna(subset=["pod"])[["team", "pod"]].astype(str).drop_duplicates()
st.markdown(f"**{model}** · held in this window by "
            + (", ".join(f"`{p}` ({t})" for t, p in holders.itertuples(index=False)) if len(holders) else "nobody"))

bucket = data.bucket_for(window.span)
groups = fv.gpu_series(frame, bucket)
names = list(groups)
for start in range(0, len(names), 2):
    columns = st.columns(2)
    for column, name in zip(columns, names[start:start + 2]):
        with column:
            st.subheader(name)
            st.line_chart(groups[name], x_label=f"UTC (sample time), {bucket} buckets", y_label=name)
missing = {"Memory (GiB)", "Power (W)", "Temperature (°C)", "SM clock (MHz)", "Activity (%)"} - set(names)
if missing:
    st.caption("Not measured on this GPU in this window: " + ", ".join(sorted(missing)) + ".")

st.subheader("Findings on this GPU")
found = [f for f in data.findings(info.path, window.start, window.end, info.version) if f.gpu_uuid == uuid]
table = hv.findings_table(found, {uuid: int(on_node.loc[on_node["gpu_uuid"].astype(str) == uuid, "gpu_index"].iloc[0])})
if table.empty:
    st.caption("No health finding on this GPU in the window.")
else:
    st.dataframe(table[["severity", "kind", "action", "confidence", "first_seen", "last_seen", "evidence"]], hide_index=True,
                 width="stretch", column_config={
                     "confidence": st.column_config.ProgressColumn("Confidence (%)", min_value=0.0, max_value=1.0, format="percent"),
                     "first_seen": st.column_config.DatetimeColumn("First seen (UTC, sample time)", format="YYYY-MM-DD HH:mm"),
                     "last_seen": st.column_config.DatetimeColumn("Last seen (UTC, sample time)", format="YYYY-MM-DD HH:mm")})
