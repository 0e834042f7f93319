"""The live queue over HTTP (issue 21): the scheduler's QueueServer (/queue, /metrics, /healthz,
POST /submit), ``gpuwarden queue`` against a running one, the demo's portal submissions into the
simulated fleet, and the demo serving its own queue."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from builders import NOW, node, workload
from polling import wait_for
from test_scheduler_loop import OWNER_AND_BORROWER, RecordingCluster, pending

from gpuwarden.kube.gates import REQUESTED_BY_ANNOTATION
from gpuwarden.scheduler.queue_server import QueueServer
from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.cli import main
from gpuwarden.cli.demo_live import portal_submitter
from gpuwarden.fleet import WorkloadPhase
from gpuwarden.sim import SimConfig, Simulation

ROOT = Path(__file__).resolve().parents[2]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def served():
    """A round over a small cluster (alpha runs 8 GPUs; beta waits with two workloads), its metrics
    and a QueueServer on a free port whose submit() records what it is given."""
    cluster = RecordingCluster([node("n0", gpus=8)], [
        workload("runner", "alpha", 8, on="n0"), pending("small", "beta", 2),
        pending("big", "beta", 8, submitted_at=NOW - timedelta(hours=5))], OWNER_AND_BORROWER)
    metrics = SchedulerMetrics()
    scheduling = SchedulingRound(cluster, on_round=[metrics])
    submitted = []

    def submit(request, identity):
        if request.get("gpus") == 0:
            raise ValueError("GPUs 0: a whole number from 1 to 8 (the cluster's GPUs)")
        submitted.append((dict(request), identity))
        return f"beta/{request['name']}", "queued"

    server = QueueServer(lambda: scheduling.queue, metrics.registry, submit=submit, port=0).start()
    try:
        yield server, scheduling, submitted
    finally:
        server.stop()


def test_the_server_serves_the_queue_metrics_and_health(served):
    server, scheduling, _ = served
    status, body = get(server.url + "/queue")
    assert status == 503 and b"no scheduling round has run yet" in body
    scheduling.run_round()
    status, body = get(server.url + "/queue")
    document = json.loads(body)
    assert status == 200 and document == json.loads(json.dumps(scheduling.queue))
    assert [w["workload"] for w in document["workloads"]] == ["beta/big", "beta/small"]
    assert json.loads(get(server.url + "/queue?namespace=alpha")[1])["workloads"] == []
    assert len(json.loads(get(server.url + "/queue?namespace=beta")[1])["workloads"]) == 2
    status, text = get(server.url + "/metrics")
    assert status == 200 and b'gpuwarden_queue_pending_workloads{team="beta"} 2.0' in text
    assert get(server.url + "/healthz") == (200, b"ok\n")
    assert get(server.url + "/nope")[0] == 404


def test_submit_answers_201_or_400_naming_the_field(served):
    server, _, submitted = served
    good = {"request": {"name": "sweep", "team": "beta", "gpus": 1}, "identity": "alice@example.com"}
    assert post(server.url + "/submit", json.dumps(good).encode()) == (201, {"workload": "beta/sweep",
                                                                             "message": "queued"})
    assert submitted == [({"name": "sweep", "team": "beta", "gpus": 1}, "alice@example.com")]
    bad = {"request": {"name": "x", "team": "beta", "gpus": 0}, "identity": "alice@example.com"}
    assert post(server.url + "/submit", json.dumps(bad).encode()) == (
        400, {"error": "GPUs 0: a whole number from 1 to 8 (the cluster's GPUs)"})
    status, answer = post(server.url + "/submit", b"{not json")
    assert status == 400 and "Expecting property name" in answer["error"]
    status, answer = post(server.url + "/submit", json.dumps({"request": {"name": "x"}}).encode())
    assert status == 400 and answer["error"].startswith("identity:")
    assert len(submitted) == 1


def test_submit_is_404_where_no_submission_is_wired():
    server = QueueServer(lambda: {}, port=0).start()
    try:
        status, answer = post(server.url + "/submit", b"{}")
    finally:
        server.stop()
    assert status == 404 and "POST /submit" in answer["error"]


def test_gpuwarden_queue_prints_the_live_queue(served, capsys):
    server, scheduling, _ = served
    scheduling.run_round()
    assert main(["queue", "--scheduler-url", server.url]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"queue at {NOW.isoformat()} (policy gpuwarden, round 1): 2 waiting")
    assert lines[1].split() == ["position", "workload", "priority", "shape", "state", "waiting", "start", "reason"]
    assert lines[2].split()[:7] == ["1", "beta/big", "normal", "8", "GPU", "pending", "5h00m"]
    assert "teams" in lines and any(line.startswith("alpha") for line in lines)

    assert main(["queue", "--scheduler-url", server.url, "--format", "json", "--namespace", "beta"]) == 0
    assert json.loads(capsys.readouterr().out)["workloads"][1]["workload"] == "beta/small"

    assert main(["queue", "--scheduler-url", server.url, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["position"], r["workload"], r["waiting_seconds"]) for r in rows] == [
        ("1", "beta/big", "18000.0"), ("2", "beta/small", "3600.0")]


def test_gpuwarden_queue_names_a_refused_team_and_the_pods_left_alone(capsys):
    """A team whose quota annotation cannot be read carries its error in the team table, and pods
    gated by hand outside the queue are listed, as /queue has them (issue 31)."""
    document = {"taken_at": NOW.isoformat(), "policy": "gpuwarden", "round": 3, "workloads": [],
                "teams": [{"team": "research", "guaranteed_gpus": None, "burst_limit_gpus": None, "allocated_gpus": 4.0,
                           "borrowed_gpus": 0.0, "lent_gpus": 0.0, "pending_workloads": 0, "pending_gpus": 0.0,
                           "error": "namespace research: gpuwarden.io/guaranteed-gpus='8Gi' is not a number of GPUs"},
                          {"team": "vision", "guaranteed_gpus": 4.0, "burst_limit_gpus": None, "allocated_gpus": 0.0,
                           "borrowed_gpus": 0.0, "lent_gpus": 0.0, "pending_workloads": 0, "pending_gpus": 0.0}],
                "ignored_pods": [{"pod": "ops/by-hand", "reason": "carries the gpuwarden.io/admission gate in namespace "
                                                                 "ops, which has no gpuwarden.io/queue label"}]}
    server = QueueServer(lambda: document, port=0).start()
    try:
        assert main(["queue", "--scheduler-url", server.url, "--wide"]) == 0
        out = capsys.readouterr().out
        assert "guaranteed-gpus='8Gi' is not a number of GPUs" in out
        assert "ignored pods" in out and "ops/by-hand" in out
        assert main(["queue", "--scheduler-url", server.url, "--format", "json", "--namespace", "vision"]) == 0
        assert json.loads(capsys.readouterr().out)["ignored_pods"] == []  # another namespace's pods
    finally:
        server.stop()


def test_gpuwarden_queue_says_in_one_line_when_the_scheduler_is_unreachable(capsys):
    server = QueueServer(lambda: {}, port=0)
    url = server.url
    server.httpd.server_close()  # the port is closed: nothing answers
    assert main(["queue", "--scheduler-url", url]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"gpuwarden: error: cannot read the queue: {url}/queue: no answer")


# -- the demo --------------------------------------------------------------------------------------


class NoRound:
    def run_round(self) -> None:
        return None


def test_the_simulated_fleet_starts_nothing_by_itself(data_dir):
    """The demo's pods are held until the scheduling round admits them: with a round that never
    acts, every job waits."""
    simulation = Simulation(SimConfig(nodes=2, warmup_days=0.05, fault_rate_scale=0.0, data_dir=data_dir),
                            scheduling=lambda cluster: NoRound())
    simulation.run(30)
    summary = simulation.summary()
    assert summary["submitted"] > 0 and summary["started"] == 0 and summary["running"] == 0


def test_a_portal_request_becomes_a_simulated_workload_that_waits_for_the_round(data_dir):
    simulation = Simulation(SimConfig(nodes=2, warmup_days=0.0, fault_rate_scale=0.0, data_dir=data_dir),
                            scheduling=lambda cluster: NoRound())
    submit = portal_submitter(simulation, REQUESTED_BY_ANNOTATION)
    team = simulation.teams[0].name
    image = "nvcr.io/nvidia/pytorch:24.05-py3"
    body = {"name": "sweep", "team": team, "image": image, "shape": {"gpus": 8, "pods": 2}, "priorityClass": "high"}
    key, message = submit(body, "alice@example.com")
    assert key == f"{team}/sweep-1" and "alice@example.com" in message  # named as generateName would
    assert submit(body, "alice@example.com")[0] == f"{team}/sweep-2"
    (state,) = [w for w in simulation.cluster.snapshot().workloads if w.workload.key == key]
    assert (state.phase, state.workload.gang_size, state.workload.gpus.count) == (WorkloadPhase.PENDING, 2, 8)
    assert state.workload.priority_class.value == "high"
    assert state.annotations[REQUESTED_BY_ANNOTATION] == "alice@example.com"
    # the same team templates a cluster's portal checks: a refusal names the field and what is allowed
    for change, field in (({"team": "nope"}, "team 'nope': no portal template"),
                          ({"shape": {"gpus": 3}}, "shape '3 GPUs'"),
                          ({"image": "evil:latest"}, "image 'evil:latest'"),
                          ({"priorityClass": "critical"}, "priorityClass 'critical'"),
                          ({"colour": "red"}, "colour")):
        with pytest.raises(ValueError, match=field):
            submit({**body, **change}, "alice@example.com")


def test_the_demo_serves_its_live_queue_and_takes_submissions(tmp_path, data_dir):
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden.cli", "demo", "--headless", "--duration", "60", "--nodes", "4",
         "--days", "0.05", "--warmup-days", "0.1", "--store", str(tmp_path / "store"), "--exporter-listen",
         "127.0.0.1:0", "--scheduler-listen", "127.0.0.1:0", "--step-interval", "0.2", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True).start()
    try:
        line = wait_for(lambda: next((x for x in lines if x.startswith("queue:")), None), 120, "the queue URL")
        url = line.split()[1].removesuffix("/queue")
        document = wait_for(lambda: json.loads(get(url + "/queue")[1]), 30, "the first queue", tolerate_errors=True)
        assert document["policy"] == "gpuwarden" and document["teams"]
        team = document["teams"][0]["team"]
        request = {"request": {"name": "portal-job", "team": team, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                               "shape": {"gpus": 64}, "priorityClass": "normal"}, "identity": "alice@example.com"}
        status, answer = post(url + "/submit", json.dumps(request).encode())
        assert status == 400 and "shape '64 GPUs'" in answer["error"]  # not in the team's template
        request["request"]["shape"] = {"gpus": 8, "pods": 2}
        assert post(url + "/submit", json.dumps(request).encode())[0] == 201
        row = wait_for(lambda: next((w for w in json.loads(get(url + "/queue")[1])["workloads"]
                                     if w["name"] == "portal-job-1"), None), 30, "the submitted job in the queue")
        assert (row["team"], row["requested_by"], row["gpus"]) == (team, "alice@example.com", 16.0)
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert "== gpuwarden demo summary ==" in "".join(lines)


# -- the queue depth, read back from a real Prometheus ------------------------------------------------


def test_prometheus_scrapes_the_scheduler_and_the_queue_depth_is_read_back(served, tmp_path):
    """The fleet summary's queue depth: a real Prometheus scrapes the scheduler's /metrics; the
    efficiency report's pending-GPU history is read back from it (None from a source without it)."""
    import pandas as pd
    import yaml
    from servers import ServerProcess, binary

    from gpuwarden.scheduler.scheduler_metrics import pending_gpus_history
    from gpuwarden.store.prometheus import PrometheusSource

    server, scheduling, _ = served
    scheduling.run_round()  # beta waits with 10 GPUs
    with __import__("socket").socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = server.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "scheduler", "static_configs": [{"targets": [target]}]}]}))
    prometheus = ServerProcess([binary("prometheus", "prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                                f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                "--log.level=warn"], tmp_path / "prometheus.log", f"http://127.0.0.1:{port}/-/ready")
    try:
        wait_for(prometheus.ready, 30, "Prometheus ready")
        source = PrometheusSource(f"http://127.0.0.1:{port}")
        start = pd.Timestamp.now(tz="UTC") - pd.Timedelta(minutes=5)
        (history,) = wait_for(lambda: [h for h in [pending_gpus_history(source, start, pd.Timestamp.now(tz="UTC"),
                                                                       step_seconds=1.0)] if h is not None], 30,
                              "the pending GPUs scraped")
    finally:
        prometheus.stop()
    assert list(history.columns) == ["timestamp", "gpus"] and set(history["gpus"]) == {10.0}
    assert pending_gpus_history(object(), start, start) is None  # not Prometheus: unknown, not 0


# -- the commands on a cluster (the fake API server speaking the real REST protocol) ------------------


def test_scheduler_run_schedules_a_cluster_as_leader(tmp_path, capsys):
    from fake_kube_api import BATCH, COORDINATION, FakeKubeAPI
    from kube_fleet import job, namespace
    from kube_fleet import node as kube_node

    api = FakeKubeAPI().start()
    try:
        kube_node(api, "a", gpus=8)
        namespace(api, "ml", {"gpuwarden.io/queue": "ml"}, {"gpuwarden.io/guaranteed-gpus": "8"})
        job(api, "ml", "mine", gpus=4, suspend=True, annotations={"gpuwarden.io/suspended-by": "scheduler"})
        job(api, "ml", "theirs", gpus=4, suspend=True)
        assert main(["scheduler", "run", "--rounds", "1", "--interval-seconds", "0.1", "--port", "0",
                     "--no-attained-service", "--leader-elect", "--identity", "replica-a",
                     "--kubeconfig", api.kubeconfig(tmp_path / "kc.json")]) == 0
        assert api.get(COORDINATION, "leases", "gpuwarden-scheduler", "gpuwarden")["spec"]["holderIdentity"] == "replica-a"
        assert api.get(BATCH, "jobs", "mine", "ml")["spec"]["suspend"] is False
        assert api.get(BATCH, "jobs", "theirs", "ml")["spec"]["suspend"] is True  # a user's suspend stays
    finally:
        api.stop()
    assert "scheduler: policy gpuwarden every 0.1 s; queue http://127.0.0.1:" in capsys.readouterr().out


def test_scheduler_run_refuses_an_attained_service_source_it_cannot_read(tmp_path, capsys):
    """A store that is not there or a Prometheus that does not answer: one line naming it and the way
    out, exit 2, before anything starts (not a silent empty read: LAS would see every workload as
    unserved for as long as it ran)."""
    from fake_kube_api import FakeKubeAPI
    from kube_fleet import node as kube_node

    api = FakeKubeAPI().start()
    try:
        kube_node(api, "a", gpus=8)
        kubeconfig = api.kubeconfig(tmp_path / "kc.json")
        for source, named in ((["--source", "local", "--store", str(tmp_path / "nothing-here")], "the embedded store"),
                              (["--source", "prometheus", "--prometheus-url", "http://127.0.0.1:9"], "Prometheus at")):
            assert main(["scheduler", "run", "--rounds", "1", "--port", "0", "--kubeconfig", kubeconfig, *source]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and named in err and "--no-attained-service" in err, err
        assert not [r for r in api.requests if r.method != "GET"]  # nothing started, nothing written
    finally:
        api.stop()


def test_the_actuator_no_longer_schedules_and_says_where_scheduling_went(capsys):
    assert main(["actuator", "run", "--scheduling", "gpuwarden", "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert "--scheduling gpuwarden: the actuator no longer schedules; run 'gpuwarden scheduler run" in err
