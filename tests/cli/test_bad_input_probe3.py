"""Issue 24's fresh probe (the `p3-` cases): the bad inputs that need a server, a Parquet file the
corpus format cannot write, or an environment variable. Servers are real sockets on 127.0.0.1
(tests/cli/test_bad_input_probe2.py's Scripted server, the fake API server of tests/fake_kube_api.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_bad_input_probe2 import Scripted, body_answer, drip_headers, endless, json_answer, run_cli, trickle
from builders import make_samples


def against(answer, argv: list[str], capsys) -> tuple[int, str, str, float]:
    """``gpuwarden argv`` with ``{url}`` replaced by a scripted server's URL that answers ``answer``."""
    server = Scripted(answer)
    try:
        return run_cli([arg.replace("{url}", server.url) for arg in argv], capsys)
    finally:
        server.close()


def one_line_error(code: int, err: str, want: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "this is a bug" not in err, err
    assert want in err, err


# -- the live queue's client: a whole-request deadline and an answer checked before use ----------
@pytest.mark.parametrize("answer", [trickle, drip_headers, endless], ids=["trickled-body", "dripped-head", "endless"])
def test_queue_gives_up_on_a_slow_or_endless_scheduler_at_its_timeout(answer, capsys):
    run_cli(["queue", "--scheduler-url", "http://127.0.0.1:1", "--timeout", "1"], capsys)  # imports, off the clock
    code, _, err, elapsed_s = against(answer, ["queue", "--scheduler-url", "{url}", "--timeout", "1"], capsys)
    one_line_error(code, err, "cannot read the queue")
    assert elapsed_s < 2.5, elapsed_s  # the one deadline plus a margin, not one per socket read


QUEUE_SHAPES = {
    "a-list": [1, 2],
    "workloads-of-numbers": {"workloads": [1, 2]},
    "waiting-as-text": {"workloads": [{"workload": "w", "waiting_seconds": "long"}]},
    "teams-as-text": {"workloads": [], "teams": "research"},
    "teams-of-numbers": {"workloads": [], "teams": [3]},
}


@pytest.mark.parametrize("payload", QUEUE_SHAPES.values(), ids=QUEUE_SHAPES.keys())
def test_queue_answer_of_the_wrong_shape_is_one_line_naming_what_was_expected(payload, capsys):
    code, _, err, _ = against(json_answer(payload), ["queue", "--scheduler-url", "{url}", "--timeout", "5"], capsys)
    one_line_error(code, err, "not a scheduler's queue")


def test_queue_answer_that_is_a_login_page_is_named(capsys):
    code, _, err, _ = against(body_answer(b"<html><body>Sign in</body></html>", "text/html"),
                              ["queue", "--scheduler-url", "{url}"], capsys)
    one_line_error(code, err, "http://127.0.0.1:")


# -- Prometheus answers of the wrong shape, fresh ones --------------------------------------------
PROMETHEUS_SHAPES = {
    "top-level-list": [{"status": "success"}],
    "matrix-values-not-a-list": {"status": "success", "data": {"resultType": "matrix",
                                                               "result": [{"metric": {"UUID": "G"}, "values": 5}]}},
    "matrix-point-short": {"status": "success", "data": {"resultType": "matrix",
                                                         "result": [{"metric": {"UUID": "G"}, "values": [[1]]}]}},
    "status-missing": {"data": {"resultType": "vector", "result": []}},
}


@pytest.mark.parametrize("payload", PROMETHEUS_SHAPES.values(), ids=PROMETHEUS_SHAPES.keys())
def test_prometheus_answer_of_the_wrong_shape_is_one_line(payload, capsys):
    code, _, err, _ = against(json_answer(payload), ["health", "scan", "--source", "prometheus", "--prometheus-url",
                                                      "{url}", "--prometheus-timeout", "5"], capsys)
    one_line_error(code, err, "Prometheus")


def test_prometheus_behind_a_login_page_is_named(capsys):
    code, _, err, _ = against(body_answer(b"<!doctype html><title>Sign in</title>", "text/html"),
                              ["report", "cost", "--source", "prometheus", "--prometheus-url", "{url}"], capsys)
    one_line_error(code, err, "Prometheus")


# -- Parquet files the corpus cannot write: rows as they are, duplicate names, percent ----------
def raw_parquet(path, frame) -> str:
    """``frame`` written as it is (write_samples would validate it first)."""
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return str(path)


def samples(**set_values):
    frame = make_samples("2026-11-01T00:00:00Z", steps=3)
    for column, value in set_values.items():
        frame.loc[0, column] = value
    return frame


@pytest.mark.parametrize("command", [["report", "efficiency"], ["simulate", "whatif"], ["health", "scan"]])
def test_rows_a_parquet_source_rejects_are_counted_beside_the_results(command, tmp_path, capsys):
    path = raw_parquet(tmp_path / "k.parquet", samples(temperature_celsius=330.0))
    code, out, err, _ = run_cli([*command, "--source", "file", "--file", path, "--until", "2026-11-01T01:00:00Z",
                                 "--format", "json"], capsys)
    assert code == 0, err
    assert "k.parquet: 1 of 12 row(s) rejected - temperature_celsius above 130 C" in " ".join((out + err).split())


def test_store_load_counts_the_rows_a_parquet_file_loses(tmp_path, capsys):
    path = raw_parquet(tmp_path / "n.parquet", samples(power_watts=-5.0))
    code, out, err, _ = run_cli(["store", "load", path, "--store", str(tmp_path / "s")], capsys)
    assert code == 0 and "11 rows appended" in out, (out, err)
    assert "n.parquet: 1 of 12 row(s) rejected - power_watts is negative" in err, err


def test_a_parquet_percent_ratio_column_is_refused_with_the_hint(tmp_path, capsys):
    frame = samples()
    frame["gpu_util_ratio"] = frame["gpu_util_ratio"] * 100
    path = raw_parquet(tmp_path / "u.parquet", frame)
    code, _, err, _ = run_cli(["store", "load", path, "--store", str(tmp_path / "s")], capsys)
    one_line_error(code, err, "looks like percent")


def test_a_parquet_file_with_a_duplicated_column_is_refused(tmp_path, capsys):
    frame = samples()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.append_column("node", pa.array(["other"] * len(frame)))  # Parquet allows two 'node' columns
    pq.write_table(table, tmp_path / "d.parquet")
    code, _, err, _ = run_cli(["store", "load", str(tmp_path / "d.parquet"), "--store", str(tmp_path / "s")], capsys)
    one_line_error(code, err, "'node'")


# -- size bounds -----------------------------------------------------------------------------
@pytest.mark.parametrize(("bound", "said"), [("100", "more than the 100 allowed"),
                                             ("10GB", "GPUWARDEN_MAX_INPUT_BYTES='10GB' is not a whole number of bytes")])
def test_the_samples_file_bound_refuses_a_larger_file_and_names_a_bad_setting(bound, said, tmp_path, capsys, monkeypatch):
    path = tmp_path / "s.csv"
    make_samples(steps=3).to_csv(path, index=False)
    monkeypatch.setenv("GPUWARDEN_MAX_INPUT_BYTES", bound)
    code, _, err, _ = run_cli(["store", "load", str(path), "--store", str(tmp_path / "s")], capsys)
    one_line_error(code, err, said)


@pytest.mark.parametrize("flag", ["--price-book", "--inventory"])
def test_a_huge_sparse_config_is_refused_before_it_is_read(flag, tmp_path, capsys):
    data = tmp_path / "s.csv"
    make_samples(steps=3).to_csv(data, index=False)
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as handle:  # 17 GiB that take no disk: a read would fill memory
        handle.truncate(17 << 30)
    code, _, err, _ = run_cli(["report", "cost", "--source", "file", "--file", str(data), "--until",
                               "2026-11-01T01:00:00Z", flag, str(huge)], capsys)
    one_line_error(code, err, "more than the 16,777,216 allowed")


def test_a_huge_sparse_kubeconfig_is_refused_before_it_is_read(tmp_path, capsys):
    huge = tmp_path / "kc"
    with huge.open("wb") as handle:
        handle.truncate(17 << 30)
    code, _, err, _ = run_cli(["actuator", "list", "--audit", str(tmp_path / "a.jsonl")], capsys)
    assert code == 0, err  # the audit log alone needs no cluster
    code, _, err, _ = run_cli(["actuator", "plan", "--source", "file", "--file", str(tmp_path / "none.csv"),
                               "--kubeconfig", str(huge)], capsys)
    one_line_error(code, err, "cannot load the kubeconfig")
    assert "more than the 16,777,216 allowed" in err


# -- the Kubernetes API answers of the wrong shape, on every round ------------------------------
def test_scheduler_run_whose_only_round_got_a_wrong_shaped_answer_exits_non_zero(tmp_path, capsys):
    from fake_kube_api import FakeKubeAPI
    from kube_fleet import node

    api = FakeKubeAPI().start()
    try:
        node(api, "gpu-a")
        api.inject("GET", "/api/v1/pods", "not-an-object", times=10)
        code, _, err, _ = run_cli(["scheduler", "run", "--rounds", "1", "--interval-seconds", "1", "--port", "0",
                                   "--listen", "127.0.0.1", "--no-attained-service",
                                   "--kubeconfig", api.kubeconfig(tmp_path / "kc.json")], capsys)
    finally:
        api.stop()
    assert code != 0, err
    assert "Traceback" not in err and "this is a bug" not in err, err

