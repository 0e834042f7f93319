"""GPU detail: one GPU's memory, power, temperature, SM clock and SM / tensor / DRAM activity over
the shared window, who held it, and its health findings (as dcgm-exporter's Grafana board does).
The GPU is chosen here or given in the URL: ``?gpu=GPU-...``."""

from __future__ import annotations

import streamlit as st

from gpuwarden.dashboards import data, show

info = data.require_store()
st.title("GPU detail")
window = data.current_window(info)
gpus = data.bundle("fleet", info, window)["grid"][["node", "gpu_index", "gpu_uuid"]]
if gpus.empty:
    st.info("No GPU reported in this window; widen the window in the sidebar.", icon=":material/info:")
    st.stop()
nodes = list(gpus["node"].unique())
wanted = st.query_params.get("gpu")
row = gpus[gpus["gpu_uuid"] == wanted]
default_node = str(row["node"].iloc[0]) if len(row) else nodes[0]
left, right = st.columns(2)
node = left.selectbox("Node", nodes, index=nodes.index(default_node))
on_node = gpus[gpus["node"] == node]
labels = {u: f"GPU {int(i)} · {u}" for u, i in zip(on_node["gpu_uuid"], on_node["gpu_index"].fillna(-1))}
choices = list(labels)
uuid = right.selectbox("GPU", choices, index=choices.index(wanted) if wanted in choices else 0, format_func=labels.get)
st.query_params["gpu"] = uuid

histories = data.bundle("gpus", info, window, wait=False)  # every GPU's history, computed once per window
if histories is not None:
    from gpuwarden.analytics.fleet_report import history_groups

    mine = histories["holders"][histories["holders"]["gpu_uuid"] == uuid]
    model = str(mine["model"].iloc[0]) if len(mine) else "unknown model"
    holders = mine.dropna(subset=["pod"])
    groups = history_groups(histories["history"][histories["history"]["gpu_uuid"] == uuid])
    data.window_caption(info, window, f" · {node}, {labels[uuid]}", bundles=(histories,))
else:  # not ready yet: read this GPU's node only
    history = data.gpu_history(info.path, window.start, window.end, info.version, node, uuid)
    model, holders, groups = history["model"], history["holders"], history["groups"]
    data.window_caption(info, window, f" · {node}, {labels[uuid]}")
claims = holders["dra_claim"] if "dra_claim" in holders.columns else [None] * len(holders)
held_by = [f"`{pod}` ({team}" + (f", claim `{claim}`)" if isinstance(claim, str) else ")")
           for team, pod, claim in zip(holders["team"], holders["pod"], claims)]
st.markdown(f"**{model}** · held in this window by " + (", ".join(held_by) if held_by else "nobody"))

bucket = data.bucket_for(window.span)
names = list(groups)
for start in range(0, len(names), 2):
    columns = st.columns(2)
    for column, name in zip(columns, names[start:start + 2]):
        with column:
            st.subheader(name)
            show.lines(groups[name], name, f"UTC (sample time), {bucket} buckets", key=f"gpu-{name}")
missing = {"Memory (GiB)", "Power (W)", "Temperature (°C)", "SM clock (MHz)", "Activity (%)"} - set(names)
if missing:
    st.caption("Not measured on this GPU in this window: " + ", ".join(sorted(missing)) + ".")

st.subheader("Findings on this GPU")
health = data.bundle("health", info, window, wait=False)
table = None if health is None else health["findings"][health["findings"]["gpu_uuid"] == uuid]
if table is None:
    st.caption("The health scan of this window is running; reload in a moment.")
elif table.empty:
    st.caption("No health finding on this GPU in the window.")
else:
    st.dataframe(table[["severity", "kind", "action", "confidence", "first_seen", "last_seen", "evidence"]], hide_index=True,
                 width="stretch", column_config={
                     "confidence": st.column_config.ProgressColumn("Confidence (%)", min_value=0.0, max_value=1.0, format="percent"),
                     "first_seen": st.column_config.DatetimeColumn("First seen (UTC, sample time)", format="YYYY-MM-DD HH:mm"),
                     "last_seen": st.column_config.DatetimeColumn("Last seen (UTC, sample time)", format="YYYY-MM-DD HH:mm")})
