"""The recorded H200 through a real Prometheus with no kubelet: idle by activity, not "unallocated".

A real exporter replays ``h200/phase_trace.csv`` (the NVML backend over the recorded H200, no pod
attribution: the exporter serves ``gpuwarden_pod_attribution_state{state="off"}``), a real
Prometheus (Debian package ``prometheus``) scrapes it every second. The test holds the replay in
the ``compute_bf16_matmul`` phase, then in ``idle_no_process``, and reads the samples back through
``gpuwarden report idle --source prometheus``: the matmul time is ``busy``, the idle time is
``idle_unattributed``, nothing is ``unallocated`` (nobody could see a pod), and the report says
all of it is unattributed. A read with a single sample per GPU at the default 60 s step answers.
"""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from gpuwarden.analytics import build_ledger
from gpuwarden.cli import main
from gpuwarden.exporter import ExporterService
from gpuwarden.exporter.replay import ReplayBackend
from gpuwarden.store.prometheus import PrometheusSource
from servers import PrometheusServer, wait_for

SERVE_SECONDS = {"compute_bf16_matmul": 6.0, "idle_no_process": 7.5}


def _hold(exporter: ExporterService, backend: ReplayBackend, rows: range, seconds: float) -> None:
    """Serve trace rows ``rows`` (looping inside them) for ``seconds``, four collections a second."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if backend.recorded.cursor not in rows:
            backend.recorded.cursor = rows.start
        exporter.collect_now()
        time.sleep(0.25)


@pytest.fixture(scope="module")
def h200(data_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prometheus-h200")
    trace = pd.read_csv(data_dir / "h200" / "phase_trace.csv")
    backend = ReplayBackend("h200-lab-000", data_dir / "h200" / "phase_trace.csv", data_dir / "h200" / "nvml_probe.json",
                            xid_events=False)
    # No attributor (no kubelet socket); collections are driven by the test, not a timer.
    exporter = ExporterService(backend, interval_seconds=3600, host="127.0.0.1", port=0, node_name="h200-lab-000").start()
    server = None
    try:
        target = exporter.url.split("//", 1)[1].rsplit("/metrics", 1)[0]
        server = PrometheusServer(tmp, [target], [])
        wait_for(server.ready, 30, "prometheus /-/ready")
        source = PrometheusSource(server.url, step=1, lookback="2s", timeout=5, retries=1, backoff=0.05)
        wait_for(lambda: source.query("DCGM_FI_DEV_GPU_UTIL"), 30, "the first scraped sample")
        served = {}
        for phase, seconds in SERVE_SECONDS.items():
            index = trace.index[trace["phase"] == phase]
            started = pd.Timestamp.now(tz="UTC")
            _hold(exporter, backend, range(int(index.min()), int(index.max()) + 1), seconds)
            served[phase] = (started, pd.Timestamp.now(tz="UTC"))
        time.sleep(1.2)  # one more scrape of the last phase
        yield {"server": server, "source": source, "served": served}
    finally:
        if server is not None:
            server.stop()
        exporter.stop()


def _report(capsys, *argv: str) -> dict:
    code = main(["report", "idle", "--source", "prometheus", *argv, "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "RuntimeWarning" not in err and "FutureWarning" not in err
    # No recording rules are loaded here: the report says it read raw samples instead, and how much slower.
    report = json.loads(out)
    assert any("no gpuwarden recording-rule rollups" in note and "slower" in note for note in report["notes"])
    return report


def test_matmul_is_busy_and_nothing_is_unallocated(h200, capsys, caplog):
    report = _report(capsys, "--prometheus-url", h200["server"].url, "--prometheus-step", "1s", "--since", "5m")
    assert any("no gpuwarden recording-rule rollups" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    summary = report["summary"]
    assert summary["idle_gpu_hours_by_reason"]["unallocated"] == 0
    assert summary["unattributed_share"] == pytest.approx(1.0)
    assert any("unattributed" in note for note in report["notes"])
    states = {row["state"]: row["gpu_hours"] for row in report["tables"]["states"]}
    assert states["busy"] > 0 and states["idle_unattributed"] > 0, states
    # Sample by sample: the matmul phase is busy, the idle phase (once its window is all idle) idle.
    source = h200["source"]
    frame = source.read(h200["served"]["compute_bf16_matmul"][0] - pd.Timedelta(seconds=5), pd.Timestamp.now(tz="UTC"))
    assert set(frame["attribution"].astype(str)) == {"off"}
    assert frame["pod"].isna().all()
    ledger = build_ledger(frame, keep_rows=True)
    rows = ledger.classified.assign(timestamp=ledger.classified["timestamp"])
    matmul_start, matmul_end = h200["served"]["compute_bf16_matmul"]
    idle_start, idle_end = h200["served"]["idle_no_process"]
    in_matmul = rows[(rows["timestamp"] >= matmul_start + pd.Timedelta(seconds=2)) & (rows["timestamp"] <= matmul_end)]
    in_idle = rows[(rows["timestamp"] >= idle_start + pd.Timedelta(seconds=6)) & (rows["timestamp"] <= idle_end)]
    assert len(in_matmul) >= 3 and len(in_idle) >= 1
    assert set(in_matmul["state"].astype(str)) == {"busy"}
    assert set(in_idle["state"].astype(str)) == {"idle_unattributed"}


def test_one_sample_per_gpu_at_the_default_step_answers(h200, capsys):
    """The issue's failure: a Prometheus with under a minute of history, read at the default 60 s
    grid, gives one sample per GPU; the source's step stands for it."""
    def newest_clear_of_the_minute():
        # The window below starts 59 s before its grid point: a newest sample in the first 2 s
        # after a minute boundary would fall before it. Prometheus keeps scraping, so wait past.
        newest = h200["source"].time_range()[1]
        return newest if newest - newest.floor("60s") >= pd.Timedelta(seconds=2) else None

    newest = wait_for(newest_clear_of_the_minute, 10, "a newest sample 2 s past a minute boundary")
    grid = newest.ceil("60s")  # the one grid point whose last minute holds the newest sample
    report = _report(capsys, "--prometheus-url", h200["server"].url, "--since", "1m",
                     "--until", (grid + pd.Timedelta(seconds=1)).isoformat())
    assert report["quality"]["rows_read"] == 1
    assert report["window"]["step_seconds"] == 60
    assert report["summary"]["gpu_hours"] == pytest.approx(60 / 3600)
    assert report["summary"]["idle_gpu_hours_by_reason"]["unallocated"] == 0
