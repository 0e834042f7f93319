"""Builders for a cluster shared by tenants that never opted in (issue 31): scenario data, not logic.

A ``Shared`` harness is the fake API server (``tests/fake_kube_api.py``, the official client over real
HTTP) with its stand-ins for kube-scheduler and the Job controller on one virtual clock
(``tests/gated_scenario.FakeCluster``, graceful pod deletion on), and gpuwarden's scheduling round on
``KubeCluster``, exactly as ``gpuwarden scheduler run`` runs it. ``round()`` lets the stand-ins take
one step, then runs one round, and returns its results; ``writes(namespace)`` lists every write
gpuwarden's client made into a namespace (the stand-ins act as other users and are not counted).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fake_kube_api import BATCH, CORE, FakeKubeAPI
from gated_scenario import H100, FakeCluster
from kube_fleet import namespace, priority_class

from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.kube.gates import ADMISSION_GATE, QUEUE_LABEL
from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.fleet import ActionResult, ClusterSnapshot
from gpuwarden.fleet.clock import ModelClock

PRIORITIES = {"background": 10, "low": 100, "normal": 1000, "high": 10000}
WRITES = ("POST", "PATCH", "PUT", "DELETE")


def gpu_node(api: FakeKubeAPI, name: str, *, gpus: int = 8, shared: int = 0, mig: Mapping[str, int] | None = None,
             mig_config: str = "", labels: Mapping[str, str] | None = None, taints: list | None = None,
             leaf: str = "leaf-a", cpu: str = "190", memory: str = "1900Gi") -> None:
    """An H100 node: ``gpus`` whole GPUs, or time-sliced (``shared`` replicas of ``gpus`` GPUs), or MIG
    (``mig``: profile -> instances, as the device plugin's mixed strategy publishes them)."""
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    node_labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": str(gpus),
                   "gpuwarden.io/leaf-switch": leaf, "nvidia.com/gpu.clique": f"clique-{name}"}
    if shared:
        capacity.update({"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": str(shared)})
        node_labels.update({"nvidia.com/gpu.replicas": str(shared // gpus), "nvidia.com/gpu.product": f"{H100}-SHARED"})
    elif mig:
        capacity.update({"nvidia.com/gpu": "0", **{f"nvidia.com/mig-{p}": str(n) for p, n in mig.items()}})
        node_labels.update({"nvidia.com/mig.config": mig_config or "custom", "nvidia.com/mig.strategy": "mixed"})
    else:
        capacity["nvidia.com/gpu"] = str(gpus)
    node_labels.update(labels or {})
    spec = {"taints": list(taints)} if taints else {}
    api.add(CORE, "nodes", {"metadata": {"name": name, "labels": node_labels}, "spec": spec,
                            "status": {"capacity": capacity, "allocatable": capacity}})


def team_namespace(api: FakeKubeAPI, name: str, team: str | None = None, guaranteed: str | None = None,
                   burst: str | None = None, queue: bool = True) -> None:
    """A namespace; ``queue`` labels it ``gpuwarden.io/queue=<team>`` (opted in)."""
    notes = {}
    if guaranteed is not None:
        notes["gpuwarden.io/guaranteed-gpus"] = guaranteed
    if burst is not None:
        notes["gpuwarden.io/burst-gpus"] = burst
    namespace(api, name, {QUEUE_LABEL: team or name} if queue else {}, notes)


def pod_spec(resource: str = "nvidia.com/gpu", count: int = 1, *, priority: str = "normal", gated: bool = True,
             node_selector: Mapping[str, str] | None = None, affinity: dict | None = None,
             tolerations: list | None = None, grace_seconds: int = 30, cpu: str = "4", memory: str = "32Gi") -> dict:
    spec: dict = {"restartPolicy": "Never", "priorityClassName": priority, "terminationGracePeriodSeconds": grace_seconds,
                  "containers": [{"name": "main", "image": "trainer",
                                  "resources": {"requests": {resource: str(count), "cpu": cpu, "memory": memory},
                                                "limits": {resource: str(count)}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": ADMISSION_GATE}]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if affinity:
        spec["affinity"] = affinity
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


@dataclass
class Shared:
    """The fake cluster and gpuwarden's round on it (see the module docstring)."""

    tmp_path: object
    attained: Callable[[ClusterSnapshot], Mapping[str, float]] | None = None
    api: FakeKubeAPI = field(default_factory=FakeKubeAPI)

    def __post_init__(self) -> None:
        self.api.start()
        self.fake = FakeCluster(self.api)
        for name, value in PRIORITIES.items():
            priority_class(self.api, name, value)
        clock = ModelClock(lambda: datetime.fromtimestamp(self.fake.clock.now, UTC))
        client = load_client(self.api.kubeconfig(self.tmp_path / "kc.json"))  # type: ignore[operator]
        self.cluster = KubeCluster(KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.05, clock=clock),
                                   clock=clock)
        self.metrics = SchedulerMetrics()
        self.loop = SchedulingRound(self.cluster, attained=self.attained, on_round=[self.metrics])

    def stop(self) -> None:
        self.api.stop()

    # -- what runs there ------------------------------------------------------------------------------
    def pod(self, ns: str, name: str, spec: dict, *, labels: Mapping[str, str] | None = None,
            annotations: Mapping[str, str] | None = None) -> None:
        """A pod created through the API (its priority set by the Priority plugin, as a user's is)."""
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {}),
                             "annotations": dict(annotations or {})}, "spec": spec}
        self.api.act("alice@example.com", "POST", f"/api/v1/namespaces/{ns}/pods", body)

    def job(self, ns: str, name: str, spec: dict, *, parallelism: int = 1, annotations: Mapping[str, str] | None = None,
            run_seconds: int = 36000) -> None:
        """A Job; the Job controller stand-in makes its pods (from the template: gated if ``spec`` is)."""
        notes = {"fake.gpuwarden.io/run-seconds": str(run_seconds), **(annotations or {})}
        body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns, "annotations": notes},
                "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
                         **({"completionMode": "Indexed"} if parallelism > 1 else {}),
                         "template": {"metadata": {"labels": {"app": name}, "annotations": notes}, "spec": spec}}}
        self.api.act("alice@example.com", "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body)

    def running(self, ns: str, name: str, spec: dict, *, parallelism: int = 1, bare: bool = False,
                annotations: Mapping[str, str] | None = None) -> None:
        """Work already running before gpuwarden's first round (created ungated; kube-scheduler places it)."""
        spec = {k: v for k, v in spec.items() if k != "schedulingGates"}
        if bare:
            self.pod(ns, name, spec, annotations=annotations)
        else:
            self.job(ns, name, spec, parallelism=parallelism, annotations=annotations)
        self.fake.step(0)
        self.fake.step(0)

    # -- running it ------------------------------------------------------------------------------------
    def round(self, seconds: float = 10.0) -> tuple[ActionResult, ...]:
        self.fake.step(seconds)
        return self.loop.run_round()

    def rounds(self, count: int, seconds: float = 10.0) -> list[ActionResult]:
        return [result for _ in range(count) for result in self.round(seconds)]

    # -- what happened ---------------------------------------------------------------------------------
    def writes(self, ns: str) -> list[str]:
        """Every write gpuwarden's client (user "") made into namespace ``ns``: "METHOD path"."""
        return [f"{r.method} {r.path}" for r in self.api.requests
                if r.user == "" and r.method in WRITES and f"/namespaces/{ns}/" in r.path]

    def live_pods(self, ns: str | None = None) -> list[dict]:
        return [p for p in self.api.objects(CORE, "pods") if (ns is None or p["metadata"]["namespace"] == ns)
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    def pod_named(self, ns: str, name: str) -> dict | None:
        return self.api.get(CORE, "pods", name, ns)

    def job_named(self, ns: str, name: str) -> dict | None:
        return self.api.get(BATCH, "jobs", name, ns)

    def events(self, ns: str) -> list[dict]:
        return [e for e in self.api.objects(CORE, "events") if e["metadata"]["namespace"] == ns
                and (e.get("source") or {}).get("component") != "default-scheduler"]
