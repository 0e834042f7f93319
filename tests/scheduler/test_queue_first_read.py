"""The live queue's first reader waits a bounded time (issue 35, known gaps): a round drops the
positions of a round before that nobody read, so a reader that arrives while the next round runs
waits for it; a round that never finishes (a slow API server) must not hold that reader for ever.
Real HTTP requests against the QueueServer: 503 with Retry-After and one line within the bound,
then 200 once a round has finished."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta

from builders import NOW, node, workload
from test_scheduler_loop import OWNER_AND_BORROWER, RecordingCluster, pending

from gpuwarden.scheduler.queue_server import RETRY_AFTER_SECONDS, QueueServer
from gpuwarden.scheduler.scheduling_round import QUEUE_WAIT_SECONDS, SchedulingRound


def get(url: str, timeout: float = 10.0) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


class StallingCluster(RecordingCluster):
    """A cluster whose snapshot blocks, once ``stall`` is set, until ``release`` is set: a round
    that does not finish (an API server that never answers)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stall = threading.Event()
        self.stalled = threading.Event()
        self.release = threading.Event()

    def snapshot(self):
        if self.stall.is_set():
            self.stalled.set()
            self.release.wait(timeout=30)
        return super().snapshot()


def served(wait_seconds: float = 0.5):
    cluster = StallingCluster([node("n0", gpus=8)], [
        workload("runner", "alpha", 8, on="n0"), pending("small", "beta", 2),
        pending("big", "beta", 8, submitted_at=NOW - timedelta(hours=5))], OWNER_AND_BORROWER,
        publishes=False)  # as SimCluster: nothing reads the queue after a round
    scheduling = SchedulingRound(cluster)
    scheduling.queue_wait_seconds = wait_seconds
    server = QueueServer(lambda: scheduling.queue, port=0).start()
    return cluster, scheduling, server


def test_the_bound_is_below_the_clients_request_timeouts():
    from gpuwarden.dashboards.live_queue import TIMEOUT_SECONDS

    assert 0 < QUEUE_WAIT_SECONDS < TIMEOUT_SECONDS < 10.0  # 10 s: `gpuwarden queue --timeout`'s default


def test_before_any_round_503_with_retry_after_at_once():
    _, _, server = served()
    try:
        started = time.monotonic()
        status, headers, body = get(server.url + "/queue")
        took = time.monotonic() - started
    finally:
        server.stop()
    assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_SECONDS), (status, headers)
    assert list(body) == ["error"] and "no scheduling round has run yet" in body["error"] and "\n" not in body["error"]
    assert took < 0.5


def test_a_reader_during_a_round_that_never_finishes_gets_503_within_the_bound_then_200():
    cluster, scheduling, server = served(wait_seconds=0.5)
    runner = None
    try:
        scheduling.run_round()  # round 1: nobody reads its queue, so round 2 drops it
        cluster.stall.set()
        runner = threading.Thread(target=scheduling.run_round, daemon=True)
        runner.start()
        assert cluster.stalled.wait(timeout=5)
        started = time.monotonic()
        status, headers, body = get(server.url + "/queue", timeout=5)
        took = time.monotonic() - started
        assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
        assert "has not finished" in body["error"]
        assert 0.4 < took < 2.0, took  # waited for the round, at most the bound
        assert get(server.url + "/queue?namespace=beta", timeout=5)[0] == 503  # every reader, bounded
        cluster.stall.clear()
        cluster.release.set()
        runner.join(timeout=10)
        assert not runner.is_alive()
        status, _, body = get(server.url + "/queue")
        assert status == 200 and body["round"] == 2
        assert [w["workload"] for w in body["workloads"]] == ["beta/big", "beta/small"]
    finally:
        cluster.release.set()
        server.stop()
        if runner is not None:
            runner.join(timeout=10)


def test_a_round_that_finishes_within_the_bound_is_waited_for():
    cluster, scheduling, server = served(wait_seconds=5.0)
    try:
        scheduling.run_round()
        cluster.stall.set()
        runner = threading.Thread(target=scheduling.run_round, daemon=True)
        runner.start()
        assert cluster.stalled.wait(timeout=5)
        threading.Timer(0.3, cluster.release.set).start()
        status, _, body = get(server.url + "/queue")
        runner.join(timeout=10)
    finally:
        cluster.release.set()
        server.stop()
    assert status == 200 and body["round"] == 2
