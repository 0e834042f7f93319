"""Actions: what the actuator planned, applied, was refused or blocked by a limit (its audit log)."""

from __future__ import annotations

import streamlit as st

from gpuwarden.dashboards import actions_view as av
from gpuwarden.dashboards.data import store_path

st.title("Actions")
path = av.audit_path(store_path())
frame = av.load_audit(path)
if frame.empty:
    st.info(
        f"No actuator audit log at `{path}` yet. `gpuwarden demo` runs the actuator in observe mode and "
        f"logs what it would do there; set `{av.AUDIT_ENV}` to read another log.",
        icon=":material/info:",
    )
    st.stop()

modes = sorted(frame["mode"].unique())
st.caption(f"Audit log `{path}` · mode(s): {', '.join(modes)} · {len(frame)} entries, newest first")
if modes == ["observe"]:
    st.caption("Observe mode: nothing was applied; these are the actions the actuator would have taken.")
c1, c2, c3 = st.columns(3)
c1.metric("Planned (observe)", int((frame["outcome"] == "planned").sum()))
c2.metric("Applied", int((frame["outcome"] == "applied").sum()))
c3.metric("Blocked or refused", int(frame["outcome"].isin(["blocked-by-limit", "refused", "error"]).sum()))

st.subheader("By kind and outcome")
st.dataframe(av.outcome_counts(frame), width="stretch")
outcomes = st.multiselect("Outcomes", sorted(frame["outcome"].unique()), default=sorted(frame["outcome"].unique()))
st.subheader("Entries")
st.dataframe(frame[frame["outcome"].isin(outcomes)], width="stretch", hide_index=True)
