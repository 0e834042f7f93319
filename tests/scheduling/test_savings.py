"""The savings search (gpuwarden/scheduling/savings.py): the smallest serving fleet on jobs worked out by
hand, the search's steps and bisection on a stand-in replay, the cache, the report's keys, and the
jobs CSV's checks."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.fleet.traces import TraceError
from gpuwarden.scheduling import savings
from gpuwarden.scheduling.errors import SchedulingError
from gpuwarden.scheduling.policy import POLICIES, QueuePolicy
from gpuwarden.scheduling.savings import POLICY_KEYS, FleetSearch, Outcome, find_savings, savings_policies
from gpuwarden.scheduling.savings_jobs import JOBS_COLUMNS, file_workload, read_jobs_csv

HEADER = "submitted,duration_seconds,gpus,team,checkpointable\n"
# Two whole-node jobs at once, then a half-node job after both finished: 2 nodes start everything on
# arrival; on 1 node one of the first two waits an hour (its team's p95 wait), over a 30-minute SLO.
TWO_NODES = HEADER + ("2017-10-09 00:00:00,3600,8,vision,true\n"
                      "2017-10-09 00:00:00,3600,8,speech,false\n"
                      "2017-10-09 02:00:00,3600,4,vision,yes\n")


def _csv(tmp_path: Path, text: str, name: str = "jobs.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def two_nodes(tmp_path):
    return file_workload(_csv(tmp_path, TWO_NODES), None, None)


def test_the_workload_of_a_jobs_csv(two_nodes):
    w = two_nodes
    assert [j.pods * j.gpus_per_pod for j in w.jobs] == [8, 8, 4]
    assert [j.checkpointable for j in w.jobs] == [True, False, True]
    assert [j.submitted for j in w.jobs] == [0.0, 0.0, 7200.0]
    assert w.tail_seconds == 3600.0  # the longest job
    assert w.window_seconds == 7201.0  # default: from the first submission, all of it
    assert w.deadline_seconds == 7201.0 + 3600.0
    assert w.useful_gpu_seconds == (8 + 8 + 4) * 3600.0
    assert (w.min_nodes(), w.max_nodes()) == (1, 2)  # the widest job; two pods at most at once
    assert w.guarantees(2) == {"speech": 8.0, "vision": 8.0}  # equal shares


@pytest.mark.parametrize("start_gpus", [8, 16, 800])
def test_the_search_finds_the_two_nodes_worked_out_by_hand(two_nodes, start_gpus):
    report = find_savings(two_nodes, ("kueue", "gpuwarden"), start_gpus, 1800.0)
    for policy in ("kueue", "gpuwarden"):
        figures = report.policy_figures(policy)
        assert figures["nodes"] == 2
        assert figures["gpu_hours_provisioned"] == pytest.approx(2 * 8 * 3.0)  # until the last finish, at 3 h
        assert figures["useful_gpu_hours"] == pytest.approx(20.0)
        assert figures["utilisation"] == pytest.approx(20.0 / 48.0)
        assert figures["jct_mean"] == pytest.approx(3600.0) and figures["wait_p95"] == 0.0
    assert report.replays == {"kueue": 2, "gpuwarden": 2}  # 1 node and 2 nodes, each once
    assert report.saved()["vs_kueue"] == pytest.approx(0.0)
    assert not report.unserved()


def test_one_node_misses_the_slo_and_a_longer_slo_accepts_it(two_nodes):
    search = FleetSearch(two_nodes, 1800.0)
    one = search.outcome("fifo", 1)
    assert not one.served and "p95 wait" in one.why
    relaxed = FleetSearch(two_nodes, 3600.0)  # one job waits exactly an hour: within
    assert relaxed.smallest("fifo", 2).nodes == 1


def test_a_job_unfinished_at_the_deadline_does_not_serve(tmp_path):
    # on one node the third job starts at 11,600 s and ends at 15,200 s; the deadline is 8,640 s + 1 h tail
    text = HEADER + "2017-10-09 00:00:00,3600,8,a,true\n" + "2017-10-09 02:13:20,3600,8,b,true\n" * 2
    w = file_workload(_csv(tmp_path, text), "2017-10-09", 0.1)
    assert w.min_nodes() == 1 and w.deadline_seconds == 8640.0 + 3600.0
    outcome = FleetSearch(w, 10 * 3600.0).outcome("fifo", 1)
    assert not outcome.served and "unfinished at the deadline" in outcome.why


def _stand_in(monkeypatch, smallest: int) -> list[int]:
    """Replays replaced: a fleet serves from ``smallest`` nodes up; returns the sizes replayed."""
    replayed: list[int] = []

    def replay(workload, policy, nodes, slo, spec):
        replayed.append(nodes)
        return Outcome(policy, nodes, nodes >= smallest, makespan=3600.0, jct_mean=1.0, wait_p95=0.0,
                       worst_team_guarantee_met=1.0)

    monkeypatch.setattr(savings, "replay_window", replay)
    return replayed


@pytest.mark.parametrize("start", [1, 5, 36, 37, 38, 60, 200, 500])
def test_the_search_steps_then_bisects_to_the_smallest_and_caches_every_run(monkeypatch, two_nodes, start):
    replayed = _stand_in(monkeypatch, 37)
    search = FleetSearch(two_nodes, 1800.0)
    search.low, search.high = 3, 400
    assert search.smallest("kueue", start).nodes == 37
    assert len(replayed) == len(set(replayed)) == search.replays["kueue"]  # never the same size twice
    assert len(replayed) <= 2 * math.ceil(math.log2(400)) + 1
    assert all(search.low <= n <= search.high for n in replayed)
    again = search.smallest("kueue", start + 3)  # every size it needs is cached by now or close by
    assert again.nodes == 37 and search.cache[("kueue", 37)] is again


def test_the_cache_reuses_runs(two_nodes):
    search = FleetSearch(two_nodes, 1800.0)
    first = find_savings(two_nodes, ("fifo",), 16, 1800.0, search)
    again = find_savings(two_nodes, ("fifo",), 16, 1800.0, search)
    assert search.replays == {"fifo": 2} and sorted(search.cache) == [("fifo", 1), ("fifo", 2)]
    assert again.outcomes["fifo"] is first.outcomes["fifo"]


def test_below_the_bound_nothing_is_replayed(tmp_path):
    w = file_workload(_csv(tmp_path, HEADER + "2017-10-09,60,16,a,true\n"), None, None)  # a 2-node gang
    search = FleetSearch(w, 60.0)
    assert search.low == 2
    assert not search.outcome("fifo", 1).served and search.replays == {}
    assert search.smallest("fifo", 8).nodes == 2 and search.replays == {"fifo": 1}


def test_no_fleet_up_to_the_bound_serves(monkeypatch, two_nodes):
    _stand_in(monkeypatch, 10**6)
    report = find_savings(two_nodes, ("fifo",), 8, 1800.0)
    assert report.policy_figures("fifo")["nodes"] is None
    assert report.unserved() == ["fifo: no fleet up to 2 nodes served the window ()"]


def test_the_report_has_exactly_the_keys(two_nodes, monkeypatch):
    monkeypatch.setitem(POLICIES, "kube-default", QueuePolicy("kube-default"))
    assert savings_policies()[0] == "kube-default"
    report = find_savings(two_nodes, savings_policies(), 16, 1800.0).to_dict()
    assert set(report["policies"]) == {"kube-default", "fifo", "kueue", "tiresias", "gpuwarden"}
    assert all(tuple(figures) == POLICY_KEYS for figures in report["policies"].values())
    assert POLICY_KEYS == ("nodes", "gpu_hours_provisioned", "useful_gpu_hours", "utilisation", "jct_mean",
                           "wait_p95", "worst_team_guarantee_met")
    assert report["gpu_hours_saved_pct"] == {"vs_kube_default": 0.0, "vs_kueue": 0.0}
    assert report["replays"] == sum(report["replays_by_policy"].values()) == 10


def test_saved_needs_gpuwarden_and_the_baseline(two_nodes):
    assert find_savings(two_nodes, ("kueue",), 16, 1800.0).saved() == {"vs_kube_default": None, "vs_kueue": None}


def test_an_unknown_policy_and_a_zero_slo_are_refused(two_nodes):
    with pytest.raises(SchedulingError, match="--policies: unknown queue policy 'nope'"):
        find_savings(two_nodes, ("nope",), 16, 1800.0)
    with pytest.raises(SchedulingError, match="--slo-wait"):
        FleetSearch(two_nodes, 0.0)


@pytest.mark.parametrize(("text", "message"), [
    ("submitted,duration_seconds,gpus\n2017-10-09,60,1\n", "missing column(s) team"),
    (HEADER + "2017-10-09,60,1,a,true\n2017-10-09,-5,1,a,true\n", "jobs.csv:3: duration_seconds '-5' is negative"),
    (HEADER + "2017-10-09,60,-1,a,true\n", "jobs.csv:2: gpus '-1' is negative"),
    (HEADER + "2017-10-09,60,1.5,a,true\n", "jobs.csv:2: gpus '1.5' is not a whole number"),
    (HEADER + "2017-10-09,60,1,a,true\n2017-10-09,60,1, ,true\n", "jobs.csv:3: team '' is empty"),
    (HEADER + "yesterday,60,1,a,true\n", "jobs.csv:2: submitted 'yesterday' is not a date-time"),
    (HEADER + "2017-10-09,soon,1,a,true\n", "jobs.csv:2: duration_seconds 'soon' is not a number"),
    (HEADER + "2017-10-09,60,1,a,maybe\n", "jobs.csv:2: checkpointable 'maybe' is not true/false"),
    (HEADER, "no jobs"),
])
def test_a_bad_jobs_csv_is_named_by_row(tmp_path, text, message):
    with pytest.raises(TraceError) as raised:
        read_jobs_csv(_csv(tmp_path, text))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_window_outside_the_trace_names_the_flags(tmp_path):
    path = _csv(tmp_path, TWO_NODES)
    with pytest.raises(SchedulingError, match=r"--start 2018-01-01 00:00 --days 1: no GPU job .* 2017-10-09 00:00 to"):
        file_workload(path, "2018-01-01", 1.0)
    assert len(file_workload(path, "2017-10-09 01:00", 1.0).jobs) == 1  # any window of the trace


def test_the_columns_are_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "savings.md").read_text()
    assert all(f"`{column}`" in doc for column in (*JOBS_COLUMNS, "checkpointable"))


def test_the_slo_watch_counts_a_job_whose_pods_are_placed_one_by_one_once():
    """kube-default hands the scheduler a 3-pod job as three pods: the early stop judges the job's
    wait, not each pod's (it once counted two waiting pods as two late jobs and stopped a replay that
    met the SLO), and a job whose pods run only in part is still waiting."""
    from gpuwarden.scheduling import POLICIES, Job, NodeState, Scheduler, State
    from gpuwarden.scheduling.replay import Replay
    from gpuwarden.scheduling.replay_queue import job_waits
    from gpuwarden.scheduling.savings import _SloWatch

    def work() -> list[Job]:
        jobs = [Job("blocker", "t", gpus_per_pod=8, submitted=0.0, duration=10000.0),
                Job("big", "t", pods=3, gpus_per_pod=1, submitted=1.0, duration=10.0)]
        return jobs + [Job(f"s{i:02d}", "t", submitted=9000.0 + i, duration=10.0) for i in range(18)]

    for policy in ("kube-default", "fifo"):
        jobs = work()
        watch = _SloWatch({"t": 8.0}, jobs, 5000.0)
        replay = Replay(State([NodeState(name="n0", model="H100", gpu_count=8, cpu_free=64000, mem_free=2**36)]),
                        Scheduler(POLICIES[policy]), jobs, metrics=watch).run()  # raises _SloBroken if it stops
        assert watch.late["t"] == {"big"}, policy
        assert float(np.percentile(job_waits(jobs, replay), 95)) <= 5000.0, policy
