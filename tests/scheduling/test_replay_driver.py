"""The one replay driver (``scheduling.replay``): event order, accrual of progress and attained
service, resume overhead, kill loss and ticks on tiny hand-made traces worked out by hand; and each
replay built on it (Philly queue, mixed fleet, what-if) keeps its figures on a small slice."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from gpuwarden.scheduling import POLICIES, DecisionKind, Job, NodeState, Scheduler, State
from gpuwarden.scheduling.replay import REQUEST_FIELDS, JobModel, Replay, ReplayMetrics, fresh_copy

# -- scenario builders: a test names only what it is about ----------------------------------------


def node(name: str = "n1", gpus: int = 1) -> NodeState:
    return NodeState(name=name, model="gpu", gpu_count=gpus, cpu_free=10**9, mem_free=10**15,
                     nvlink_domain=name, leaf_switch="leaf")


def job(name: str, submitted: float, duration: float, gpus: int = 1, team: str = "a") -> Job:
    return Job(name=name, team=team, gpus_per_pod=gpus, submitted=submitted, duration=duration, checkpointable=True)


class Recorder(ReplayMetrics):
    """Every hook call, in order: (now, event, job) and the accrual intervals with who ran and waited."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []
        self.intervals: list[tuple[float, float, tuple[str, ...], tuple[str, ...]]] = []

    def accrue(self, replay: Replay, start: float, end: float) -> None:
        self.intervals.append((start, end, tuple(replay.running), tuple(replay.waiting)))

    def started(self, replay: Replay, job: Job, kind: DecisionKind) -> None:
        self.events.append((replay.now, str(kind), job.name))

    def stopped(self, replay: Replay, job: Job, kind: DecisionKind) -> None:
        self.events.append((replay.now, str(kind), job.name))

    def finished(self, replay: Replay, job: Job) -> None:
        self.events.append((replay.now, "finished", job.name))


def run(jobs: list[Job], policy: str = "fifo", gpus: int = 1, **options: object) -> tuple[Replay, Recorder]:
    recorder = Recorder()
    replay = Replay(State([node(gpus=gpus)]), Scheduler(POLICIES[policy]), jobs, metrics=recorder,
                    **options).run()  # type: ignore[arg-type]
    return replay, recorder


# -- the event loop --------------------------------------------------------------------------------


def test_fifo_events_come_in_time_order_and_accrual_covers_every_interval_once():
    # a (2 GPUs, 100 s) fills the node; b (1 GPU, 50 s) arrives at 10 and waits for it
    a, b = job("a", 0.0, 100.0, gpus=2), job("b", 10.0, 50.0)
    replay, seen = run([b, a], gpus=2)  # given out of order: the driver sorts arrivals
    assert seen.events == [(0.0, "bind", "a"), (100.0, "finished", "a"), (100.0, "bind", "b"), (150.0, "finished", "b")]
    assert seen.intervals == [(0.0, 10.0, ("a",), ()), (10.0, 100.0, ("a",), ("b",)), (100.0, 150.0, ("b",), ())]
    assert replay.runs == {"a": [(0.0, 100.0)], "b": [(100.0, 150.0)]}
    assert (a.finished, b.finished, b.first_started) == (100.0, 150.0, 100.0)
    assert a.progress == 100.0 and a.attained == 200.0  # attained service is GPU-seconds
    assert replay.state.jobs == {}  # finished jobs leave the state
    assert replay.now == 150.0


def test_las_suspends_on_arrival_and_the_resume_pays_its_overhead_in_held_time():
    # a runs alone; at 5000 s its attained service (5000 GPU-s) is above tiresias's first edge
    # (3600), so b (level 0) preempts it; a is checkpointable: suspended, resumed when b finishes,
    # and holds the GPU 60 s before it computes again
    a, b = job("a", 0.0, 10000.0), job("b", 5000.0, 600.0)
    replay, seen = run([a, b], "tiresias", model=JobModel(resume_overhead_seconds=60.0), tick_seconds=300.0)
    assert seen.events == [(0.0, "bind", "a"), (5000.0, "suspend", "a"), (5000.0, "bind", "b"),
                           (5600.0, "finished", "b"), (5600.0, "resume", "a"), (10660.0, "finished", "a")]
    assert replay.runs["a"] == [(0.0, 5000.0), (5600.0, 10660.0)]
    assert a.progress == pytest.approx(10000.0)
    assert a.attained == pytest.approx(5000.0 + 5060.0)  # the overhead is held, so it is service


def test_a_tick_lets_las_rerank_when_no_event_happens():
    # c arrives at 100 s at a's level (both 0): it waits. a crosses 3600 GPU-s at 3600 s with no
    # event; the tick at 3600 re-ranks and c preempts it. Without ticks c waits for a's finish.
    def trace() -> list[Job]:
        return [job("a", 0.0, 10000.0), job("c", 100.0, 600.0)]

    ticking, _ = run(trace(), "tiresias", tick_seconds=300.0)
    assert ticking.runs["c"] == [(3600.0, 4200.0)]
    assert ticking.runs["a"] == [(0.0, 3600.0), (4200.0, 10600.0)]
    quiet, _ = run(trace(), "tiresias")
    assert quiet.runs["c"] == [(10000.0, 10600.0)]


def test_the_horizon_stops_the_replay_and_accrues_up_to_it():
    a = job("a", 0.0, 10000.0)
    replay, seen = run([a, job("b", 5000.0, 10.0, gpus=2)], gpus=2, horizon_seconds=3000.0)
    assert replay.now == 3000.0 and a.progress == 3000.0 and a.finished is None
    assert seen.intervals[-1][:2] == (0.0, 3000.0)
    assert "b" not in replay.state.jobs  # never arrived


def test_work_nothing_can_ever_place_ends_the_replay_instead_of_ticking_forever():
    too_big = job("big", 0.0, 10.0, gpus=4)
    replay, seen = run([job("a", 0.0, 50.0), too_big], "tiresias", tick_seconds=300.0)
    assert replay.now == 50.0 and too_big.finished is None and too_big.first_started is None
    assert "asks for 4 whole GPUs per pod" in too_big.wait_reason


def test_bad_tick_is_refused_naming_it():
    with pytest.raises(ValueError, match="tick_seconds 0 must be > 0"):
        Replay(State([node()]), Scheduler("fifo"), [], tick_seconds=0)


# -- the job model ---------------------------------------------------------------------------------


def test_a_kill_keeps_the_last_periodic_checkpoint_since_the_start():
    model = JobModel(resume_overhead_seconds=60.0, checkpoint_interval_seconds=1800.0)
    killed = job("a", 0.0, 10000.0)
    killed.progress = 1000.0 + 4000.0  # computed 4000 s since it restarted at 1000 s of progress
    assert model.progress_after_kill(killed, 1000.0) == 1000.0 + 3600.0
    killed.progress = 1000.0 + 1799.0
    assert model.progress_after_kill(killed, 1000.0) == 1000.0
    assert JobModel().progress_after_kill(killed, 1000.0) == 1000.0  # no periodic checkpoints: its start
    assert model.progress_after_kill(replace(killed, checkpointable=False), 1000.0) == 0.0  # from scratch


def test_kueue_reclaim_kills_and_the_killed_job_redoes_the_work_since_its_checkpoint():
    # two teams of one GPU each on a 2-GPU node: big borrows both from 0; small's job at 4500 s
    # reclaims one. kueue kills (no checkpoint signal): big keeps 3600 s of its 4500 s.
    from gpuwarden.scheduling import Quotas, QuotaSpec

    big, small = job("big", 0.0, 36000.0, gpus=2, team="big"), job("small", 4500.0, 600.0, team="small")
    state = State([node(gpus=2)], Quotas([QuotaSpec("big", 1, 2), QuotaSpec("small", 1, 2)]))
    model = JobModel(resume_overhead_seconds=60.0, checkpoint_interval_seconds=1800.0)
    replay = Replay(state, Scheduler(POLICIES["kueue"]), [big, small], model).run()
    assert replay.runs["big"] == [(0.0, 4500.0), (5100.0, 5100.0 + 60.0 + 36000.0 - 3600.0)]
    assert big.progress == pytest.approx(36000.0)


def test_bad_job_model_is_refused_naming_the_value():
    with pytest.raises(ValueError, match="checkpoint_interval_seconds 0"):
        JobModel(checkpoint_interval_seconds=0)
    with pytest.raises(ValueError, match="resume_overhead_seconds -1"):
        JobModel(resume_overhead_seconds=-1)


def test_fresh_copy_keeps_the_request_and_drops_what_happened():
    ran = job("a", 5.0, 100.0, gpus=2)
    ran.progress, ran.attained, ran.started, ran.preempted_at = 50.0, 100.0, 7.0, [9.0]
    copy = fresh_copy(ran, gpu_model="H100")
    assert (copy.name, copy.gpus_per_pod, copy.submitted, copy.duration, copy.gpu_model) == ("a", 2, 5.0, 100.0, "H100")
    assert (copy.progress, copy.attained, copy.started, copy.preempted_at) == (0.0, 0.0, None, [])
    assert set(REQUEST_FIELDS) <= {f.name for f in fields(Job)}


# -- each replay through the driver keeps its figures (measured before the driver) ---------------


def test_queue_replay_figures_on_a_small_philly_slice(data_dir):
    from gpuwarden.scheduling.replay_queue import QueueSlice, run_queue_replay

    fifo, tiresias = run_queue_replay(data_dir, QueueSlice(max_jobs=300), ("fifo", "tiresias"))
    # fifo never stops a job: its figures are the pre-driver replay's to the last digit
    assert (fifo.finished, fifo.jct_mean, fifo.wait_p99) == (300, pytest.approx(FIFO_300["jct_mean"]),
                                                             pytest.approx(FIFO_300["wait_p99"]))
    assert fifo.utilisation == pytest.approx(FIFO_300["utilisation"])
    assert tiresias.suspends > 0 and tiresias.jct_mean < fifo.jct_mean


# the pre-driver replay (main at 7180670) on these slices. The mixed figures are that replay
# (sim/replay_mixed.py of 7180670) run over the one placement engine of issue 22, whose first-fit
# scorer places the naive policy's whole GPUs (the old first fit gave naive 0.7339 useful, 55
# services): the driver must reproduce the old loop, whatever engine both run on.
FIFO_300 = {"jct_mean": 4788.65, "wait_p99": 3178.02, "utilisation": 0.10533690832312352}
MIXED_12H = {  # naive, gpuwarden
    "useful_utilisation": (0.7274457887257175, 0.8148550839700126),
    "training_gpu_hours_per_hour": (99.51294452221991, 111.91598786617713),
    "allocation": (0.9538525309658659, 0.9146731195118079),
    "inference_served": (56, 55), "training_started": (57, 63), "moves": (0, 4), "waiting_at_end": (16, 11),
}


def test_mixed_replay_figures_on_twelve_hours():
    from gpuwarden.cli.simulate_cmd import mixed_rows
    from gpuwarden.scheduling.replay_mixed import MixedSpec

    rows = mixed_rows(replace(MixedSpec(), hours=12))
    assert [r["policy"] for r in rows] == ["naive", "gpuwarden"]
    for key, expected in MIXED_12H.items():
        assert tuple(r[key] for r in rows) == pytest.approx(expected, rel=1e-9), key
