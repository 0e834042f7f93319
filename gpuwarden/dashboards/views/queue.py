"""Queue & quotas (the Run:ai / Kueue view): per team, guarantee vs burst vs allocated vs used, lent
and borrowed; the pending workloads in the planner's order with position, wait reason and an
estimated start. Planned by :func:`gpuwarden.scheduling.plan` on the newest cluster snapshot."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from gpuwarden.dashboards import data, show
from gpuwarden.scheduling import queue_report

st.title("Queue & quotas")
directory, (snapshot, result, pending, requests, problems) = data.require_queue_plan()
for problem in problems[:3]:
    st.warning(problem, icon=":material/warning:")
st.caption(f"Cluster snapshot taken at {snapshot.taken_at:%Y-%m-%d %H:%M} UTC (sample time) · {len(snapshot.nodes)} nodes, "
           f"{len(snapshot.cordoned)} cordoned · {len(requests)} portal request(s) included")

used: dict[str, float] = {}
info = data.store_info()
ledger = None
if info is not None:  # the window's ledger, shared with the Idle and Cost pages; never waited for here
    ledger = data.bundle("ledger", info, data.current_window(info), wait=False)
    if ledger is not None:
        used = dict(zip(ledger["used_by_team"]["team"], ledger["used_by_team"]["used_gpus"].astype(float)))

quotas = queue_report.quota_table(snapshot, used)
c1, c2, c3, c4 = st.columns(4)
c1.metric("GPUs guaranteed", f"{quotas['guaranteed_gpus'].sum():,.0f}")
c2.metric("GPUs allocated", f"{quotas['allocated_gpus'].sum():,.1f}")
c3.metric("GPUs borrowed", f"{quotas['borrowed_gpus'].sum():,.1f}")
c4.metric("Workloads waiting", len(pending))

st.subheader("Per team (GPUs)")
bars = quotas.melt("team", ["guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "used_gpus"], "measure", "gpus").dropna()
bars["measure"] = bars["measure"].map({"guaranteed_gpus": "guarantee", "burst_limit_gpus": "burst limit",
                                       "allocated_gpus": "allocated", "used_gpus": "used (window mean)"})
st.altair_chart(alt.Chart(bars).mark_bar().encode(
    y=alt.Y("team:N", title=None), yOffset="measure:N", x=alt.X("gpus:Q", title="GPUs"),
    color=alt.Color("measure:N", title=None, scale=alt.Scale(
        domain=["guarantee", "burst limit", "allocated", "used (window mean)"],
        range=["#90caf9", "#e3f2fd", "#1565c0", "#2e7d32"]))), width="stretch")
show.table(quotas, key_columns=["team", "guaranteed_gpus", "burst_limit_gpus", "allocated_gpus", "used_gpus",
                                "lent_gpus", "borrowed_gpus"])
st.caption("Used: mean GPUs doing useful work (SM activity) over the window"
           + (" (being computed: reload in a moment)" if info is not None and ledger is None else "")
           + ". Lent: unused guarantee other teams borrow, shared in proportion to each lender's unused guarantee.")

st.subheader("Pending workloads, in queue order")
if pending.empty:
    st.caption("Nothing waits: every workload is running.")
else:
    shown = pending.assign(estimated_start=pd.to_datetime(pending["estimated_start"], utc=True).dt.tz_convert(None))
    st.dataframe(shown, hide_index=True, width="stretch", column_config={
        "position": st.column_config.NumberColumn("Position"), "gpus": st.column_config.NumberColumn("GPUs", format="%.2f"),
        "waiting_hours": st.column_config.NumberColumn("Waiting (h)", format="%.1f"),
        "reason": st.column_config.TextColumn("Why it waits", width="large"),
        "estimated_start": st.column_config.DatetimeColumn("Estimated start (UTC, sample time)", format="YYYY-MM-DD HH:mm")})
    st.caption("Estimated start: running workloads free their GPUs when their known duration ends and the queue takes "
               "them in order; blank where no duration is known. A guess, not a promise.")
