"""The dashboard as a person sees it: a real Streamlit server rendered by real headless Chromium,
driven over the DevTools protocol (:mod:`gpuwarden.dashboards.cdp`).

Every page is loaded on a full simulated store (samples, cluster snapshot, an action awaiting
approval; the Queue and Request pages fed by the demo's own scheduling loop, as `gpuwarden demo`
serves it, and the demo's portal templates) and on an empty one, and must show its own content and no exception text. Then an approval is clicked in the browser and the actuator applies it.

Needs the ``chromium`` binary (Debian package ``chromium``, installed by ``.ci/run``) and the
shared traces the simulator reads: skipped with a reason when absent, failed under ``CI=true``.
One dashboard process per store and one Chromium for the whole module keep it fast.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import urllib.parse
from pathlib import Path

import pytest

from gpuwarden.remediation import (
    Actuator,
    AuditLog,
    Mode,
    Reconciler,
    SafetyLimits,
    approvals,
)
from gpuwarden.portal.submit import DEMO_TEMPLATES_PATH
from gpuwarden.dashboards.cdp import EXCEPTION_MARKERS, Chromium, find_chromium
from gpuwarden.kube.gates import REQUESTED_BY_ANNOTATION
from gpuwarden.scheduler.queue_server import QueueServer
from gpuwarden.cli.demo_live import portal_submitter

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("screenshots", ROOT / "scripts" / "screenshots.py")
screenshots = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(screenshots)

# url path -> what that page itself must show on a full store (beyond its title)
FULL_CONTENT = {
    "": ("Fleet overview", "GPUs reporting", "Activity by node and GPU (%)", "Nodes"),
    "gpu": ("GPU detail", "Memory (GiB)", "Power (W)", "Findings on this GPU"),
    "idle": ("Idle GPUs and why", "Idle GPU-hours", "GPU-hours by state over time", "Pods hoarding GPU memory"),
    "cost": ("Cost and chargeback", "Fleet cost", "Cost over time", "Chargeback", "Buy vs rent"),
    "health": ("GPU health", "Critical", "XID / ECC / row-remap events per node"),
    "queue": ("Queue & quotas", "Per team (GPUs)", "Pending workloads, in queue order", "round "),
    "portal": ("Request GPUs", "Submit request", "Your requests in the queue", "Team priorities (team leads)"),
    "actions": ("Actuator actions", "Awaiting approval", "Approve", "Limits:"),
}
EMPTY_CONTENT = {
    "": "gpuwarden demo", "gpu": "gpuwarden demo", "idle": "gpuwarden demo", "cost": "gpuwarden demo",
    "health": "gpuwarden demo", "queue": "GPUWARDEN_SCHEDULER_URL", "portal": "GPUWARDEN_PORTAL_TEMPLATES", "actions": "never run",
}
APPROVER = "dana-oncall"


def require(condition: bool, why: str) -> None:
    if not condition:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def chrome(tmp_path_factory):
    browser = find_chromium()
    require(browser is not None, "chromium is not installed (apt-get install chromium)")
    with Chromium(browser, tmp_path_factory.mktemp("profile"), width=1400, height=1400) as client:
        yield client


@pytest.fixture(scope="module")
def full_store(tmp_path_factory):
    require(screenshots.DATA_DIR.is_dir(), f"the shared traces the simulator reads are absent ({screenshots.DATA_DIR})")
    root = tmp_path_factory.mktemp("full") / "store"
    built = screenshots.build_demo_store(root, nodes=4, days=0.25)
    return root, built


def serve(store: Path, **env):
    port = screenshots.free_port()
    process = screenshots.start_dashboard(store, port, env)
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def scheduler(full_store):
    """The demo's own scheduling loop serving its live queue and taking portal submissions, as
    ``gpuwarden demo`` serves them: the round the simulated fleet was scheduled by. Its tables are
    drawn on a canvas, so the page is checked by its caption naming the round."""
    simulation = full_store[1]["simulation"]
    assert simulation.scheduling.rounds > 0  # the simulated fleet ran its rounds while the store filled
    server = QueueServer(lambda: simulation.scheduling.queue, submit=portal_submitter(simulation, REQUESTED_BY_ANNOTATION),
                         port=0).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def full(full_store, chrome, scheduler):
    root, built = full_store
    process, url = serve(root, GPUWARDEN_DEMO_APPROVER=APPROVER, GPUWARDEN_SCHEDULER_URL=scheduler.url,
                         GPUWARDEN_PORTAL_TEMPLATES=str(DEMO_TEMPLATES_PATH))
    chrome.goto(url + "/")  # a fresh server can serve a blank first load
    chrome.settle(("Fleet overview",), timeout_s=120)
    yield url, root, built
    process.terminate()
    process.wait(timeout=15)


@pytest.fixture(scope="module")
def empty(tmp_path_factory, chrome):
    root = tmp_path_factory.mktemp("empty")
    process, url = serve(root)
    yield url
    process.terminate()
    process.wait(timeout=15)


def load(chrome: Chromium, url: str, needles: tuple[str, ...], in_app: str | None = None) -> str:
    """Open a page (through the app's own sidebar link when ``in_app`` names it, else by URL) and
    check it shows ``needles`` and no exception text."""
    started = time.monotonic()
    if in_app is None or not chrome.open_page(in_app):
        chrome.goto(url)
    text = chrome.settle(needles, timeout_s=120)
    html = chrome.html()
    for marker in EXCEPTION_MARKERS:
        assert marker not in html, f"{url} shows exception text: {text[:500]}"
    assert "could not be drawn" not in text, text[:500]
    print(f"{url}: {time.monotonic() - started:.1f} s")
    return text


def test_every_page_on_a_full_store(full, chrome):
    url, _, _ = full
    chrome.goto(url + "/")
    for path, needles in FULL_CONTENT.items():
        text = load(chrome, f"{url}/{path}", needles, in_app=path)
        assert "gpuwarden demo" not in text, f"/{path} says the store is empty"


def test_every_page_on_an_empty_store(empty, chrome):
    chrome.goto(empty + "/")
    for path, needle in EMPTY_CONTENT.items():
        load(chrome, f"{empty}/{path}", (needle,), in_app=path)


def test_a_heatmap_cell_opens_that_gpus_detail(full, chrome):
    """Click a cell of the node x GPU heatmap on the Fleet page: the GPU detail page opens on that
    GPU (its UUID in the URL, its charts and name on the page)."""
    url, _root, built = full
    load(chrome, url + "/", ("Activity by node and GPU (%)",))  # by URL: the browser may be on another server
    heatmap = '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg'  # the page's first chart
    assert chrome.box(heatmap) is not None, "no heatmap on the Fleet page"
    time.sleep(0.5)  # after scrolling it into view, let the page stop moving
    x, y, width, height = chrome.box(heatmap)
    # The cells fill the plot area: right of the node names, above the GPU-index axis, left of the legend.
    chrome.click_at(x + width * 0.45, y + height * 0.35)
    text = chrome.settle(("GPU detail", "Memory (GiB)", "Findings on this GPU"), timeout_s=120)
    href = chrome.evaluate("location.href")
    assert "/gpu" in href and "gpu=" in href, href
    chosen = urllib.parse.parse_qs(urllib.parse.urlparse(href).query)["gpu"][0]
    assert chosen in {gpu.uuid for gpu in built["cluster"].snapshot().gpus}
    assert chosen in text  # the page shows the GPU that was clicked


def test_approve_in_the_browser_then_the_actuator_applies_it(full, chrome):
    url, _root, built = full
    audit = built["audit"]
    [waiting] = approvals.pending(audit)
    load(chrome, f"{url}/actions", ("Awaiting approval", "Approve", f"Signed in as {APPROVER}"))
    assert chrome.click("Approve")
    text = chrome.settle(("Decisions", APPROVER, "Nothing waits for a person."), timeout_s=60)
    assert "approved" in text
    decisions = [json.loads(line) for line in audit.read_text().splitlines()]
    decided = [d for d in decisions if d.get("outcome") == "approved"]
    assert [(d["approval_id"], d["by"]) for d in decided] == [(waiting.approval_id, APPROVER)]
    assert approvals.pending(audit) == []

    # The actuator's next round in approve mode (a fresh process would do the same: the queue is the log).
    if getattr(approvals, "MINIMAL_STAND_IN", False):
        pytest.skip("this branch carries the approvals stand-in; the actuator applies approved actions from the log "
                    "once the actuator's approvals module is merged")
    actuator = Actuator(built["cluster"], Mode.APPROVE, SafetyLimits(max_cordoned_node_ratio=1.0), AuditLog(audit))
    Reconciler(actuator, lambda _snapshot: [built["finding"]]).reconcile_once()
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    applied = [e for e in entries if e.get("outcome") == "applied" and e.get("target") == built["node"]]
    assert applied and applied[-1].get("by") == APPROVER
    assert built["node"] in built["cluster"].snapshot().cordoned
    text = load(chrome, f"{url}/actions", ("Applied",))
    assert APPROVER in text


def test_submit_from_the_portal_in_the_browser(full, chrome, scheduler):
    """The form as drawn: the first team's template, the signed-in identity; the request reaches the
    scheduler's /submit and the page says where it went."""
    url, _root, _built = full
    load(chrome, f"{url}/portal", ("Submit request", f"Signed in as {APPROVER}"))
    assert chrome.click("Submit request")
    chrome.settle(("applied-ml/my-job-1 submitted by",), timeout_s=60)
    (state,) = [w for w in _built["cluster"].snapshot().workloads if w.workload.key == "applied-ml/my-job-1"]
    assert state.annotations[REQUESTED_BY_ANNOTATION] == APPROVER and state.workload.priority_class.value == "normal"
