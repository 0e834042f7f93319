"""``KubeCluster``: the ``Cluster`` protocol over the Kubernetes API (official client).

Actions and the requests they make:
- cordon / uncordon, taint / untaint: GET node, PATCH ``spec.unschedulable`` / ``spec.taints`` and
  the owner annotations with the read ``resourceVersion`` (a 409 means someone changed the node
  meanwhile: re-read and retry); only cordons and taints gpuwarden set are lifted (:mod:`.ownership`);
- drain: cordon, then per drain mode (:mod:`.drain`) suspend checkpointable Jobs, let pods finish,
  or use the Eviction API for each pod on the node (``spec.nodeName`` field selector, checked again
  on each pod), skipping DaemonSet and mirror pods; a PodDisruptionBudget's 429 is "blocked, retry later";
- bind (admit): per gated pod of the workload, one merge PATCH that removes gpuwarden's gate and
  narrows the pod to its planned node (:mod:`.admission`); every pod is checked present and gated
  before the first PATCH, and a failure midway names the pods already admitted;
- set-mig-config: a drained node's ``nvidia.com/mig.config`` label (:mod:`.mig_config`);
- suspend / resume: a Kueue Workload's ``spec.active`` where Kueue manages the job, else
  ``batch/v1`` Job (or JobSet) ``spec.suspend``; ``params['by']`` writes who suspended it
  (``gpuwarden.io/suspended-by``), which a resume clears. A Job in a queue namespace
  (``gpuwarden.io/queue``) resumes with ``spec.suspend: false`` only: its new pods come gated and
  are admitted in a later round. Elsewhere a Job resumed with the plan's placements is pinned
  to their nodes in the same PATCH (:mod:`.pinning`; a Job that ran first has its
  ``status.startTime`` cleared once its pods are gone; Kueue and JobSets place their own pods);
- preempt: suspend where the controller can (undo: resume), else evict each pod with the grace
  period (``params['grace_seconds']``);
- evict: the Eviction API for each pod of the workload;
- set-priority: a Kueue Workload's ``spec.priorityClassName`` and ``spec.priority``; anything else
  is refused with the reason (a pod's priority is fixed at creation);
- notify: an Event on the pod and the ``gpuwarden.io/idle-notified-at`` annotation.
Every result is an ``ActionResult``: ok, or a permanent or temporary failure with one line why.
``HANDLERS`` maps each ``ActionKind`` to its handler (checked complete at import). It also offers
fleet's capabilities: Events, node conditions, workload and team notices (:mod:`.queue_notes`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuwarden.fleet import Action, ActionKind, ActionResult, ClusterSnapshot, Finding
from gpuwarden.fleet.capabilities import handler_table
from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock
from gpuwarden.fleet.taints import taint_object

from .api import MERGE_PATCH, Json, KubeApi, KubeFailure
from . import conditions, drain
from .admission import admit_pods, pod_nodes
from .drain import drain_labels
from .gates import CHECKPOINT_ANNOTATION, RESERVED_AT_ANNOTATION, RESERVED_NODES_ANNOTATION, SUSPENDED_BY_ANNOTATION
from .inventory import ADMISSION_TIMEOUT_SECONDS, KUEUE, Inventory, read_snapshot
from .inventory_nodes import DEFAULT_LABELS, NodeLabels
from .kueue_priority import set_kueue_priority
from .mig_config import set_mig_config
from .ownership import DRAINING_ANNOTATION, cordon_patch, parse_since, taint_patch, uncordon_patch, untaint_patch
from .pinning import pinned_nodes, resume_pinned_patch
from .queue_notes import JOBSET, WorkloadNotes, annotate_objects

log = logging.getLogger("gpuwarden.kube")

CONFLICT_RETRIES = 3

Done = tuple[str, Action | None]  # what an action handler did, and the action that takes it back


class KubeCluster(WorkloadNotes):
    def __init__(self, api: KubeApi, namespace: str = "gpuwarden", page_size: int = 500,
                 clock: Clock = SYSTEM_CLOCK, event_source: str = "gpuwarden-actuator",
                 labels: NodeLabels = DEFAULT_LABELS,
                 admission_timeout_seconds: float = ADMISSION_TIMEOUT_SECONDS) -> None:
        self.api = api
        self.namespace = namespace  # where the actuator's own Events go
        self.page_size = page_size
        self.clock = clock
        self.event_source = event_source
        self.labels = labels  # node labels that give topology and pools
        self.admission_timeout_seconds = admission_timeout_seconds
        self.inventory = Inventory()
        self._last: ClusterSnapshot | None = None  # lends unchanged Workload objects to the next snapshot

    # -- reading -------------------------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        snapshot, self.inventory = read_snapshot(self.api, self.page_size, self.clock, self.labels,
                                                 self.admission_timeout_seconds, self._last)
        self._last = snapshot
        return snapshot

    # -- acting --------------------------------------------------------------------------------
    def apply(self, action: Action) -> ActionResult:
        handler = HANDLERS[action.kind]
        if isinstance(handler, str):
            return ActionResult(action, False, f"{action.kind.value}: {handler}")
        try:
            message, undo = self._with_conflict_retries(lambda a: handler(self, a), action)
        except KubeFailure as failure:
            if failure.gone and action.kind in (ActionKind.EVICT, ActionKind.PREEMPT):
                return ActionResult(action, True, f"{action.target} already gone: {failure.message}")
            return ActionResult(action, False, f"{action.kind.value} {action.target}: {failure.message}",
                                temporary=failure.temporary)
        except (ValueError, LookupError) as error:
            return ActionResult(action, False, f"{action.kind.value} {action.target}: {error}")
        return ActionResult(action, True, message, undo=undo)

    @staticmethod
    def _with_conflict_retries(handler: Callable[[Action], Done], action: Action) -> Done:
        """A 409 means the object changed under us: each handler re-reads what it needs, so run it again."""
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                return handler(action)
            except KubeFailure as failure:
                if not failure.conflict or attempt == CONFLICT_RETRIES:
                    raise
                log.info("%s %s: %s; re-reading and retrying", action.kind.value, action.target, failure.message)
        raise AssertionError("unreachable")

    def record_event(self, reason: str, message: str) -> None:
        self._event(self.namespace, {"kind": "Namespace", "name": self.namespace, "apiVersion": "v1"}, reason, message,
                    "Warning")

    def _event(self, namespace: str, involved: Json, reason: str, message: str, kind: str = "Normal") -> None:
        now = self.clock.now().isoformat().replace("+00:00", "Z")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{involved['name']}.gpuwarden.", "namespace": namespace},
                "involvedObject": {**involved, "namespace": namespace if involved["kind"] != "Namespace" else None},
                "reason": reason, "message": message[:1024], "type": kind, "source": {"component": self.event_source},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        self.api.call(self.api.core.create_namespaced_event, namespace, body, verb="create", resource="events")

    # nodes
    def _patch_node(self, name: str, body: Json) -> Json:
        return self.api.call(self.api.core.patch_node, name, body, verb="patch", resource="nodes",
                             _content_type=MERGE_PATCH)

    def _do_cordon(self, action: Action) -> Done:
        node = self._read_node(action.target)
        patch, owned = cordon_patch(node, action.reason, self.clock.now())
        if not owned:
            return f"{action.target} was already cordoned by someone else; left as theirs", None
        self._patch_node(action.target, patch)
        return f"cordoned {action.target}", Action(ActionKind.UNCORDON, action.target, "undo cordon")

    def _do_uncordon(self, action: Action) -> Done:
        self._patch_node(action.target, uncordon_patch(self._read_node(action.target)))
        return f"uncordoned {action.target}", None

    def publish_conditions(self, health: Mapping[str, Sequence[Finding]]) -> int:
        """The ``GPUHealthy`` NodeCondition on each GPU node (:mod:`.conditions`)."""
        return conditions.publish(self.api, health, self.clock, self.page_size)

    def _read_node(self, name: str) -> Json:
        return self.api.call(self.api.core.read_node, name, verb="get", resource="nodes")

    def _do_taint(self, action: Action) -> Done:
        wanted = str(action.params.get("taint", "gpuwarden.io/unhealthy=true:NoSchedule"))
        taint = taint_object(wanted)
        patch = taint_patch(self._read_node(action.target), taint, action.reason, self.clock.now())
        self._patch_node(action.target, patch)
        if "spec" not in patch:
            return f"{action.target} already carries {wanted}, set by someone else; left as theirs", None
        return (f"tainted {action.target} with {wanted}",
                Action(ActionKind.UNTAINT, action.target, "undo taint", {"taint": wanted}))

    def _do_untaint(self, action: Action) -> Done:
        wanted = action.params.get("taint")
        patch, kept = untaint_patch(self._read_node(action.target), taint_object(str(wanted)) if wanted else None)
        self._patch_node(action.target, patch)
        theirs = f"; left {', '.join(kept)} (set by someone else)" if kept else ""
        return f"removed taint {wanted or '(all of gpuwarden)'} from {action.target}{theirs}", None

    def _do_drain(self, action: Action) -> Done:
        name, now = action.target, self.clock.now()
        node = self._read_node(name)
        fallback = drain.Setting(drain.parse_mode(action.params.get("mode", "immediate"), "the plan"),
                                 float(action.params.get("timeout_seconds", drain.DEFAULT_COMPLETION_SECONDS)))
        node_setting = drain.setting(node["metadata"].get("labels") or {}, fallback, f"node {name}")
        pods = self.api.list_all(self.api.core.list_pod_for_all_namespaces, resource="pods", page_size=self.page_size,
                                 field_selector=f"spec.nodeName={name},status.phase!=Succeeded,status.phase!=Failed")
        labels = {ns: drain_labels(self.api, ns) for ns in sorted({p["metadata"].get("namespace", "") for p in pods
                                                                  if (p.get("spec") or {}).get("nodeName") == name})}
        checkpointable = {}
        for namespace, job_name in sorted(drain.jobs_to_read(name, pods, node_setting, labels)):
            job = self.api.call(self.api.batch.read_namespaced_job, job_name, namespace, verb="get", resource="jobs")
            notes = job["metadata"].get("annotations") or {}
            checkpointable[(namespace, job_name)] = (str(notes.get(CHECKPOINT_ANNOTATION, "")).lower() == "true",
                                                     bool((job.get("spec") or {}).get("suspend")))
        patch, owned = cordon_patch(node, action.reason, now)
        since = parse_since((node["metadata"].get("annotations") or {}).get(DRAINING_ANNOTATION)) or now
        if DRAINING_ANNOTATION not in (node["metadata"].get("annotations") or {}):
            patch.setdefault("metadata", {}).setdefault("annotations", {})[DRAINING_ANNOTATION] = now.isoformat()
        self._patch_node(name, patch)
        todo = drain.plan_drain(name, pods, node_setting, labels, checkpointable, (now - since).total_seconds(),
                                float(action.params.get("grace_seconds") or drain.DEFAULT_SUSPEND_GRACE_SECONDS))
        if todo.foreign:
            log.warning("drain %s: the pod list named %d pod(s) on other nodes (%s); not touched", name,
                        len(todo.foreign), ", ".join(todo.foreign[:5]))
        for namespace, job_name in todo.suspend_jobs:
            self.api.call(self.api.batch.patch_namespaced_job, job_name, namespace, {"spec": {"suspend": True}},
                          verb="patch", resource="jobs", _content_type=MERGE_PATCH)
        evicted, blocked = 0, []
        for pod in todo.evict:
            meta = pod["metadata"]
            done = self._evict(meta.get("namespace", ""), meta["name"], action.params.get("grace_seconds"))
            if done is not False:
                evicted += 1
            else:
                blocked.append(f"{meta.get('namespace')}/{meta['name']}")
        message = (f"drained {name} ({node_setting.mode.value}): {evicted} pod(s) evicted, "
                   f"{len(todo.suspend_jobs)} checkpointable Job(s) suspended, {todo.left} DaemonSet/mirror pod(s) left"
                   + (f", {len(todo.foreign)} pod(s) listed on other nodes not touched" if todo.foreign else ""))
        if blocked:
            raise KubeFailure(429, f"{message}; {len(blocked)} blocked by a PodDisruptionBudget ({', '.join(blocked[:5])}): "
                                   "retry later (the node stays cordoned)", True)
        if todo.waiting:
            raise KubeFailure(None, f"{message}; {len(todo.waiting)} pod(s) allowed to finish or save first "
                                    f"({', '.join(todo.waiting[:5])}): retry later (the node stays cordoned)", True)
        undo = Action(ActionKind.UNCORDON, name, "undo drain (evicted pods are recreated elsewhere)") if owned else None
        return message, undo

    def _evict(self, namespace: str, pod: str, grace_seconds: Any = None) -> bool | None:
        """True once evicted, None if already gone, False if a PodDisruptionBudget said not now.
        The caller checked the pod's ``spec.nodeName`` (drain) or took it from the snapshot."""
        body: Json = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": int(grace_seconds)}
        try:
            self.api.call(self.api.core.create_namespaced_pod_eviction, pod, namespace, body, verb="create",
                          resource="pods/eviction", retry_429=False)
        except KubeFailure as failure:
            if failure.gone:
                return None
            if failure.status == 429:
                return False
            raise
        return True

    # workloads
    def _workload(self, target: str) -> tuple[str, str, str]:
        """(namespace, owner name, controller) of a workload of the last snapshot."""
        namespace, _, name = target.partition("/")
        controller = self.inventory.controller.get(target)
        if controller is None:
            raise LookupError("not found in the last snapshot (already gone?)")
        return namespace, self.inventory.names.get(target, name), controller

    def _set_suspended(self, target: str, suspended: bool, by: str | None = None,
                       notes: Mapping[str, str | None] | None = None) -> str:
        """Suspend or resume; ``by`` (suspending) is written as who suspended it, which resuming
        clears; ``notes``: more annotations in the same PATCH. A suspend drops a resume's reservation."""
        namespace, name, controller = self._workload(target)
        kueue = self.inventory.kueue_workload.get(target)
        who: dict[str, str | None] = {SUSPENDED_BY_ANNOTATION: by} if suspended and by else \
            {SUSPENDED_BY_ANNOTATION: None} if not suspended and target in self.inventory.suspended_by else {}
        if suspended and target in self.inventory.reserved:
            who.update({RESERVED_NODES_ANNOTATION: None, RESERVED_AT_ANNOTATION: None})
        who.update(notes or {})
        meta = {"metadata": {"annotations": who}} if who else {}
        if kueue:
            self.api.call(self.api.custom.patch_namespaced_custom_object, *KUEUE, namespace, "workloads", kueue,
                          {**meta, "spec": {"active": not suspended}}, verb="patch",
                          resource="workloads.kueue.x-k8s.io", _content_type=MERGE_PATCH)
            return f"Kueue Workload {namespace}/{kueue} spec.active={not suspended}"
        if controller == "Job":
            self.api.call(self.api.batch.patch_namespaced_job, name, namespace, {**meta, "spec": {"suspend": suspended}},
                          verb="patch", resource="jobs", _content_type=MERGE_PATCH)
            return f"Job {namespace}/{name} spec.suspend={suspended}"
        if controller == "JobSet":
            self.api.call(self.api.custom.patch_namespaced_custom_object, *JOBSET, namespace, "jobsets", name,
                          {**meta, "spec": {"suspend": suspended}}, verb="patch", resource="jobsets.jobset.x-k8s.io",
                          _content_type=MERGE_PATCH)
            return f"JobSet {namespace}/{name} spec.suspend={suspended}"
        raise ValueError(f"a {controller} cannot be suspended (only Jobs, JobSets and Kueue Workloads can); "
                         "evict it or scale its controller down")

    def _do_set_mig_config(self, action: Action) -> Done:
        return set_mig_config(self.api, action, self.page_size)

    def _do_suspend(self, action: Action) -> Done:
        how = self._set_suspended(action.target, True, action.params.get("by"))
        return f"suspended {action.target} ({how})", Action(ActionKind.RESUME, action.target, "undo suspend")

    def _do_bind(self, action: Action) -> Done:
        namespace, _, _ = self._workload(action.target)
        if action.target not in self.inventory.gated:
            raise LookupError("no pod of it waits behind gpuwarden's gate in the last snapshot (nothing to admit)")
        pods = self.inventory.gated[action.target]
        need = self.inventory.gang_size.get(action.target, len(pods))
        nodes = pod_nodes(action.params.get("placements", ()), need)
        if len(pods) < need:
            raise KubeFailure(None, f"{len(pods)} of its {need} pod(s) are present and gated: none admitted (a gang "
                                    "is admitted whole; it waits for the rest)", True)
        where = ", ".join(sorted(set(nodes)))
        if action.params.get("after_stops") and any(self.inventory.stop_seconds.get(n, 0.0) > 0 for n in nodes):
            # its GPUs are held by pods it preempted, which take their grace period: admit once they stopped
            notes = {RESERVED_NODES_ANNOTATION: ",".join(nodes), RESERVED_AT_ANNOTATION: self._now_iso()}
            annotate_objects(self.api, namespace, {("Pod", p.name): p.annotations for p in pods[:need]}, notes)
            return f"{action.target}: {need} pod(s) held for {where}; admitted once the pods it preempted stop", None
        admitted = admit_pods(self.api, namespace, pods[:need], nodes, self._now_iso())
        self.inventory.gated[action.target] = pods[need:]
        return f"admitted {action.target}: {len(admitted)} pod(s) to {where}", None

    def _now_iso(self) -> str:
        return self.clock.now().isoformat().replace("+00:00", "Z")

    def _do_resume(self, action: Action) -> Done:
        nodes = sorted({p["node"] for p in action.params.get("placements", ())})
        namespace, name, controller = self._workload(action.target)
        if (not nodes or controller != "Job" or action.target in self.inventory.kueue_workload
                or namespace in self.inventory.queue_namespaces):
            # Kueue and the JobSet controller place their own pods; a queue namespace's new pods come
            # gated, and the nodes the plan chose are held for them until they are admitted there.
            reserve = self._reservation_notes(action) if namespace in self.inventory.queue_namespaces else None
            return f"resumed {action.target} ({self._set_suspended(action.target, False, notes=reserve)})", None
        return self._resume_pinned(action.target, namespace, name, nodes), None

    def _reservation_notes(self, action: Action) -> dict[str, str | None] | None:
        placements = action.params.get("placements", ())
        if not placements:
            return None
        nodes = pod_nodes(placements, self.inventory.gang_size.get(action.target, len(placements)))
        return {RESERVED_NODES_ANNOTATION: ",".join(nodes), RESERVED_AT_ANNOTATION: self._now_iso()}

    def _resume_pinned(self, target: str, namespace: str, name: str, nodes: list[str]) -> str:
        job = self.api.call(self.api.batch.read_namespaced_job, name, namespace, verb="get", resource="jobs")
        status = job.get("status") or {}
        if status.get("startTime"):
            # It ran, and Kubernetes takes a new pin only without a startTime: clear it once the Job's
            # pods are gone, as Kueue does (from 1.36 the Job controller clears it itself).
            if (status.get("active") or 0) + (status.get("terminating") or 0):
                raise KubeFailure(None, "its pods are still stopping; it is resumed, pinned, once they are gone", True)
            try:
                job = self.api.call(self.api.batch.patch_namespaced_job_status, name, namespace,
                                    {"metadata": {"resourceVersion": job["metadata"]["resourceVersion"]},
                                     "status": {"startTime": None}},
                                    verb="patch", resource="jobs/status", _content_type=MERGE_PATCH)
            except KubeFailure as failure:
                if failure.status != 403:
                    raise
                log.warning("%s: %s; pinning without it", target, failure.message)  # an older chart's RBAC
        try:
            patch = resume_pinned_patch(job, nodes)
            if target in self.inventory.suspended_by:
                patch["metadata"]["annotations"][SUSPENDED_BY_ANNOTATION] = None
            self.api.call(self.api.batch.patch_namespaced_job, name, namespace, patch,
                          verb="patch", resource="jobs", _content_type=MERGE_PATCH)
        except KubeFailure as failure:
            if failure.status != 422 or pinned_nodes(job):
                raise  # resuming onto an earlier pin would bind it to nodes the plan has given away
            # Refused (an admission policy, a fixed template): nothing of ours is in the template, so
            # resume it unpinned and let kube-scheduler place it.
            how = self._set_suspended(target, False)
            return f"resumed {target} ({how}); not pinned to {', '.join(nodes)}: {failure.message}"
        return f"resumed {target} (Job spec.suspend=False, pinned to {', '.join(nodes)})"

    def _evict_workload(self, action: Action) -> str:
        namespace, _, _ = self._workload(action.target)
        pods = self.inventory.pods.get(action.target, [])
        done = [self._evict(namespace, p, action.params.get("grace_seconds")) for p in pods]
        if False in done:
            raise KubeFailure(429, f"{done.count(False)} of {len(pods)} pod(s) blocked by a PodDisruptionBudget: "
                                   "retry later", True)
        gone = done.count(None)
        return f"evicted {len(pods) - gone} pod(s) of {action.target}" + (f", {gone} already gone" if gone else "")

    def _do_evict(self, action: Action) -> Done:
        return self._evict_workload(action), None

    def _do_preempt(self, action: Action) -> Done:
        _, _, controller = self._workload(action.target)
        if controller in ("Job", "JobSet") or action.target in self.inventory.kueue_workload:
            how = self._set_suspended(action.target, True, action.params.get("by"))
            return (f"preempted {action.target} by suspending it ({how}); its pods get their grace period",
                    Action(ActionKind.RESUME, action.target, "undo preempt"))
        return self._evict_workload(action) + " (preempted; its controller or owner recreates it)", None

    def _do_set_priority(self, action: Action) -> Done:
        namespace, _, controller = self._workload(action.target)
        return set_kueue_priority(self.api, self.inventory, action, namespace, controller)

    def _do_notify(self, action: Action) -> Done:
        namespace, _, _ = self._workload(action.target)
        pods = self.inventory.pods.get(action.target, [])
        at = str(action.params.get("at") or self.clock.now().isoformat())
        annotation = str(action.params.get("annotation", "gpuwarden.io/idle-notified-at"))
        message = str(action.params.get("message") or action.reason)
        for pod in pods:
            self._event(namespace, {"kind": "Pod", "name": pod, "apiVersion": "v1"}, "GpuIdle", message, "Warning")
            self.api.call(self.api.core.patch_namespaced_pod, pod, namespace,
                          {"metadata": {"annotations": {annotation: at}}}, verb="patch", resource="pods",
                          _content_type=MERGE_PATCH)
        return f"notified {action.target}: an Event and {annotation}={at} on {len(pods)} pod(s)", None


HANDLERS = handler_table("KubeCluster", {
    ActionKind.CORDON: KubeCluster._do_cordon, ActionKind.UNCORDON: KubeCluster._do_uncordon,
    ActionKind.TAINT: KubeCluster._do_taint, ActionKind.UNTAINT: KubeCluster._do_untaint,
    ActionKind.DRAIN: KubeCluster._do_drain, ActionKind.EVICT: KubeCluster._do_evict,
    ActionKind.SUSPEND: KubeCluster._do_suspend, ActionKind.RESUME: KubeCluster._do_resume,
    ActionKind.PREEMPT: KubeCluster._do_preempt, ActionKind.SET_PRIORITY: KubeCluster._do_set_priority,
    ActionKind.BIND: KubeCluster._do_bind, ActionKind.NOTIFY: KubeCluster._do_notify,
    ActionKind.SET_MIG_CONFIG: KubeCluster._do_set_mig_config,
})
