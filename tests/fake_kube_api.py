"""A fake Kubernetes API server that speaks the real REST protocol, for tests and the bench.

Over 400 lines: one server, the routing of every verb and subresource the fake speaks; the rules
it enforces live beside it (``fake_kube_pod_rules``, ``fake_kube_patch``, ``fake_kube_webhooks``).

There is no kube-apiserver here, so the official ``kubernetes`` client is driven UNMODIFIED over
real HTTP against this small threaded server. It keeps JSON objects per resource path and answers
the way the API server does for what gpuwarden uses:
- ``/api/v1/...`` and ``/apis/GROUP/VERSION/...``, cluster-scoped and namespaced, list across
  namespaces; list with ``limit``/``continue`` paging, ``labelSelector`` (k=v, k!=v, k) and
  ``fieldSelector`` (dotted.path=v, dotted.path!=v);
- GET, POST (409 AlreadyExists), PUT (409 Conflict on a stale ``metadata.resourceVersion``),
  PATCH as JSON merge patch for ``merge-patch+json`` and ``strategic-merge-patch+json`` (lists are
  replaced, which is what the fields gpuwarden patches do, except a pod's ``schedulingGates``,
  merged by name as the real strategic merge does) and RFC 6902 ``json-patch+json``, with the same
  optimistic-concurrency check (a patched ``metadata.resourceVersion`` must be the current one), DELETE;
- a Job's pod template is immutable except its scheduling directives while the Job is suspended
  and has no ``status.startTime`` (KEP-2926), a running Job keeps its ``startTime``, and node
  field selectors name ``metadata.name`` with one value: anything else is the API server's 422;
  ``.../status`` changes status only;
- ``pods/NAME/eviction``: honours PodDisruptionBudgets (``status.disruptionsAllowed`` 0 -> 429),
  deletes the pod otherwise;
- pods follow the API server's validation (``tests/fake_kube_pod_rules.py``): scheduling gates may
  only be removed, a gated pod's node affinity / nodeSelector may only be tightened, the rest of the
  spec is immutable, ``spec.nodeName`` is set by ``POST pods/NAME/binding`` (409 while gated);
  ``graceful_deletion`` keeps a deleted running pod terminating for its grace period, as a kubelet
  does (off by default: most tests want it gone at once);
  a created pod or Job needs a lowercase RFC 1123 name (a Job's at most 63 characters) and
  containers, a Job's template ``restartPolicy`` Never or OnFailure;
  creation sets ``metadata.creationTimestamp`` from ``clock`` (a test may make it virtual) and, as
  the Priority admission plugin, ``spec.priority`` from the PriorityClass (403 for an unknown one);
- pod creation calls the stored MutatingWebhookConfigurations over HTTPS and applies their
  JSONPatch (``tests/fake_kube_webhooks.py``); ``webhook_services`` maps a webhook's service to
  the test's ``https://127.0.0.1:PORT``, ``webhook_calls`` records each call;
- a resource nobody registered answers 404 (a CRD that is not installed); ``with_kueue()`` and
  ``with_dra()`` (resource.k8s.io/v1: ResourceSlices and DeviceClasses cluster-scoped,
  ResourceClaims and ResourceClaimTemplates namespaced) serve those groups (DRA's controllers, claims
  made from templates and allocated on binding, are ``tests/fake_kube_dra_alloc.py``'s);
- ``huge_list``: a list of any length (millions) served page by page and never stored, each item
  made when its page is asked for (a cluster too large for the client to hold);
- injectable faults per method and path: any HTTP status, a JSON answer that is not an object, or a hang longer than the client's
  timeout; with ``retry_after`` the Status carries ``details.retryAfterSeconds`` and, as
  kube-apiserver writes it from there, a ``Retry-After`` header (a 429 from API Priority and Fairness).
Every request is recorded (method, path, query, content type, body, and ``user``: "" for HTTP
clients, the actor's name for the in-process stand-ins of kube-scheduler and the Job controller,
which go through ``handle`` and so through the same rules) so a test can assert the exact call the
client made.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from fake_kube_pod_rules import (bind, binding_refusal, invalid_status, job_create_causes, job_update_refusal,
                                 pod_create_causes, pod_update_causes, priority_admission)
from fake_kube_patch import updated_object
from fake_kube_webhooks import WebhookCall, call_webhooks

CLUSTER_SCOPED = {"nodes", "namespaces", "priorityclasses", "clusterqueues", "workloadpriorityclasses",
                  "mutatingwebhookconfigurations", "resourceslices", "deviceclasses"}
KINDS = {"nodes": "Node", "namespaces": "Namespace", "pods": "Pod", "jobs": "Job", "events": "Event",
         "poddisruptionbudgets": "PodDisruptionBudget", "priorityclasses": "PriorityClass", "leases": "Lease",
         "workloads": "Workload", "clusterqueues": "ClusterQueue", "workloadpriorityclasses": "WorkloadPriorityClass",
         "jobsets": "JobSet", "mutatingwebhookconfigurations": "MutatingWebhookConfiguration", "secrets": "Secret",
         "configmaps": "ConfigMap", "services": "Service", "resourceslices": "ResourceSlice",
         "deviceclasses": "DeviceClass", "resourceclaims": "ResourceClaim",
         "resourceclaimtemplates": "ResourceClaimTemplate"}
CORE = "api/v1"
BATCH = "apis/batch/v1"
POLICY = "apis/policy/v1"
SCHEDULING = "apis/scheduling.k8s.io/v1"
COORDINATION = "apis/coordination.k8s.io/v1"
KUEUE = "apis/kueue.x-k8s.io/v1beta1"
JOBSET = "apis/jobset.x-k8s.io/v1alpha2"
ADMISSION = "apis/admissionregistration.k8s.io/v1"
RESOURCE = "apis/resource.k8s.io/v1"  # Dynamic Resource Allocation, GA in Kubernetes 1.34
DEFAULT_RESOURCES = [(CORE, "nodes"), (CORE, "namespaces"), (CORE, "pods"), (CORE, "events"), (BATCH, "jobs"),
                     (POLICY, "poddisruptionbudgets"), (SCHEDULING, "priorityclasses"), (COORDINATION, "leases"),
                     (ADMISSION, "mutatingwebhookconfigurations"), (CORE, "secrets"), (CORE, "configmaps"),
                     (CORE, "services")]
KUEUE_RESOURCES = [(KUEUE, "workloads"), (KUEUE, "clusterqueues"), (KUEUE, "workloadpriorityclasses")]
# not served by default: a cluster older than 1.34 answers 404 for resource.k8s.io/v1
DRA_RESOURCES = [(RESOURCE, "resourceslices"), (RESOURCE, "deviceclasses"), (RESOURCE, "resourceclaims"),
                 (RESOURCE, "resourceclaimtemplates")]


def iso(seconds: float) -> str:
    """Kubernetes' timestamp format (RFC 3339, UTC, whole seconds)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client closing its kept-alive connection is normal
            super().handle_error(request, client_address)


@dataclass
class Fault:
    method: str
    path: re.Pattern
    status: int | str  # an HTTP status, "timeout" (hang for ``hang_seconds``) or "not-an-object" (200, a JSON list)
    times: int = 1
    hang_seconds: float = 3.0
    retry_after: int | None = None  # seconds: the answer's details.retryAfterSeconds and Retry-After header


@dataclass
class Request:
    method: str
    path: str
    query: dict
    content_type: str
    body: object
    user: str = ""


@dataclass
class FakeKubeAPI:
    resources: set = field(default_factory=lambda: set(DEFAULT_RESOURCES))
    store: dict = field(default_factory=dict)  # (prefix, plural) -> {(namespace, name): object}
    requests: list = field(default_factory=list)
    faults: list = field(default_factory=list)
    webhook_services: dict = field(default_factory=dict)  # (namespace, service name) -> "https://127.0.0.1:PORT"
    webhook_calls: list[WebhookCall] = field(default_factory=list)
    clock: Callable[[], float] = field(default_factory=lambda: time.time)  # seconds since the epoch
    graceful_deletion: bool = False  # True: a running pod's DELETE marks it terminating (see _delete)
    huge_lists: dict = field(default_factory=dict)  # (prefix, plural) -> how many objects its list has (huge_list)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._version = 1
        self._server: ThreadingHTTPServer | None = None

    # -- test set-up ----------------------------------------------------------------------------
    def with_kueue(self) -> FakeKubeAPI:
        self.resources |= set(KUEUE_RESOURCES)
        return self

    def with_dra(self) -> FakeKubeAPI:
        """Serve Dynamic Resource Allocation (resource.k8s.io/v1), as a 1.34+ cluster does."""
        self.resources |= set(DRA_RESOURCES)
        return self

    def add(self, prefix: str, plural: str, obj: dict) -> dict:
        with self._lock:
            self.resources.add((prefix, plural))
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta.setdefault("uid", f"uid-{meta['name']}")
            meta.setdefault("creationTimestamp", "2026-11-23T00:00:00Z")
            meta["resourceVersion"] = self._next_version()
            self.store.setdefault((prefix, plural), {})[(meta.get("namespace", ""), meta["name"])] = obj
            return obj

    def huge_list(self, prefix: str, plural: str, count: int) -> None:
        """``plural``'s list has ``count`` objects, each made (``NAME-000000042``, metadata only) when
        its page is served; nothing is stored. A list without ``limit`` makes them all: ask with one."""
        with self._lock:
            self.resources.add((prefix, plural))
            self.huge_lists[(prefix, plural)] = count

    def get(self, prefix: str, plural: str, name: str, namespace: str = "") -> dict | None:
        with self._lock:
            return copy.deepcopy(self.store.get((prefix, plural), {}).get((namespace, name)))

    def inject(self, method: str, path_regex: str, status: int | str, times: int = 1, hang_seconds: float = 3.0,
               retry_after: int | None = None) -> None:
        """The next ``times`` requests matching answer ``status``; ``retry_after`` (seconds) adds the
        server's Retry-After (e.g. ``inject("PATCH", "/nodes/n0$", 429, times=2, retry_after=7)``)."""
        self.faults.append(Fault(method.upper(), re.compile(path_regex), status, times, hang_seconds, retry_after))

    def calls(self, method: str | None = None, path_regex: str = "", user: str | None = None) -> list[Request]:
        pattern = re.compile(path_regex)
        return [r for r in self.requests if (method is None or r.method == method) and pattern.search(r.path)
                and (user is None or r.user == user)]

    def objects(self, prefix: str, plural: str, copy: bool = True) -> list[dict]:
        """The stored objects of one resource, in (namespace, name) order: copies, or with ``copy=False`` the
        stored objects themselves, which the caller must only read (the stand-ins' every-step reads: the
        server replaces an object on each write and never changes one in place, so they stay a snapshot)."""
        with self._lock:
            found = [o for _, o in sorted(self.store.get((prefix, plural), {}).items())]
        return json.loads(json.dumps(found)) if copy else found

    def act(self, user: str, method: str, path: str, body: dict | None = None,
            content_type: str = "application/json") -> dict:
        """A request by an in-process actor (kube-scheduler, a controller): its answer, RuntimeError when refused."""
        status, answer = self.handle(method, path, content_type, json.dumps(body).encode() if body is not None else b"",
                                     user=user)
        if status >= 300:
            raise RuntimeError(f"{method} {path} -> {status}: {answer.get('message')}")
        return json.loads(json.dumps(answer))  # a copy: the answer may be the stored object

    def now_iso(self) -> str:
        return iso(self.clock())

    # -- serving ------------------------------------------------------------------------------------
    def start(self) -> FakeKubeAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, body = api.handle(self.command, self.path, self.headers.get("Content-Type", ""), raw)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    retry_after = _retry_after_of(body)
                    if retry_after is not None:  # kube-apiserver's writer sets it from the Status's details
                        self.send_header("Retry-After", str(retry_after))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # The handler sends headers and body apart: with Nagle's algorithm the body waits for the
        # client's delayed ACK (~40 ms a request). Go servers, kube-apiserver's too, set TCP_NODELAY;
        # accepted sockets inherit it from the listening one.
        self._server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def kubeconfig(self, path) -> str:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        }))
        return str(path)

    # -- the protocol -------------------------------------------------------------------------------
    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    @staticmethod
    def _status(code: int, reason: str, message: str) -> tuple[int, dict]:
        return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                      "reason": reason, "code": code}

    def handle(self, method: str, raw_path: str, content_type: str, raw: bytes, user: str = "") -> tuple[int, dict]:
        """One API request; the HTTP server calls it, and so do the in-process stand-ins (naming ``user``)."""
        url = urlparse(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return self._status(400, "BadRequest", "body is not JSON")
        with self._lock:
            self.requests.append(Request(method, url.path, query, content_type.split(";")[0], body, user))
            fault = next((f for f in self.faults if f.times > 0 and f.method in (method, "*") and f.path.search(url.path)), None)
            if fault:
                fault.times -= 1
        if fault and fault.status == "timeout":
            time.sleep(fault.hang_seconds)
            return self._status(504, "Timeout", "hung")
        if fault and fault.status == "not-an-object":  # valid JSON of the wrong shape (a broken proxy, say)
            return 200, ["not", "an", "object"]  # type: ignore[return-value]
        if fault:
            reasons = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid", 429: "TooManyRequests"}
            code, answer = self._status(int(fault.status), reasons.get(int(fault.status), "InternalError"),
                                        f"injected {fault.status} for {method} {url.path}")
            if fault.retry_after is not None:
                answer["details"] = {"retryAfterSeconds": fault.retry_after}
            return code, answer
        parsed = self._parse(url.path)
        if method == "POST" and parsed and parsed[:2] == (CORE, "pods") and parsed[3] is None and isinstance(body, dict):
            body, refusal = self._admit(parsed[2], body, user)  # outside the lock: a webhook may call back
            if refusal:
                return refusal
        with self._lock:
            return self._route(method, url.path, query, content_type.split(";")[0], body)

    def _admit(self, namespace: str, pod: dict, user: str) -> tuple[dict, tuple[int, dict] | None]:
        pod = copy.deepcopy(pod)
        pod.setdefault("metadata", {})["namespace"] = namespace
        with self._lock:
            configurations = [copy.deepcopy(c) for c in self.store.get((ADMISSION, "mutatingwebhookconfigurations"), {}).values()]
            ns = copy.deepcopy(self.store.get((CORE, "namespaces"), {}).get(("", namespace)))
            services = dict(self.webhook_services)
            classes = {c["metadata"]["name"]: c for c in self.store.get((SCHEDULING, "priorityclasses"), {}).values()}
        forbidden = priority_admission(pod, classes)  # the built-in Priority plugin runs before the webhooks
        if forbidden:
            return pod, self._status(403, "Forbidden", forbidden)
        calls: list[WebhookCall] = []
        pod, refusal = call_webhooks(configurations, ns, pod, services, user, calls)
        with self._lock:
            self.webhook_calls.extend(calls)
        return pod, refusal

    def _parse(self, path: str):
        parts = [p for p in path.strip("/").split("/") if p]
        if parts[:2] == ["api", "v1"]:
            prefix, rest = CORE, parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            prefix, rest = "/".join(parts[:3]), parts[3:]
        else:
            return None
        namespace, name, sub = "", None, None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, plural = rest[1], rest[2]
            name = rest[3] if len(rest) > 3 else None
            sub = rest[4] if len(rest) > 4 else None
        elif rest:
            plural = rest[0]
            name = rest[1] if len(rest) > 1 else None
            sub = rest[2] if len(rest) > 2 else None
        else:
            return None
        return prefix, plural, namespace, name, sub

    def _route(self, method, path, query, content_type, body):
        parsed = self._parse(path)
        if parsed is None or (parsed[0], parsed[1]) not in self.resources:
            return self._status(404, "NotFound", f"the server could not find the requested resource ({path})")
        prefix, plural, namespace, name, sub = parsed
        objects = self.store.setdefault((prefix, plural), {})
        if (prefix, plural, sub, method) == (CORE, "pods", "binding", "POST"):
            return self._bind(objects, (namespace, name), body)
        if plural in CLUSTER_SCOPED:
            namespace = ""
        if name is None:
            if method == "GET":
                return self._list(prefix, plural, objects, namespace, query)
            if method == "POST":
                return self._create(prefix, plural, objects, namespace, body)
            return self._status(405, "MethodNotAllowed", method)
        key = (namespace, name)
        current = objects.get(key)
        if sub == "eviction" and plural == "pods" and method == "POST":
            return self._evict(objects, key, body)
        if current is None:
            return self._status(404, "NotFound", f'{plural} "{name}" not found')
        if method == "GET":
            return 200, current
        if method == "DELETE":
            return self._delete(plural, objects, key, query, body)
        if method in ("PUT", "PATCH"):
            updated = updated_object(method, content_type, current, body, plural)
            if isinstance(updated, tuple):
                return self._status(*updated)
            sent = (updated if method == "PATCH" else body or {}).get("metadata", {}).get("resourceVersion")
            if sent and sent != current["metadata"]["resourceVersion"]:
                return self._status(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object '
                                                      "has been modified; please apply your changes to the latest version")
            if sub == "status":  # the status subresource changes status only
                updated = {**copy.deepcopy(current), "status": updated.get("status") or {}}
            elif plural == "pods" and "status" in current:  # and a pod's own update never changes its status
                updated["status"] = copy.deepcopy(current["status"])
            refused = job_update_refusal(current, updated) if (prefix, plural) == (BATCH, "jobs") else None
            if refused:
                return self._status(422, "Invalid", f'Job.batch "{name}" is invalid: {refused}')
            causes = pod_update_causes(current, updated) if (prefix, plural) == (CORE, "pods") and sub != "status" else []
            if causes:
                return 422, invalid_status("Pod", name, causes)
            updated.setdefault("metadata", {}).update({k: current["metadata"][k] for k in ("name", "uid") if k in current["metadata"]})
            if namespace:
                updated["metadata"]["namespace"] = namespace
            updated["metadata"]["resourceVersion"] = self._next_version()
            objects[key] = updated
            return 200, updated
        return self._status(405, "MethodNotAllowed", method)

    def _list(self, prefix, plural, objects, namespace, query):
        if (prefix, plural) in self.huge_lists:
            return self._huge_page(prefix, plural, query)
        items = [o for (ns, _), o in sorted(objects.items()) if not namespace or ns == namespace]
        items = [o for o in items if _labels_match(o, query.get("labelSelector", "")) and
                 _fields_match(o, query.get("fieldSelector", ""))]
        start = int(base64.b64decode(query["continue"]).decode()) if query.get("continue") else 0
        limit = int(query.get("limit") or 0)
        page = items[start:start + limit] if limit else items[start:]
        meta = {"resourceVersion": str(self._version)}
        if limit and start + limit < len(items):
            meta["continue"] = base64.b64encode(str(start + limit).encode()).decode()
        version = "v1" if prefix == CORE else prefix.split("/", 1)[1]
        return 200, {"kind": KINDS.get(plural, plural) + "List", "apiVersion": version, "metadata": meta, "items": page}

    def _huge_page(self, prefix, plural, query):
        count = self.huge_lists[(prefix, plural)]
        start = int(base64.b64decode(query["continue"]).decode()) if query.get("continue") else 0
        end = min(count, start + int(query.get("limit") or count))
        singular = KINDS.get(plural, plural).lower()
        items = [{"metadata": {"name": f"{singular}-{i:09d}", "uid": f"uid-{i}", "resourceVersion": "1"}}
                 for i in range(start, end)]
        meta = {"resourceVersion": str(self._version)}
        if end < count:
            meta["continue"] = base64.b64encode(str(end).encode()).decode()
        version = "v1" if prefix == CORE else prefix.split("/", 1)[1]
        return 200, {"kind": KINDS.get(plural, plural) + "List", "apiVersion": version, "metadata": meta, "items": items}

    def _create(self, prefix, plural, objects, namespace, body):
        body = copy.deepcopy(body or {})
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{self._version}"
        if namespace:
            meta["namespace"] = namespace
        key = (namespace, meta.get("name"))
        if key in objects:
            return self._status(409, "AlreadyExists", f'{plural} "{meta.get("name")}" already exists')
        kind = {(CORE, "pods"): "Pod", (BATCH, "jobs"): "Job.batch"}.get((prefix, plural))
        causes = (pod_create_causes(body) if kind == "Pod" else job_create_causes(body)) if kind else []
        if causes:
            return 422, invalid_status(kind, meta["name"], causes)
        meta["resourceVersion"] = self._next_version()
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("creationTimestamp", self.now_iso())
        objects[key] = body
        return 201, body

    def _bind(self, pods, key, body):
        """``POST pods/NAME/binding``: what kube-scheduler calls; the only way to set spec.nodeName."""
        pod = pods.get(key)
        if pod is None:
            return self._status(404, "NotFound", f'pods "{key[1]}" not found')
        target = (body or {}).get("target") or {}
        if target.get("kind", "Node") != "Node" or not target.get("name"):
            return self._status(400, "BadRequest", "binding target must name a Node (target.kind Node, target.name)")
        refused = binding_refusal(pod)
        if refused:
            return self._status(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{key[1]}": {refused}')
        bound = bind(pod, target["name"], self.now_iso())
        bound["metadata"]["resourceVersion"] = self._next_version()
        pods[key] = bound
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _evict(self, pods, key, body):
        pod = pods.get(key)
        if pod is None:
            return self._status(404, "NotFound", f'pods "{key[1]}" not found')
        budgets = self.store.get((POLICY, "poddisruptionbudgets"), {})
        for (ns, pdb_name), pdb in sorted(budgets.items()):
            selector = pdb.get("spec", {}).get("selector", {}).get("matchLabels", {})
            labels = pod.get("metadata", {}).get("labels", {})
            if ns == key[0] and selector and all(labels.get(k) == v for k, v in selector.items()):
                if (pdb.get("status") or {}).get("disruptionsAllowed", 0) <= 0:
                    return self._status(429, "TooManyRequests",
                                        "Cannot evict pod as it would violate the pod's disruption budget.")
                pdb = copy.deepcopy(pdb)  # stored objects are replaced, never changed in place (see objects)
                pdb["status"]["disruptionsAllowed"] -= 1
                budgets[(ns, pdb_name)] = pdb
        self._delete("pods", pods, key, {}, (body or {}).get("deleteOptions"))
        return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    def _delete(self, plural, objects, key, query, body):
        """With ``graceful_deletion``, a pod running on a node gets ``deletionTimestamp`` (now + its grace period)
        and stays, holding its node's resources, until the kubelet stand-in deletes it with grace 0."""
        pod = objects[key]
        grace = (body or {}).get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        running = (pod.get("spec") or {}).get("nodeName") and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        if not (self.graceful_deletion and plural == "pods" and running and int(grace) > 0):
            del objects[key]
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}
        if not pod["metadata"].get("deletionTimestamp"):
            pod = copy.deepcopy(pod)
            pod["metadata"].update({"deletionTimestamp": iso(self.clock() + int(grace)), "deletionGracePeriodSeconds":
                                    int(grace), "resourceVersion": self._next_version()})
            objects[key] = pod
        return 200, pod



def _retry_after_of(body) -> int | None:
    """A Status's ``details.retryAfterSeconds`` (what kube-apiserver turns into the Retry-After header)."""
    if isinstance(body, dict) and body.get("kind") == "Status" and isinstance(body.get("details"), dict):
        seconds = body["details"].get("retryAfterSeconds")
        return seconds if isinstance(seconds, int) and seconds > 0 else None
    return None


def _labels_match(obj, selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(obj, selector: str) -> bool:
    def value(path):
        node = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return "" if node is None else str(node)

    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if value(k) == v:
                return False
        else:
            k, v = term.split("=", 1)
            if value(k.rstrip("=")) != v:
                return False
    return True
