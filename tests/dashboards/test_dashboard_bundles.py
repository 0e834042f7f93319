"""Report bundles: what a page shows over one window, kept beside the store, served while a fresh
one is computed, and precomputed by the demo so a page's first view computes nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from test_dashboard_idle_cost import fleet

from gpuwarden.analytics import report_bundle
from gpuwarden.analytics.report_bundle import Bundle
from gpuwarden.analytics.windows import Window, window_for
from gpuwarden.dashboards import STORE_ENV
from gpuwarden.dashboards.board import Board
from gpuwarden.dashboards.launch import APP_PATH
from gpuwarden.store import LocalStore

END = pd.Timestamp("2026-03-02T12:00:00Z")


def day_ending(end: pd.Timestamp) -> Window:
    return Window(end - pd.Timedelta(hours=24), end, "last 24 hours", "24h")


def test_a_bundle_round_trips_frames_and_values(tmp_path):
    series = pd.DataFrame({"util": [0.5, np.nan]}, index=pd.DatetimeIndex(["2026-03-02T00:00Z", "2026-03-02T00:10Z"],
                                                                          name="timestamp"))
    empty = pd.DataFrame({"team": pd.Series(dtype=object), "gpus": pd.Series(dtype="float64")})
    bundle = Bundle({"series": series, "empty": empty, "headline": {"gpus": 8, "mean": None}, "pair": [7, 8]},
                    END - pd.Timedelta(hours=1), END, 123.5)
    report_bundle.save(tmp_path, "fleet", "custom:2026-03-01:2026-03-02", bundle)
    back = report_bundle.load(tmp_path, "fleet", "custom:2026-03-01:2026-03-02")
    assert back is not None and (back.start, back.end, back.version) == (bundle.start, bundle.end, 123.5)
    pd.testing.assert_frame_equal(back["series"], series, check_freq=False)
    assert back["empty"].empty and list(back["empty"].columns) == ["team", "gpus"]
    assert back["headline"] == {"gpus": 8, "mean": None} and back["pair"] == [7, 8]
    assert report_bundle.load(tmp_path, "fleet", "24h") is None  # another window: none


def test_a_damaged_bundle_is_simply_computed_again(tmp_path):
    bundle = Bundle({"n": 1}, END - pd.Timedelta(hours=1), END, 1.0)
    folder = report_bundle.save(tmp_path, "fleet", "24h", bundle)
    (folder / report_bundle.META_FILE).write_text("{not json")
    assert report_bundle.load(tmp_path, "fleet", "24h") is None
    board = Board()
    fresh = board.get("fleet", str(tmp_path), day_ending(END), 1.0, lambda source, window, version: Bundle(
        {"n": 2}, window.start, window.end, version))
    assert fresh is not None and fresh["n"] == 2 and board.computed["fleet"] == 1


class CountingBuilder:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, source, window: Window, version: float) -> Bundle:
        self.calls += 1
        return Bundle({"n": self.calls}, window.start, window.end, version)


def test_new_samples_serve_the_last_bundle_while_a_fresh_one_is_computed(tmp_path):
    board, build, path = Board(), CountingBuilder(), str(tmp_path)
    first = board.get("ledger", path, day_ending(END), 1.0, build)
    assert first["n"] == 1 and board.get("ledger", path, day_ending(END), 1.0, build) is first  # same version: kept
    later = day_ending(END + pd.Timedelta(minutes=10))
    assert board.get("ledger", path, later, 2.0, build)["n"] == 1  # served at once, a little behind
    board.wait()
    assert board.get("ledger", path, later, 2.0, build)["n"] == 2 and build.calls == 2
    far = day_ending(END + pd.Timedelta(hours=12))  # more than a quarter of the window behind: computed now
    assert board.get("ledger", path, far, 3.0, build)["n"] == 3


def test_a_page_that_does_not_wait_gets_none_then_the_bundle(tmp_path):
    board, build = Board(), CountingBuilder()
    assert board.get("health", str(tmp_path), day_ending(END), 1.0, build, wait=False) is None
    board.wait()
    assert board.get("health", str(tmp_path), day_ending(END), 1.0, build, wait=False)["n"] == 1
    assert report_bundle.load(tmp_path, "health", "24h") is not None  # written beside the store for the next process


def test_the_demo_precomputes_what_the_pages_show(monkeypatch, tmp_path):
    """After ``precompute_reports`` (what ``gpuwarden demo`` runs before opening the dashboard),
    the Fleet, GPU detail, Idle, Cost and Health pages draw without reading or analysing a single
    sample."""
    from gpuwarden.analytics import fleet_report, health_report, idle_cost_report
    from gpuwarden.cli.demo import precompute_reports

    store = LocalStore(tmp_path)
    store.append(fleet())
    assert precompute_reports(store) == ["fleet", "ledger", "health", "gpus"]
    oldest, newest = store.time_range()
    assert report_bundle.load(tmp_path, "ledger", window_for("24h", oldest, newest).key).version == \
        report_bundle.store_version(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("a page computed a report the demo had precomputed")

    for module, name in ((fleet_report, "fleet_bundle"), (idle_cost_report, "ledger_bundle"),
                         (health_report, "health_bundle"), (fleet_report, "gpu_histories_bundle"),
                         (fleet_report, "gpu_history")):
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    at = AppTest.from_file(str(APP_PATH), default_timeout=60)
    at.run()
    for page in ("fleet.py", "gpu.py", "idle.py", "cost.py", "health.py"):
        at.switch_page(f"views/{page}").run()
        assert not at.exception and not at.error, page
    metrics = {m.label: m.value for m in at.switch_page("views/idle.py").run().metric}
    assert metrics["Idle GPU-hours"] == "6.0 GPU-h"  # the precomputed figure: hoarded, unallocated, fake busy, 2 h each


@pytest.mark.parametrize("preset", ["1h", "24h"])
def test_presets_end_at_the_newest_sample_and_have_a_key(preset):
    window = window_for(preset, END - pd.Timedelta(days=3), END)
    assert window.key == preset and window.end == END + pd.Timedelta(seconds=1)


def test_a_page_reading_a_bundle_finishes_it_when_a_newer_one_lands(tmp_path):
    frame = pd.DataFrame({"gpus": [1.0, 2.0]})
    report_bundle.save(tmp_path, "ledger", "24h", Bundle({"table": frame, "n": 1}, END - pd.Timedelta(hours=1), END, 1.0))
    old = report_bundle.load(tmp_path, "ledger", "24h")  # frames are read when first asked for
    report_bundle.save(tmp_path, "ledger", "24h", Bundle({"table": frame * 10, "n": 2}, END - pd.Timedelta(hours=1), END, 2.0))
    assert old["table"]["gpus"].tolist() == [1.0, 2.0] and old["n"] == 1  # its own copy, not half of the new one
    new = report_bundle.load(tmp_path, "ledger", "24h")
    assert new["table"]["gpus"].tolist() == [10.0, 20.0] and new.version == 2.0


def test_a_page_that_waits_joins_the_computation_another_page_started(tmp_path):
    import threading

    release = threading.Event()
    build = CountingBuilder()

    def slow(source, window, version):
        release.wait(30)
        return build(source, window, version)

    board = Board()
    assert board.get("ledger", str(tmp_path), day_ending(END), 1.0, slow, wait=False) is None  # the Fleet tile
    threading.Timer(0.2, release.set).start()
    assert board.get("ledger", str(tmp_path), day_ending(END), 1.0, slow)["n"] == 1  # the Idle page: same one
    assert build.calls == 1
