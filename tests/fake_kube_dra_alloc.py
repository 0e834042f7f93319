"""Dynamic Resource Allocation enforced by the fakes (``tests/fake_kube_api.py`` with ``with_dra()``):
the ResourceClaim controller of kube-controller-manager and the allocation kube-scheduler's
``DynamicResources`` plugin does on binding. Nothing real runs here; these do what the real ones do
for the objects gpuwarden's tests make, through the fake API server's ``handle`` (every API rule),
each as its own user.

:class:`FakeResourceClaimController` (``step()``), as the resourceclaim controller does:
- a pod whose ``spec.resourceClaims[]`` entry names ``resourceClaimTemplateName`` gets a claim made
  from the template (its ``spec.spec``, labels and annotations of its ``spec.metadata``) named
  ``<pod>-<entry>-<5 random characters>`` (the API server's generateName alphabet), with a controller
  ownerReference to the pod and the annotation ``resource.kubernetes.io/pod-claim-name``, and recorded
  in the pod's ``status.resourceClaimStatuses`` (gated pods too: claims are made when pods are);
- a pod that is gone or terminated (Succeeded, Failed) leaves the claims' ``status.reservedFor``; a
  claim nobody reserves any more is deallocated (``status.allocation`` removed: structured
  parameters, 1.31 and later); a claim owned by a pod that is gone is deleted (the garbage collector).

:class:`DraPass` is kube-scheduler's ``DynamicResources`` for one scheduling pass of
``tests/fake_kube_scheduler.py``: read once (DeviceClasses, ResourceSlices, ResourceClaims), then
for each pod:
- PreFilter (:meth:`DraPass.needs`): the pod's claims (its own, or the one its template's entry made:
  none made yet is a wait), KEP-5004's extended resources a DeviceClass maps (``extendedResourceName``,
  or the implicit ``deviceclass.resource.kubernetes.io/<class>``); what the fake cannot evaluate
  (a CEL form below the supported ones, ``firstAvailable``, ``constraints``, a partitionable device's
  ``consumesCounters``) is refused, the pod kept Pending with the reason, never guessed;
- Filter (:meth:`DraPass.allocate`), after the other filters passed on a node: an allocated claim must
  be on that node ("resourceclaim not available on the node"); the others' requests are allocated
  together from the node's devices: node-local ResourceSlices (``spec.nodeName``) of each pool's
  newest ``generation``, a device already in any claim's allocation (or taken earlier in the pass) not
  free, the request's DeviceClass selectors then its own, ``allocationMode`` ExactCount (``count``,
  default 1) or All (every matching device, none of them taken, at least one); a search that
  backtracks as the real allocator does. None found: "cannot allocate all claims". A KEP-5004 pod on
  a node whose allocatable lacks the resource asks it through DRA (``count`` of the class); where the
  node has it, the device plugin serves it (NodeResourcesFit);
- PreBind (:meth:`DraPass.commit`): ``status.allocation`` (``devices.results`` request / driver / pool /
  device, ``nodeSelector`` the node) and ``status.reservedFor`` the pod; for KEP-5004 the special
  claim (``<pod>-extended-resources-<suffix>``, annotation ``resource.kubernetes.io/extended-resource-claim``,
  requests ``container-<i>-request-<j>``, owned by the pod) and the pod's
  ``status.extendedResourceClaimStatus``.

CEL (:func:`compile_selector`): a small evaluator, honest about its reach. Supported: ``&&``, ``||``,
parentheses; ``device.driver``; ``device.attributes['DOMAIN'].NAME`` (or ``['NAME']``: a bare
attribute name is the driver's domain, a qualified one ``DOMAIN/NAME``) of type string, int or bool;
``device.capacity['DOMAIN'].NAME`` with ``.compareTo(quantity('40Gi'))`` (then compared with an int)
or ``.isGreaterThan`` / ``.isLessThan``; ``==`` ``!=`` on those, ``<`` ``<=`` ``>`` ``>=`` on ints;
string, int and bool literals. A missing key is CEL's runtime error ("no such key"); ``&&`` / ``||``
absorb it as CEL does (``false && error`` is false) and one left aborts the allocation, as the real
allocator's "CEL runtime error". Anything else (versions, ``semver``, ``!``, ``in``, macros) raises
:class:`UnsupportedSelector`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache

from fake_kube_api import CORE, RESOURCE, FakeKubeAPI
from kubernetes.utils import parse_quantity

CLAIM_CONTROLLER_USER = "system:serviceaccount:kube-system:resource-claim-controller"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"
CANNOT_ALLOCATE = "cannot allocate all claims"  # kube-scheduler's DynamicResources Filter, verbatim
NOT_ON_NODE = "resourceclaim not available on the node"
TERMINATED = ("Succeeded", "Failed")
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's SimpleNameGenerator: no vowels, no 0/1/3


class UnsupportedSelector(ValueError):
    """A CEL expression the fake does not evaluate (it refuses rather than guesses)."""


class CelRuntimeError(RuntimeError):
    """CEL's runtime error (a missing key): the real allocator aborts the allocation with it."""


def generated_name(base: str, seed: str) -> str:
    """``base`` plus 5 random characters, as the API server's generateName (base cut to 58)."""
    rng = random.Random(seed)
    return base[:58] + "".join(rng.choice(_NAME_ALPHABET) for _ in range(5))


# -- CEL ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<str>'[^']*'|\"[^\"]*\")|(?P<int>\d+)|(?P<op>&&|\|\||==|!=|>=|<=|[<>().\[\],])"
                    r"|(?P<id>[A-Za-z_][A-Za-z0-9_]*))")


def _tokens(expression: str) -> list[tuple[str, str]]:
    out, at = [], 0
    text = expression.strip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        if not match or match.end() == at:
            raise UnsupportedSelector(f"unsupported selector: {expression!r} (at {text[at:at + 12]!r})")
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        at = match.end()
    return out


class _Parser:
    def __init__(self, expression: str) -> None:
        self.expression, self.tokens, self.at = expression, _tokens(expression), 0

    def fail(self, why: str) -> UnsupportedSelector:
        return UnsupportedSelector(f"unsupported selector: {self.expression!r} ({why})")

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self, wanted: str | None = None, kind: str | None = None) -> str:
        if self.at >= len(self.tokens):
            raise self.fail("unexpected end")
        token_kind, value = self.tokens[self.at]
        if (wanted is not None and value != wanted) or (kind is not None and token_kind != kind):
            raise self.fail(f"unexpected {value!r}")
        self.at += 1
        return value

    def parse(self) -> tuple:
        tree = self.disjunction()
        if self.at != len(self.tokens):
            raise self.fail(f"unexpected {self.peek()!r}")
        return tree

    def disjunction(self) -> tuple:
        terms = [self.conjunction()]
        while self.peek() == "||":
            self.take("||")
            terms.append(self.conjunction())
        return terms[0] if len(terms) == 1 else ("or", *terms)

    def conjunction(self) -> tuple:
        terms = [self.comparison()]
        while self.peek() == "&&":
            self.take("&&")
            terms.append(self.comparison())
        return terms[0] if len(terms) == 1 else ("and", *terms)

    def comparison(self) -> tuple:
        left = self.operand()
        if self.peek() in ("==", "!=", "<", "<=", ">", ">="):
            op = self.take()
            return ("cmp", op, left, self.operand())
        return left

    def operand(self) -> tuple:
        kind, value = self.tokens[self.at] if self.at < len(self.tokens) else ("", "")
        if value == "(":
            self.take("(")
            inner = self.disjunction()
            self.take(")")
            return inner
        if kind == "str":
            self.at += 1
            return ("lit", value[1:-1])
        if kind == "int":
            self.at += 1
            return ("lit", int(value))
        if value in ("true", "false"):
            self.at += 1
            return ("lit", value == "true")
        if value == "device":
            return self.device_path()
        raise self.fail(f"unexpected {value!r}" if value else "unexpected end")

    def key(self) -> str:
        self.take("[")
        text = self.take(kind="str")[1:-1]
        self.take("]")
        return text

    def device_path(self) -> tuple:
        self.take("device")
        self.take(".")
        field_name = self.take(kind="id")
        if field_name == "driver":
            return ("driver",)
        if field_name not in ("attributes", "capacity"):
            raise self.fail(f"device.{field_name}")
        domain = self.key()
        if self.peek() == ".":
            self.take(".")
            name = self.take(kind="id")
        else:
            name = self.key()
        node: tuple = (field_name, domain, name)
        if self.peek() == ".":  # a quantity's method
            self.take(".")
            method = self.take(kind="id")
            if field_name != "capacity" or method not in ("compareTo", "isGreaterThan", "isLessThan"):
                raise self.fail(f".{method}()")
            self.take("(")
            self.take("quantity")
            self.take("(")
            quantity = self.take(kind="str")[1:-1]
            self.take(")")
            self.take(")")
            try:
                bound = Decimal(parse_quantity(quantity))
            except ValueError as err:
                raise self.fail(f"quantity {quantity!r}") from err
            node = ("quantity", method, node, bound)
        elif field_name == "capacity":
            raise self.fail("a capacity compares only through compareTo / isGreaterThan / isLessThan")
        return node


def _attribute(device: dict, driver: str, domain: str, name: str) -> object:
    attributes = device.get("attributes") or {}
    value = attributes.get(f"{domain}/{name}")
    if value is None and domain == driver:
        value = attributes.get(name)
    if value is None:
        raise CelRuntimeError(f"no such key: {domain}/{name}")
    if not isinstance(value, dict) or len(value) != 1:
        raise CelRuntimeError(f"attribute {domain}/{name} is not one typed value")
    (kind, typed), = value.items()
    if kind == "version":
        raise UnsupportedSelector(f"unsupported selector: version attribute {domain}/{name} (semver)")
    return typed


def _capacity(device: dict, driver: str, domain: str, name: str) -> Decimal:
    capacity = device.get("capacity") or {}
    value = capacity.get(f"{domain}/{name}") or (capacity.get(name) if domain == driver else None)
    if value is None:
        raise CelRuntimeError(f"no such key: {domain}/{name}")
    return Decimal(parse_quantity(value.get("value") if isinstance(value, dict) else value))


def _evaluate(node: tuple, device: dict, driver: str) -> object:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "driver":
        return driver
    if kind == "attributes":
        return _attribute(device, driver, node[1], node[2])
    if kind == "quantity":
        _, method, path, bound = node
        amount = _capacity(device, driver, path[1], path[2])
        if method == "compareTo":
            return (amount > bound) - (amount < bound)
        return amount > bound if method == "isGreaterThan" else amount < bound
    if kind in ("and", "or"):
        absorbing = kind == "or"  # true absorbs ||, false absorbs &&, and either absorbs an error
        error: CelRuntimeError | None = None
        for term in node[1:]:
            try:
                value = _evaluate(term, device, driver)
            except CelRuntimeError as err:
                error = error or err
                continue
            if not isinstance(value, bool):
                raise CelRuntimeError(f"no such overload: {kind} on {type(value).__name__}")
            if value is absorbing:
                return absorbing
        if error is not None:
            raise error
        return not absorbing
    if kind == "cmp":
        _, op, left_node, right_node = node
        left, right = _evaluate(left_node, device, driver), _evaluate(right_node, device, driver)
        if op in ("==", "!="):
            same = type(left) is type(right) and left == right  # heterogeneous equality is false in CEL
            return same if op == "==" else not same
        if not (type(left) is int and type(right) is int):
            raise CelRuntimeError(f"no such overload: {type(left).__name__} {op} {type(right).__name__}")
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]
    raise CelRuntimeError(f"cannot evaluate {kind}")


@lru_cache(maxsize=512)
def compile_selector(expression: str) -> Callable[[dict, str], bool]:
    """``expression`` as a predicate on (slice device, driver); UnsupportedSelector for what it cannot read,
    CelRuntimeError from the predicate where CEL's runtime would fail."""
    tree = _Parser(expression).parse()

    def matches(device: dict, driver: str) -> bool:
        value = _evaluate(tree, device, driver)
        if not isinstance(value, bool):
            raise CelRuntimeError(f"selector {expression!r} is not a boolean")
        return value

    return matches


def _selectors(obj_spec: dict) -> list[Callable[[dict, str], bool]]:
    out = []
    for selector in obj_spec.get("selectors") or ():
        expression = (selector.get("cel") or {}).get("expression")
        if not isinstance(expression, str):
            raise UnsupportedSelector(f"unsupported selector: {selector!r} (only CEL)")
        out.append(compile_selector(expression))
    return out


# -- the ResourceClaim controller --------------------------------------------------------------------

def _pod_owner(pod: dict) -> dict:
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta.get("uid"), "controller": True,
            "blockOwnerDeletion": True}


def _claims_path(ns: str, name: str = "") -> str:
    return f"/{RESOURCE}/namespaces/{ns}/resourceclaims" + (f"/{name}" if name else "")


def _pod_path(pod: dict) -> str:
    return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"


@dataclass
class FakeResourceClaimController:
    api: FakeKubeAPI
    user: str = CLAIM_CONTROLLER_USER

    def _call(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> dict:
        return self.api.act(self.user, method, path, body, content_type)

    def step(self) -> None:
        if (RESOURCE, "resourceclaims") not in self.api.resources:
            return  # a cluster without DRA has no such controller at work
        pods = self.api.objects(CORE, "pods", copy=False)
        by_uid = {p["metadata"].get("uid"): p for p in pods}
        by_name = {(p["metadata"].get("namespace"), p["metadata"]["name"]): p for p in pods}
        for claim in self.api.objects(RESOURCE, "resourceclaims", copy=False):
            self._sync_claim(claim, by_uid, by_name)
        templates = {(t["metadata"].get("namespace"), t["metadata"]["name"]): t
                     for t in self.api.objects(RESOURCE, "resourceclaimtemplates", copy=False)}
        for pod in pods:
            self._sync_pod(pod, templates)

    def _sync_claim(self, claim: dict, by_uid: dict, by_name: dict) -> None:
        meta, status = claim["metadata"], claim.get("status") or {}
        ns = meta.get("namespace", "")
        owner = next((r for r in meta.get("ownerReferences") or () if r.get("kind") == "Pod" and r.get("controller")), None)
        if owner is not None and owner.get("uid") not in by_uid:
            self._call("DELETE", _claims_path(ns, meta["name"]))  # the garbage collector: its pod is gone
            return
        reserved = status.get("reservedFor") or []

        def live(ref: dict) -> bool:
            pod = by_uid.get(ref.get("uid")) or by_name.get((ns, ref.get("name")))
            return pod is not None and (pod.get("status") or {}).get("phase") not in TERMINATED

        kept = [r for r in reserved if r.get("resource") != "pods" or live(r)]
        if kept == reserved:
            return
        patch: dict = {"reservedFor": kept or None}
        if not kept and status.get("allocation"):
            patch["allocation"] = None  # nobody uses it: deallocated, its devices free
        self._call("PATCH", f"{_claims_path(ns, meta['name'])}/status", {"status": patch}, "application/merge-patch+json")

    def _sync_pod(self, pod: dict, templates: dict) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        if status.get("phase") in TERMINATED or meta.get("deletionTimestamp"):
            return
        made = list(status.get("resourceClaimStatuses") or ())
        known = {s.get("name") for s in made}
        added = False
        for entry in spec.get("resourceClaims") or ():
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name or entry.get("name") in known:
                continue
            template = templates.get((meta["namespace"], template_name))
            if template is None:
                continue  # the real controller retries until the template exists
            inner = (template.get("spec") or {})
            name = generated_name(f"{meta['name']}-{entry['name']}-", f"{meta.get('uid')}/{entry['name']}")
            claim_meta = {"name": name, "namespace": meta["namespace"], "ownerReferences": [_pod_owner(pod)],
                          "labels": dict(((inner.get("metadata") or {}).get("labels")) or {}),
                          "annotations": {**(((inner.get("metadata") or {}).get("annotations")) or {}),
                                          POD_CLAIM_NAME_ANNOTATION: entry["name"]}}
            self._call("POST", _claims_path(meta["namespace"]), {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": claim_meta,
                "spec": inner.get("spec") or {}})
            made.append({"name": entry["name"], "resourceClaimName": name})
            added = True
        if added:
            self._call("PATCH", f"{_pod_path(pod)}/status", {"status": {"resourceClaimStatuses": made}},
                       "application/merge-patch+json")


# -- kube-scheduler's DynamicResources -------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str
    data: dict = field(compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


@dataclass
class _Request:
    claim: str  # claim name ("" for KEP-5004's claim, made on commit)
    name: str
    device_class: str
    mode: str
    count: int
    selectors: list[Callable[[dict, str], bool]]


@dataclass
class PodNeeds:
    """What a pod asks of DRA (PreFilter): its claims and the extended resources a class could back."""

    claims: list[dict] = field(default_factory=list)  # the ResourceClaims, allocated or not
    extended: dict[str, tuple[str, int, list[tuple[str, str]]]] = field(default_factory=dict)
    # extended resource -> (device class, total count, [(container, request name)])

    def __bool__(self) -> bool:
        return bool(self.claims or self.extended)


@dataclass
class Plan:
    """Filter's answer on one node: devices per claim (results), and KEP-5004's requests."""

    node: str
    results: dict[str, list[tuple[str, Device]]] = field(default_factory=dict)  # claim name -> (request, device)
    reserve: list[str] = field(default_factory=list)  # allocated claims the pod joins
    extended: list[tuple[str, Device]] = field(default_factory=list)  # (request name, device)
    extended_requests: list[dict] = field(default_factory=list)
    mappings: list[dict] = field(default_factory=list)


def _allocated_keys(claim: dict) -> list[tuple[str, str, str]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [(r.get("driver"), r.get("pool"), r.get("device"))
            for r in (allocation.get("devices") or {}).get("results") or ()]


@dataclass
class DraPass:
    """The cluster's DRA objects as kube-scheduler's informers have them at the start of a pass."""

    api: FakeKubeAPI
    classes: dict[str, dict] = field(default_factory=dict)
    devices: dict[str, list[Device]] = field(default_factory=dict)  # node -> its devices
    by_key: dict[tuple[str, str, str], Device] = field(default_factory=dict)
    claims: dict[tuple[str, str], dict] = field(default_factory=dict)
    taken: set[tuple[str, str, str]] = field(default_factory=set)
    extended_classes: dict[str, str] = field(default_factory=dict)  # extended resource -> class

    @classmethod
    def read(cls, api: FakeKubeAPI) -> DraPass | None:
        if (RESOURCE, "resourceclaims") not in api.resources:
            return None
        found = cls(api)
        for item in api.objects(RESOURCE, "deviceclasses", copy=False):
            name = item["metadata"]["name"]
            found.classes[name] = item
            found.extended_classes[IMPLICIT_EXTENDED_PREFIX + name] = name
        for name, item in sorted(found.classes.items()):
            mapped = (item.get("spec") or {}).get("extendedResourceName")
            if mapped:
                found.extended_classes.setdefault(mapped, name)
        newest: dict[tuple[str, str], int] = {}
        slices = api.objects(RESOURCE, "resourceslices", copy=False)
        for item in slices:
            spec = item.get("spec") or {}
            pool = spec.get("pool") or {}
            key = (spec.get("driver"), pool.get("name"))
            newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
        for item in slices:
            spec = item.get("spec") or {}
            pool = spec.get("pool") or {}
            if int(pool.get("generation") or 0) != newest[(spec.get("driver"), pool.get("name"))]:
                continue  # an older generation, being replaced
            for data in spec.get("devices") or ():
                node = data.get("nodeName") or spec.get("nodeName")
                if not node:
                    continue  # not node-local (allNodes, a node selector): not modelled
                device = Device(spec["driver"], pool["name"], data["name"], node, data)
                found.devices.setdefault(node, []).append(device)
                found.by_key[device.key] = device
        for item in api.objects(RESOURCE, "resourceclaims", copy=False):
            found.claims[(item["metadata"]["namespace"], item["metadata"]["name"])] = item
            found.taken.update(_allocated_keys(item))
        return found

    # -- PreFilter -----------------------------------------------------------------------------------
    def needs(self, pod: dict) -> PodNeeds | str:
        """The pod's claims and DRA-backable extended resources, or why it cannot be scheduled at all."""
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        ns = meta["namespace"]
        made = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()}
        found = PodNeeds()
        for entry in spec.get("resourceClaims") or ():
            name = entry.get("resourceClaimName") or made.get(entry.get("name"))
            if not name:
                if entry.get("resourceClaimTemplateName"):
                    return f'waiting for resource claim of pod claim "{entry.get("name")}" to be created'
                return f'pod claim "{entry.get("name")}" names no claim'
            claim = self.claims.get((ns, name))
            if claim is None:
                return f'resourceclaim "{name}" not found'
            if entry.get("resourceClaimTemplateName") and not any(
                    r.get("uid") == meta.get("uid") for r in claim["metadata"].get("ownerReferences") or ()):
                return f"ResourceClaim {name} was not created for the pod"
            found.claims.append(claim)
        if not status.get("extendedResourceClaimStatus"):
            for index, container in enumerate(spec.get("containers") or ()):
                resources = container.get("resources") or {}
                asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
                for number, (resource, quantity) in enumerate(sorted(asked.items())):
                    device_class = self.extended_classes.get(resource)
                    count = int(Decimal(parse_quantity(quantity)))
                    if device_class is None or count <= 0:
                        continue
                    _, total, mappings = found.extended.get(resource, (device_class, 0, []))
                    mappings.append((container.get("name", ""), f"container-{index}-request-{number}"))
                    found.extended[resource] = (device_class, total + count, mappings)
        try:
            for claim in found.claims:
                if not (claim.get("status") or {}).get("allocation"):
                    self._requests(claim)  # an unreadable request is refused before any node is tried
        except (UnsupportedSelector, LookupError) as err:
            return str(err)
        return found

    def exempt(self, needs: PodNeeds | None, node: dict) -> frozenset[str]:
        """The extended resources DRA serves on ``node`` (not in its allocatable): not NodeResourcesFit's."""
        if not needs or not needs.extended:
            return frozenset()
        offered = (node.get("status") or {}).get("allocatable") or {}
        return frozenset(r for r in needs.extended if r not in offered)

    def _requests(self, claim: dict) -> list[_Request]:
        out = []
        name = claim["metadata"]["name"]
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
            out.append(self._request(name, request))
        if ((claim.get("spec") or {}).get("devices") or {}).get("constraints"):
            raise UnsupportedSelector(f"claim {name}: constraints are not modelled by the fake")
        return out

    def _request(self, claim: str, request: dict) -> _Request:
        exactly = request.get("exactly")
        if not isinstance(exactly, dict):
            raise UnsupportedSelector(f"claim {claim}: request {request.get('name')}: firstAvailable is not modelled "
                                      "by the fake")
        device_class = exactly.get("deviceClassName")
        found = self.classes.get(device_class)
        if found is None:
            raise LookupError(f'request {request.get("name")}: device class "{device_class}" does not exist')
        mode = exactly.get("allocationMode") or "ExactCount"
        if mode not in ("ExactCount", "All"):
            raise UnsupportedSelector(f"claim {claim}: allocationMode {mode}")
        selectors = _selectors(found.get("spec") or {}) + _selectors(exactly)
        return _Request(claim, request.get("name", ""), device_class, mode, int(exactly.get("count") or 1), selectors)

    # -- Filter --------------------------------------------------------------------------------------
    def allocate(self, pod: dict, needs: PodNeeds, node: dict) -> Plan | str:
        """The devices of ``node`` the pod's claims get, or the reason this node cannot give them."""
        name = node["metadata"]["name"]
        plan = Plan(name)
        requests: list[_Request] = []
        for claim in needs.claims:
            allocated = _allocated_keys(claim)
            if allocated:
                if any((self.by_key.get(k) is None or self.by_key[k].node != name) for k in allocated):
                    return NOT_ON_NODE
                if not any(r.get("uid") == pod["metadata"].get("uid") for r in
                           (claim.get("status") or {}).get("reservedFor") or ()):
                    plan.reserve.append(claim["metadata"]["name"])
                continue
            requests += self._requests(claim)
        for resource in sorted(self.exempt(needs, node)):
            device_class, count, mappings = needs.extended[resource]
            request_name = mappings[0][1]
            requests.append(self._request("", {"name": request_name, "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}}))
            plan.extended_requests.append({"name": request_name, "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}})
            plan.mappings += [{"containerName": c, "resourceName": resource, "requestName": r} for c, r in mappings]
        free = [d for d in self.devices.get(name, ()) if d.key not in self.taken]
        try:
            chosen = self._search(requests, free, self.devices.get(name, []))
        except CelRuntimeError as err:
            return f"CEL runtime error: {err}"
        except UnsupportedSelector as err:
            return str(err)
        if chosen is None:
            return CANNOT_ALLOCATE
        for request, device in zip(_slots(requests), chosen, strict=True):
            if request.claim:
                plan.results.setdefault(request.claim, []).append((request.name, device))
            else:
                plan.extended.append((request.name, device))
        return plan

    def _search(self, requests: list[_Request], free: list[Device], every: list[Device]) -> list[Device] | None:
        """Devices for every slot (a request's ``count`` slots; All: its matching devices), backtracking."""
        slots: list[tuple[_Request, list[Device]]] = []
        for request in requests:
            matching = [d for d in free if _matches(request, d)]
            if request.mode == "All":
                everything = [d for d in every if _matches(request, d)]
                if not everything or len(everything) != len(matching):
                    return None  # All: every matching device, none of them in use
                request.count = len(everything)
            slots += [(request, matching)] * request.count
        chosen: list[Device] = []

        def fill(i: int) -> bool:
            if i == len(slots):
                return True
            request, candidates = slots[i]
            start = 0
            if i and slots[i - 1][0] is request:  # the same request's devices in order: no permutations
                start = candidates.index(chosen[-1]) + 1
            for device in candidates[start:]:
                if device in chosen:
                    continue
                chosen.append(device)
                if fill(i + 1):
                    return True
                chosen.pop()
            return False

        return list(chosen) if fill(0) else None

    # -- PreBind -------------------------------------------------------------------------------------
    def commit(self, call: Callable[..., dict], pod: dict, plan: Plan) -> None:
        """Write the allocation and the reservation (``call``: the scheduler's API call), before binding."""
        meta = pod["metadata"]
        ns = meta["namespace"]
        reserve = {"resource": "pods", "name": meta["name"], "uid": meta.get("uid")}
        selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                            "values": [plan.node]}]}]}
        for claim_name, results in plan.results.items():
            claim = self.claims[(ns, claim_name)]
            status = {"allocation": {"devices": {"results": [
                {"request": request, "driver": d.driver, "pool": d.pool, "device": d.name} for request, d in results]},
                "nodeSelector": selector},
                "reservedFor": [*((claim.get("status") or {}).get("reservedFor") or ()), reserve]}
            self.claims[(ns, claim_name)] = call("PATCH", f"{_claims_path(ns, claim_name)}/status", {"status": status},
                                                 "application/merge-patch+json")
            self.taken.update(d.key for _, d in results)
        for claim_name in plan.reserve:
            claim = self.claims[(ns, claim_name)]
            reserved = [*((claim.get("status") or {}).get("reservedFor") or ()), reserve]
            self.claims[(ns, claim_name)] = call("PATCH", f"{_claims_path(ns, claim_name)}/status",
                                                 {"status": {"reservedFor": reserved}}, "application/merge-patch+json")
        if plan.extended:
            name = generated_name(f"{meta['name']}-extended-resources-", f"{meta.get('uid')}/extended")
            call("POST", _claims_path(ns), {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": ns, "ownerReferences": [_pod_owner(pod)],
                             "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"}},
                "spec": {"devices": {"requests": plan.extended_requests}}})
            status = {"allocation": {"devices": {"results": [
                {"request": request, "driver": d.driver, "pool": d.pool, "device": d.name} for request, d in plan.extended]},
                "nodeSelector": selector}, "reservedFor": [reserve]}
            self.claims[(ns, name)] = call("PATCH", f"{_claims_path(ns, name)}/status", {"status": status},
                                           "application/merge-patch+json")
            self.taken.update(d.key for _, d in plan.extended)
            call("PATCH", f"{_pod_path(pod)}/status", {"status": {"extendedResourceClaimStatus": {
                "resourceClaimName": name, "requestMappings": plan.mappings}}}, "application/merge-patch+json")


def _slots(requests: list[_Request]) -> list[_Request]:
    return [r for r in requests for _ in range(r.count)]


def _matches(request: _Request, device: Device) -> bool:
    """The class's selectors, then the request's, in order; the first false ends it (as the allocator)."""
    if device.data.get("consumesCounters"):
        raise UnsupportedSelector(f"device {device.pool}/{device.name} consumes counters: partitionable devices "
                                  "are not modelled by the fake")
    return all(selector(device.data, device.driver) for selector in request.selectors)
