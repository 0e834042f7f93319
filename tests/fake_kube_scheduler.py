"""A stand-in for kube-scheduler (and the kubelet's "pod started") over ``tests/fake_kube_api.py``.

No kube-scheduler can run here; this one does what the default scheduler does for the pods
gpuwarden's tests make, and it goes through the fake API server's ``handle`` (the same rules as
an HTTP client: binding refuses gated pods), with ``user`` ``system:kube-scheduler``:
- a Pending pod with scheduling gates is never bound; it gets ``PodScheduled=False`` reason
  ``SchedulingGated`` once, as the real scheduler writes;
- each Pending pod with no gates and no ``nodeName``, in (creationTimestamp, name) order, goes to the
  first node in name order that passes the filters in the real order: NodeUnschedulable (a cordoned
  node is the taint ``node.kubernetes.io/unschedulable:NoSchedule``), TaintToleration (NoSchedule and
  NoExecute), NodeAffinity (``nodeSelector``; required node affinity, terms ORed, each term's
  ``matchExpressions`` In/NotIn/Exists/DoesNotExist/Gt/Lt on labels and ``matchFields``
  ``metadata.name`` ANDed), NodeResourcesFit (every resource the pod requests, requests or else
  limits, against allocatable minus what bound non-terminated pods request: ``nvidia.com/gpu``,
  ``nvidia.com/gpu.shared``, ``nvidia.com/mig-*``, cpu, memory);
- a fit is bound with ``POST pods/NAME/binding`` (PodScheduled=True), then started as the kubelet
  would: phase Running, ``status.startTime``;
- a misfit gets ``PodScheduled=False`` reason Unschedulable with kube-scheduler's message
  ("0/8 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 6 Insufficient
  nvidia.com/gpu.") and a Warning Event ``FailedScheduling`` whenever that message changes.
Scoring is left out (the first feasible node wins): gpuwarden pins the pods it admits to one node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from fake_kube_api import CORE, FakeKubeAPI
from kubernetes.utils import parse_quantity

SCHEDULER_USER = "system:kube-scheduler"
TERMINATED = ("Succeeded", "Failed")
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def pod_requests(pod: dict) -> dict[str, Decimal]:
    """What the pod asks of a node: containers summed, each init container's as a floor (requests, else limits)."""
    def one(container: dict) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {k: Decimal(parse_quantity(v)) for k, v in merged.items()}

    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or ():
        for k, v in one(container).items():
            total[k] = total.get(k, Decimal(0)) + v
    for container in spec.get("initContainers") or ():
        for k, v in one(container).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return {k: v for k, v in total.items() if v > 0}


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if not t.get("key") and t.get("operator") == "Exists":
            return True
        if t.get("key") == taint.get("key") and (
                t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")):
            return True
    return False


def _requirement_matches(requirement: dict, values: dict) -> bool:
    key, operator, wanted = requirement.get("key"), requirement.get("operator"), requirement.get("values") or []
    present, value = key in values, values.get(key)
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and wanted:
        try:
            number, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def affinity_matches(pod: dict, node: dict) -> bool:
    """nodeSelector and required node affinity (the NodeAffinity filter)."""
    spec, meta = pod.get("spec") or {}, node["metadata"]
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = (required or {}).get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": meta["name"]}
    return any((term.get("matchExpressions") or term.get("matchFields"))
               and all(_requirement_matches(r, labels) for r in term.get("matchExpressions") or ())
               and all(_requirement_matches(r, fields) for r in term.get("matchFields") or ())
               for term in terms)


def node_misfit(pod: dict, node: dict, free: dict[str, Decimal]) -> list[str]:
    """Why ``pod`` cannot go to ``node`` (kube-scheduler's reasons, first failing filter), [] when it fits."""
    spec, node_spec = pod.get("spec") or {}, node.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    if node_spec.get("unschedulable") and not tolerates(tolerations, UNSCHEDULABLE_TAINT):
        return ["node(s) were unschedulable"]
    for taint in node_spec.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
    if not affinity_matches(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    return [f"Insufficient {r}" for r, q in sorted(pod_requests(pod).items()) if q > free.get(r, Decimal(0))]


def unschedulable_message(nodes: int, reasons: dict[str, int]) -> str:
    listed = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{nodes} nodes are available: {', '.join(listed)}."


@dataclass
class StepResult:
    bound: list[tuple[str, str]] = field(default_factory=list)  # ("ns/name", node) in binding order
    unschedulable: dict[str, str] = field(default_factory=dict)  # "ns/name" -> kube-scheduler's message


@dataclass
class FakeKubeScheduler:
    api: FakeKubeAPI
    user: str = SCHEDULER_USER

    def _call(self, method: str, path: str, body: dict, content_type: str = "application/json") -> dict:
        return self.api.act(self.user, method, path, body, content_type)

    def _condition(self, pod: dict, status: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        others = [c for c in (pod.get("status") or {}).get("conditions") or () if c.get("type") != "PodScheduled"]
        condition = {"type": "PodScheduled", "status": status, "reason": reason, "message": message,
                     "lastTransitionTime": self.api.now_iso()}
        self._call("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                   {"status": {"conditions": [*others, condition]}}, "application/merge-patch+json")

    def _event(self, pod: dict, message: str) -> None:
        meta, now = pod["metadata"], self.api.now_iso()
        self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", {
            "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta.get("uid")},
            "reason": "FailedScheduling", "message": message, "type": "Warning", "count": 1,
            "source": {"component": "default-scheduler"}, "reportingComponent": "default-scheduler",
            "firstTimestamp": now, "lastTimestamp": now})

    def step(self) -> StepResult:
        """One scheduling pass over every pending pod, then the kubelet starts what is bound."""
        result = StepResult()
        nodes = self.api.objects(CORE, "nodes")
        pods = self.api.objects(CORE, "pods")
        free = {n["metadata"]["name"]: {k: Decimal(parse_quantity(v)) for k, v in
                                        ((n.get("status") or {}).get("allocatable") or {}).items()} for n in nodes}
        for pod in pods:
            where = (pod.get("spec") or {}).get("nodeName")
            if where in free and (pod.get("status") or {}).get("phase") not in TERMINATED:
                for k, v in pod_requests(pod).items():
                    free[where][k] = free[where].get(k, Decimal(0)) - v
        pending = [p for p in pods if not (p.get("spec") or {}).get("nodeName")
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending"]
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        for pod in pending:
            meta = pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or ()
                              if c.get("type") == "PodScheduled"), {})
            if (pod.get("spec") or {}).get("schedulingGates"):
                if scheduled.get("reason") != "SchedulingGated":
                    self._condition(pod, "False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
                continue
            reasons: dict[str, int] = {}
            chosen = None
            for node in nodes:
                misfit = node_misfit(pod, node, free[node["metadata"]["name"]])
                if not misfit:
                    chosen = node["metadata"]["name"]
                    break
                for reason in misfit:
                    reasons[reason] = reasons.get(reason, 0) + 1
            if chosen is None:
                message = unschedulable_message(len(nodes), reasons)
                result.unschedulable[key] = message
                if scheduled.get("reason") != "Unschedulable" or scheduled.get("message") != message:
                    self._condition(pod, "False", "Unschedulable", message)
                    self._event(pod, message)
                continue
            self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                       {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": chosen}})
            for k, v in pod_requests(pod).items():
                free[chosen][k] = free[chosen].get(k, Decimal(0)) - v
            result.bound.append((key, chosen))
        self._start_bound()
        return result

    def _start_bound(self) -> None:
        """The kubelet's part: a bound Pending pod starts Running."""
        for pod in self.api.objects(CORE, "pods"):
            status = pod.get("status") or {}
            if (pod.get("spec") or {}).get("nodeName") and status.get("phase", "Pending") == "Pending":
                meta = pod["metadata"]
                self._call("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                           {"status": {"phase": "Running", "startTime": self.api.now_iso()}}, "application/merge-patch+json")
