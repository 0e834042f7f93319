"""Actions: what the actuator planned, what waits for a person (approve or reject here, audited
with who did it), what was applied, refused or blocked by a limit, and what each disruptive action
put at risk (GPU-hours since the last checkpoint, the mode, a drain's checkpoint asked first and
what came of it). Audit times are the actuator's wall clock; finding times are sample time
(simulated in the demo): both are labelled."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from gpuwarden.remediation import approvals
from gpuwarden.remediation import audit_report as av
from gpuwarden.remediation.at_risk import risk_line
from gpuwarden.remediation.checkpoint_first import risk_rows
from gpuwarden.remediation.pacing import pace_rows
from gpuwarden.analytics.health_report import findings_on_node
from gpuwarden.analytics.windows import window_for
from gpuwarden.dashboards import auth, data, show
from gpuwarden.fleet import cluster_state as cs
from gpuwarden.dashboards.data import store_path

st.title("Actuator actions")
path = av.audit_path(store_path())
entries, problems = av.read_entries(path)
frame = av.load_audit(path, entries)
try:
    snapshot = data.cluster_snapshot(cs.state_dir(store_path()))
except ValueError as error:
    snapshot = None
    problems.append(str(error))
for problem in problems[:5]:
    st.warning(problem, icon=":material/warning:")
if len(problems) > 5:
    st.warning(f"...and {len(problems) - 5} more unreadable lines.", icon=":material/warning:")

status = av.actuator_status(path, frame, snapshot.taken_at if snapshot else None)
if status == "never-ran":
    where = f"at `{path}`" if path is not None else f"(`{av.AUDIT_ENV}` is not set and there is no store)"
    st.info(f"The actuator has never run against this store: no audit log {where} and no cluster snapshot. "
            f"`gpuwarden demo` runs it in observe mode; set `{av.AUDIT_ENV}` to read another log.", icon=":material/info:")
    st.stop()
if status == "planned-nothing":
    last = f" (last round at {snapshot.taken_at:%Y-%m-%d %H:%M} UTC, sample time)" if snapshot else ""
    st.success(f"The actuator ran and planned nothing: no finding called for an action{last}.", icon=":material/check_circle:")

modes = sorted(m for m in frame["mode"].dropna().unique())
st.caption(f"Audit log `{path}` · mode(s): {', '.join(modes) or 'n/a'} · {len(frame)} entries, newest first · "
           "audit times are the actuator's wall clock (UTC)")
if modes == ["observe"]:
    st.caption("Observe mode: nothing was applied; these are the actions the actuator would have taken.")

c1, c2, c3, c4 = st.columns(4)
waiting = approvals.pending_from(entries)
c1.metric("Awaiting approval", len(waiting))
c2.metric("Planned (observe)", int((frame["outcome"] == "planned").sum()))
c3.metric("Applied", int((frame["outcome"] == "applied").sum()))
c4.metric("Blocked or refused", int(frame["outcome"].isin(["blocked-by-limit", "refused", "error"]).sum()))

paced = pace_rows(entries)
if paced:
    st.subheader("Pace")
    st.caption("Disruptive actions (cordon, drain, taint, evict) per node pool and detector: one in flight at "
               "first, doubled after each proven success (the node Ready with no open finding), back to one after "
               "a failure, a jittered cooldown between; the circuit breaker stays the outer limit. "
               f"{int((frame['outcome'] == 'held-by-pace').sum())} action(s) held by the pace in this log.")
    st.dataframe(pd.DataFrame(paced), hide_index=True, width="stretch")

at_risk = risk_rows(entries)
if at_risk:
    st.subheader("Work at risk and checkpoints")
    said = pd.Series([row["checkpoint"] for row in at_risk])
    st.caption("GPU-hours each disruptive action puts at risk: the work of what it stops since its last checkpoint "
               "(basis: the trainer's checkpoint annotation, else its start, else attained service), and the mode "
               "chosen. A drain of checkpointable work asks for a checkpoint first (gpuwarden.io/checkpoint-request, "
               "docs/remediation.md) and goes once it is done or at the deadline: checkpoint requested "
               f"{int((said == 'requested').sum())}, done {int((said == 'done').sum())}, timed out "
               f"{int((said == 'timed-out').sum())}, not asked {int((said == 'not-asked').sum())} in this log.")
    st.dataframe(pd.DataFrame(at_risk).rename(columns={"gpu_hours_at_risk": "GPU-h at risk"}), hide_index=True,
                 width="stretch")

health_findings = None
info = data.store_info()
if waiting and info is not None:  # findings of the last 24 h, for actions whose log entry does not carry them
    health = data.bundle("health", info, window_for("24h", info.oldest, info.newest))
    health_findings = health["findings"]

st.subheader("Awaiting approval")
if not waiting:
    st.caption("Nothing waits for a person.")
else:
    who = auth.sign_in("approver")
    for item in waiting:
        with st.container(border=True):
            st.markdown(f"**{item.kind} `{item.target}`** · approval `{item.approval_id}` · planned at "
                        f"{item.planned_at} (wall clock)")
            st.caption(f"Why: {item.reason}")
            asked = next((e.get("params") for e in entries if e.get("approval_id") == item.approval_id
                          and e.get("outcome") == "awaiting-approval"), None)
            stated = risk_line(asked) if isinstance(asked, dict) else ""
            if stated:
                st.caption(f"At stake: {stated}")
            if item.findings:
                behind = pd.DataFrame(list(item.findings))
            elif health_findings is not None:
                behind = findings_on_node(health_findings, item.target)
            else:
                behind = pd.DataFrame()
            if not behind.empty:
                st.caption("Findings behind it:")
                st.dataframe(behind, hide_index=True, width="stretch")
            evicted = av.evictions(snapshot, item.kind, item.target)
            if not evicted.empty:
                st.caption(f"Would evict {len(evicted)} workload(s) of {evicted['team'].nunique()} team(s), "
                           f"{evicted['gpus'].sum():.1f} GPUs, {evicted['gpu_hours_run'].sum():,.1f} GPU-h of work run so far:")
                show.table(evicted, key_columns=["workload", "team"])
            elif item.kind in av.EVICTING_KINDS:
                st.caption("Would evict nothing running" + ("" if snapshot else " (no cluster snapshot to check)") + ".")
            st.caption("Limits: " + av.limit_check(snapshot, frame, item.kind, item.target))
            if who is not None:
                comment = st.text_input("Comment (optional)", key=f"comment-{item.approval_id}")
                left, right = st.columns(2)
                approve = left.button("Approve", key=f"approve-{item.approval_id}", type="primary")
                reject = right.button("Reject", key=f"reject-{item.approval_id}")
                if approve or reject:
                    try:
                        approvals.decide(path, item.approval_id, approve=approve, by=who.name, comment=comment)
                    except ValueError as error:
                        st.error(str(error))
                    else:
                        st.toast(f"{'Approved' if approve else 'Rejected'} {item.kind} {item.target} as {who.name}")
                        st.rerun()

decided = frame[frame["outcome"].isin(["approved", "rejected"])]
if not decided.empty:
    st.subheader("Decisions")
    for row in decided.head(10).itertuples(index=False):
        note = f" — “{row.comment}”" if isinstance(row.comment, str) and row.comment else ""
        st.markdown(f"- **{row.outcome}** {row.kind} `{row.target}` by **{row.by}** at {row.at:%Y-%m-%d %H:%M:%S} "
                    f"(wall clock, UTC), approval `{row.approval_id}`{note}")
    if len(decided) > 10:
        st.caption(f"...and {len(decided) - 10} more in the entries below.")

if not frame.empty:
    st.subheader("By kind and outcome")
    st.dataframe(av.outcome_counts(frame), width="stretch")
    outcomes = sorted(frame["outcome"].dropna().unique())
    chosen = st.multiselect("Outcomes", outcomes, default=outcomes)
    st.subheader("Entries")
    shown = frame[frame["outcome"].isin(chosen)]
    st.dataframe(shown[["at", "outcome", "kind", "target", "reason", "by", "mode"]], width="stretch", hide_index=True,
                 column_config={"at": st.column_config.DatetimeColumn("At (wall clock, UTC)", format="YYYY-MM-DD HH:mm:ss")})
    with st.expander("Diagnostic columns"):
        st.dataframe(shown[["at", "approval_id", "message", "comment"]], width="stretch", hide_index=True)
