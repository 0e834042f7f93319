"""Request GPUs: a signed-in team member submits a Job from their team's template (images, GPU
shapes, priority classes: :mod:`gpuwarden.portal.submit`); it is created through the Kubernetes
API (or the demo's scheduler) with gpuwarden's scheduling gate and the requester's identity, and
the page shows its live position and why it waits. The teams offered are those the signed-in
identity's groups map to (the portal file's ``groups``; none configured: every team, and the page
says so), and :func:`gpuwarden.portal.access.submit_as` checks it again on submission. A team's
leads raise or lower its waiting jobs within the template's classes."""

from __future__ import annotations

import os
import shlex

import streamlit as st

from gpuwarden.portal.access import PortalConfig, load_portal, log_to_stderr, submit_as
from gpuwarden.portal.submit import TEMPLATES_ENV, PortalError, PortalRequest
from gpuwarden.portal.submitters import KUBECONFIG_ENV, SCHEDULER_URL_ENV, SETTINGS_ENVS, Submitter, submitter_from_env
from gpuwarden.dashboards import auth, live_queue

SUBMITTED_KEY = "portal_submitted"  # the workloads this session submitted, newest last

st.title("Request GPUs")


@st.cache_resource(ttl=60, show_spinner=False)
def portal_at(path: str, modified: float) -> PortalConfig:
    return load_portal(path)


@st.cache_resource(show_spinner=False)
def submitter_for(settings: tuple[tuple[str, str], ...]) -> Submitter | None:
    return submitter_from_env(dict(settings))


path = os.environ.get(TEMPLATES_ENV, "").strip()
if not path:
    st.info(f"No portal templates: `{TEMPLATES_ENV}` is not set. It names the teams' templates file (helm values "
            "`portal.teams`; `gpuwarden demo` sets it).", icon=":material/info:")
    st.stop()
try:
    config = portal_at(path, os.path.getmtime(path))
    templates = config.templates
    submitter = submitter_for(tuple((k, os.environ[k]) for k in SETTINGS_ENVS if k in os.environ))
except (PortalError, OSError) as error:
    st.error(f"The portal cannot submit: {str(error).splitlines()[0]}", icon=":material/error:")
    st.stop()
if submitter is None:
    st.info(f"Submitting is off: set `{KUBECONFIG_ENV}` or run the dashboard in the cluster (Jobs go through the "
            f"Kubernetes API), or set `{SCHEDULER_URL_ENV}` to a scheduler that takes submissions (the demo's).",
            icon=":material/info:")
    st.stop()
who = auth.identity()
if who is None:
    st.info("Sign in to request GPUs: your identity is written on the Job (`gpuwarden.io/requested-by`).",
            icon=":material/login:")
    if auth.oidc_configured():
        st.button("Log in", on_click=st.login, help="Sign in with your organisation's identity provider.")
    else:
        st.caption("Nobody can sign in: configure OIDC (`st.login`, the chart's dashboard auth), or, for a local "
                   f"demo, `{auth.DEMO_APPROVER_ENV}`.")
    st.stop()
st.caption(f"Signed in as **{who.name}** · requests go to {submitter.where}")
log_to_stderr()
requester = auth.requester(who, config.access.groups_claim)
teams = config.access.teams_for(requester, templates)
if not config.access.enforced:
    st.warning("Any signed-in user may submit for any team: no group -> team mapping is configured (helm values "
               "`portal.groups`, see docs/portal.md).", icon=":material/group:")
else:
    shown = ", ".join(sorted(requester.groups)[:8]) + (" …" if len(requester.groups) > 8 else "")
    st.caption(f"Your groups: {shown or 'none'} · you may submit for: {', '.join(teams) or 'no team'}")

queue, queue_problem = None, None
try:
    queue = live_queue.live_queue()
    queue_problem = live_queue.unset_line() if queue is None else None
except live_queue.QueueUnavailable as error:
    queue_problem = live_queue.unavailable_line(error)


def request_form(team: str, sender: Submitter) -> None:
    """The team's template as a form; a submission goes through submit_as, which checks the team again."""
    template = templates[team]
    with st.form("request"):
        left, right = st.columns(2)
        name = left.text_input("Job name", value="my-job", help="Lower-case letters, digits and '-'; a suffix is added.")
        image = right.selectbox("Image", template.images)
        shape = left.selectbox("Shape", template.shapes, format_func=lambda s: s.label,
                               help="GPUs per pod; several pods start together or not at all (a gang).")
        classes = list(template.priority_classes)
        priority = right.selectbox("Priority class", classes, index=classes.index("normal") if "normal" in classes else 0)
        command = left.text_input("Command (optional)", help="Run instead of the image's entrypoint, e.g. `torchrun train.py`.")
        checkpointable = right.checkbox("Checkpointable (may be suspended and resumed instead of killed)")
        submitted = st.form_submit_button("Submit request", type="primary")
    if not submitted:
        return
    try:
        request = PortalRequest(team, name.strip(), image, shape, priority, checkpointable, tuple(shlex.split(command)))
        key, message = submit_as(sender, config, requester, request, queue.held_gpus(team) if queue else 0.0)
    except (PortalError, ValueError) as error:
        st.error(f"Not submitted: {str(error).splitlines()[0]}", icon=":material/error:")
    else:
        st.session_state[SUBMITTED_KEY] = [*st.session_state.get(SUBMITTED_KEY, []), key]
        st.success(message, icon=":material/check_circle:")


if teams:
    request_form(st.selectbox("Team", teams, help="The teams your groups map to (all, where no mapping is "
                              "configured); each offers its own images, shapes and priority classes."), submitter)
else:
    st.error(f"You may submit for no team: {requester.groups_problem or 'none of your groups maps to one'}. An admin "
             "maps an identity provider group to a team in the chart's `portal.groups` (docs/portal.md).",
             icon=":material/block:")

st.subheader("Your requests in the queue")
mine = st.session_state.get(SUBMITTED_KEY, [])
if queue is None:
    st.caption(f"Positions unknown: {queue_problem}")
else:  # what this session submitted, and whatever waits with this identity on it (gpuwarden.io/requested-by)
    rows = queue.workloads[queue.workloads["workload"].isin(mine)
                           | (queue.workloads["requested_by"].astype(str).str.lower() == who.name.lower())]
    if not mine and rows.empty:
        st.caption("Nothing of yours waits in the queue.")
    for key in [k for k in mine if k not in set(rows["workload"])]:
        st.caption(f"`{key}`: not waiting in the scheduler's round {queue.round} (admitted and running, finished, "
                   "or submitted after that round: reload in a moment).")
    if not rows.empty:
        st.dataframe(rows[["position", "workload", "priority_class", "gpus", "state", "reason", "estimated_start"]],
                     hide_index=True, width="stretch", column_config={
                         "reason": st.column_config.TextColumn("Why it waits", width="large")})
        st.caption(f"Of {len(queue.workloads)} workloads waiting in the whole queue.")

st.subheader("Team priorities (team leads)")
led = [t for t in templates.values() if t.is_lead(who.name)]
if not led:
    st.caption("Only a team's leads (its template's `leads`) raise or lower its jobs.")
elif not submitter.can_change_priority:
    st.caption(f"Priority changes are Job annotations made through the Kubernetes API; {submitter.where} takes none.")
elif queue is None:
    st.caption(f"Your teams' waiting jobs are unknown: {queue_problem}")
if submitter.can_change_priority and queue is not None:
    for lead_of in led:
        waiting = queue.workloads[queue.workloads["namespace"] == lead_of.namespace]
        st.markdown(f"**{lead_of.team}**: {len(waiting)} waiting")
        if waiting.empty:
            continue
        st.dataframe(waiting[["position", "workload", "priority_class", "gpus", "requested_by", "reason"]],
                     hide_index=True, width="stretch")
        with st.form(f"priority-{lead_of.team}"):
            left, right = st.columns(2)
            target = left.selectbox("Job", list(waiting["workload"]))
            moved_to = right.selectbox("New priority class", lead_of.priority_classes)
            if st.form_submit_button("Change priority"):
                try:
                    st.success(submitter.change_priority(lead_of, target, moved_to, who.name), icon=":material/check_circle:")
                except PortalError as error:
                    st.error(f"Not changed: {str(error).splitlines()[0]}", icon=":material/error:")
