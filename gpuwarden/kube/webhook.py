"""The mutating admission webhook that puts GPU pods behind gpuwarden's scheduling gate.

:func:`admission_response` is a pure function from an AdmissionReview v1 request to its response:
a pod CREATE asking for a GPU gets the gate ``gpuwarden.io/admission`` as a base64 JSONPatch, so
kube-scheduler leaves it alone until gpuwarden's scheduler admits it (``fleet/object_names.py``).
Left ungated: pods already gated, Kueue's pods (its label or gate), pods asking no GPU, DaemonSet
and static (mirror) pods, pods created bound (``spec.nodeName``: the API server refuses gates on
them) and pods naming another scheduler. It never refuses a pod: a review it cannot read is
answered "allowed, unchanged" (200) with a warning line, never a 500 or a hang, so a broken request
never blocks pod creation (the chart's ``failurePolicy: Ignore`` covers an outage the same way).
Cannot read, as one rule: a body not JSON (absurd nesting, a 5,000-digit number), of no usable
length, past ``max_body_bytes`` or not all there within ``timeout_seconds`` (one deadline for the
body, however it trickles); a field the decision reads of the wrong JSON type at any depth
(:data:`REVIEW_SHAPE`); anything else that fails while deciding.

:func:`serve_webhook` runs the HTTPS server (stdlib ``http.server`` + ``ssl``, a thread per
connection, a bounded body, a per-connection timeout) on ``/mutate-pods`` and ``/healthz``. Its
certificate is read from ``tls.crt`` / ``tls.key`` in a folder (``webhook_tls.py``): without a usable
pair it refuses to start (one line, exit 2 at the CLI); a rotation is reloaded without a restart.
:class:`WebhookService` is what the scheduler starts and stops: the server plus, without
cert-manager, the periodic certificate refresh that keeps those files current.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Container, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuwarden.fleet.clock import SYSTEM_CLOCK, Clock

from .api import Json, KubeFailure
from .inventory_nodes import GPU, MIG_PREFIX, SHARED_GPU
from .gates import ADMISSION_GATE, KUEUE_QUEUE_LABEL, scheduling_gates
from .webhook_shape import shape_problem
from .webhook_tls import CERT_FILE, KEY_FILE, ReloadingTLS, WebhookCertificateError

__all__ = ["CERT_FILE", "KEY_FILE", "ReloadingTLS", "WebhookCertificateError", "WebhookService", "serve_webhook"]

log = logging.getLogger("gpuwarden.kube.webhook")

ADMISSION_API_VERSION = "admission.k8s.io/v1"
GPU_RESOURCES = (GPU, SHARED_GPU)
MIG_RESOURCE_PREFIX = MIG_PREFIX
KUEUE_GATE_PREFIX = "kueue.x-k8s.io/"  # Kueue's admission gate and its topology gate
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"  # the kubelet's copy of a static pod
DEFAULT_SCHEDULER = "default-scheduler"
MUTATE_PATH = "/mutate-pods"
HEALTH_PATH = "/healthz"
DRAIN_FACTOR = 4  # a body past the bound is read and dropped up to this many bounds, so its sender reads the answer


# -- the decision ------------------------------------------------------------------------------------

def _asks_gpu(quantity: object) -> bool:
    """True unless the quantity is zero ("0", 0, "0m"); an unreadable one counts as asking."""
    text = str(quantity).strip().rstrip("m")
    try:
        return float(text) != 0
    except ValueError:
        return True


def requests_gpu(pod: Mapping[str, Any]) -> bool:
    """Whether any container or init container requests or limits a whole, shared or MIG GPU."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        for part in ("requests", "limits"):
            for name, quantity in (resources.get(part) or {}).items():
                if (name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX)) and _asks_gpu(quantity):
                    return True
    return False


NO_GPU = "asks no GPU"
ClaimsAskGpu = Callable[[str, Mapping[str, Any]], bool]  # (namespace, pod) -> its resource claims ask a GPU


def skip_reason(pod: Mapping[str, Any]) -> str | None:
    """Why this pod is left ungated, or None when it gets the gate."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    gates = scheduling_gates(pod)
    if ADMISSION_GATE in gates:
        return "already gated"
    if KUEUE_QUEUE_LABEL in (meta.get("labels") or {}) or any(g.startswith(KUEUE_GATE_PREFIX) for g in gates):
        return "managed by Kueue"
    if MIRROR_POD_ANNOTATION in (meta.get("annotations") or {}):
        return "static pod"
    if any(ref.get("kind") in ("DaemonSet", "Node") for ref in meta.get("ownerReferences") or ()):
        return "DaemonSet or static pod"
    if spec.get("nodeName"):
        return "created bound to a node"  # the API server refuses scheduling gates on a pod with nodeName
    if spec.get("schedulerName") not in (None, "", DEFAULT_SCHEDULER):
        return f"scheduled by {spec['schedulerName']}"
    if not requests_gpu(pod):
        return NO_GPU
    return None


def gate_patch(pod: Mapping[str, Any]) -> list[Json]:
    """The JSONPatch adding the gate after any gates the pod already has."""
    if isinstance((pod.get("spec") or {}).get("schedulingGates"), list):
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ADMISSION_GATE}}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]}]


def _review(uid: str, patch: list[Json] | None = None) -> Json:
    response: Json = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


def admission_response(review: object, namespaces: Container[str] | None = None,
                       claims_ask_gpu: ClaimsAskGpu | None = None) -> Json:
    """The AdmissionReview v1 response to ``review`` (parsed JSON); never raises, never refuses.

    ``namespaces``: the namespaces whose pods are gated; None trusts the webhook configuration's
    namespaceSelector (``gpuwarden.io/queue`` Exists) to send only those. ``claims_ask_gpu``: whether a
    pod asking no GPU resource gets GPUs through its DRA claims (:class:`.webhook_claims.GpuClaims`).
    """
    request = review.get("request") if isinstance(review, Mapping) else None
    if not isinstance(request, Mapping):
        log.warning("admission review without a request object: answered allowed, unchanged")
        return _review("")
    uid = request.get("uid")
    uid = uid if isinstance(uid, str) else ""
    problem = shape_problem(request)
    if problem:
        log.warning("admission review %s cannot be read (%s): allowed, unchanged", uid or "?", problem)
        return _review(uid)
    try:
        kind = (request.get("kind") or {}).get("kind")
        pod = request.get("object")
        if kind != "Pod" or request.get("operation") != "CREATE" or not isinstance(pod, Mapping):
            log.warning("admission review %s is not a pod CREATE (kind %r, operation %r): allowed, unchanged",
                        uid, kind, request.get("operation"))
            return _review(uid)
        namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or ""
        if namespaces is not None and namespace not in namespaces:
            return _review(uid)
        reason = skip_reason(pod)
        if reason == NO_GPU and claims_ask_gpu is not None and claims_ask_gpu(namespace, pod):
            reason = None  # its GPUs come through DRA claims: queued like any GPU pod
        name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName") or "?"
        if reason:
            log.debug("pod %s/%s left ungated: %s", namespace, name, reason)
            return _review(uid)
        log.info("pod %s/%s gated with %s", namespace, name, ADMISSION_GATE)
        return _review(uid, gate_patch(pod))
    except Exception as error:  # noqa: BLE001 whatever fails while deciding: the pod goes through unchanged
        log.warning("admission review %s cannot be read (%s: %s): allowed, unchanged", uid, type(error).__name__, error)
        return _review(uid)


def review_answer(body: bytes, namespaces: Container[str] | None = None, source: str = "",
                  claims_ask_gpu: ClaimsAskGpu | None = None) -> Json:
    """The response to a review's raw ``body``: allowed and unchanged (and a warning) for one that is
    not JSON, however: bad bytes, absurd nesting, a number too long to convert."""
    try:
        review: object = json.loads(body)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        log.warning("webhook body%s is not JSON (%s): allowed, unchanged", f" from {source}" if source else "",
                    str(error).splitlines()[0][:200])
        return _review("")
    return admission_response(review, namespaces, claims_ask_gpu)


# -- the HTTPS server -------------------------------------------------------------------------------------

class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], tls: ReloadingTLS, namespaces: Container[str] | None,
                 max_body_bytes: int, timeout_seconds: float, claims_ask_gpu: ClaimsAskGpu | None = None) -> None:
        self.tls, self.namespaces, self.claims_ask_gpu = tls, namespaces, claims_ask_gpu
        self.max_body_bytes, self.timeout_seconds = max_body_bytes, timeout_seconds
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept, then wrap with the current certificate; the handshake runs in the handler's thread."""
        sock, address = self.socket.accept()
        context = self.tls.context()
        if context is None:
            sock.close()
            raise OSError("no serving certificate yet")  # socketserver drops this connection and goes on
        sock.settimeout(self.timeout_seconds)
        return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("webhook connection from %s failed", client_address, exc_info=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall

    def setup(self) -> None:
        super().setup()  # the socket already carries the server's timeout (get_request)
        self.request.do_handshake()  # in this thread, bounded by that timeout

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("webhook %s: " + format, self.address_string(), *args)

    def _send(self, status: int, body: Json | str) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.split("?")[0] == HEALTH_PATH:
            self._send(200, "ok")
        else:
            self._send(404, f"not found; this server answers POST {MUTATE_PATH} and GET {HEALTH_PATH}")

    def _read_within(self, length: int, keep: bool = True) -> tuple[bytes, int]:
        """Up to ``length`` body bytes (kept, or dropped) and how many came, all within one deadline
        of ``timeout_seconds``: a body that trickles a byte a second ends there too."""
        deadline = time.monotonic() + self.server.timeout_seconds
        chunks: list[bytes] = []
        got = 0
        try:
            while got < length and (left := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left)
                chunk = self.rfile.read1(min(length - got, 1 << 16))
                if not chunk:
                    break
                got += len(chunk)
                if keep:
                    chunks.append(chunk)
        except OSError:  # the deadline (a timeout is an OSError), or the client went away
            pass
        finally:
            self.connection.settimeout(self.server.timeout_seconds)  # the answer's write is bounded as before
        return b"".join(chunks), got

    def _allow_unread(self, why: str, drain: int = 0) -> None:
        """Answer allowed, unchanged to a review not read (``why``), then drop up to ``drain`` body
        bytes so the sender gets to read the answer, and close the connection."""
        log.warning("webhook review from %s %s: allowed, unchanged", self.address_string(), why)
        self.close_connection = True
        self._send(200, _review(""))
        if drain:
            self._read_within(drain, keep=False)

    def do_POST(self) -> None:
        if self.path.split("?")[0] != MUTATE_PATH:
            self._send(404, f"not found; this server answers POST {MUTATE_PATH} and GET {HEALTH_PATH}")
            return
        bound = self.server.max_body_bytes
        text = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") or not (text or "").strip().isdigit():  # no length to read by
            self._allow_unread(f"with no usable Content-Length ({text!r}, Transfer-Encoding "
                               f"{self.headers.get('Transfer-Encoding')!r})")
            return
        length = int(text or "")
        if length > bound:
            self._allow_unread(f"of {length:,} bytes, past the {bound:,} read",
                               drain=length if length <= DRAIN_FACTOR * bound else 0)
            return
        body, got = self._read_within(length)
        if got < length:
            self._allow_unread(f"cut short: {got:,} of {length:,} bytes within {self.server.timeout_seconds:g} s")
            return
        try:
            answer = review_answer(body, self.server.namespaces, self.address_string(), self.server.claims_ask_gpu)
        except Exception as error:  # noqa: BLE001 never a 500: whatever fails, the pod goes through unchanged
            log.warning("webhook review from %s failed (%s): allowed, unchanged", self.address_string(), error)
            answer = _review("")
        self._send(200, answer)


def serve_webhook(cert_dir: str | Path, port: int = 9443, host: str = "0.0.0.0",
                  namespaces: Container[str] | None = None, max_body_bytes: int = 3 * 1024 * 1024,
                  timeout_seconds: float = 10.0, reload_check_seconds: float = 5.0,
                  claims_ask_gpu: ClaimsAskGpu | None = None) -> WebhookServer:
    """Start the admission webhook on ``host:port`` in a daemon thread and return the server.

    ``cert_dir`` holds ``tls.crt`` and ``tls.key`` (the mounted Secret); they are re-read when
    they change, at most every ``reload_check_seconds`` (a pair that stops loading keeps the last).
    ``max_body_bytes`` bounds a review (the API server's own request limit is 3 MiB);
    ``timeout_seconds`` bounds the handshake, each read or write of a connection and a review's
    whole body. ``port`` 0 picks a free one (``server.port``). Stop it with ``server.stop()``. The
    scheduler CLI calls this with ``--webhook-port`` and ``--webhook-cert-dir``. Without a usable
    pair in ``cert_dir`` it raises :class:`WebhookCertificateError` before it listens.
    """
    tls = ReloadingTLS(cert_dir, reload_check_seconds)
    tls.load()  # no usable pair: refused here, one line naming the file
    server = WebhookServer((host, port), tls, namespaces, max_body_bytes, timeout_seconds, claims_ask_gpu)
    threading.Thread(target=server.serve_forever, name="gpuwarden-webhook", daemon=True).start()
    log.info("admission webhook listening on https://%s:%d%s", host, server.port, MUTATE_PATH)
    return server


class WebhookService:
    """What ``gpuwarden scheduler run --webhook-port`` starts and stops, on every replica.

    :meth:`start` runs ``refresh`` once (without cert-manager: ``certs.WebhookCertificates.ensure``
    bound to ``cert_dir``, so the pair is on disk before the first connection), starts
    :func:`serve_webhook`, then re-runs ``refresh`` every ``refresh_seconds`` on ``clock`` (a
    rotation lands in ``cert_dir`` and the server reloads it). A failed refresh is a warning, never
    a stop: the server keeps its current certificate and the next refresh tries again. With
    cert-manager ``refresh`` is None: its Secret is mounted at ``cert_dir`` and the kubelet updates it.
    No usable pair once the first refresh is done: :meth:`start` raises :class:`WebhookCertificateError`.
    """

    def __init__(self, cert_dir: str | Path, port: int, host: str = "0.0.0.0",
                 refresh: Callable[[], object] | None = None, refresh_seconds: float = 3600.0,
                 clock: Clock = SYSTEM_CLOCK, namespaces: Container[str] | None = None,
                 claims_ask_gpu: ClaimsAskGpu | None = None) -> None:
        """``namespaces``: the only namespaces whose pods it gates (``queue_namespaces.QueueNamespaces``);
        None trusts the configuration's namespaceSelector. ``claims_ask_gpu``: see :func:`admission_response`."""
        self.cert_dir, self.port, self.host = cert_dir, port, host
        self.namespaces, self.claims_ask_gpu = namespaces, claims_ask_gpu
        self.refresh, self.refresh_seconds, self.clock = refresh, refresh_seconds, clock
        self.server: WebhookServer | None = None
        self.refreshes = 0  # attempts done, failed ones included
        self.refresh_error: Exception | None = None  # the last refresh's failure, said if the start fails
        self._stopped = threading.Event()

    def _refresh(self) -> None:
        if self.refresh is None:
            return
        try:
            self.refresh()
            self.refresh_error = None
        except (KubeFailure, OSError) as error:
            self.refresh_error = error
            log.warning("webhook certificate refresh failed (%s); serving the current one, retrying in %.0f s",
                        error, self.refresh_seconds)
        finally:
            self.refreshes += 1

    def _loop(self) -> None:
        while not self.clock.wait(self._stopped, self.refresh_seconds):
            self._refresh()

    def start(self) -> WebhookService:
        self._refresh()
        try:
            self.server = serve_webhook(self.cert_dir, self.port, self.host, namespaces=self.namespaces,
                                        claims_ask_gpu=self.claims_ask_gpu)
        except WebhookCertificateError as error:
            if self.refresh_error is None:
                raise
            raise WebhookCertificateError(f"{error} (its refresh failed: {self.refresh_error})") from None
        if self.refresh is not None:
            threading.Thread(target=self._loop, name="gpuwarden-webhook-certs", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self.server is not None:
            self.server.stop()
