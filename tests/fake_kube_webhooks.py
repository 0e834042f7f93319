"""Mutating admission webhooks as the API server calls them, for ``tests/fake_kube_api.py``.

No kube-apiserver can run here, so this speaks its side of the real protocol: for each stored
``admissionregistration.k8s.io/v1`` MutatingWebhookConfiguration (in name order, webhooks in list
order) whose rules match pods CREATE and whose ``namespaceSelector`` (against the namespace's
labels, plus ``kubernetes.io/metadata.name`` as the real server adds) and ``objectSelector``
(against the pod's labels) select the pod, it POSTs an AdmissionReview v1 request over HTTPS,
verifying the server's certificate with ``clientConfig.caBundle`` (base64 PEM; the system roots
when absent) and the host name the real server dials (``NAME.NAMESPACE.svc`` for a service,
the URL's host for ``clientConfig.url``), within ``timeoutSeconds`` (default 10). A service is
reached through a test-given mapping ``{(namespace, name): "https://127.0.0.1:PORT"}``.
The answer's JSONPatch (RFC 6902: add, remove, replace, test, move, copy) is applied;
``allowed: false`` refuses the create with the webhook's message (code 400 unless it gives one);
a call that fails (TLS, timeout, a bad answer) refuses with ``failurePolicy: Fail`` (the default)
and leaves the pod unchanged with ``Ignore``. Every call is recorded.
Not modelled: ``matchConditions`` (CEL) are not evaluated (the webhook is called, so it must
decide itself), ``reinvocationPolicy``, validating webhooks, and operations other than pods CREATE.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import socket
import ssl
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

from fake_kube_patch import apply_json_patch

NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass
class WebhookCall:
    configuration: str
    webhook: str
    url: str
    review: dict  # the AdmissionReview sent
    answer: dict | None  # the AdmissionReview received, None when the call failed
    outcome: str  # "patched", "allowed", "denied", "failed-closed" (Fail) or "failed-open" (Ignore)
    error: str = ""


class CallFailed(Exception):
    """The webhook could not be called or answered badly: its failurePolicy decides."""


def selector_matches(selector: dict | None, labels: dict) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist); empty selects all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        ok = {"In": present and labels.get(key) in values, "NotIn": not present or labels.get(key) not in values,
              "Exists": present, "DoesNotExist": not present}.get(operator)
        if ok is None:
            raise ValueError(f"selector operator {operator!r} is not one of: In, NotIn, Exists, DoesNotExist")
        if not ok:
            return False
    return True


def _rule_matches(rule: dict) -> bool:
    def has(key: str, value: str) -> bool:
        return any(v in (value, "*") for v in rule.get(key) or ())
    return (has("operations", "CREATE") and has("apiGroups", "") and has("apiVersions", "v1")
            and (has("resources", "pods") or "*/*" in (rule.get("resources") or ())))


def matching_webhooks(configurations: list[dict], namespace: dict | None, pod: dict):
    """(configuration name, webhook) pairs that apply to creating ``pod``, in the API server's order."""
    ns_meta = (namespace or {}).get("metadata") or {}
    ns_labels = {**(ns_meta.get("labels") or {}), NAME_LABEL: pod["metadata"].get("namespace", "")}
    pod_labels = pod["metadata"].get("labels") or {}
    for configuration in sorted(configurations, key=lambda c: c["metadata"]["name"]):
        for webhook in configuration.get("webhooks") or ():
            if (any(_rule_matches(r) for r in webhook.get("rules") or ())
                    and selector_matches(webhook.get("namespaceSelector"), ns_labels)
                    and selector_matches(webhook.get("objectSelector"), pod_labels)):
                yield configuration["metadata"]["name"], webhook


class _Connection(http.client.HTTPSConnection):
    """HTTPS to ``host:port`` that verifies the certificate for ``server_name`` (the name the API server dials)."""

    def __init__(self, host: str, port: int, server_name: str, context: ssl.SSLContext, timeout: float):
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name, self._tls = server_name, context

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self._server_name)


def _target(client: dict, services: dict) -> tuple[str, str, str]:
    """(URL shown in messages, address actually dialled, TLS server name) of a webhook's clientConfig."""
    if client.get("url"):
        url = urlparse(client["url"])
        return client["url"], client["url"], url.hostname or ""
    service = client.get("service") or {}
    ns, name, path = service.get("namespace", ""), service.get("name", ""), service.get("path") or "/"
    shown = f"https://{name}.{ns}.svc:{service.get('port', 443)}{path}"
    if (ns, name) not in services:
        raise CallFailed(f'Post "{shown}": service "{ns}/{name}" has no address in the test\'s mapping')
    return shown, services[(ns, name)].rstrip("/") + path, f"{name}.{ns}.svc"


def _post(webhook: dict, services: dict, review: dict) -> tuple[str, dict]:
    client = webhook.get("clientConfig") or {}
    timeout_seconds = int(webhook.get("timeoutSeconds") or 10)
    shown, address, server_name = _target(client, services)
    where = f'Post "{shown}?timeout={timeout_seconds}s"'
    try:
        context = ssl.create_default_context()
        if client.get("caBundle"):
            context = ssl.create_default_context(cadata=base64.b64decode(client["caBundle"]).decode())
        url = urlparse(address)
        connection = _Connection(url.hostname or "", url.port or 443, server_name, context, timeout_seconds)
        try:
            connection.request("POST", f"{url.path or '/'}?timeout={timeout_seconds}s", json.dumps(review),
                               {"Content-Type": "application/json", "Accept": "application/json"})
            response = connection.getresponse()
            status, data = response.status, response.read()
        finally:
            connection.close()
    except (OSError, ssl.SSLError, ValueError) as error:  # TLS, refused, timed out, a bad caBundle
        raise CallFailed(f"{where}: {error}") from None
    if status != 200:
        raise CallFailed(f"{where}: the server answered HTTP {status}")
    try:
        answer = json.loads(data)
    except json.JSONDecodeError:
        raise CallFailed(f"{where}: received invalid webhook response: not JSON") from None
    if not isinstance(answer, dict) or answer.get("apiVersion") != "admission.k8s.io/v1" or answer.get("kind") != "AdmissionReview":
        raise CallFailed(f"received invalid webhook response: expected admission.k8s.io/v1 AdmissionReview, got {str(answer)[:120]}")
    response_uid = (answer.get("response") or {}).get("uid")
    if response_uid != review["request"]["uid"]:
        raise CallFailed(f"received invalid webhook response: expected response.uid={review['request']['uid']!r}, got {response_uid!r}")
    return shown, answer


def review_for(pod: dict, user: str) -> dict:
    meta = pod["metadata"]
    gvk, gvr = {"group": "", "version": "v1", "kind": "Pod"}, {"group": "", "version": "v1", "resource": "pods"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
                        "name": meta.get("name", ""), "namespace": meta.get("namespace", ""), "operation": "CREATE",
                        "userInfo": {"username": user or "kubernetes-admin"}, "object": copy.deepcopy(pod),
                        "oldObject": None, "dryRun": False,
                        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def call_webhooks(configurations: list[dict], namespace: dict | None, pod: dict, services: dict, user: str,
                  calls: list[WebhookCall]) -> tuple[dict, tuple[int, dict] | None]:
    """The pod after every matching webhook, or the refusal ``(HTTP status, Status)`` that stops the create."""
    for configuration, webhook in matching_webhooks(configurations, namespace, pod):
        name = webhook.get("name", "")
        review = review_for(pod, user)
        try:
            shown, answer = _post(webhook, services, review)
        except CallFailed as error:
            fail = (webhook.get("failurePolicy") or "Fail") != "Ignore"
            calls.append(WebhookCall(configuration, name, "", review, None, "failed-closed" if fail else "failed-open", str(error)))
            if fail:
                return pod, (500, _status(500, "InternalError", f'Internal error occurred: failed calling webhook "{name}": '
                                                                f"failed to call webhook: {error}"))
            continue
        response = answer.get("response") or {}
        if not response.get("allowed"):
            calls.append(WebhookCall(configuration, name, shown, review, answer, "denied"))
            result = response.get("status") or {}
            code = max(int(result.get("code") or 400), 400)
            text = result.get("message") or result.get("reason")
            denied = f'admission webhook "{name}" denied the request' + (f": {text}" if text else " without explanation")
            return pod, (code, _status(code, result.get("reason") or "", denied))
        if response.get("patch"):
            if response.get("patchType") != "JSONPatch":
                return pod, (500, _status(500, "InternalError", f"Internal error occurred: webhook {name!r} answered "
                                                                f"patchType {response.get('patchType')!r}, not JSONPatch"))
            try:
                pod = apply_json_patch(pod, json.loads(base64.b64decode(response["patch"])))
            except (ValueError, KeyError, IndexError, TypeError) as error:
                return pod, (500, _status(500, "InternalError", f"Internal error occurred: webhook {name!r}: {error}"))
            calls.append(WebhookCall(configuration, name, shown, review, answer, "patched"))
        else:
            calls.append(WebhookCall(configuration, name, shown, review, answer, "allowed"))
    return pod, None


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
