"""The live queue of a scheduled cluster, as its users read it: ``gpuwarden queue`` and the
dashboard's Queue page in real headless Chromium, both fed by the scheduler's ``/queue`` while its
round schedules the fake cluster of issue 21's scenario (official client over HTTP against
``tests/fake_kube_api.py`` and its stand-ins for kube-scheduler and the Job controller: no
kube-apiserver can run here).

Needs the ``chromium`` binary (Debian package ``chromium``, installed by ``.ci/run``): skipped with a
reason when absent, failed under ``CI=true``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fake_kube_api import FakeKubeAPI
from gated_scenario import FakeCluster, build, install_cluster, submit_due
from test_dashboard_browser import chrome, load, require, serve  # noqa: F401 - chrome is a fixture

from gpuwarden.kube import KubeApi, KubeCluster, load_client
from gpuwarden.scheduler.queue_server import QueueServer
from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.dashboards.cdp import find_chromium
from gpuwarden.fleet.clock import ModelClock

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 30  # half an hour of the scenario: the cluster is full and a queue waits


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory):
    """The scenario's first rounds on the fake cluster, the round's queue served as the scheduler serves it."""
    tmp = tmp_path_factory.mktemp("live-queue")
    api = FakeKubeAPI().start()
    install_cluster(api)
    fake = FakeCluster(api)
    scenario = build(seed=11)
    clock = ModelClock(lambda: datetime.fromtimestamp(fake.clock.now, UTC))
    cluster = KubeCluster(KubeApi(load_client(api.kubeconfig(tmp / "kc.json")), clock=clock), clock=clock)
    metrics = SchedulerMetrics()
    loop = SchedulingRound(cluster, on_round=[metrics])
    for step in range(ROUNDS):
        submit_due(api, scenario, fake.clock.now)
        fake.step(60 if step else 0)
        loop.run_round()
    server = QueueServer(lambda: loop.queue, metrics.registry, port=0).start()
    yield loop, server
    server.stop()
    api.stop()


def test_gpuwarden_queue_prints_the_live_queue(scheduled):
    loop, server = scheduled
    document = loop.queue
    waiting = document["workloads"]
    assert len(waiting) > 5 and document["round"] == ROUNDS
    run = subprocess.run([sys.executable, "-m", "gpuwarden.cli", "queue", "--scheduler-url", server.url, "--format", "json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    assert json.loads(run.stdout)["workloads"] == waiting
    table = subprocess.run([sys.executable, "-m", "gpuwarden.cli", "queue", "--scheduler-url", server.url,
                            "--namespace", "vision"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True).stdout
    first_vision = next(w for w in waiting if w["namespace"] == "vision")
    assert first_vision["name"] in table and not any(w["name"] in table for w in waiting if w["namespace"] != "vision")
    assert all(w["reason"] for w in waiting)  # every waiting workload says why


def test_the_queue_page_shows_the_live_queue_in_chromium(scheduled, chrome, tmp_path):  # noqa: F811 - the fixture
    require(find_chromium() is not None, "chromium is not installed (apt-get install chromium)")
    loop, server = scheduled
    process, url = serve(tmp_path / "store", GPUWARDEN_SCHEDULER_URL=server.url)
    try:
        teams = [t["team"] for t in loop.queue["teams"]]
        text = load(chrome, f"{url}/queue", ("Queue & quotas", "Pending workloads, in queue order", f"round {ROUNDS}"))
        assert all(team in text for team in teams), text[:800]
    finally:
        process.terminate()
        process.wait(timeout=15)
