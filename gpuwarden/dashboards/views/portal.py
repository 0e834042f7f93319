"""Request GPUs: a team member submits a workload (GPUs, a fraction or a MIG profile, priority
class, checkpointable). The request joins the same queue and goes through the same planner as
everything else; the page shows its position and why it waits. Admins edit team priorities."""

from __future__ import annotations

from datetime import UTC

import pandas as pd
import streamlit as st

from gpuwarden.dashboards import auth, data
from gpuwarden.fleet import cluster_state as cs
from gpuwarden.fleet import FleetValueError, PriorityClass

st.title("Request GPUs")
directory, (snapshot, *_) = data.require_queue_plan()  # the same snapshot the queue below plans on
max_gpus, profiles, teams = cs.request_limits(snapshot)
with st.form("request"):
    left, right = st.columns(2)
    team = left.selectbox("Team", teams)
    name = right.text_input("Workload name", value="my-job", max_chars=cs.NAME_MAX_CHARS,
                            help="Lower-case letters, digits and '-', starting and ending with a letter or digit.")
    shape = left.radio("Shape", ["Whole GPUs", "Fraction of one GPU", "MIG profile"], horizontal=True)
    gpus = right.number_input("GPUs (whole)", min_value=1, max_value=max_gpus, value=1, step=1,
                              help=f"1 to {max_gpus}, the GPUs of this cluster.")
    fraction = left.slider("Fraction of one GPU (%)", 10, 100, 50, step=10)
    profile = right.selectbox("MIG profile", profiles or ["(no GPU here has MIG)"], disabled=not profiles,
                              help="The MIG profiles this cluster's GPU models offer.")
    priority = left.selectbox("Priority class", [p.value for p in PriorityClass], index=2)
    checkpointable = right.checkbox("Checkpointable (may be suspended and resumed instead of killed)")
    submitted = st.form_submit_button("Submit request", type="primary")

if submitted:
    who = auth.identity()
    whole = shape == "Whole GPUs"
    request = cs.WorkloadRequest(
        name=name.strip(), team=team, gpus=int(gpus) if whole else 1,
        fraction_milli=int(fraction) * 10 if shape == "Fraction of one GPU" else 1000,
        mig_profile=profile if shape == "MIG profile" else None, priority_class=priority, checkpointable=checkpointable,
        submitted_by=who.name if who else "anonymous", submitted_at=snapshot.taken_at.astimezone(UTC).isoformat())
    try:
        cs.append_request(directory, request, snapshot)
    except (FleetValueError, ValueError) as error:
        st.error(f"Not submitted: {str(error).splitlines()[0]}", icon=":material/error:")
    else:
        st.session_state["portal_last"] = f"{team}/{request.name}"
        st.success(f"Submitted {team}/{request.name}.", icon=":material/check_circle:")

planned, result, pending, requests, problems = data.queue_plan(str(directory), data.cluster_version(directory))
mine = {f"{r.team}/{r.name}" for r in requests}
st.subheader("Your requests in the queue")
if not requests:
    st.caption("No request submitted yet.")
else:
    rows = pending[pending["workload"].isin(mine)]
    bound = {a.target for a in result.actions if a.kind.value in ("bind", "resume")}
    for key in sorted(mine - set(rows["workload"])):
        st.caption(f"`{key}`: " + ("the planner would start it now." if key in bound else "not waiting."))
    if not rows.empty:
        st.dataframe(rows[["position", "workload", "team", "gpus", "priority_class", "reason"]], hide_index=True,
                     width="stretch", column_config={"reason": st.column_config.TextColumn("Why it waits", width="large")})
        st.caption(f"Of {len(pending)} workloads waiting in the whole queue.")

st.subheader("Team priorities (fair-share weights)")
weights = {t.name: t.weight for t in planned.teams}
admin = auth.sign_in("admin")
edited = st.data_editor(pd.DataFrame({"team": list(weights), "weight": list(weights.values())}), hide_index=True,
                        disabled=admin is None or ["team"], key="weights",
                        column_config={"weight": st.column_config.NumberColumn("Weight", min_value=0.01, format="%.2f")})
if admin is not None and st.button("Save priorities"):
    try:
        cs.write_weights(directory, dict(zip(edited["team"], edited["weight"].astype(float))))
    except ValueError as error:
        st.error(str(error))
    else:
        st.success(f"Saved by {admin.name}; the next plan uses them.")
elif admin is None:
    st.caption("Only admins can change team priorities.")
