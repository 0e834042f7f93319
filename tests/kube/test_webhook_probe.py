"""Issue 35 item 6, the admission webhook's bad-input rules (``kube/webhook.py``), each with several
cases, through real HTTPS to the real server:

1. it refuses to start without a usable certificate (missing, unreadable, not PEM, empty, a FIFO or
   a huge file, a key not matching the certificate): one line naming the file, exit 2 at the CLI,
   never a hang and never a server that refuses every handshake;
2. it answers "allowed, unchanged" (200, the uid echoed when it can be read, no patch) to any
   AdmissionReview it cannot read, and logs it: not JSON, the wrong shape, absurd nesting, wrong
   types at any depth, a body past the bound or of no stated length, a body that stalls or drips;
   never a 500, never a hang.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import ssl
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fake_kube_api import FakeKubeAPI
from servers import free_port
from test_webhook import POLICY, _post, patched, pod, review

from gpuwarden.cli import main
from gpuwarden.fleet.errors import UserError
from gpuwarden.kube.certs import CA_CERT, plan_rotation, write_cert_files
from gpuwarden.kube.gates import gated_by_gpuwarden
from gpuwarden.kube.webhook import CERT_FILE, KEY_FILE, WebhookService, serve_webhook

UID = "705ab4f5-6393-11e8-b7cc-42010a800002"  # test_webhook.review's
MAX_BODY_BYTES = 256 * 1024
TIMEOUT_SECONDS = 1.0


@pytest.fixture(scope="module")
def pairs():
    now = datetime.now(UTC)
    return plan_rotation(None, POLICY, now).data, plan_rotation(None, POLICY, now).data


# -- 1. no usable certificate: refused at start --------------------------------------------------------
def _certificates(folder: Path, state: str, pairs) -> Path:
    """``folder`` holding the pair as ``state`` says (``missing-folder``: a path that is not there)."""
    data, other = pairs
    if state == "missing-folder":
        return folder / "nowhere"
    write_cert_files(data, folder)
    cert, key = folder / CERT_FILE, folder / KEY_FILE
    if state == "empty-folder":
        cert.unlink()
        key.unlink()
    elif state == "key-missing":
        key.unlink()
    elif state == "certificate-missing":
        cert.unlink()
    elif state == "certificate-not-pem":
        cert.write_bytes(b"this is not a certificate\n")
    elif state == "certificate-empty":
        cert.write_bytes(b"")
    elif state == "key-not-pem":
        key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    elif state == "key-is-a-certificate":
        key.write_bytes(cert.read_bytes())
    elif state == "key-of-another-pair":
        key.write_bytes(base64.b64decode(other[KEY_FILE]))
    elif state == "certificate-a-folder":
        cert.unlink()
        cert.mkdir()
    elif state == "certificate-a-fifo":
        cert.unlink()
        os.mkfifo(cert)
    elif state == "certificate-huge":
        cert.unlink()
        with cert.open("wb") as handle:  # 17 GiB that take no disk: a read would fill memory
            handle.truncate(17 << 30)
    return folder


STATES = ["missing-folder", "empty-folder", "key-missing", "certificate-missing", "certificate-not-pem",
          "certificate-empty", "key-not-pem", "key-is-a-certificate", "key-of-another-pair", "certificate-a-folder",
          "certificate-a-fifo", "certificate-huge"]


def _start_bounded(start, folder: Path, limit_seconds: float = 10.0) -> dict:
    """``start()`` in a thread: {"error": ...} or {"server": ...}; fails if it is still running after
    ``limit_seconds`` (a FIFO read for ever), after unblocking it."""
    box: dict = {}

    def run() -> None:
        try:
            box["server"] = start()
        except Exception as error:  # noqa: BLE001 what it raised is the answer under test
            box["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_seconds)
    if thread.is_alive():
        fifo = folder / CERT_FILE
        if fifo.exists() and not fifo.is_file() and not fifo.is_dir():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer that closes: the reader sees EOF
        pytest.fail(f"still starting after {limit_seconds} s (a hang)")
    if hasattr(box.get("server"), "stop"):
        box["server"].stop()
    return box


def _refused(box: dict, folder: Path) -> str:
    assert "server" not in box, "the webhook started without a usable certificate"
    error = box["error"]
    assert isinstance(error, UserError), repr(error)
    message = str(error)
    assert "\n" not in message and str(folder) in message, message
    return message


@pytest.mark.parametrize("state", STATES)
def test_the_server_refuses_to_start_without_a_usable_certificate(state, tmp_path, pairs):
    folder = _certificates(tmp_path / "certs", state, pairs)
    box = _start_bounded(lambda: serve_webhook(folder, port=0, host="127.0.0.1"), folder)
    _refused(box, folder)


@pytest.mark.parametrize("state", ["missing-folder", "certificate-not-pem", "key-of-another-pair"])
def test_the_service_refuses_to_start_without_a_usable_certificate(state, tmp_path, pairs):
    folder = _certificates(tmp_path / "certs", state, pairs)
    box = _start_bounded(lambda: WebhookService(folder, 0, host="127.0.0.1").start(), folder)
    _refused(box, folder)


@pytest.mark.parametrize("state", ["missing-folder", "key-of-another-pair", "certificate-a-fifo"])
def test_scheduler_run_refuses_to_start_its_webhook_without_a_usable_certificate(state, tmp_path, pairs, capsys):
    folder = _certificates(tmp_path / "certs", state, pairs)
    api = FakeKubeAPI().start()
    try:
        argv = ["scheduler", "run", "--kubeconfig", api.kubeconfig(tmp_path / "kc.json"), "--no-attained-service",
                "--port", "0", "--listen", "127.0.0.1", "--webhook-port", str(free_port()),
                "--webhook-cert-dir", str(folder), "--rounds", "1", "--interval-seconds", "0.1"]
        box = _start_bounded(lambda: main(argv), folder, 20.0)
    finally:
        api.stop()
    err = capsys.readouterr().err
    assert box.get("server") == 2, err
    lines = [line for line in err.strip().splitlines() if "WARNING" not in line]
    assert len(lines) == 1 and str(folder) in lines[0] and "Traceback" not in err, err


def test_a_usable_certificate_still_starts(tmp_path, pairs):
    folder = _certificates(tmp_path / "certs", "good", pairs)
    server = serve_webhook(folder, port=0, host="127.0.0.1")
    try:
        ca = base64.b64decode(pairs[0][CA_CERT])
        status, answer = _post(server, json.dumps(review(pod())).encode(), ca)
        assert status == 200 and gated_by_gpuwarden(patched(answer, pod()))
    finally:
        server.stop()


# -- 2. a review it cannot read: allowed, unchanged, logged -----------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory, pairs):
    folder = tmp_path_factory.mktemp("served")
    write_cert_files(pairs[0], folder)
    server = serve_webhook(folder, port=0, host="127.0.0.1", max_body_bytes=MAX_BODY_BYTES,
                           timeout_seconds=TIMEOUT_SECONDS, reload_check_seconds=60.0)
    yield server, base64.b64decode(pairs[0][CA_CERT])
    server.stop()


def _nested_review(depth: int) -> bytes:
    """A real pod review whose labels nest ``depth`` objects deep."""
    text = json.dumps(review(pod(labels={"deep": "PLACEHOLDER"})))
    return text.replace('"PLACEHOLDER"', '{"a": ' * depth + "1" + "}" * depth).encode()


def _shaped(change) -> bytes:
    """A review of a GPU pod (which would be gated) with one field changed by ``change``."""
    body = review(pod())
    change(body["request"], body["request"]["object"])
    return json.dumps(body).encode()


def _set(path: str, value):
    def change(request: dict, obj: dict) -> None:
        node = {"request": request, "object": obj}
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


UNREADABLE = {  # body -> the uid the answer echoes ("" when the body cannot be read at all)
    "not-json": (b"{not json", ""),
    "invalid-utf8": (b"\xff\xfe\xfa\x00 garbage", ""),
    "empty": (b"", ""),
    "null": (b"null", ""),
    "a-list": (b"[]", ""),
    "request-a-list": (b'{"request": []}', ""),
    "huge-integer": (b'{"request": {"uid": "u1", "kind": ' + b"9" * 5000 + b"}}", ""),
    "deep-array": (b"[" * 30000 + b"]" * 30000, ""),
    "deep-labels": (_nested_review(20000), ""),
    "uid-a-number": (_shaped(_set("request.uid", 5)), ""),
    "kind-a-string": (_shaped(_set("request.kind", "Pod")), UID),
    "namespace-a-number": (_shaped(_set("request.namespace", 5)), UID),
    "object-metadata-a-list": (_shaped(_set("object.metadata", ["x"])), UID),
    "labels-a-list": (_shaped(_set("object.metadata.labels", ["kueue.x-k8s.io/queue-name"])), UID),
    "annotations-a-string": (_shaped(_set("object.metadata.annotations", "kubernetes.io/config.mirror")), UID),
    "owner-kind-a-number": (_shaped(_set("object.metadata.ownerReferences", [{"kind": 5}])), UID),
    "containers-of-numbers": (_shaped(_set("object.spec.containers", [5])), UID),
    "limits-a-list": (_shaped(_set("object.spec.containers.0.resources.limits", ["nvidia.com/gpu"])), UID),
    "quantity-an-object": (_shaped(_set("object.spec.containers.0.resources.limits", {"nvidia.com/gpu": {"n": 8}})), UID),
    "quantity-a-bool": (_shaped(_set("object.spec.containers.0.resources.limits", {"nvidia.com/gpu": True})), UID),
    "gates-a-string": (_shaped(_set("object.spec.schedulingGates", "gpuwarden.io/admission")), UID),
    "gate-name-a-number": (_shaped(_set("object.spec.schedulingGates", [{"name": 5}])), UID),
    "scheduler-name-a-list": (_shaped(_set("object.spec.schedulerName", ["volcano"])), UID),
    "node-name-a-number": (_shaped(_set("object.spec.nodeName", 7)), UID),
}


@pytest.mark.parametrize("body, uid", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_a_review_it_cannot_read_is_allowed_unchanged_and_logged(body, uid, served, caplog):
    server, ca = served
    assert len(body) <= MAX_BODY_BYTES
    with caplog.at_level(logging.WARNING, "gpuwarden.kube.webhook"):
        status, answer = _post(server, body, ca)
    assert status == 200 and answer["response"] == {"uid": uid, "allowed": True}
    assert any("allowed, unchanged" in r.getMessage() for r in caplog.records), caplog.text


def _tls(server, ca: bytes, timeout: float) -> ssl.SSLSocket:
    context = ssl.create_default_context(cadata=ca.decode())
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    return context.wrap_socket(sock, server_hostname="localhost")


def _answer(data: bytes) -> tuple[int, dict] | None:
    """(status, JSON body) once ``data`` holds a whole HTTP answer, else None."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length"), None)
    if length is None or len(rest) < length:
        return None
    return int(lines[0].split()[1]), json.loads(rest[:length])


def _exchange(server, ca: bytes, head: bytes, parts: list[bytes] = (), pause_s: float = 0.0,
              timeout: float = 8.0) -> tuple[tuple[int, dict] | None, float]:
    """Send ``head``, then each of ``parts`` ``pause_s`` apart, reading whatever answer comes meanwhile;
    then wait for the answer. (the answer or None, seconds it took)."""
    began = time.monotonic()
    data = b""
    with _tls(server, ca, timeout) as tls:
        tls.sendall(head)
        for part in parts:
            tls.settimeout(pause_s)
            try:
                chunk = tls.recv(65536)
            except (TimeoutError, ssl.SSLError):
                chunk = None
            if chunk is not None:
                data += chunk
                break
            try:
                tls.sendall(part)
            except OSError:
                break
        tls.settimeout(timeout)
        while _answer(data) is None:
            try:
                chunk = tls.recv(65536)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            data += chunk
    return _answer(data), time.monotonic() - began


def _head(headers: str) -> bytes:
    return f"POST /mutate-pods HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}\r\n".encode()


ALLOWED_BLIND = (200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "response": {"uid": "", "allowed": True}})


@pytest.mark.parametrize("headers", [
    f"Content-Length: {10 ** 12}\r\n", "", "Content-Length: -5\r\n", "Content-Length: many\r\n",
    "Transfer-Encoding: chunked\r\n",
], ids=["past-the-bound", "no-length", "negative-length", "length-not-a-number", "chunked"])
def test_a_body_of_no_usable_length_is_allowed_unchanged_unread(headers, served, caplog):
    server, ca = served
    with caplog.at_level(logging.WARNING, "gpuwarden.kube.webhook"):
        answer, elapsed_s = _exchange(server, ca, _head(headers))
    assert answer == ALLOWED_BLIND and elapsed_s < TIMEOUT_SECONDS + 2
    assert "allowed, unchanged" in caplog.text


def test_a_body_past_the_bound_that_is_sent_is_allowed_unchanged(served, caplog):
    server, ca = served
    body = json.dumps(review(pod(labels={"pad": "x" * (MAX_BODY_BYTES + 10)}))).encode()
    with caplog.at_level(logging.WARNING, "gpuwarden.kube.webhook"):
        answer, _ = _exchange(server, ca, _head(f"Content-Length: {len(body)}\r\n") + body)
    assert answer == ALLOWED_BLIND and "allowed, unchanged" in caplog.text


@pytest.mark.parametrize("pause_s, parts", [(0.0, [b'{"request": ']), (0.25, [b"{"] * 40), (0.1, [b" "] * 100)],
                         ids=["stalls", "drips", "drips-fast"])
def test_a_body_that_stalls_or_drips_is_answered_within_the_deadline(pause_s, parts, served, caplog):
    server, ca = served
    with caplog.at_level(logging.WARNING, "gpuwarden.kube.webhook"):
        answer, elapsed_s = _exchange(server, ca, _head("Content-Length: 1000\r\n"), parts, pause_s)
    assert answer == ALLOWED_BLIND, answer
    assert elapsed_s < TIMEOUT_SECONDS + 2.0, elapsed_s  # one deadline for the body, not one per read
    assert "allowed, unchanged" in caplog.text


def test_after_every_probe_a_gpu_pod_is_still_gated(served):
    server, ca = served
    for body, _ in UNREADABLE.values():
        _post(server, body, ca)
    status, answer = _post(server, json.dumps(review(pod())).encode(), ca)
    assert status == 200 and gated_by_gpuwarden(patched(answer, pod()))
