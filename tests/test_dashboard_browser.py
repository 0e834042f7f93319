"""The dashboard as a person sees it: a real Streamlit server rendered by real headless Chromium.

Needs the ``chromium`` binary (Debian package ``chromium``, installed by ``.ci/run``): skipped with
a reason when absent, failed under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from gpuwarden.dashboards.launch import dashboard_url, launch_dashboard
from gpuwarden.store import LocalStore, coerce

from test_dashboard import fleet_frame  # the hand-built 2-node fleet with known numbers

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed; .ci/run must install the Debian package 'chromium'")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"dashboard never became healthy at {url}")


def render(browser: str, url: str, profile, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=15000", *extra, url],
        capture_output=True, text=True, timeout=120,
    )


def test_fleet_page_renders_in_chromium(tmp_path):
    browser = chromium()
    store = LocalStore(tmp_path / "store")
    store.append(coerce(fleet_frame()))
    port = free_port()
    process = launch_dashboard(store.root, port=port, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/_stcore/health")
        url = dashboard_url("127.0.0.1", port)
        # A fresh Streamlit server can serve a blank first load: load once, then read.
        render(browser, url, tmp_path / "profile", "--dump-dom")
        dom = ""
        for _ in range(3):
            dom = render(browser, url, tmp_path / "profile", "--dump-dom").stdout
            if "GPUs allocated now" in dom:
                break
        assert "Fleet" in dom
        assert "GPUs allocated now" in dom
        # The headline metrics rendered with the store's numbers (8 GPUs on 2 nodes).
        assert re.search(r'data-testid="stMetricValue"[^>]*>.*?>8<', dom, re.S)
        assert re.search(r'data-testid="stMetricValue"[^>]*>.*?>2<', dom, re.S)
        screenshot = tmp_path / "fleet.png"
        for _ in range(3):  # on a busy machine a capture can still catch the page before it paints
            render(browser, url, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1400,1000")
            if screenshot.exists() and screenshot.stat().st_size > 20_000:
                break
        assert screenshot.exists() and screenshot.stat().st_size > 20_000  # a page, not a blank frame
    finally:
        process.terminate()
        process.wait(timeout=15)
