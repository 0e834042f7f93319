"""The Fleet page's savings tile: the figure of gpuwarden/scheduling/savings_history.py for the page's
window, computed in the background (the page never waits for it) and drawn when ready; why there is
none on too little history. Headless through the app's router with Streamlit's AppTest, and as a
person sees it: a real Streamlit server rendered by real headless Chromium, where the tile fills in
by itself once the search is done."""

from __future__ import annotations

import os
import time

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from test_dashboard_idle_cost import START, fleet

from gpuwarden.analytics.windows import window_for
from gpuwarden.dashboards import STORE_ENV
from gpuwarden.dashboards.cdp import EXCEPTION_MARKERS, Chromium, find_chromium
from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.scheduling.savings_history import history_savings
from gpuwarden.store import LocalStore, coerce

TITLE = "What gpuwarden would have saved on this window's work"
PENDING = "Working out the smallest fleet each policy needs"


def _expected(store_dir) -> dict:
    """The figure for the page's default window (the last 24 hours, clipped to the store)."""
    store = LocalStore(store_dir)
    window = window_for("24h", *store.time_range())
    return history_savings(store, window.start, window.end).figure()


def _page_until(at: AppTest, done, timeout_s: float = 120.0) -> AppTest:
    """Rerun the page until ``done(at)``: the search runs on the dashboard's worker thread."""
    deadline = time.monotonic() + timeout_s
    while True:
        at.run()
        assert not at.exception, at.exception
        if done(at) or time.monotonic() > deadline:
            return at
        time.sleep(0.2)


def _texts(at: AppTest, kind: str) -> list[str]:
    return [element.value for element in getattr(at, kind)]


def test_the_fleet_page_shows_the_windows_savings_figure(monkeypatch, tmp_path):
    LocalStore(tmp_path).append(coerce(fleet()))
    expected = _expected(tmp_path)
    assert expected["ok"] and expected["jobs"] == 4  # four pods; the GPU nobody holds has no known owner
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at = _page_until(at, lambda page: any(expected["headline"] in text for text in _texts(page, "success")))
    assert TITLE in _texts(at, "subheader")
    assert _texts(at, "success") == [expected["headline"] + "."]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["gpuwarden"] == f"{expected['nodes']} nodes"
    assert metrics["kube-default"] == f"{expected['baseline_nodes']} nodes"
    assert metrics["GPU-hours saved"] == f"{expected['saved_pct']:.0f}%"
    assert (tmp_path / "reports" / "savings").is_dir()  # kept beside the store for the next dashboard process


def test_too_little_history_says_why(monkeypatch, tmp_path):
    samples = fleet()
    LocalStore(tmp_path).append(coerce(samples[samples["timestamp"] < START + pd.Timedelta(minutes=30)]))
    expected = _expected(tmp_path)
    assert not expected["ok"] and "too little history" in expected["why"]
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    at = _page_until(AppTest.from_file(str(APP_PATH), default_timeout=60),
                     lambda page: any("No savings figure" in text for text in _texts(page, "info")))
    assert expected["headline"] in _texts(at, "info") and not _texts(at, "success")
    assert "Fleet overview" in _texts(at, "title")  # the rest of the page is drawn as ever


def require(condition: bool, why: str) -> None:
    if not condition:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def test_in_the_browser_the_tile_fills_in_by_itself(tmp_path):
    """The first view draws the page at once with the tile pending; the tile's fragment looks again
    every few seconds and, once the search is done, the headline appears without a reload."""
    import importlib.util
    from pathlib import Path

    browser = find_chromium()
    require(browser is not None, "chromium is not installed (apt-get install chromium)")
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("screenshots", root / "scripts" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    screenshots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(screenshots)
    store = tmp_path / "store"
    LocalStore(store).append(coerce(fleet()))
    expected = _expected(store)
    port = screenshots.free_port()
    process = screenshots.start_dashboard(store, port)
    try:
        with Chromium(browser, tmp_path / "profile", width=1400, height=1400) as chrome:
            chrome.goto(f"http://127.0.0.1:{port}/")
            text = chrome.settle(("Fleet overview", TITLE, expected["headline"]), timeout_s=120)
            html = chrome.html()
            for marker in EXCEPTION_MARKERS:
                assert marker not in html, text[:500]
            assert PENDING not in text
    finally:
        process.terminate()
        process.wait(timeout=15)
