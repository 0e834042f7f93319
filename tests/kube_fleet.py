"""Small builders for Kubernetes objects on the fake API server (``tests/fake_kube_api.py``), shared by
the kube tests and ``bench/bench_actuator.py``. Scenario data, not logic."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

from fake_kube_api import ADMISSION, BATCH, CORE, KUEUE, POLICY, SCHEDULING, FakeKubeAPI

from gpuwarden.fleet.clock import FakeClock
from gpuwarden.fleet.object_names import ADMISSION_GATE
from gpuwarden.kube import KubeApi, KubeCluster, load_client


def node(api: FakeKubeAPI, name: str, gpus: int = 8, labels: dict | None = None, unschedulable: bool = False,
         taints: list | None = None) -> None:
    spec = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    api.add(CORE, "nodes", {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", **(labels or {})}},
        "spec": spec,
        "status": {"capacity": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1Ti"},
                   "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "95", "memory": "1000Gi"}},
    })


def namespace(api: FakeKubeAPI, name: str, labels: dict | None = None, annotations: dict | None = None) -> None:
    api.add(CORE, "namespaces", {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}})


def pod(api: FakeKubeAPI, ns: str, name: str, node_name: str | None, gpus: int = 1, owner: tuple | None = None,
        phase: str = "Running", labels: dict | None = None, annotations: dict | None = None,
        priority_class: str | None = None, gated: bool = False) -> None:
    """A pod; ``gated``: created with gpuwarden's scheduling gate (it waits for gpuwarden's admission)."""
    meta = {"name": name, "namespace": ns, "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1" if owner[0] == "Job" else "apps/v1", "kind": owner[0],
                                    "name": owner[1], "uid": f"uid-{owner[1]}", "controller": True}]
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec = {"containers": [{"name": "main", "image": "trainer", "resources": resources}]}
    if node_name:
        spec["nodeName"] = node_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    if gated:
        spec["schedulingGates"] = [{"name": "gpuwarden.io/admission"}]
    api.add(CORE, "pods", {"metadata": meta, "spec": spec,
                           "status": {"phase": phase, "startTime": "2026-11-23T00:00:00Z" if phase == "Running" else None}})


def job(api: FakeKubeAPI, ns: str, name: str, gpus: int = 1, suspend: bool = False, parallelism: int = 1,
        annotations: dict | None = None, affinity: dict | None = None, start_time: str | None = None) -> None:
    """A Job; ``start_time`` is ``status.startTime``: the Job ran (set by its controller)."""
    template_spec: dict = {
        "containers": [{"name": "main", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if affinity:
        template_spec["affinity"] = affinity
    api.add(BATCH, "jobs", {
        "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
        "spec": {"suspend": suspend, "parallelism": parallelism, "template": {"spec": template_spec}},
        "status": {"startTime": start_time} if start_time else {},
    })


def job_with_pods(api: FakeKubeAPI, ns: str, name: str, nodes: list[str | None], gpus: int = 1, phase: str = "Running",
                  annotations: dict | None = None, pod_annotations: dict | None = None, gated: bool = False) -> None:
    job(api, ns, name, gpus, parallelism=len(nodes), annotations=annotations)
    for i, node_name in enumerate(nodes):
        pod(api, ns, f"{name}-{i}", node_name, gpus, owner=("Job", name), phase=phase, annotations=pod_annotations,
            labels={"batch.kubernetes.io/job-name": name}, gated=gated)


def pdb(api: FakeKubeAPI, ns: str, name: str, match: dict, allowed: int) -> None:
    api.add(POLICY, "poddisruptionbudgets", {"metadata": {"name": name, "namespace": ns},
                                             "spec": {"selector": {"matchLabels": match}},
                                             "status": {"disruptionsAllowed": allowed}})


def kueue_workload(api: FakeKubeAPI, ns: str, name: str, job_name: str, priority_class: str, active: bool = True) -> None:
    api.add(KUEUE, "workloads", {
        "metadata": {"name": name, "namespace": ns,
                     "ownerReferences": [{"kind": "Job", "name": job_name, "uid": f"uid-{job_name}", "controller": True,
                                          "apiVersion": "batch/v1"}]},
        "spec": {"active": active, "priorityClassName": priority_class, "priority": 100, "queueName": "default"},
    })


def fleet(api: FakeKubeAPI, nodes: int, gpus_per_node: int = 8, pods_per_node: int = 0, namespaces: int = 10) -> None:
    """A uniform fleet for the bench: ``nodes`` GPU nodes, single-GPU Job pods spread over namespaces."""
    for n in range(namespaces):
        namespace(api, f"team-{n}", {"gpuwarden.io/team": f"team-{n}"}, {"gpuwarden.io/guaranteed-gpus": "8"})
    for i in range(nodes):
        name = f"gpu-node-{i:04d}"
        node(api, name, gpus_per_node)
        for p in range(pods_per_node):
            ns = f"team-{(i + p) % namespaces}"
            job_name = f"job-{i:04d}-{p}"
            pod(api, ns, f"{job_name}-0", name, 1, owner=("Job", job_name), labels={"batch.kubernetes.io/job-name": job_name})


def priority_class(api: FakeKubeAPI, name: str, value: int, preemption_policy: str = "PreemptLowerPriority") -> None:
    api.add(SCHEDULING, "priorityclasses", {"metadata": {"name": name}, "value": value, "preemptionPolicy": preemption_policy})


def mutating_webhook(api: FakeKubeAPI, name: str, ca_pem: bytes | None, url: str | None = None,
                     service: tuple[str, str, str] | None = None, failure_policy: str = "Ignore",
                     namespace_selector: dict | None = None, object_selector: dict | None = None,
                     timeout_seconds: int = 10) -> None:
    """A MutatingWebhookConfiguration with one webhook on pods CREATE, called at ``url`` or the
    ``service`` (namespace, name, path), trusting ``ca_pem``."""
    client: dict = {"url": url} if url else {"service": {"namespace": service[0], "name": service[1], "path": service[2],
                                                         "port": 443}} if service else {}
    if ca_pem:
        client["caBundle"] = base64.b64encode(ca_pem).decode()
    api.add(ADMISSION, "mutatingwebhookconfigurations", {"metadata": {"name": name}, "webhooks": [{
        "name": f"{name}.gpuwarden.io", "clientConfig": client, "failurePolicy": failure_policy,
        "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": timeout_seconds,
        "namespaceSelector": namespace_selector or {}, "objectSelector": object_selector or {},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                   "scope": "Namespaced"}]}]})


def connect(api: FakeKubeAPI, tmp_path, **kwargs) -> KubeCluster:
    client = load_client(api.kubeconfig(tmp_path / "kc.json"))
    return KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05), clock=FakeClock(NOW), **kwargs)


def gpu_pod(api: FakeKubeAPI, ns: str, name: str, gpus: int = 1, *, owner: str | None = None, labels: dict | None = None,
            resource: str = "nvidia.com/gpu", gates: tuple[str, ...] = (ADMISSION_GATE,), affinity: dict | None = None,
            annotations: dict | None = None, node_name: str | None = None, phase: str = "Pending",
            conditions: list | None = None, created: str = "2026-11-30T11:00:00Z", priority: str | None = None) -> None:
    meta: dict = {"name": name, "namespace": ns, "labels": labels or {}, "annotations": annotations or {},
                  "creationTimestamp": created}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": f"uid-{owner}",
                                    "controller": True}]
    spec: dict = {"containers": [{"name": "main", "image": "trainer", "resources": {"limits": {resource: str(gpus)}}}]}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if affinity:
        spec["affinity"] = affinity
    if node_name:
        spec["nodeName"] = node_name
    if priority:
        spec["priorityClassName"] = priority
    status: dict = {"phase": phase}
    if conditions:
        status["conditions"] = conditions
    api.add(CORE, "pods", {"metadata": meta, "spec": spec, "status": status})


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def gated_job(api: FakeKubeAPI, ns: str, name: str, pods: int, gpus: int = 1, priority: str | None = None,
              annotations: dict | None = None, created: str = "2026-11-30T11:00:00Z", running_on: str | None = None,
              running: int = 0) -> None:
    """A Job and its ``pods`` pods, created with gpuwarden's gate (as the webhook writes it); the first
    ``running`` of them already ungated and bound to ``running_on``."""
    template: dict = {"containers": [{"name": "main", "image": "trainer",
                                      "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    api.add(BATCH, "jobs", {"metadata": {"name": name, "namespace": ns, "annotations": annotations or {},
                                         "creationTimestamp": created},  # a Job is created with its first pods
                            "spec": {"parallelism": pods, "completions": pods, "template": {"spec": template}},
                            "status": {}})
    for i in range(pods):
        bound = i < running
        gpu_pod(api, ns, f"{name}-{i}", gpus, owner=name, created=created, labels={"batch.kubernetes.io/job-name": name},
                priority=priority, gates=() if bound else (ADMISSION_GATE,), node_name=running_on if bound else None,
                phase="Running" if bound else "Pending")
