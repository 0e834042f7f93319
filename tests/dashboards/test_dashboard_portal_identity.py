"""The portal page as a person behind an auth proxy sees it: a real Streamlit server rendered by real
headless Chromium through a small proxy that, as oauth2-proxy in front of a dashboard does, drops
the client's own ``X-Forwarded-*`` / ``X-Auth-Request-*`` headers and sets the signed-in identity's
(``X-Forwarded-Email``, ``X-Forwarded-Groups``) on each connection, the page's WebSocket among them
(Streamlit reads them there; Chromium's own extra headers never reach a WebSocket). The portal file maps groups to teams
(``groups``, as the chart renders ``portal.groups``): the form offers only the identity's teams, a
submission reaches the scheduler's ``/submit`` (a stand-in HTTP server) with the header's identity and
is logged to the dashboard's stderr; an identity with no mapped group, or a nested groups header, may
submit for no team and is told why; with no mapping the page says anyone may submit for any team.

Needs the ``chromium`` binary: skipped with a reason when absent, failed under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from queue_server_stand_in import QueueServerStandIn, queue

from gpuwarden.dashboards.cdp import EXCEPTION_MARKERS, Chromium, find_chromium
from gpuwarden.dashboards.launch import launch_dashboard

TEAMS = {name: {"namespace": name, "images": [f"{name}:1"], "shapes": [{"gpus": 1}], "priorityClasses": ["normal"]}
         for name in ("research", "speech", "vision")}
GROUPS = {"ml-research": "research", "platform admins": ["research", "vision"]}


def require(condition: bool, why: str) -> None:
    if not condition:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def write_portal(path: Path, groups: dict | None) -> None:
    document = {"teams": TEAMS} | ({"groups": groups} if groups is not None else {})
    before = path.stat().st_mtime if path.exists() else 0.0
    path.write_text(json.dumps(document))
    os.utime(path, (before + 10, before + 10))  # a new mtime: the page reads the file again


class SignInProxy:
    """A TCP proxy to the dashboard that rewrites each connection's first request head: the client's
    identity headers dropped, ``headers`` (the identity the test signs in as) added. Streamlit reads
    them from the WebSocket's handshake, the first request of its own connection."""

    DROPPED = (b"x-forwarded-", b"x-auth-request-")

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.headers: dict[str, str] = {}
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, rest = head.split(b"\r\n\r\n", 1)
            first, *lines = head.split(b"\r\n")
            kept = [line for line in lines if not line.lower().startswith(self.DROPPED)]
            added = [f"{name}: {value}".encode() for name, value in self.headers.items()]
            upstream.sendall(b"\r\n".join([first, *kept, *added]) + b"\r\n\r\n" + rest)
            back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
            back.start()
            pipe(client, upstream)
            back.join(timeout=5)

    def close(self) -> None:
        self.listener.close()


def pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
        sink.shutdown(socket.SHUT_WR)
    except OSError:  # the other side closed
        pass


@pytest.fixture(scope="module")
def chrome(tmp_path_factory):
    browser = find_chromium()
    require(browser is not None, "chromium is not installed (apt-get install chromium)")
    with Chromium(browser, tmp_path_factory.mktemp("profile"), width=1400, height=1400) as client:
        yield client


@pytest.fixture(scope="module")
def scheduler():
    server = QueueServerStandIn(queue([], [])).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, scheduler):
    root = tmp_path_factory.mktemp("portal-identity")
    portal, log = root / "portal.json", root / "dashboard.log"
    write_portal(portal, GROUPS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    env |= {"GPUWARDEN_VIEW_AUTH": "proxy", "GPUWARDEN_PORTAL_TEMPLATES": str(portal),
            "GPUWARDEN_SCHEDULER_URL": scheduler.url}
    port = free_port()
    with log.open("wb") as sink:
        process = launch_dashboard(root / "store", port=port, env=env, stdout=sink, stderr=subprocess.STDOUT)
    proxy = SignInProxy(port)
    try:
        wait_healthy(port)
        yield proxy, portal, log
    finally:
        proxy.close()
        process.terminate()
        process.wait(timeout=15)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the dashboard never answered on port {port}")


def open_as(chrome: Chromium, proxy: SignInProxy, headers: dict[str, str], needles: tuple[str, ...]) -> str:
    """Load the portal page through the proxy signed in with ``headers``; the client's own
    ``X-Forwarded-Email`` (sent here as an impostor would) never reaches the dashboard."""
    proxy.headers = headers
    chrome.call("Network.setExtraHTTPHeaders", headers={"X-Forwarded-Email": "impostor@example.com"})
    chrome.goto("about:blank")
    chrome.goto(f"{proxy.url}/portal")
    text = chrome.settle(needles, timeout_s=120)
    html = chrome.html()
    for marker in EXCEPTION_MARKERS:
        assert marker not in html, text[:500]
    return text


def team_options(chrome: Chromium) -> list[str]:
    """The Team select's choices as its dropdown lists them: clicked open as a mouse does, read, closed."""
    box = chrome.box('input[role="combobox"][aria-label="Team"]')
    assert box is not None, "no Team select on the page"
    x, y, width, height = box
    chrome.click_at(x + width / 2, y + height / 2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = chrome.evaluate("[...document.querySelectorAll('[role=\"option\"]')].map(o => o.innerText.trim())")
        if found:
            chrome.call("Input.dispatchKeyEvent", type="keyDown", key="Escape", code="Escape", windowsVirtualKeyCode=27)
            return sorted(found)
        time.sleep(0.1)
    raise AssertionError("the Team select never listed its choices")


def test_one_group_one_team_and_the_submission_carries_the_proxys_identity(dashboard, chrome, scheduler):
    proxy, _, log = dashboard
    text = open_as(chrome, proxy, {"X-Forwarded-Email": "ana@example.com", "X-Forwarded-Groups": " ml-research ,other"},
                   ("Signed in as ana@example.com", "you may submit for: research", "Submit request"))
    assert "Any signed-in user may submit for any team" not in text
    assert team_options(chrome) == ["research"]
    posted = len(scheduler.posted)
    assert chrome.click("Submit request")
    chrome.settle(("research/my-job-1 queued",), timeout_s=60)
    assert scheduler.posted[posted:] == [{"identity": "ana@example.com", "request": {
        "team": "research", "name": "my-job", "image": "research:1", "shape": {"gpus": 1}, "priorityClass": "normal",
        "checkpointable": False, "command": []}}]
    deadline = time.monotonic() + 10
    while '"outcome": "submitted"' not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    [line] = [li for li in log.read_text().splitlines() if '"outcome": "submitted"' in li]
    entry = json.loads(line.split("portal submission submitted: ", 1)[1])
    assert (entry["identity"], entry["team"], entry["groups"], entry["workload"]) == (
        "ana@example.com", "research", ["ml-research", "other"], "research/my-job-1")


def test_an_identity_in_several_teams_groups_picks_among_only_those(dashboard, chrome):
    proxy, _, _ = dashboard
    open_as(chrome, proxy, {"X-Auth-Request-Email": "bo@example.com", "X-Auth-Request-Groups": "platform admins"},
            ("Signed in as bo@example.com", "you may submit for: research, vision", "Submit request"))
    assert team_options(chrome) == ["research", "vision"]  # never speech


@pytest.mark.parametrize(("groups", "why"), [
    ("", "none of your groups maps to one"),
    ("sales, Ml-Research", "none of your groups maps to one"),  # exact names: a case change is another group
    ('["ml-research"]', "X-Forwarded-Groups: a nested or quoted value"),
    (",".join(f"g{i}" for i in range(600)), "X-Forwarded-Groups: more than 512 groups"),
], ids=["no-groups", "unmapped", "nested", "too-many"])
def test_an_identity_whose_groups_map_to_no_team_may_submit_for_none(dashboard, chrome, scheduler, groups, why):
    proxy, _, _ = dashboard
    headers = {"X-Forwarded-Email": "eve@example.com"} | ({"X-Forwarded-Groups": groups} if groups else {})
    text = open_as(chrome, proxy, headers, ("Signed in as eve@example.com", "You may submit for no team"))
    assert why in text and "Submit request" not in text


def test_without_a_mapping_the_page_says_anyone_may_submit_for_any_team(dashboard, chrome):
    proxy, portal, _ = dashboard
    write_portal(portal, None)
    try:
        open_as(chrome, proxy, {"X-Forwarded-Email": "eve@example.com"},
                ("Any signed-in user may submit for any team", "portal.groups", "Submit request"))
        assert team_options(chrome) == ["research", "speech", "vision"]
    finally:
        write_portal(portal, GROUPS)
