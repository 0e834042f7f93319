"""Queue & quotas (the Run:ai / Kueue view): per team, guarantee vs burst vs allocated vs used, lent
and borrowed; the waiting workloads in the scheduler's order with position, wait reason and an
estimated start. Read live from the scheduler (:mod:`gpuwarden.dashboards.live_queue`); the used
GPUs come from the samples store where there is one."""

from __future__ import annotations

import altair as alt
import streamlit as st

from gpuwarden.dashboards import data, live_queue, show

QUEUE_REFRESH_S = 10  # the scheduler plans a round every few seconds; the tables follow it

st.title("Queue & quotas")


@st.fragment(run_every=QUEUE_REFRESH_S if st.session_state.get("auto_refresh", True) else None)
def live_tables() -> None:
    queue = live_queue.require()
    st.caption(f"Live from the scheduler at `{queue.url}` · policy {queue.policy} · round {queue.round} · "
               f"planned at {queue.taken_at:%Y-%m-%d %H:%M:%S} UTC (the scheduler's clock; simulated in the demo)")
    quotas = queue.teams.copy()
    quotas["used_gpus"] = quotas["team"].map(used).astype(float)
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("GPUs guaranteed", f"{quotas['guaranteed_gpus'].sum():,.0f}")
    c2.metric("GPUs allocated", f"{quotas['allocated_gpus'].sum():,.1f}")
    c3.metric("GPUs borrowed", f"{quotas['borrowed_gpus'].sum():,.1f}")
    c4.metric("Workloads waiting", len(queue.workloads))

    st.subheader("Per team (GPUs)")
    bars = quotas.melt("team", ["guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "used_gpus"], "measure",
                       "gpus").dropna()
    bars["measure"] = bars["measure"].map({"guaranteed_gpus": "guarantee", "burst_limit_gpus": "burst limit",
                                           "allocated_gpus": "allocated", "used_gpus": "used (window mean)"})
    st.altair_chart(alt.Chart(bars).mark_bar().encode(
        y=alt.Y("team:N", title=None), yOffset="measure:N", x=alt.X("gpus:Q", title="GPUs"),
        color=alt.Color("measure:N", title=None, scale=alt.Scale(
            domain=["guarantee", "burst limit", "allocated", "used (window mean)"],
            range=["#90caf9", "#e3f2fd", "#1565c0", "#2e7d32"]))), width="stretch")
    show.table(quotas, key_columns=["team", "guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "used_gpus",
                                    "lent_gpus", "borrowed_gpus", "pending_workloads", "pending_gpus"])
    st.caption("Used: mean GPUs doing useful work (SM activity) over the window"
               + (" (being computed: reload in a moment)" if info is not None and ledger is None else
                  " (no samples store: blank)" if info is None else "")
               + ". Lent: unused guarantee other teams borrow.")

    st.subheader("Pending workloads, in queue order")
    if queue.workloads.empty:
        st.caption("Nothing waits: every workload is running.")
        return
    shown = queue.workloads.assign(waiting_hours=queue.workloads["waiting_seconds"] / 3600.0,
                                   estimated_start=queue.workloads["estimated_start"].dt.tz_convert(None))
    st.dataframe(shown[["position", "workload", "team", "priority_class", "gpus", "shape", "state", "waiting_hours",
                        "reason", "estimated_start", "requested_by"]], hide_index=True, width="stretch", column_config={
        "position": st.column_config.NumberColumn("Position"), "gpus": st.column_config.NumberColumn("GPUs", format="%.2f"),
        "waiting_hours": st.column_config.NumberColumn("Waiting (h)", format="%.1f"),
        "reason": st.column_config.TextColumn("Why it waits", width="large"),
        "estimated_start": st.column_config.DatetimeColumn("Estimated start (UTC)", format="YYYY-MM-DD HH:mm"),
        "requested_by": st.column_config.TextColumn("Requested by")})
    st.caption("Estimated start: when the GPUs it needs are expected free, from running workloads' known durations; "
               "blank where none is known. A guess, not a promise.")


used: dict[str, float] = {}
info = data.store_info()
ledger = None
if info is not None:  # the window's ledger, shared with the Idle and Cost pages; never waited for here
    ledger = data.bundle("ledger", info, data.current_window(info), wait=False)
    if ledger is not None:
        used = dict(zip(ledger["used_by_team"]["team"], ledger["used_by_team"]["used_gpus"].astype(float)))
live_tables()
