"""Issue 35's third bad-input probe, the Kubernetes client's class: each rule held by several cases,
through the official ``kubernetes`` client over real HTTP (the fake API server of
tests/fake_kube_api.py, or a raw server on 127.0.0.1 for answers no API server gives).

1. A whole-request deadline: an answer that trickles, a head that never ends, a TLS handshake that
   stalls each fail the call at the request timeout, not per socket read; SIGTERM stops a process
   that waits on one (or on a Retry-After) at once.
2. A cap on an answer's size: an answer past the cap (declared, overlong, an error's, encoded
   unasked) is an UnexpectedAnswer read no further than the cap; every list is paged and bounded in
   items and pages.
3. A kubeconfig from ``KUBECONFIG`` is checked like ``--kubeconfig``; a failing exec credential
   plugin, a file it names that is no regular file, or a wrong-typed field is one line at load, exit 2.
4. A round that cannot read the cluster exits non-zero under ``--rounds``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fake_kube_api import CORE, FakeKubeAPI
from hypothesis import HealthCheck, given, settings, strategies as st
from kube_fleet import fleet, node
from polling import wait_for

from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.kube.failure import UnexpectedAnswer, Unreachable

MIB = 1 << 20


# -- a raw server: each connection answers one request as the test says ---------------------------
class Raw:
    """A TCP server on 127.0.0.1; each connection is ``serve(connection)`` on its own thread, over
    TLS with ``tls`` (cert, key files). ``requests`` counts the requests read."""

    def __init__(self, serve, tls: tuple[str, str] | None = None, scheme: str | None = None) -> None:
        self.serve, self.requests, self.closed = serve, 0, False
        self.context = None
        if tls:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(*tls)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"{scheme or ('https' if tls else 'http')}://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(connection,), daemon=True).start()

    def _one(self, connection: socket.socket) -> None:
        try:
            connection.settimeout(60)
            if self.context:
                connection = self.context.wrap_socket(connection, server_side=True)
            self.serve(self, connection)
        except OSError:
            pass
        finally:
            connection.close()

    def read_request(self, connection: socket.socket) -> bytes:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = connection.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            head += chunk
        self.requests += 1
        return head.split(b"\r\n", 1)[0]

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def _head(status: str, *headers: str) -> bytes:
    return ("\r\n".join([f"HTTP/1.1 {status}", *headers, "Connection: close"]) + "\r\n\r\n").encode()


def _json(status: str, payload: object, *headers: str) -> bytes:
    body = json.dumps(payload).encode()
    return _head(status, "Content-Type: application/json", f"Content-Length: {len(body)}", *headers) + body


def trickle(server: Raw, connection: socket.socket) -> None:
    """A 200 whose body comes one byte every 0.1 s: each read is quick, the answer never is."""
    server.read_request(connection)
    connection.sendall(_head("200 OK", "Content-Type: application/json", "Content-Length: 100000"))
    while not server.closed:
        connection.sendall(b" ")
        time.sleep(0.1)


def drip_head(server: Raw, connection: socket.socket) -> None:
    """A status line, then a header line every 0.1 s: the head never ends."""
    server.read_request(connection)
    connection.sendall(b"HTTP/1.1 200 OK\r\n")
    for line in range(100000):
        if server.closed:
            return
        connection.sendall(f"X-Drip-{line}: a\r\n".encode())
        time.sleep(0.1)


def stalled_handshake(server: Raw, connection: socket.socket) -> None:
    """Takes the ClientHello, then sends a TLS record header for 16 KiB and its bytes one every 0.1 s."""
    connection.recv(65536)
    server.requests += 1
    connection.sendall(b"\x16\x03\x03\x40\x00")
    while not server.closed:
        connection.sendall(b"\x00")
        time.sleep(0.1)


def declared_huge(server: Raw, connection: socket.socket) -> None:
    """A 200 that says it is a terabyte long, sends a byte, and waits."""
    server.read_request(connection)
    connection.sendall(_head("200 OK", "Content-Type: application/json", f"Content-Length: {1 << 40}") + b"{")
    time.sleep(30)


def overlong(status: str):
    """A chunked answer of ``status`` that runs to 64 MiB, as fast as the socket takes it, then waits."""
    def serve(server: Raw, connection: socket.socket) -> None:
        server.read_request(connection)
        connection.sendall(_head(status, "Content-Type: application/json", "Transfer-Encoding: chunked"))
        for _ in range(64 * MIB // 65536):
            connection.sendall(b"10000\r\n" + b" " * 65536 + b"\r\n")
        time.sleep(30)
    return serve


_BOMB: list[bytes] = []


def gzip_bomb(server: Raw, connection: socket.socket) -> None:
    """A 200 that is 64 MiB of spaces, gzip-encoded (about 64 KiB on the wire), which nobody asked for."""
    if not _BOMB:
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        _BOMB.append(b"".join(packer.compress(b" " * MIB) for _ in range(64)) + packer.flush())
    server.read_request(connection)
    connection.sendall(_head("200 OK", "Content-Type: application/json", "Content-Encoding: gzip",
                             f"Content-Length: {len(_BOMB[0])}") + _BOMB[0])


def one_page_of(count: int):
    """A NodeList of ``count`` nodes in one answer, whatever ``limit`` asked."""
    def serve(server: Raw, connection: socket.socket) -> None:
        server.read_request(connection)
        items = [{"metadata": {"name": f"node-{i:07d}"}} for i in range(count)]
        connection.sendall(_json("200 OK", {"kind": "NodeList", "metadata": {}, "items": items}))
    return serve


def continuing(same_token: bool):
    """Empty pages, each with a continue token: the same one, or a new one every time."""
    def serve(server: Raw, connection: socket.socket) -> None:
        server.read_request(connection)
        token = "again" if same_token else f"page-{server.requests}"
        connection.sendall(_json("200 OK", {"kind": "NodeList", "metadata": {"continue": token}, "items": []}))
    return serve


def throttled(server: Raw, connection: socket.socket) -> None:
    """429 with Retry-After: 30 (API Priority and Fairness)."""
    server.read_request(connection)
    connection.sendall(_json("429 Too Many Requests", {"kind": "Status", "code": 429, "message": "slow down",
                                                       "details": {"retryAfterSeconds": 30}}, "Retry-After: 30"))


# -- kubeconfigs, TLS, the client ----------------------------------------------------------------
def config_dict(server: str, ca: str | None = None, user: dict | None = None) -> dict:
    cluster = {"server": server, **({"certificate-authority": ca} if ca else {})}
    return {"apiVersion": "v1", "kind": "Config", "current-context": "probe",
            "clusters": [{"name": "probe", "cluster": cluster}],
            "contexts": [{"name": "probe", "context": {"cluster": "probe", "user": "probe"}}],
            "users": [{"name": "probe", "user": user if user is not None else {"token": "probe-token"}}]}


def kubeconfig(path, server: str, **kwargs) -> str:
    path.write_text(json.dumps(config_dict(server, **kwargs)))
    return str(path)


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (its own CA): cert and key files."""
    folder = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(key, hashes.SHA256()))
    (folder / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return str(folder / "tls.crt"), str(folder / "tls.key")


@pytest.fixture
def served():
    servers: list[Raw] = []

    def start(serve, **kwargs) -> Raw:
        servers.append(Raw(serve, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def fake():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def kube(url: str, tmp_path, timeout_seconds: float = 1.0, ca: str | None = None, **kwargs) -> KubeApi:
    client = load_client(kubeconfig(tmp_path / "kc.json", url, ca=ca), timeout_seconds=timeout_seconds)
    kwargs.setdefault("attempts", 1)
    return KubeApi(client, backoff_seconds=0.01, max_backoff_seconds=0.02, **kwargs)


def list_nodes(api: KubeApi) -> dict:
    return api.call(api.core.list_node, verb="list", resource="nodes")


def run_cli(argv: list[str], capsys) -> tuple[int, str, str, float]:
    from gpuwarden.cli import main

    capsys.readouterr()
    began = time.monotonic()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err, time.monotonic() - began


def one_line_error(code: int, err: str, *wanted: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "this is a bug" not in err, err
    for want in wanted:
        assert want in err, err


# == 1. a whole-request deadline ===================================================================
@pytest.mark.timeout(60)
@pytest.mark.parametrize("serve, over_tls", [(trickle, False), (drip_head, False), (trickle, True),
                                             (drip_head, True), (stalled_handshake, None)],
                         ids=["trickled-body", "dripped-head", "tls-trickled-body", "tls-dripped-head",
                              "tls-stalled-handshake"])
def test_a_slow_answer_fails_at_the_whole_request_deadline(serve, over_tls, served, tls, tmp_path):
    server = served(serve, tls=tls if over_tls else None, scheme="https" if over_tls is None else None)
    api = kube(server.url, tmp_path, timeout_seconds=1.0, ca=tls[0] if over_tls is not False else None)
    began = time.monotonic()
    with pytest.raises(Unreachable) as raised:
        list_nodes(api)
    assert time.monotonic() - began < 2.0, raised.value
    assert "\n" not in raised.value.message


@pytest.mark.timeout(60)
def test_the_deadline_is_said_and_each_try_has_its_own(served, tmp_path):
    server = served(drip_head)
    api = kube(server.url, tmp_path, timeout_seconds=0.5, attempts=3)
    began = time.monotonic()
    with pytest.raises(Unreachable, match=r"list nodes: no answer from the API server within 0\.5 s, .*gave up after 3 tries"):
        list_nodes(api)
    assert time.monotonic() - began < 3.0
    assert server.requests == 3


@pytest.mark.timeout(60)
def test_a_refused_tls_handshake_is_one_line(served, tls, tmp_path):
    server = served(trickle, tls=tls)
    api = kube(server.url, tmp_path, timeout_seconds=5.0)  # no certificate-authority: the server is not trusted
    with pytest.raises(Unreachable, match="no answer from the API server") as raised:
        list_nodes(api)
    assert "\n" not in raised.value.message and "CERTIFICATE_VERIFY_FAILED" in raised.value.message


def test_prompt_answers_are_read_whole_and_hold_no_descriptor(fake, tmp_path):
    for i in range(3):
        node(fake, f"gpu-{i}")
    api = kube(fake.url, tmp_path, timeout_seconds=5.0)
    list_nodes(api)
    descriptors = len(os.listdir("/proc/self/fd"))
    for _ in range(150):
        assert [n["metadata"]["name"] for n in list_nodes(api)["items"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert len(os.listdir("/proc/self/fd")) <= descriptors + 4


LOOP_ARGS = {"scheduler": ["scheduler", "run", "--no-attained-service", "--port", "0", "--listen", "127.0.0.1",
                           "--interval-seconds", "60"],
             "actuator": ["actuator", "run", "--interval", "60", "--source", "file", "--file", "{samples}",
                          "--audit", "{audit}"]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command, serve", [("scheduler", drip_head), ("actuator", drip_head),
                                            ("scheduler", throttled)],
                         ids=["scheduler-dripped-head", "actuator-dripped-head", "scheduler-retry-after"])
def test_sigterm_stops_a_process_waiting_on_the_api_server(command, serve, served, tmp_path):
    server = served(serve)
    argv = [a.format(samples=tmp_path / "s.csv", audit=tmp_path / "a.jsonl") for a in LOOP_ARGS[command]]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    process = subprocess.Popen([sys.executable, "-m", "gpuwarden.cli", *argv, "--request-timeout", "60",
                                "--kubeconfig", kubeconfig(tmp_path / "kc.json", server.url)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        wait_for(lambda: server.requests >= 1 or process.poll() is not None, timeout=60, what="the first request")
        time.sleep(0.5)  # now in the read, or in the Retry-After wait
        assert process.poll() is None
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=100)
        stopped_s = time.monotonic() - began
    finally:
        if process.poll() is None:
            process.kill()
        _, err = process.communicate()
    assert stopped_s < 5.0, err.decode()[-2000:]


# == 2. a cap on an answer's size ===================================================================
@pytest.mark.timeout(60)
@pytest.mark.parametrize("serve, said", [(declared_huge, "larger than 4,194,304 bytes"),
                                         (overlong("200 OK"), "larger than 4,194,304 bytes"),
                                         (overlong("500 Internal Server Error"), "larger than 4,194,304 bytes"),
                                         (gzip_bomb, "gzip")],
                         ids=["declared-a-terabyte", "overlong", "overlong-error", "gzip-unasked"])
def test_an_answer_past_the_cap_is_refused_and_read_no_further(serve, said, served, tmp_path):
    server = served(serve)
    api = kube(server.url, tmp_path, timeout_seconds=5.0, max_answer_bytes=4 * MIB, attempts=3)
    tracemalloc.start()
    try:
        with pytest.raises(UnexpectedAnswer, match=said) as raised:
            list_nodes(api)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "nothing was acted on" in raised.value.message and "\n" not in raised.value.message
    assert peak_bytes < 24 * MIB
    assert server.requests == 1  # never retried: the same answer would come again


@pytest.mark.timeout(60)
def test_a_huge_list_is_refused_at_the_item_cap_after_few_pages(fake, tmp_path):
    fake.huge_list(CORE, "nodes", 200_000)
    api = kube(fake.url, tmp_path, timeout_seconds=10.0, max_list_items=5_000)
    with pytest.raises(UnexpectedAnswer, match=r"list nodes: more than 5,000 items") as raised:
        api.list_all(api.core.list_node, resource="nodes", page_size=500)
    assert "nothing was acted on" in raised.value.message
    assert len(fake.calls("GET", "/api/v1/nodes$")) <= 11


@pytest.mark.timeout(60)
def test_a_server_that_ignores_limit_meets_the_byte_cap(served, tmp_path):
    server = served(one_page_of(100_000))  # about 4 MiB of JSON in one page
    api = kube(server.url, tmp_path, timeout_seconds=10.0, max_answer_bytes=1 * MIB)
    with pytest.raises(UnexpectedAnswer, match=r"larger than 1,048,576 bytes.*--page-size"):
        api.list_all(api.core.list_node, resource="nodes", page_size=500)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("same_token", [True, False], ids=["same-token", "new-token-every-page"])
def test_continue_tokens_that_never_end_are_refused(same_token, served, tmp_path):
    server = served(continuing(same_token))
    api = kube(server.url, tmp_path, timeout_seconds=5.0, max_list_items=5_000)
    with pytest.raises(UnexpectedAnswer, match=r"list nodes: .*continue"):
        api.list_all(api.core.list_node, resource="nodes", page_size=500)
    assert server.requests <= 12


def test_every_list_a_round_makes_is_paged(fake, tmp_path):
    fleet(fake, nodes=3, pods_per_node=2, namespaces=2)
    cluster = KubeCluster(kube(fake.url, tmp_path, timeout_seconds=5.0), page_size=2)
    cluster.snapshot()
    cluster.publish_conditions({})
    lists = [r for r in fake.requests if r.method == "GET" and fake._parse(r.path)[3] is None]
    assert len(lists) >= 6
    assert all(r.query.get("limit") == "2" for r in lists), [(r.path, r.query) for r in lists]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["scheduler", "actuator"])
def test_a_round_on_a_huge_list_fails_and_the_run_exits_non_zero(command, fake, tmp_path, capsys, caplog,
                                                                   monkeypatch):
    import gpuwarden.kube.api as kube_api

    monkeypatch.setattr(kube_api, "MAX_LIST_ITEMS", 5_000)  # the shipped bound is 500,000
    fake.huge_list(CORE, "nodes", 200_000)
    argv = [a.format(samples=tmp_path / "s.csv", audit=tmp_path / "a.jsonl") for a in LOOP_ARGS[command]]
    code, _, err, _ = run_cli([*argv, "--rounds", "1", "--kubeconfig", kubeconfig(tmp_path / "kc.json", fake.url)],
                              capsys)
    assert code == 1, err
    assert "more than 5,000 items" in caplog.text
    assert len(fake.calls("GET", "/api/v1/nodes$")) <= 11


# == 3. kubeconfigs checked at load =================================================================
def bounded_cli(argv: list[str], capsys, fifo: str | None = None, seconds: float = 15.0):
    """``run_cli`` on a thread: a read that blocks (a FIFO) fails the test, and is unblocked."""
    result: list = []
    worker = threading.Thread(target=lambda: result.append(run_cli(argv, capsys)), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        if fifo:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader's open returns, and reads nothing
        worker.join(10)
        pytest.fail(f"still loading after {seconds} s")
    return result[0]


PLAN = ["actuator", "plan", "--source", "file", "--file", "none.csv", "--audit", "none.jsonl"]


def _special(kind: str, path) -> str:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/null")
    elif kind == "sparse":
        with path.open("wb") as handle:
            handle.truncate(17 << 30)
    elif kind == "not-yaml":
        path.write_bytes(b"\x00\xff\xfe{[: ]]")
    elif kind == "a-list":
        path.write_text("- 1\n- 2\n")
    elif kind == "empty":
        path.write_text("")
    return str(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, said", [("fifo", "FIFO"), ("directory", "a directory"), ("device", "a device"),
                                        ("missing", "no such file"), ("sparse", "more than the 16,777,216 allowed"),
                                        ("not-yaml", "kubeconfig"), ("a-list", "kubeconfig"), ("empty", "kubeconfig")])
def test_a_kubeconfig_from_the_environment_is_checked_like_the_flag(kind, said, tmp_path, capsys, monkeypatch):
    path = _special(kind, tmp_path / "kc")
    monkeypatch.setenv("KUBECONFIG", path)
    code, _, err, elapsed_s = bounded_cli(PLAN, capsys, fifo=path if kind == "fifo" else None)
    one_line_error(code, err, "KUBECONFIG", path, said)
    assert elapsed_s < 10


def test_a_kubeconfig_list_skips_missing_files_and_the_flag_wins(fake, tmp_path, monkeypatch):
    good = kubeconfig(tmp_path / "good.json", fake.url)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), good]))
    assert load_client().configuration.host == fake.url
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert load_client(good).configuration.host == fake.url  # --kubeconfig: the environment is not read


def _plugin(tmp_path, script: str) -> dict:
    path = tmp_path / "plugin"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(path)}}


EXEC_FAILURES = {
    "exits-non-zero": ("echo 'the refresh token expired' >&2; exit 1", "the refresh token expired"),
    "prints-no-json": ("echo hello", "exec"),
    "prints-no-token": ("echo '{\"apiVersion\": \"client.authentication.k8s.io/v1\", \"kind\": \"ExecCredential\", "
                        "\"status\": {}}'", "exec"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", [*EXEC_FAILURES, "not-installed", "no-command"])
def test_a_failing_exec_credential_plugin_is_one_line_at_load(case, fake, tmp_path, capsys):
    if case == "not-installed":
        user, said = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/nonexistent/kubelogin"}}, \
            "/nonexistent/kubelogin"
    elif case == "no-command":
        user, said = {"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}, "command"
    else:
        script, said = EXEC_FAILURES[case]
        user = _plugin(tmp_path, script)
    path = kubeconfig(tmp_path / "kc.json", fake.url, user=user)
    code, _, err, _ = run_cli([*PLAN, "--kubeconfig", path], capsys)
    one_line_error(code, err, "exec credential plugin", said)
    assert not fake.requests  # refused at load, before any request


def test_a_working_exec_credential_plugin_still_loads(fake, tmp_path):
    user = _plugin(tmp_path, "echo '{\"apiVersion\": \"client.authentication.k8s.io/v1\", \"kind\": "
                             "\"ExecCredential\", \"status\": {\"token\": \"from-plugin\"}}'")
    client = load_client(kubeconfig(tmp_path / "kc.json", fake.url, user=user))
    assert client.configuration.api_key["BearerToken"] == "Bearer from-plugin"


def _set(config: dict, path: tuple, value) -> dict:
    where = config
    for key in path[:-1]:
        where = where[key]
    if value is _DELETE:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    return config


_DELETE = object()
CLUSTER, USER = ("clusters", 0, "cluster"), ("users", 0, "user")
WRONG_TYPED = {
    "server-a-number": (CLUSTER + ("server",), 123, "server"),
    "server-a-list": (CLUSTER + ("server",), ["https://a"], "server"),
    "server-not-a-url": (CLUSTER + ("server",), "not a url", "server"),
    "server-missing": (CLUSTER + ("server",), _DELETE, "server"),
    "cluster-a-string": (CLUSTER, "x", "cluster"),
    "user-a-string": (USER, "u", "user"),
    "token-a-list": (USER + ("token",), ["t"], "token"),
    "insecure-skip-a-string": (CLUSTER + ("insecure-skip-tls-verify",), "false", "insecure-skip-tls-verify"),
    "proxy-url-a-number": (CLUSTER + ("proxy-url",), 5, "proxy-url"),
    "contexts-a-number": (("contexts",), 5, "contexts"),
    "current-context-a-number": (("current-context",), 5, "current-context"),
    "exec-args-a-string": (USER + ("exec",), {"apiVersion": "client.authentication.k8s.io/v1", "command": "true",
                                              "args": "--all"}, "args"),
}


@pytest.mark.parametrize("case", WRONG_TYPED)
def test_a_wrong_typed_field_is_one_line_naming_it(case, tmp_path):
    path, value, said = WRONG_TYPED[case]
    (tmp_path / "kc.json").write_text(json.dumps(_set(config_dict("http://127.0.0.1:9"), path, value)))
    with pytest.raises(ValueError) as raised:
        load_client(str(tmp_path / "kc.json"))
    assert "\n" not in str(raised.value) and said in str(raised.value), raised.value


def test_a_wrong_typed_field_exits_2_at_the_cli(tmp_path, capsys):
    (tmp_path / "kc.json").write_text(json.dumps(_set(config_dict("http://127.0.0.1:9"), CLUSTER + ("server",), 8)))
    code, _, err, _ = run_cli([*PLAN, "--kubeconfig", str(tmp_path / "kc.json")], capsys)
    one_line_error(code, err, "server")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field", ["certificate-authority", "tokenFile"])
def test_a_file_the_kubeconfig_names_is_checked_too(field, tmp_path, capsys):
    fifo = tmp_path / "named"
    os.mkfifo(fifo)
    config = config_dict("https://127.0.0.1:9")
    _set(config, (CLUSTER if field == "certificate-authority" else USER) + (field,), str(fifo))
    if field == "tokenFile":
        del config["users"][0]["user"]["token"]
    (tmp_path / "kc.json").write_text(json.dumps(config))
    code, _, err, _ = bounded_cli([*PLAN, "--kubeconfig", str(tmp_path / "kc.json")], capsys, fifo=str(fifo))
    one_line_error(code, err, field, "FIFO")


FIELDS = [("current-context",), ("clusters",), ("contexts",), ("users",), CLUSTER, CLUSTER + ("server",),
          CLUSTER + ("insecure-skip-tls-verify",), CLUSTER + ("tls-server-name",), CLUSTER + ("proxy-url",),
          CLUSTER + ("certificate-authority-data",), ("contexts", 0, "context"), ("contexts", 0, "context", "cluster"),
          ("contexts", 0, "context", "user"), ("contexts", 0, "name"), USER, USER + ("token",), USER + ("username",)]
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                      max_leaves=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_any_value_in_any_field_loads_a_usable_client_or_is_one_line(field, value, tmp_path):
    (tmp_path / "kc.json").write_text(json.dumps(_set(config_dict("https://127.0.0.1:9"), field, value)))
    try:
        client = load_client(str(tmp_path / "kc.json"))
    except ValueError as error:
        assert "\n" not in str(error) and str(error).startswith("cannot load the kubeconfig"), error
    else:
        assert client.configuration.host.startswith(("http://", "https://")), client.configuration.host
        assert isinstance(client.configuration.verify_ssl, bool)


# == 4. a round that cannot read the cluster exits non-zero under --rounds =========================
@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["scheduler", "actuator"])
def test_a_run_whose_round_found_no_api_server_exits_non_zero(command, tmp_path, capsys):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: refused
        argv = [a.format(samples=tmp_path / "s.csv", audit=tmp_path / "a.jsonl") for a in LOOP_ARGS[command]]
        code, _, err, _ = run_cli([*argv, "--rounds", "1", "--request-timeout", "1",
                                   "--kubeconfig", kubeconfig(tmp_path / "kc.json", url)], capsys)
    assert code == 1, err
    assert "Traceback" not in err


@pytest.mark.timeout(60)
def test_a_scheduler_round_on_a_dripping_api_server_ends_and_exits_non_zero(served, tmp_path, capsys):
    server = served(drip_head)
    code, _, err, elapsed_s = run_cli([*LOOP_ARGS["scheduler"], "--rounds", "1", "--request-timeout", "1",
                                       "--kubeconfig", kubeconfig(tmp_path / "kc.json", server.url)], capsys)
    assert code == 1, err
    assert elapsed_s < 20, elapsed_s  # four tries of 1 s and their back-offs


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", ["scheduler", "actuator"])
def test_one_failed_round_of_several_exits_non_zero(command, fake, tmp_path, capsys):
    from builders import make_samples

    make_samples(steps=3).to_csv(tmp_path / "s.csv", index=False)
    node(fake, "gpu-a")
    fake.inject("GET", "/api/v1/nodes$", 503, times=4)  # the first round's four tries; the second reads
    argv = [a.format(samples=tmp_path / "s.csv", audit=tmp_path / "a.jsonl") for a in LOOP_ARGS[command]]
    interval = "--interval-seconds" if command == "scheduler" else "--interval"
    argv[argv.index(interval) + 1] = "0.1"
    if command == "actuator":
        argv += ["--until", "2026-11-01T00:03:00Z"]  # the samples' window: the second round reads them
    code, _, err, _ = run_cli([*argv, "--rounds", "2", "--kubeconfig", kubeconfig(tmp_path / "kc.json", fake.url)],
                              capsys)
    assert len(fake.calls("GET", "/api/v1/nodes$")) >= 5, err  # the second round read the nodes
    assert code == 1, err
    assert "1 of 2" in err, err
