"""A stand-in for kube-scheduler (and the kubelet's "pod started") over ``tests/fake_kube_api.py``.

No kube-scheduler can run here; this one does what the default scheduler does for the pods
gpuwarden's tests make, and it goes through the fake API server's ``handle`` (the same rules as
an HTTP client: binding refuses gated pods), with ``user`` ``system:kube-scheduler``:
- a Pending pod with scheduling gates is never bound; it gets ``PodScheduled=False`` reason
  ``SchedulingGated`` once, as the real scheduler writes;
- each Pending pod with no gates and no ``nodeName``, in PrioritySort order (``spec.priority`` highest
  first, then creationTimestamp, then name), goes to the
  first node in name order that passes the filters in the real order: NodeUnschedulable (a cordoned
  node is the taint ``node.kubernetes.io/unschedulable:NoSchedule``), TaintToleration (NoSchedule and
  NoExecute), NodeAffinity (``nodeSelector``; required node affinity, terms ORed, each term's
  ``matchExpressions`` In/NotIn/Exists/DoesNotExist/Gt/Lt on labels and ``matchFields``
  ``metadata.name`` ANDed), NodeResourcesFit (every resource the pod requests, requests or else
  limits, against allocatable minus what bound non-terminated pods request: ``nvidia.com/gpu``,
  ``nvidia.com/gpu.shared``, ``nvidia.com/mig-*``, cpu, memory);
- DynamicResources, where the API serves resource.k8s.io/v1 (``tests/fake_kube_dra_alloc.py``): a pod's
  claims (its own, those its templates' entries made, KEP-5004's extended resources a DeviceClass maps
  on a node without them in allocatable) are allocated from the node's ResourceSlices as the last
  filter ("cannot allocate all claims" when they cannot be), written to the claims (allocation,
  reservedFor) before the binding; what it cannot read keeps the pod Pending with the reason;
- a fit is bound with ``POST pods/NAME/binding`` (PodScheduled=True) and a ``Scheduled`` Event,
  then started as the kubelet would: phase Running, ``status.startTime``;
- a misfit gets ``PodScheduled=False`` reason Unschedulable with kube-scheduler's message
  ("0/8 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 6 Insufficient
  nvidia.com/gpu.") and a Warning Event ``FailedScheduling`` whenever that message changes;
- DefaultPreemption (``preemption=True``, as on a real cluster): a misfit whose
  ``preemptionPolicy`` is not Never evicts lower-priority pods (``spec.priority``, set by the API's
  Priority plugin) from the node that needs the lowest-priority, fewest victims: each gets
  ``DisruptionTarget`` (PreemptionByScheduler), a ``Preempted`` Event and a DELETE; the preemptor
  gets ``status.nominatedNodeName``, which pods of no higher priority leave free for it, and is
  bound in a later pass once the victims are gone. A gpuwarden test can assert none happened;
- the kubelet's part: a terminating pod (``FakeKubeAPI.graceful_deletion``) is deleted for good
  once its ``deletionTimestamp`` passed; a bound Pending pod starts Running.
Scoring is left out by default (the nominated node, else the first feasible one in name order wins):
gpuwarden pins the pods it admits to one node. ``scoring="LeastAllocated"`` scores the feasible nodes
as kube-scheduler's default NodeResourcesFit does (LeastAllocated, weight 1 each on cpu, memory and
``nvidia.com/gpu``: :func:`least_allocated`) and binds the highest; equal scores go to the first in
name order (kube-scheduler picks one of them at random); a nominated node that fits still wins first. Not modelled: preemption weighing
PodDisruptionBudgets, inter-pod (anti-)affinity, topology spread constraints, node readiness,
host ports and volumes. Pods whose ``spec.schedulerName`` is not default-scheduler are left alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache

from fake_kube_api import CORE, FakeKubeAPI, epoch_seconds
from fake_kube_dra_alloc import DraPass, Plan
from kubernetes.utils import parse_quantity

SCHEDULER_USER = "system:kube-scheduler"
DEFAULT_SCHEDULER = "default-scheduler"  # pods naming another spec.schedulerName are not this scheduler's
TERMINATED = ("Succeeded", "Failed")
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def pod_requests(pod: dict) -> dict[str, Decimal]:
    """What the pod asks of a node: containers summed, each init container's as a floor (requests, else limits)."""
    spec = pod.get("spec") or {}
    resources = [[c.get("resources") or {} for c in spec.get(part) or ()] for part in ("containers", "initContainers")]
    return dict(_requests(json.dumps(resources, sort_keys=True)))


@lru_cache(maxsize=4096)  # pods of one template ask the same; parsing quantities is most of a pass's time
def _requests(resources_json: str) -> tuple[tuple[str, Decimal], ...]:
    def one(resources: dict) -> dict[str, Decimal]:
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {k: Decimal(parse_quantity(v)) for k, v in merged.items()}

    containers, init_containers = json.loads(resources_json)
    total: dict[str, Decimal] = {}
    for resources in containers:
        for k, v in one(resources).items():
            total[k] = total.get(k, Decimal(0)) + v
    for resources in init_containers:
        for k, v in one(resources).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return tuple((k, v) for k, v in total.items() if v > 0)


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


def node_misfit(pod: dict, node: dict, free: dict[str, Decimal], exempt: frozenset[str] = frozenset()) -> list[str]:
    """Why ``pod`` cannot go to ``node`` (kube-scheduler's reasons, first failing filter), [] when it fits;
    ``exempt``: extended resources DRA serves on this node (KEP-5004), not NodeResourcesFit's."""
    spec, node_spec = pod.get("spec") or {}, node.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    if node_spec.get("unschedulable") and not tolerates(tolerations, UNSCHEDULABLE_TAINT):
        return ["node(s) were unschedulable"]
    for taint in node_spec.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
    if not affinity_matches(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    return [f"Insufficient {r}" for r, q in sorted(pod_requests(pod).items())
            if r not in exempt and q > free.get(r, Decimal(0))]


LEAST_ALLOCATED = "LeastAllocated"
SCORED = (("cpu", 1000), ("memory", 1), ("nvidia.com/gpu", 1))  # resource, units of kube-scheduler's integers


def least_allocated(requests: dict[str, Decimal], allocatable: dict[str, Decimal], free: dict[str, Decimal]) -> int:
    """kube-scheduler's LeastAllocated score of a node for a pod: per resource the node offers,
    ``(allocatable - requested after the pod) * 100 // allocatable`` in integers (milli-CPU, bytes,
    GPUs); their mean, rounded down."""
    total = count = 0
    for resource, unit in SCORED:
        offered = int(allocatable.get(resource, Decimal(0)) * unit)
        if offered <= 0:
            continue  # a resource the node does not offer is not scored
        left = int((free.get(resource, Decimal(0)) - requests.get(resource, Decimal(0))) * unit)
        total += max(left, 0) * 100 // offered
        count += 1
    return total // count if count else 0


def unschedulable_message(nodes: int, reasons: dict[str, int]) -> str:
    listed = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{nodes} nodes are available: {', '.join(listed)}."


@dataclass
class StepResult:
    bound: list[tuple[str, str]] = field(default_factory=list)  # ("ns/name", node) in binding order
    unschedulable: dict[str, str] = field(default_factory=dict)  # "ns/name" -> kube-scheduler's message
    preempted: list[tuple[str, str]] = field(default_factory=list)  # (victim "ns/name", preemptor "ns/name")


def _key(pod: dict) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _priority(pod: dict) -> int:
    return int((pod.get("spec") or {}).get("priority") or 0)


def _fits(requests: dict[str, Decimal], free: dict[str, Decimal]) -> bool:
    return all(q <= free.get(r, Decimal(0)) for r, q in requests.items())


@dataclass
class FakeKubeScheduler:
    api: FakeKubeAPI
    user: str = SCHEDULER_USER
    preemption: bool = True  # kube-scheduler's DefaultPreemption: evict lower-priority pods to make room
    scoring: str = ""  # "": the first feasible node in name order; LEAST_ALLOCATED: the default score plugin

    def _call(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> dict:
        return self.api.act(self.user, method, path, body, content_type)

    def _pod_path(self, pod: dict) -> str:
        return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"

    def _condition(self, pod: dict, status: str, reason: str, message: str, nominated: str | None = None) -> None:
        others = [c for c in (pod.get("status") or {}).get("conditions") or () if c.get("type") != "PodScheduled"]
        condition = {"type": "PodScheduled", "status": status, "reason": reason, "message": message,
                     "lastTransitionTime": self.api.now_iso()}
        patch: dict = {"conditions": [*others, condition]}
        if nominated:
            patch["nominatedNodeName"] = nominated
        self._call("PATCH", f"{self._pod_path(pod)}/status", {"status": patch}, "application/merge-patch+json")

    def _event(self, pod: dict, reason: str, message: str, kind: str = "Warning") -> None:
        meta, now = pod["metadata"], self.api.now_iso()
        self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", {
            "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta.get("uid")},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "source": {"component": "default-scheduler"}, "reportingComponent": "default-scheduler",
            "firstTimestamp": now, "lastTimestamp": now})

    def step(self) -> StepResult:
        """The kubelet removes pods whose grace ended; one scheduling pass over every pending pod; the kubelet
        starts what is bound."""
        result = StepResult()
        nodes = self.api.objects(CORE, "nodes", copy=False)  # read only, as every object below
        dra = DraPass.read(self.api)  # DynamicResources: None where resource.k8s.io/v1 is not served
        pods = self._end_terminated(self.api.objects(CORE, "pods", copy=False))
        doomed: set[str] = set()  # victims preempted in this pass
        starting = [p for p in pods if (p.get("spec") or {}).get("nodeName")
                    and (p.get("status") or {}).get("phase", "Pending") == "Pending"]
        free = {n["metadata"]["name"]: {k: Decimal(parse_quantity(v)) for k, v in
                                        ((n.get("status") or {}).get("allocatable") or {}).items()} for n in nodes}
        allocatable = {name: dict(offered) for name, offered in free.items()}
        running: dict[str, list[dict]] = {name: [] for name in free}
        for pod in pods:
            where = (pod.get("spec") or {}).get("nodeName")
            if where in free and (pod.get("status") or {}).get("phase") not in TERMINATED:
                running[where].append(pod)
                for k, v in pod_requests(pod).items():
                    free[where][k] = free[where].get(k, Decimal(0)) - v
        pending = [p for p in pods if not (p.get("spec") or {}).get("nodeName")
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending" and not p["metadata"].get("deletionTimestamp")
                   and (p.get("spec") or {}).get("schedulerName", DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER]
        # PrioritySort, as the real scheduling queue pops: higher priority first, then the older
        pending.sort(key=lambda p: (-_priority(p), p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        # What a pod nominated by an earlier preemption will take: others of no higher priority leave it to it
        nominated = {_key(p): p for p in pending if (p.get("status") or {}).get("nominatedNodeName") in free}
        for pod in pending:
            scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or ()
                              if c.get("type") == "PodScheduled"), {})
            if (pod.get("spec") or {}).get("schedulingGates"):
                if scheduled.get("reason") != "SchedulingGated":
                    self._condition(pod, "False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
                continue
            room = {name: dict(f) for name, f in free.items()} if nominated else free
            for other in nominated.values():
                if other is not pod and _priority(other) >= _priority(pod):
                    for k, v in pod_requests(other).items():
                        where = other["status"]["nominatedNodeName"]
                        room[where][k] = room[where].get(k, Decimal(0)) - v
            reasons: dict[str, int] = {}
            chosen = None
            mine = (pod.get("status") or {}).get("nominatedNodeName")
            feasible: list[str] = []
            needs = dra.needs(pod) if dra is not None else None
            if isinstance(needs, str):  # DynamicResources' PreFilter refused it: no node is tried
                self._unschedulable(pod, scheduled, f"0/{len(nodes)} nodes are available: {needs}.", result)
                continue
            plans: dict[str, Plan] = {}
            for node in sorted(nodes, key=lambda n: n["metadata"]["name"] != mine):  # its nominated node first
                misfit = node_misfit(pod, node, room[node["metadata"]["name"]],
                                     dra.exempt(needs, node) if dra is not None else frozenset())
                if not misfit and dra is not None and needs:  # DynamicResources' Filter runs last
                    plan = dra.allocate(pod, needs, node)
                    if isinstance(plan, str):
                        misfit = [plan]
                    else:
                        plans[node["metadata"]["name"]] = plan
                if not misfit:
                    if self.scoring != LEAST_ALLOCATED or node["metadata"]["name"] == mine:
                        chosen = node["metadata"]["name"]
                        break
                    feasible.append(node["metadata"]["name"])
                    continue
                for reason in misfit:
                    reasons[reason] = reasons.get(reason, 0) + 1
            if chosen is None and feasible:  # max: the first in name order among equal scores
                asked = pod_requests(pod)
                chosen = max(feasible, key=lambda name: least_allocated(asked, allocatable[name], room[name]))
            if chosen is None:
                message = unschedulable_message(len(nodes), reasons)
                result.unschedulable[_key(pod)] = message
                target = self._preempt(pod, nodes, room, running, doomed, result) if self.preemption else None
                if target:
                    nominated[_key(pod)] = {**pod, "status": {**(pod.get("status") or {}), "nominatedNodeName": target}}
                if target or scheduled.get("reason") != "Unschedulable" or scheduled.get("message") != message:
                    self._condition(pod, "False", "Unschedulable", message, target)
                    self._event(pod, "FailedScheduling", message)
                continue
            if chosen in plans and dra is not None:  # PreBind: the claims' allocation and reservation
                dra.commit(self._call, pod, plans[chosen])
            self._call("POST", f"{self._pod_path(pod)}/binding",
                       {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": chosen}})
            self._event(pod, "Scheduled", f"Successfully assigned {_key(pod)} to {chosen}", "Normal")
            for k, v in pod_requests(pod).items():
                free[chosen][k] = free[chosen].get(k, Decimal(0)) - v
            running[chosen].append(pod)
            nominated.pop(_key(pod), None)
            result.bound.append((_key(pod), chosen))
            starting.append(pod)
        for pod in starting:  # the kubelet's part: a bound Pending pod starts Running
            self._call("PATCH", f"{self._pod_path(pod)}/status",
                       {"status": {"phase": "Running", "startTime": self.api.now_iso()}}, "application/merge-patch+json")
        return result

    def _unschedulable(self, pod: dict, scheduled: dict, message: str, result: StepResult) -> None:
        result.unschedulable[_key(pod)] = message
        if scheduled.get("reason") != "Unschedulable" or scheduled.get("message") != message:
            self._condition(pod, "False", "Unschedulable", message)
            self._event(pod, "FailedScheduling", message)

    def _preempt(self, pod: dict, nodes: list[dict], room: dict, running: dict, doomed: set[str],
                 result: StepResult) -> str | None:
        """DefaultPreemption, simplified: on the node needing the lowest-priority, fewest victims (then name), evict
        lower-priority pods (lowest priority, then latest started, first) until the pod fits; nominate it there."""
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            return None
        mine = (pod.get("status") or {}).get("nominatedNodeName")
        if mine in running and any(p["metadata"].get("deletionTimestamp") and _priority(p) < _priority(pod)
                                   for p in running[mine]):
            return mine  # PodEligibleToPreemptOthers: its victims are still terminating; wait, evict no more
        wanted, best = pod_requests(pod), None
        for node in nodes:
            name = node["metadata"]["name"]
            if node_misfit(pod, node, {r: Decimal(10 ** 18) for r in wanted}):
                continue  # not a resource problem: evicting cannot help
            candidates = sorted((p for p in running[name] if _priority(p) < _priority(pod)
                                 and not p["metadata"].get("deletionTimestamp") and _key(p) not in doomed),
                                key=lambda p: (p.get("status") or {}).get("startTime", ""), reverse=True)
            candidates.sort(key=_priority)  # lowest priority first; among equals the latest started
            space, victims = dict(room[name]), []
            for victim in candidates:
                if _fits(wanted, space):
                    break
                victims.append(victim)
                for k, v in pod_requests(victim).items():
                    space[k] = space.get(k, Decimal(0)) + v
            rank = (max((_priority(v) for v in victims), default=0), len(victims), name)
            if victims and _fits(wanted, space) and (best is None or rank < best[0]):
                best = (rank, victims)
        if best is None:
            return None
        (_, _, name), victims = best
        for victim in victims:
            disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                          "message": "default-scheduler: preempting to accommodate a higher priority pod",
                          "lastTransitionTime": self.api.now_iso()}
            others = [c for c in (victim.get("status") or {}).get("conditions") or () if c.get("type") != "DisruptionTarget"]
            self._call("PATCH", f"{self._pod_path(victim)}/status", {"status": {"conditions": [*others, disruption]}},
                       "application/merge-patch+json")
            self._event(victim, "Preempted", f"Preempted by pod {pod['metadata'].get('uid')} on node {name}", "Normal")
            self._call("DELETE", self._pod_path(victim))
            doomed.add(_key(victim))  # not a candidate again this pass
            result.preempted.append((_key(victim), _key(pod)))
        return name

    def _end_terminated(self, pods: list[dict]) -> list[dict]:
        """The kubelet's part: a terminating pod whose grace period ended is deleted for good; the pods left."""
        now, left = self.api.clock(), []
        for pod in pods:
            stamp = pod["metadata"].get("deletionTimestamp")
            if stamp and epoch_seconds(stamp) <= now:
                self._call("DELETE", f"{self._pod_path(pod)}?gracePeriodSeconds=0")
            else:
                left.append(pod)
        return left
