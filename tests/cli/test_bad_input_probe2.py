"""Issue 24's second bad-input probe: each class it found, held (a one-line error naming the value,
or a count said beside the results; never data lost or changed without a word).

Servers here are real sockets on 127.0.0.1 (a trickling HTTP server, a raw pipelining client);
the store race runs a real compaction in another process against reads in this one."""

from __future__ import annotations

import socket
import threading
import time

from builders import gpu_reading
from polling import wait_for
from builders import FakeBackend

from gpuwarden.exporter.web import Limits


# -- 6. the exporter's per-connection output is bounded while a client pipelines and never reads --
def test_a_client_that_keeps_pipelining_and_never_reads_is_dropped_at_the_write_timeout(started):  # noqa: F811
    readings = [gpu_reading(i) for i in range(64)]
    service = started(FakeBackend(readings), http_limits=Limits(write_timeout=0.3, idle_timeout=30))
    wait_for(lambda: service.snapshot.success, what="first collection")
    answer_bytes = len(service.render_metrics())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", service.port))
    sock.settimeout(0.2)
    wait_for(lambda: service._server.open_connections == 1, what="connection open")
    largest_buffer_bytes = 0
    sent_requests = 0
    started_at = time.monotonic()
    dropped_after_s = None
    try:
        while time.monotonic() - started_at < 5.0:  # requests keep coming: each used to re-arm the timers
            try:
                sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                sent_requests += 1
            except TimeoutError:
                pass  # the server stopped reading (backpressure): the client keeps trying
            except OSError:
                dropped_after_s = time.monotonic() - started_at
                break
            for connection in list(service._server._connections):
                if connection.transport is not None:
                    largest_buffer_bytes = max(largest_buffer_bytes, connection.transport.get_write_buffer_size())
            if service._server.open_connections == 0:
                dropped_after_s = time.monotonic() - started_at
                break
    finally:
        sock.close()
    assert sent_requests > 10
    assert dropped_after_s is not None and dropped_after_s < 3.0, dropped_after_s
    # At most the answer being written sits in user space (plus its head), never one per request.
    assert largest_buffer_bytes <= answer_bytes + 1024, (largest_buffer_bytes, answer_bytes)
    wait_for(lambda: service._server.open_connections == 0, what="closed")
    assert service._server.open_connections == 0


# -- a scripted HTTP server: each test says how it answers ----------------------------------------
class Scripted:
    """A real HTTP server on 127.0.0.1 whose every answer is ``answer(handler)``."""

    def __init__(self, answer) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                answer(self)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer(self)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *_: None  # a client that hung up on a slow answer is the point, not news
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def trickle(handler) -> None:
    """A 200 whose JSON body arrives one byte every 0.2 s: each socket read is quick, the answer never is."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    try:
        for _ in range(1000):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.2)
    except OSError:
        pass


def drip_headers(handler) -> None:
    """A status line, then one header line every 0.3 s: the head never ends."""
    handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
    try:
        for line in range(100):
            handler.wfile.write(f"X-Drip-{line}: a\r\n".encode())
            handler.wfile.flush()
            time.sleep(0.3)
    except OSError:
        pass


def endless(handler) -> None:
    """A chunked body that never ends, as fast as the socket takes it."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    try:
        while True:
            handler.wfile.write(b"10000\r\n" + b" " * 65536 + b"\r\n")
    except OSError:
        pass


def late(handler) -> None:
    """Answers, correctly, after 5 s."""
    time.sleep(5)
    json_answer({"status": "success", "data": {"resultType": "vector", "result": []}})(handler)


def body_answer(body: bytes, content_type: str):
    """A 200 with ``body``."""
    def answer(handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def json_answer(payload):
    import json

    return body_answer(json.dumps(payload).encode(), "application/json")


def run_cli(argv: list[str], capsys) -> tuple[int, str, str, float]:
    from gpuwarden.cli import main

    capsys.readouterr()
    began = time.monotonic()
    code = main(argv)
    elapsed_s = time.monotonic() - began
    out, err = capsys.readouterr()
    return code, out, err, elapsed_s


# -- 7. whole-request deadlines ------------------------------------------------------------------
import pytest  # noqa: E402


def report_idle_from(answer, timeout_s: str, capsys):
    """``report idle`` against a scripted Prometheus answering with ``answer``: (exit, out, err, seconds)."""
    server = Scripted(answer)
    try:
        return run_cli(["report", "idle", "--source", "prometheus", "--prometheus-url", server.url,
                        "--prometheus-timeout", timeout_s], capsys)
    finally:
        server.close()


@pytest.mark.parametrize("answer", [trickle, late, drip_headers], ids=["trickled-body", "answer-after-deadline",
                                                                    "dripped-head"])
def test_a_slow_prometheus_fails_at_the_timeout_not_per_socket_read(answer, capsys):
    code, _, err, elapsed_s = report_idle_from(answer, "1", capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "no whole answer within 1 s (--prometheus-timeout)" in err
    assert elapsed_s < 2.5, elapsed_s  # the timeout plus a small margin (it used to be unbounded)


def test_an_answer_larger_than_the_bound_is_refused_naming_what_to_ask_for():
    from gpuwarden.store.prometheus import PrometheusError, PrometheusSource

    server = Scripted(endless)
    try:
        source = PrometheusSource(server.url, timeout=30)
        source.max_answer_bytes = 4 << 20  # the shipped bound is 1 GiB; a small one keeps the test light
        began = time.monotonic()
        with pytest.raises(PrometheusError, match="the answer is larger than 4,194,304 bytes .* shorter window"):
            source.time_range()
        assert time.monotonic() - began < 10
    finally:
        server.close()


def test_the_scraper_gives_up_on_a_trickling_target_at_its_timeout(tmp_path):
    from gpuwarden.store import LocalStore
    from gpuwarden.store.scraper import Scraper

    server = Scripted(trickle)
    try:
        scraper = Scraper([server.url + "/metrics"], LocalStore(tmp_path / "s"), timeout_seconds=0.5)
        began = time.monotonic()
        (result,) = scraper.scrape_once()
        elapsed_s = time.monotonic() - began
    finally:
        server.close()
    assert not result.ok and "within 0.5 s" in result.error, result
    assert elapsed_s < 1.5, elapsed_s


# -- 8. every answer checked before use ---------------------------------------------------------
WRONG_SHAPES = {
    "data-is-a-list": {"status": "success", "data": [1, 2]},
    "result-is-a-dict": {"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}},
    "metric-is-text": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": "x", "value": [1, "1"]}]}},
    "value-not-a-pair": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": 7}]}},
    "value-not-a-number": {"status": "success", "data": {"resultType": "vector",
                                                         "result": [{"metric": {}, "value": [1, "lots"]}]}},
    "label-value-a-number": {"status": "success", "data": {"resultType": "vector",
                                                           "result": [{"metric": {"UUID": 5}, "value": [1, "1"]}]}},
    "unknown-result-type": {"status": "success", "data": {"resultType": "table", "result": [{"metric": {}}]}},
}


@pytest.mark.parametrize("payload", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
def test_valid_json_of_the_wrong_shape_is_one_line_naming_what_was_expected(payload, capsys):
    code, _, err, _ = report_idle_from(json_answer(payload), "5", capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "unexpected answer from Prometheus" in err and "expected" in err and "this is a bug" not in err, err


# -- 9. a run whose only round failed exits non-zero ---------------------------------------------
def test_an_actuator_run_whose_only_round_failed_exits_non_zero(tmp_path, capsys, caplog):
    from fake_kube_api import FakeKubeAPI
    from kube_fleet import node

    api = FakeKubeAPI().start()
    try:
        node(api, "gpu-a")
        code, _, err, _ = run_cli(["actuator", "run", "--mode", "observe", "--rounds", "1", "--interval", "0.01",
                                   "--source", "file", "--file", str(tmp_path / "gone.csv"),
                                   "--kubeconfig", api.kubeconfig(tmp_path / "kc.json"),
                                   "--audit", str(tmp_path / "audit.jsonl")], capsys)
    finally:
        api.stop()
    assert code == 1, err
    assert "every reconcile round failed (1 of 1)" in err, err
    assert "gone.csv: no such file" in caplog.text  # the round's own error, logged when it failed


# -- 1. rejected rows are said on every source ---------------------------------------------------
def samples_csv(path, **set_values):
    from builders import make_samples

    frame = make_samples("2026-11-01T00:00:00Z", steps=5).astype(object)
    for column, value in set_values.items():
        frame.loc[0, column] = value
    frame.to_csv(path, index=False, date_format="%Y-%m-%dT%H:%M:%SZ")
    return str(path)


@pytest.mark.parametrize("command", [["report", "idle"], ["health", "scan"]])
def test_rows_a_file_source_rejects_are_counted_beside_the_results(command, tmp_path, capsys):
    path = samples_csv(tmp_path / "k.csv", temperature_celsius="330")
    code, out, err, _ = run_cli([*command, "--source", "file", "--file", path, "--until", "2026-11-01T00:10:00Z"], capsys)
    assert code == 0, err
    said = " ".join((out + err).split())  # the text report wraps long notes
    assert "k.csv: 1 of 20 row(s) rejected - temperature_celsius above 130 C (kelvin?): 1 (first at " in said, said


def test_a_prometheus_source_counts_its_rejected_rows_in_its_notes():
    from gpuwarden.cli.source_notes import source_notes
    from gpuwarden.store.schema import ValidationReport

    class Source:  # what open_prometheus gives: rejected rows in ``validation``, notes of its own
        pod_attribution = "auto"
        notes = ["a note of the reads"]
        validation = ValidationReport("Prometheus http://p:9090")

    Source.validation.rows_in = 10
    Source.validation.add("gpu_util_ratio is not a ratio in 0..1", 3, "row 4")
    assert source_notes(Source()) == ["Prometheus http://p:9090: 3 of 10 row(s) rejected - gpu_util_ratio is not a "
                                      "ratio in 0..1: 3 (first at row 4)", "a note of the reads"]


# -- 3. series without a GPU identity are counted and said --------------------------------------
def test_series_without_a_gpu_identity_are_counted_even_past_the_note_limit():
    import numpy as np

    from gpuwarden.store.prometheus.series_checks import MAX_NOTES, ReadNotes, check_series

    notes = ReadNotes()
    for host in range(MAX_NOTES + 20):  # more devices than notes: the count still covers every one
        assert not check_series("DCGM_FI_DEV_GPU_UTIL", {"Hostname": f"n{host}", "gpu": "0"}, np.ones(3), False, notes)
    assert notes.lines()[0].startswith(f"{MAX_NOTES + 20} series ({3 * (MAX_NOTES + 20)} samples) without a GPU identity")
    assert notes.lines()[-1] == "... and 20 more note(s) like these"


# -- 4. reads consistent with a concurrent compaction -------------------------------------------
def _state(pid: int) -> str:
    from pathlib import Path

    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("how", ["row_count", "read", "check"])  # check: issue 24 probe 3 (it saw 2x, all "duplicates")
def test_a_read_racing_a_compaction_never_counts_rows_twice(how, tmp_path):
    """A real compaction in another process, caught between putting its merged file in place and
    removing the files it replaces (GPUWARDEN_STORE_STOP_AT): a read then waits for the swap and
    counts each row once (it used to see both and count 2x)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from builders import make_samples

    from gpuwarden.store import LocalStore

    store = LocalStore(tmp_path / "s")
    for hour in range(4):  # four part files in one day
        store.append(make_samples(f"2026-11-01T0{hour}:00:00Z", steps=10))
    expected = store.row_count()
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", f"from gpuwarden.store import LocalStore; LocalStore({str(tmp_path / 's')!r}).compact(min_files=1)"],
        env={**os.environ, "PYTHONPATH": str(root), "GPUWARDEN_STORE_STOP_AT": "compact-renamed"})
    try:
        wait_for(lambda: _state(child.pid) == "T", timeout=60, what="the compaction stopped mid-swap")
        assert len(list((tmp_path / "s" / "samples").glob("date=*/part-*.parquet"))) == 5  # merged + the four
        counted: list[int] = []
        reader = threading.Thread(target=lambda: counted.append(
            store.row_count() if how == "row_count" else store.check().rows if how == "check"
            else len(store.read(columns=["timestamp", "gpu_uuid"]))))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and counted == []  # waits for the swap, never reads half of it
        os.kill(child.pid, signal.SIGCONT)
        reader.join(30)
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
    assert counted == [expected]
    assert store.row_count() == expected and store.file_count() == 1


def test_the_scraper_counts_and_says_series_without_a_gpu_identity(tmp_path, caplog):
    from gpuwarden.store import LocalStore
    from gpuwarden.store.scraper import Scraper

    page = (b'DCGM_FI_DEV_GPU_UTIL{Hostname="n1",UUID="GPU-a",gpu="0",modelName="NVIDIA H100 80GB HBM3"} 50\n'
            b'DCGM_FI_DEV_GPU_UTIL{Hostname="n1",gpu="1",modelName="NVIDIA H100 80GB HBM3"} 70\n'
            b'DCGM_FI_DEV_FB_USED{Hostname="n1",gpu="1",modelName="NVIDIA H100 80GB HBM3"} 1000\n'
            b'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-c",gpu="2",modelName="NVIDIA H100 80GB HBM3"} 10\n')
    server = Scripted(body_answer(page, "text/plain"))
    try:
        scraper = Scraper([server.url + "/metrics"], LocalStore(tmp_path / "s"))
        with caplog.at_level("WARNING", logger="gpuwarden.store.scraper"):
            (first,) = scraper.scrape_once()
            (second,) = scraper.scrape_once()
    finally:
        server.close()
    assert first.ok and first.skipped_series == 3 and second.skipped_series == 3
    said = [r.getMessage() for r in caplog.records if "without a GPU identity" in r.getMessage()]
    assert len(said) == 1, said  # said when the count changes, not at every scrape
    assert "3 series (3 samples) without a GPU identity" in said[0] and "no UUID label" in said[0]


def test_a_scrape_follows_a_redirect_within_its_one_deadline(tmp_path):
    from gpuwarden.store.http_fetch import fetch

    def answer(handler) -> None:
        if handler.path == "/old":
            handler.send_response(302)
            handler.send_header("Location", "/new")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        elif handler.path == "/loop":
            handler.send_response(301)
            handler.send_header("Location", "/loop")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        else:
            handler.send_response(200)
            handler.send_header("Content-Length", "2")
            handler.end_headers()
            handler.wfile.write(b"ok")

    server = Scripted(answer)
    try:
        assert fetch(server.url + "/old", timeout_s=5, max_bytes=100) == (200, b"ok")
        assert fetch(server.url + "/loop", timeout_s=5, max_bytes=100)[0] == 301  # gives up after a few hops
        assert fetch(server.url + "/old", timeout_s=5, max_bytes=100, method="POST", body=b"q=1")[0] == 302
    finally:
        server.close()
