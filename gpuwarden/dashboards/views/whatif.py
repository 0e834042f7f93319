"""What-if on your own history: the window's workloads, rebuilt from the samples, replayed under each
queue policy on the same fleet, beside the schedule as it really ran
(:mod:`gpuwarden.scheduling.whatif`, the same report as ``gpuwarden simulate whatif``). One replay
per window, policy choice and store version (cached like :mod:`gpuwarden.dashboards.data`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from gpuwarden.analytics.fleet_report import format_gpus
from gpuwarden.dashboards import data, fmt
from gpuwarden.scheduling.whatif import AS_IT_RAN, WhatIfReport
from gpuwarden.scheduling.whatif import WHATIF_POLICIES as POLICIES


@st.cache_resource(ttl=data.CACHE_TTL_S, max_entries=6, show_spinner="Replaying the window under each policy…")
def whatif(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float, policies: tuple[str, ...]) -> WhatIfReport:
    """The what-if report of the window (shared, read-only)."""
    from gpuwarden.scheduling.whatif import whatif_report

    try:  # the store, or Prometheus in a cluster (the cache key names which)
        return whatif_report(data.samples_source(path), start, end, policies)
    except OSError as error:  # a damaged file in the store: one line, never a traceback
        raise data.StoreUnreadable(f"the samples could not be read ({error})") from None


info = data.require_store()
st.title("What-if: your history under each policy")
window = data.current_window(info)
data.window_caption(info, window)
chosen = st.multiselect("Policies", POLICIES, default=list(POLICIES), key="whatif_policies",
                        help="Queue policies of the production scheduler to replay the window's workloads under.")
report = whatif(info.path, window.start, window.end, info.version, tuple(p for p in POLICIES if p in chosen))
history = report.history
if not history.workloads:
    st.info("No pod held a GPU in this window, so there is nothing to replay. Pick a longer window in the "
            "sidebar, or check that the exporter labels GPUs with their pods.", icon=":material/info:")
    st.stop()

rows = pd.DataFrame(report.policies).set_index("policy")
ran = rows.loc[AS_IT_RAN]
c1, c2, c3, c4 = st.columns(4)
c1.metric("Workloads", f"{len(history.workloads):,}", help="Pods on GPUs in the window, rebuilt from the samples.")
c2.metric("Fleet", format_gpus(history.gpus), help="GPUs seen in the window (GPUs with unknown owners left out).")
c3.metric("Idle as it ran", fmt.gpu_hours(ran["idle_gpu_hours"]))
c4.metric("Fleet cost as it ran", fmt.money(ran["fleet_cost"], report.currency, 0))

st.subheader("Policies side by side")
st.caption("Wait is every second between submission and finish that a workload is not running. Submission times "
           "are not in the samples: each workload counts as submitted at its first sample, so *as it ran* shows "
           "only pauses.")
shown = pd.DataFrame({
    "policy": rows.index,
    "wait_mean_minutes": rows["wait_mean_seconds"].to_numpy() / 60,
    "wait_p99_minutes": rows["wait_p99_seconds"].to_numpy() / 60,
    "finished_in_window": rows["finished_in_window"].to_numpy(),
    "idle_gpu_hours": rows["idle_gpu_hours"].to_numpy(),
    "idle_cost": rows["idle_cost"].to_numpy(),
    "fleet_cost": rows["fleet_cost"].to_numpy(),
    "guarantee_met": rows["guarantee_met_ratio"].to_numpy(),
    "worst_team": rows["worst_team_guarantee_met_ratio"].to_numpy(),
    "checkpoint_pauses": rows["suspends"].to_numpy(),
    "kills": rows["preemptions"].to_numpy(),
})
number = st.column_config.NumberColumn
st.dataframe(shown, hide_index=True, width="stretch", height=(len(shown) + 1) * 35 + 3, column_config={
    "policy": st.column_config.Column("Policy"),
    "wait_mean_minutes": number("Wait, mean (min)", format="%.1f"),
    "wait_p99_minutes": number("Wait, p99 (min)", format="%.1f"),
    "finished_in_window": number("Finished in window", format="%d"),
    "idle_gpu_hours": number("Idle (GPU-h)", format="%.0f"),
    "idle_cost": number(f"Idle cost ({report.currency})", format="%.0f"),
    "fleet_cost": number(f"Fleet cost ({report.currency})", format="%.0f",
                        help="The fleet until the window's work is done (longer when a policy finishes later)."),
    "guarantee_met": number("Guarantee met", format="percent"),
    "worst_team": number("Worst team", format="percent", help="Guarantee met of the team that got the least of it."),
    "checkpoint_pauses": number("Suspended", format="%d", help="Checkpointed and paused to make room."),
    "kills": number("Killed", format="%d", help="Preempted without a checkpoint: work since the last one is lost."),
})

st.subheader("Guarantee met per team")
teams = pd.DataFrame(report.teams)
met = teams.pivot(index="team", columns="policy", values="guarantee_met_ratio")[list(rows.index)]
met.insert(0, "guarantee_gpus", teams.drop_duplicates("team").set_index("team")["guarantee_gpus"])
st.dataframe(met, width="stretch", column_config={
    **{p: number(p, format="percent") for p in rows.index},
    "guarantee_gpus": number("Guarantee (GPUs)", format="%.0f")})

with st.expander("How this was worked out"):
    for note in report.notes:
        st.markdown(f"- {note}")
    st.markdown("- Every workload is replayed as checkpointable training at one priority; pods of a gang are "
                "replayed on their own. Same report from the command line: `gpuwarden simulate whatif --since 7d`.")
