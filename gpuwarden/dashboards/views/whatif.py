"""What-if on your own history: the window's workloads, rebuilt from the samples, replayed under each
queue policy on the same fleet, beside the schedule as it really ran
(:mod:`gpuwarden.scheduling.whatif`, the same report as ``gpuwarden simulate whatif``). One replay
per window, policy choice and store version (cached like :mod:`gpuwarden.dashboards.data`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from gpuwarden.dashboards import data, fmt, show
from gpuwarden.scheduling.whatif import AS_IT_RAN, WhatIfReport
from gpuwarden.scheduling.whatif import WHATIF_POLICIES as POLICIES


@st.cache_resource(ttl=data.CACHE_TTL_S, max_entries=6, show_spinner="Replaying the window under each policy…")
def whatif(path: str, start: pd.Timestamp, end: pd.Timestamp, version: float, policies: tuple[str, ...]) -> WhatIfReport:
    """The what-if report of the window (shared, read-only)."""
    from gpuwarden.scheduling.whatif import whatif_report
    from gpuwarden.store import LocalStore

    try:
        return whatif_report(LocalStore(path), start, end, policies)
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
c2.metric("Fleet", fmt.gpus(history.gpus), help="GPUs seen in the window (GPUs with unknown owners left out).")
c3.metric("Idle as it ran", fmt.gpu_hours(ran["idle_gpu_hours"]))
c4.metric("Fleet cost as it ran", fmt.money(ran["fleet_cost"], report.currency, 0))

st.subheader("Policies side by side")
st.caption("Wait is every second between submission and finish that a workload is not running. Submission times "
           "are not in the samples: each workload counts as submitted at its first sample, so *as it ran* shows "
           "only pauses.")
shown = rows[["finished_in_window", "wait_mean_seconds", "wait_p99_seconds", "idle_gpu_hours", "idle_cost",
              "fleet_cost", "guarantee_met_ratio", "worst_team_guarantee_met_ratio", "suspends", "preemptions"]]
show.table(shown.reset_index(), report.currency, key_columns=["policy"])

st.subheader("Guarantee met per team")
teams = pd.DataFrame(report.teams)
met = teams.pivot(index="team", columns="policy", values="guarantee_met_ratio")[list(rows.index)]
met.insert(0, "guarantee_gpus", teams.drop_duplicates("team").set_index("team")["guarantee_gpus"])
st.dataframe(met, width="stretch", column_config={
    **{p: st.column_config.ProgressColumn(p, min_value=0.0, max_value=1.0, format="percent") for p in rows.index},
    "guarantee_gpus": st.column_config.NumberColumn("Guarantee (GPUs)", format="%.0f")})

with st.expander("How this was worked out"):
    for note in report.notes:
        st.markdown(f"- {note}")
    st.markdown("- Every workload is replayed as checkpointable training at one priority; pods of a gang are "
                "replayed on their own. Same report from the command line: `gpuwarden simulate whatif --since 7d`.")
