"""A stand-in for the Job controller (and the kubelet's "pod finished") over ``tests/fake_kube_api.py``.

No kube-controller-manager can run here; this one does what the Job controller does for the Jobs
gpuwarden's tests make, through the fake API server's ``handle`` (so pod creation runs the
mutating webhooks and every API rule), with ``user`` the Job controller's service account.
``step(now)`` on a virtual clock (seconds since the epoch), for each Job in (namespace, name) order:
- a running pod completes (phase Succeeded) once it has run ``fake.gpuwarden.io/run-seconds``
  (a pod-template annotation; without it a pod runs until deleted) since its ``status.startTime``;
- a suspended Job's active pods are deleted (a checkpointable Job's run so far is kept: its next
  pods run only the rest of ``run-seconds``); once none is left (terminating ones count until the
  kubelet stand-in removes them), ``status.startTime`` is cleared
  (what lets gpuwarden change a suspended Job's template, KEP-2926) and ``Suspended=True``;
- an unsuspended, incomplete Job gets pods up to ``parallelism`` (never more than the completions
  left; ``completions`` defaults to ``parallelism`` here), POSTed from its template with
  ``generateName: JOB-`` (``JOB-INDEX-`` and the completion-index label for ``completionMode:
  Indexed``), the ``batch.kubernetes.io/job-name`` / ``controller-uid`` labels and a controller
  ownerReference; ``status.startTime`` is set on the first sync and kept, ``status.active``;
- a Job with ``completions`` succeeded pods gets ``Complete=True`` and ``completionTime``.
Pods that were evicted or deleted are replaced at once (the default ``podReplacementPolicy``,
TerminatingOrFailed), as the real controller does. JobSets: see
``FakeJobSetController`` below (child Jobs per replicated job; suspend propagated).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from fake_kube_api import BATCH, CORE, JOBSET, FakeKubeAPI, epoch_seconds, iso

JOB_CONTROLLER_USER = "system:serviceaccount:kube-system:job-controller"
JOBSET_CONTROLLER_USER = "system:serviceaccount:jobset-system:jobset-controller-manager"
RUN_SECONDS_ANNOTATION = "fake.gpuwarden.io/run-seconds"
CHECKPOINT_ANNOTATION = "gpuwarden.io/checkpointable"  # a user's word that the workload checkpoints
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
TERMINATED = ("Succeeded", "Failed")


def owned_by(obj: dict, owner: dict) -> bool:
    uid = owner["metadata"].get("uid")
    if obj["metadata"].get("namespace") != owner["metadata"].get("namespace"):
        return False  # owners are in the same namespace (the fake's uids are per name only)
    return any(r.get("controller") and r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or ())


def _condition(conditions: list[dict], kind: str, status: str, reason: str, now: str) -> list[dict]:
    """``conditions`` with ``kind`` set to ``status`` (its transition time kept when unchanged)."""
    old = next((c for c in conditions if c.get("type") == kind), None)
    if old and old.get("status") == status:
        return conditions
    return [*(c for c in conditions if c.get("type") != kind),
            {"type": kind, "status": status, "reason": reason, "lastTransitionTime": now}]


@dataclass
class _Client:
    api: FakeKubeAPI
    user: str

    def call(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> dict:
        return self.api.act(self.user, method, path, body, content_type)

    def patch_status(self, path: str, obj: dict, status: dict) -> None:
        """Write ``status`` fields only when one changed (the real controllers skip no-op updates too)."""
        if any((obj.get("status") or {}).get(k) != v for k, v in status.items()):
            self.call("PATCH", f"{path}/status", {"status": status}, "application/merge-patch+json")


@dataclass
class FakeJobController:
    api: FakeKubeAPI
    user: str = JOB_CONTROLLER_USER
    # the workload inside a checkpointable Job (``gpuwarden.io/checkpointable: "true"``): the run time
    # it has checkpointed by each suspend, which its next pods need not run again
    checkpointed_seconds: dict[tuple[str, str], float] = field(default_factory=dict)

    def step(self, now: float) -> None:
        client = _Client(self.api, self.user)
        by_owner: dict[tuple[str, str], list[dict]] = {}
        for pod in self.api.objects(CORE, "pods", copy=False):  # read only, as every object below
            for ref in pod["metadata"].get("ownerReferences") or ():
                if ref.get("controller"):
                    by_owner.setdefault((pod["metadata"].get("namespace", ""), ref.get("uid")), []).append(pod)
        for job in self.api.objects(BATCH, "jobs", copy=False):
            self._sync(client, job, by_owner.get((job["metadata"].get("namespace", ""), job["metadata"].get("uid")), []), now)

    def _finish_pods(self, client: _Client, pods: list[dict], now: float) -> list[dict]:
        """The kubelet's part: pods that ran their time succeed; the pods as the server now has them."""
        out = []
        for pod in pods:
            status, meta = pod.get("status") or {}, pod["metadata"]
            run = (meta.get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
            if status.get("phase") == "Running" and status.get("startTime") and run is not None \
                    and now - epoch_seconds(status["startTime"]) >= float(run):
                pod = client.call("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                                  {"status": {"phase": "Succeeded"}}, "application/merge-patch+json")
            out.append(pod)
        return out

    def _sync(self, client: _Client, job: dict, pods: list[dict], now: float) -> None:
        meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
        path = f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{meta['name']}"
        conditions = list(status.get("conditions") or ())
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions):
            return
        pods = self._finish_pods(client, pods, now)
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINATED]
        active = [p for p in live if not p["metadata"].get("deletionTimestamp")]
        terminating = len(live) - len(active)
        succeeded = sum((p.get("status") or {}).get("phase") == "Succeeded" for p in pods)
        parallelism = int(spec.get("parallelism", 1))
        completions = int(spec.get("completions") or parallelism)
        stamp = iso(now)
        if spec.get("suspend"):
            started = [epoch_seconds(p["status"]["startTime"]) for p in active
                       if (p.get("status") or {}).get("phase") == "Running" and p["status"].get("startTime")]
            if started and (meta.get("annotations") or {}).get(CHECKPOINT_ANNOTATION) == "true":
                key = (meta["namespace"], meta["name"])  # it saves in its grace period: all its run is kept
                self.checkpointed_seconds[key] = self.checkpointed_seconds.get(key, 0.0) + now - max(started)
            for pod in active:
                client.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{pod['metadata']['name']}")
            left = [p for p in live if self.api.get(CORE, "pods", p["metadata"]["name"], meta["namespace"])]
            ended = {"startTime": None} if not left else {}
            client.patch_status(path, job, {"active": 0, "terminating": len(left), "succeeded": succeeded, **ended,
                                            "conditions": _condition(conditions, "Suspended", "True", "JobSuspended", stamp)})
            return
        if succeeded >= completions:
            done = _condition(conditions, "Complete", "True", "CompletionsReached", stamp)
            client.patch_status(path, job, {"active": 0, "succeeded": succeeded, "completionTime": stamp, "conditions": done})
            return
        used = {int(p["metadata"].get("labels", {}).get(INDEX_LABEL, -1)) for p in pods
                if (p.get("status") or {}).get("phase") != "Failed"}
        for _ in range(max(0, min(parallelism, completions - succeeded) - len(active))):
            index = next(i for i in range(completions + len(used) + 1) if i not in used)
            used.add(index)
            created = client.call("POST", f"/api/v1/namespaces/{meta['namespace']}/pods", self._pod(job, index))
            active.append(created)
        if any(c.get("type") == "Suspended" for c in conditions):
            conditions = _condition(conditions, "Suspended", "False", "JobResumed", stamp)
        client.patch_status(path, job, {"active": len(active), "terminating": terminating, "succeeded": succeeded,
                                        "startTime": status.get("startTime") or stamp, "conditions": conditions})

    def _pod(self, job: dict, index: int) -> dict:
        meta, template = job["metadata"], (job.get("spec") or {}).get("template") or {}
        indexed = (job.get("spec") or {}).get("completionMode") == "Indexed"
        uid, name = meta.get("uid", ""), meta["name"]
        labels = {**((template.get("metadata") or {}).get("labels") or {}), JOB_NAME_LABEL: name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": uid, "controller-uid": uid}
        annotations = dict((template.get("metadata") or {}).get("annotations") or {})
        kept = self.checkpointed_seconds.get((meta["namespace"], name), 0.0)
        if kept and RUN_SECONDS_ANNOTATION in annotations:  # resumed from its checkpoint: the rest of its run
            annotations[RUN_SECONDS_ANNOTATION] = str(max(0, int(float(annotations[RUN_SECONDS_ANNOTATION]) - kept)))
        if indexed:
            labels[INDEX_LABEL] = str(index)
            annotations[INDEX_LABEL] = str(index)
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": f"{name}-{index}-" if indexed else f"{name}-", "namespace": meta["namespace"],
                             "labels": labels, "annotations": annotations,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": copy.deepcopy(template.get("spec") or {}), "status": {"phase": "Pending"}}


@dataclass
class FakeJobSetController:
    """JobSet's controller, the part gpuwarden meets: one child Job per replica of each replicated job
    (``JOBSET-RJOB-I``, its labels and a controller ownerReference), ``spec.suspend`` copied onto
    the children, ``Completed=True`` once every child completed. Run it before the Job controller."""

    api: FakeKubeAPI
    user: str = JOBSET_CONTROLLER_USER

    def step(self, now: float) -> None:
        client = _Client(self.api, self.user)
        jobs = self.api.objects(BATCH, "jobs", copy=False)  # read only
        for jobset in self.api.objects(JOBSET, "jobsets", copy=False):
            meta, spec = jobset["metadata"], jobset.get("spec") or {}
            children = {j["metadata"]["name"]: j for j in jobs if owned_by(j, jobset)}
            suspend = bool(spec.get("suspend"))
            for replicated in spec.get("replicatedJobs") or ():
                for i in range(int(replicated.get("replicas", 1))):
                    name = f"{meta['name']}-{replicated['name']}-{i}"
                    child = children.get(name)
                    if child is None:
                        client.call("POST", f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs",
                                    self._job(jobset, replicated, name, suspend))
                    elif bool((child.get("spec") or {}).get("suspend")) != suspend:
                        client.call("PATCH", f"/apis/batch/v1/namespaces/{meta['namespace']}/jobs/{name}",
                                    {"spec": {"suspend": suspend}}, "application/merge-patch+json")
            complete = children and all(any(c.get("type") == "Complete" and c.get("status") == "True"
                                            for c in (j.get("status") or {}).get("conditions") or ())
                                        for j in children.values())
            if complete:
                conditions = _condition(list((jobset.get("status") or {}).get("conditions") or ()),
                                        "Completed", "True", "AllJobsCompleted", iso(now))
                client.patch_status(f"/apis/{JOBSET.split('/', 1)[1]}/namespaces/{meta['namespace']}/jobsets/{meta['name']}",
                                    jobset, {"conditions": conditions})

    @staticmethod
    def _job(jobset: dict, replicated: dict, name: str, suspend: bool) -> dict:
        meta = jobset["metadata"]
        template = copy.deepcopy(replicated.get("template") or {})
        labels = {**((template.get("metadata") or {}).get("labels") or {}), JOBSET_NAME_LABEL: meta["name"],
                  REPLICATED_JOB_LABEL: replicated["name"]}
        spec = template.get("spec") or {}
        spec["suspend"] = suspend
        pod_meta = spec.setdefault("template", {}).setdefault("metadata", {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), JOBSET_NAME_LABEL: meta["name"],
                              REPLICATED_JOB_LABEL: replicated["name"]}
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels,
                             "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                             "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                                  "name": meta["name"], "uid": meta.get("uid", ""), "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": spec}
