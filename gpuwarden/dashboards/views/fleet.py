"""Fleet overview: idle share and cost, critical findings, cordoned nodes and how many GPUs report,
a node x GPU heatmap of activity, who holds the fleet and how busy it is over the shared window, and
the GPU-hours gpuwarden would have saved on the window's work.
Numbers come from the window's fleet, ledger and health bundles (:mod:`gpuwarden.analytics.fleet_report`,
:mod:`~gpuwarden.analytics.idle_cost_report`, :mod:`~gpuwarden.analytics.health_report`) and its
savings bundle (:mod:`gpuwarden.scheduling.savings_history`: the savings search over the window's
workloads, rebuilt from the samples); the ledger, the health scan and the search are slow to
compute and only feed tiles here, so the page never waits for them: until they are ready (the demo
precomputes the first two) the tiles say so, and the savings tile shows itself once computed."""

from __future__ import annotations

import altair as alt
import streamlit as st

from gpuwarden.analytics import fleet_report as fr
from gpuwarden.analytics.health_report import active_critical
from gpuwarden.fleet import cluster_state as cs
from gpuwarden.analytics.report_bundle import Bundle
from gpuwarden.analytics.windows import Window
from gpuwarden.dashboards import data, fmt

SAVINGS = "savings"  # the bundle kind (savings_history.BUNDLE_KIND; not imported: the page loads no replay code)
SAVINGS_POLL_S = 3


def _savings_builder(source: fr.SamplesReader, window: Window, version: float) -> Bundle:
    from gpuwarden.scheduling.savings_history import savings_bundle

    return savings_bundle(source, window, version)


def _savings(info: data.StoreInfo, window: Window) -> Bundle | None:
    """The window's savings bundle, or None while it is computed in the background."""
    return data.board().get(SAVINGS, info.path, window, info.version, _savings_builder, wait=False)


@st.fragment(run_every=SAVINGS_POLL_S)
def _savings_pending(info: data.StoreInfo, window: Window) -> None:
    """Until the search is done: say so, and look again every few seconds (then redraw the page)."""
    if _savings(info, window) is not None:
        st.rerun()
    st.caption("Working out the smallest fleet each policy needs for this window's work (the savings search "
               "replays it a few dozen times); the figure appears here when it is done.")


def savings_tile(info: data.StoreInfo, window: Window) -> None:
    """gpuwarden's GPU-hours against kube-default's on this window's work, or why there is no figure."""
    st.subheader("What gpuwarden would have saved on this window's work")
    found = _savings(info, window)
    if found is None:
        _savings_pending(info, window)
        return
    figure = found["figure"]
    if not figure["ok"]:
        st.info(figure["headline"], icon=":material/info:")
        return
    st.success(figure["headline"] + ".", icon=":material/savings:")
    s1, s2, s3 = st.columns(3)
    s1.metric("gpuwarden", f"{figure['nodes']} nodes", help="The smallest fleet of 8-GPU nodes that serves the work.")
    s2.metric(figure["baseline"], f"{figure['baseline_nodes']} nodes")
    s3.metric("GPU-hours saved", fmt.percent(figure["saved_pct"] / 100),
              help=f"{figure['gpu_hours']:,.0f} GPU-hours provisioned against {figure['baseline_gpu_hours']:,.0f}.")
    others = ", ".join(f"{p} {n} nodes" for p, n in figure["policies"].items() if p not in ("gpuwarden", figure["baseline"]))
    st.caption(
        f"The window's {figure['jobs']:,} GPU workloads, rebuilt from the samples (each submitted at its first sample, "
        f"as checkpointable training, on whole GPUs), replayed under each policy: the smallest fleet of 8-GPU nodes on "
        f"which every workload finishes and every team's p95 wait stays within {figure['slo_wait_seconds'] / 3600:g} h; "
        f"GPU-hours = nodes x 8 x the time until the last finish"
        + (f" ({others})" if others else "") + f". The fleet seen: {figure['fleet_gpus']:,} GPUs; "
        f"{figure['replays']} replays. "
        + " ".join(f"{note.rstrip('.')}." for note in figure["notes"])
        + " The whole table: `gpuwarden simulate savings --since 24h` (or `--since 7d`).")

info = data.require_store()
st.title("Fleet overview")
window = data.current_window(info)
summary = data.bundle("fleet", info, window)
ledger = data.bundle("ledger", info, window, wait=False)  # tiles only: never waited for here
health = data.bundle("health", info, window, wait=False)
data.window_caption(info, window, bundles=(summary,) + ((ledger,) if ledger is not None else ()))
head = summary["headline"]
try:
    cluster = data.cluster_snapshot(cs.state_dir(data.store_path()))  # info.path is a cache folder over Prometheus
except ValueError:
    cluster = None
reporting, seen = summary["reporting"]

c1, c2, c3, c4, c5 = st.columns(5)
if ledger is None:
    c1.metric("Idle share", "…", help="The window's GPU time is being classified; reload in a moment.")
    c2.metric("Idle cost", "…", help="The window's GPU time is being priced; reload in a moment.")
else:
    idle = ledger["idle_headline"]
    c1.metric("Idle share", fmt.percent(idle["idle_share"]), help="Idle GPU-hours over all GPU-hours in the window.")
    c2.metric("Idle cost", fmt.money(idle["idle_cost"], idle["currency"], 0))
if health is None:
    c3.metric("Critical findings", "…", help="The health scan of this window is running; reload in a moment.")
else:
    c3.metric("Critical findings", active_critical(health["findings"]), help="Active critical health findings (see GPU health).")
c4.metric("Cordoned nodes", "n/a" if cluster is None else len(cluster.cordoned),
          help="From the newest cluster snapshot" if cluster else "No cluster snapshot beside this store.")
c5.metric("GPUs reporting", f"{reporting} of {seen}",
          help=f"GPUs with a sample in the last {fr.STALE_AFTER.seconds // 60} min before the newest, of those seen in the window.")
if reporting < seen:
    st.warning(f"{seen - reporting} of {seen} GPUs stopped reporting before the newest sample.", icon=":material/sensors_off:")

d1, d2, d3, d4 = st.columns(4)
d1.metric("Nodes", head["nodes"])
d2.metric("GPUs allocated now", fr.format_gpus(head["allocated_gpus"]),
          help="GPUs whose latest sample names a pod; a MIG instance counts as its share of the GPU.")
d3.metric("Mean GPU utilisation", fmt.percent(head["mean_util"]), help="NVML utilisation.gpu: share of time any kernel ran.")
d4.metric("Mean SM activity", fmt.percent(head["mean_sm_active"], missing="not measured"),
          help="GPM SM activity, averaged over the GPUs that measure it (Hopper and newer).")
if head["mean_sm_active"] is not None and head["sm_measured_gpus"] < head["gpus"]:
    st.caption(f"SM activity is measured on {head['sm_measured_gpus']} of {head['gpus']} GPUs; the mean covers those only.")

savings_tile(info, window)

st.subheader("Activity by node and GPU (%)")
grid = summary["grid"]
grid = grid.assign(activity_pct=grid["activity"] * 100, state=grid["reporting"].map({True: "reporting", False: "silent"}))
pick = alt.selection_point(name="gpu", fields=["gpu_uuid"], on="click")
heat = alt.Chart(grid).mark_rect(stroke="white").encode(
    x=alt.X("gpu_index:O", title="GPU index"),
    y=alt.Y("node:N", title=None, sort=sorted(grid["node"].unique())),
    color=alt.Color("activity_pct:Q", title="mean activity %", scale=alt.Scale(domain=[0, 100], scheme="viridis")),
    opacity=alt.condition("datum.reporting", alt.value(1.0), alt.value(0.25)),
    tooltip=["node:N", "gpu_index:O", "gpu_uuid:N", alt.Tooltip("activity_pct:Q", format=".0f", title="activity %"),
             "source:N", "state:N"],
).add_params(pick).properties(height=max(120, 14 * grid["node"].nunique()))
clicked = st.altair_chart(heat, width="stretch", key="heatmap", on_select="rerun", selection_mode="gpu")
chosen = [p.get("gpu_uuid") for p in (clicked.selection.get("gpu") or []) if isinstance(p, dict)] if clicked else []
if chosen and chosen[0]:
    st.switch_page("views/gpu.py", query_params={"gpu": chosen[0]})
st.caption("SM activity where the GPU measures it, else NVML utilisation; faded cells stopped reporting. "
           "Click a cell for that GPU's history on the **GPU detail** page.")
st.page_link("views/gpu.py", label="GPU detail", icon=":material/memory:")

st.subheader("Utilisation over time (%)")
bucket = data.bucket_for(window.span)
series = summary["series"] * 100
series = series.rename(columns={"gpu_util_ratio": "GPU utilisation %", "sm_active_ratio": "SM activity %"})
series.index = series.index.tz_convert(None)
st.line_chart(series.dropna(axis=1, how="all"), y_label="%", x_label=f"UTC (sample time), {bucket} buckets")

left, right = st.columns(2)
with left:
    st.subheader("Allocated now, by team (GPUs)")
    teams = summary["teams"]
    if teams.empty:
        st.caption("No GPU is allocated now.")
    else:
        st.bar_chart(teams.set_index("team")["gpus"], horizontal=True, x_label="GPUs", y_label="")
with right:
    st.subheader("By GPU model (GPUs)")
    models = summary["models"]
    st.bar_chart(models.set_index("model")[["allocated", "free"]], horizontal=True, x_label="GPUs", y_label="")

st.subheader("Nodes")
nodes = summary["nodes"]
st.dataframe(
    nodes, hide_index=True, width="stretch",
    column_config={
        "node": st.column_config.TextColumn("Node"), "model": st.column_config.TextColumn("Model"),
        "gpus": st.column_config.NumberColumn("GPUs"),
        "allocated": st.column_config.NumberColumn("Allocated now (GPUs)", format="%.1f"),
        "mean_util": st.column_config.ProgressColumn("Mean utilisation (%)", min_value=0.0, max_value=1.0, format="percent"),
        "max_temperature_celsius": st.column_config.NumberColumn("Max temperature (°C)", format="%.0f"),
        "xid_events": st.column_config.NumberColumn("XID events", help="XID events in the window, all codes (counter resets handled)."),
    },
)
xids = summary["xids"]
if not xids.empty:
    with st.expander(f"XID events by GPU and code ({int(xids['total'].sum())} in the window)"):
        codes = [c for c in xids.columns if c != "total" and xids[c].sum() > 0]
        table = xids[codes + ["total"]].rename(columns=lambda c: c.removeprefix("xid_").removesuffix("_total").replace("other", "other codes"))
        st.dataframe(table.rename_axis("GPU"), width="stretch")
