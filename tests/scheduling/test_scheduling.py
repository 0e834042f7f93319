"""Scheduling scenarios as data: nodes, jobs, quotas and the expected outcome, built with small builders."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, UTC

import pandas as pd
import pytest

from gpuwarden.fleet import (
    ActionKind, ClusterSnapshot, Gpu, GpuRequest, MigInstance, Node, PriorityClass, Team, Topology, Workload,
    WorkloadKind, WorkloadPhase, WorkloadState, Placement,
)
from gpuwarden.scheduling import (
    Job, NodeState, QueuePolicy, QuotaError, Quotas, QuotaSpec, Scheduler, State, Statement, TraceOrderError,
    UnknownMigProfile, advise_layouts, find_placement, plan,
)
from gpuwarden.scheduling.replay_queue import check_order

H100 = "NVIDIA H100 80GB HBM3"


# ---------------------------------------------------------------------------------------------- builders


@dataclass
class ClusterBuilder:
    nodes: list = field(default_factory=list)
    quotas: list = field(default_factory=list)

    def node(self, name, gpus=8, model=H100, leaf="leaf-0", nvlink=None, mig=None, **kw):
        node = NodeState(name=name, model=model, gpu_count=gpus, cpu_free=kw.pop("cpu", 10**9),
                         mem_free=kw.pop("mem", 10**15), leaf_switch=leaf, nvlink_domain=nvlink or name, **kw)
        for g, layout in (mig or {}).items():
            node.mig_layout[g] = tuple(layout)
            node.gpu_free[g] = 0
        self.nodes.append(node)
        return self

    def team(self, name, guaranteed, burst=None):
        self.quotas.append(QuotaSpec(name, guaranteed, burst if burst is not None else 1000))
        return self

    def obj(self) -> State:
        return State(self.nodes, Quotas(self.quotas))


def cluster() -> ClusterBuilder:
    return ClusterBuilder()


class JobBuilder:
    def __init__(self, name):
        self.kw = dict(name=name, team="t")

    def team(self, team):
        self.kw["team"] = team
        return self

    def gpus(self, n, pods=1):
        self.kw.update(gpus_per_pod=n, pods=pods)
        return self

    def fraction(self, milli):
        self.kw.update(milli=milli, gpus_per_pod=1)
        return self

    def mig(self, profile):
        self.kw["mig_profile"] = profile
        return self

    def priority(self, p: PriorityClass):
        self.kw["priority"] = p.rank
        return self

    def checkpointable(self):
        self.kw["checkpointable"] = True
        return self

    def at(self, t):
        self.kw["submitted"] = t
        return self

    def obj(self) -> Job:
        return Job(**self.kw)


def job(name) -> JobBuilder:
    return JobBuilder(name)


def submit(state: State, *jobs: JobBuilder) -> None:
    for j in jobs:
        state.add_job(j.obj())


def kinds(decisions) -> dict[str, str]:
    return {d.job: d.kind for d in decisions}


def finish(state: State, name: str) -> None:
    j = state.jobs[name]
    state.release(j, j.placements)
    j.placements, j.state = [], "done"


# ---------------------------------------------------------------------------------------------- scenarios


def test_quota_lending_then_reclaim_from_the_borrower():
    state = cluster().node("n1", gpus=8).node("n2", gpus=8).team("a", 8).team("b", 8).obj()
    submit(state, *(job(f"b{i}").team("b").gpus(1).checkpointable().at(i) for i in range(16)))
    first = Scheduler("gpuwarden").schedule(state, now=0)
    assert sum(1 for k in kinds(first).values() if k == "bind") == 16  # b borrows a's unused guarantee
    assert state.quotas.borrowed("b", "*") == 8
    submit(state, job("a0").team("a").gpus(4).at(100))
    second = kinds(Scheduler("gpuwarden").schedule(state, now=100))
    assert second["a0"] == "bind"
    suspended = [name for name, kind in second.items() if kind == "suspend"]
    assert len(suspended) == 4 and all(name.startswith("b") for name in suspended)  # reclaimed, checkpointed
    assert state.quotas.used("a", "*") == 4 and state.quotas.used("b", "*") == 12


def test_borrowing_stops_at_the_burst_limit_with_a_reason():
    state = cluster().node("n1", gpus=8).team("a", 2, burst=3).obj()
    submit(state, *(job(f"a{i}").team("a").gpus(1).at(i) for i in range(5)))
    decisions = kinds(Scheduler("gpuwarden").schedule(state, now=0))
    assert sum(1 for k in decisions.values() if k == "bind") == 3
    assert "burst limit" in state.jobs["a3"].wait_reason


def test_priority_preemption_suspends_checkpointable_victim_and_resumes_it_with_progress():
    state = cluster().node("n1", gpus=8).obj()
    submit(state, job("low").gpus(8).priority(PriorityClass.LOW).checkpointable())
    scheduler = Scheduler("gpuwarden")
    assert kinds(scheduler.schedule(state, now=0)) == {"low": "bind"}
    state.jobs["low"].progress = 500.0
    submit(state, job("high").gpus(8).priority(PriorityClass.HIGH).at(10))
    assert kinds(scheduler.schedule(state, now=10)) == {"low": "suspend", "high": "bind"}
    assert state.jobs["low"].state == "suspended"
    finish(state, "high")
    assert kinds(scheduler.schedule(state, now=20)) == {"low": "resume"}
    assert state.jobs["low"].progress == 500.0  # progress kept across the checkpoint


DEFRAG = QueuePolicy("defrag", checkpoint=True, defragment=True)


def _scattered() -> State:
    """Two 4-GPU nodes, each with 2 GPUs held by 1-GPU jobs: 4 GPUs free, none 4 together."""
    state = cluster().node("n1", gpus=4).node("n2", gpus=4).obj()
    for name, node, gpu in (("a", "n1", 0), ("b", "n1", 1), ("c", "n2", 0), ("d", "n2", 1)):
        j = job(name).gpus(1).checkpointable().obj()
        state.add_running(j, [(node, gpu, 1000)])
        j.state, j.started, j.progress = "running", 0.0, 100.0
    return state


def test_defragment_moves_checkpointable_jobs_to_gather_a_blocked_jobs_gpus():
    state = _scattered()
    submit(state, job("big").gpus(4).at(5))
    assert Scheduler(QueuePolicy("plain", checkpoint=True)).schedule(state, now=10) == []  # scattered: it waits
    decisions = Scheduler(DEFRAG).schedule(state, now=10)
    # Both 1-GPU jobs of one node suspend, the 4-GPU job starts there, they resume on the other node.
    assert [(d.kind, d.job) for d in decisions][2] == ("bind", "big")
    moved = {d.job for d in decisions if d.kind == "suspend"}
    assert len(moved) == 2 and {d.job for d in decisions if d.kind == "resume"} == moved
    (home,) = {slot[0] for slot in state.jobs["big"].placements}
    assert len(state.jobs["big"].placements) == 4
    for name in moved:
        j = state.jobs[name]
        assert j.state == "running" and j.progress == 100.0  # checkpointed: progress kept
        assert [slot[0] for slot in j.placements] != [home]
    assert all(node.whole_free() == 0 for node in state.nodes.values())


def test_defragment_moves_nothing_it_cannot_place_or_may_not_move():
    state = _scattered()
    submit(state, job("big").gpus(4).at(5), job("huge").gpus(8).at(6))
    for name in ("a", "c"):  # one job on each node is not checkpointable: no node can be cleared
        state.jobs[name].checkpointable = False
    assert Scheduler(DEFRAG).schedule(state, now=10) == []
    assert {name: state.jobs[name].placements[0][0] for name in "abcd"} == {"a": "n1", "b": "n1", "c": "n2", "d": "n2"}
    assert state.jobs["huge"].state == "pending"  # 8 GPUs per pod on 4-GPU nodes: never gathered
    state = _scattered()
    state.jobs["a"].priority = state.jobs["c"].priority = 5  # above the waiting job's: never moved for it
    submit(state, job("big").gpus(4).at(5))
    assert Scheduler(DEFRAG).schedule(state, now=10) == []
    # All or nothing: n1's jobs may run only in n1's pool, so once the 4-GPU job took n1 they have
    # nowhere to go; the move rolls back and every job is where it was.
    state = _scattered()
    state.nodes["n1"].pool, state.nodes["n2"].pool = "p1", "p2"
    for name in ("a", "b"):
        state.jobs[name].pools = ("p1",)
    for name in ("c", "d"):
        state.jobs[name].checkpointable = False
    before = {name: list(state.jobs[name].placements) for name in "abcd"}
    submit(state, job("big").gpus(4).at(5))
    assert Scheduler(DEFRAG).schedule(state, now=10) == []
    assert {name: state.jobs[name].placements for name in "abcd"} == before
    assert state.jobs["big"].state == "pending" and [n.whole_free() for n in state.nodes.values()] == [2, 2]


def test_non_checkpointable_victim_is_preempted_not_suspended():
    state = cluster().node("n1", gpus=4).obj()
    submit(state, job("low").gpus(4).priority(PriorityClass.LOW))
    scheduler = Scheduler("gpuwarden")
    scheduler.schedule(state, now=0)
    submit(state, job("crit").gpus(4).priority(PriorityClass.CRITICAL).at(1))
    assert kinds(scheduler.schedule(state, now=1)) == {"low": "preempt", "crit": "bind"}


def test_no_preemption_loop_victim_is_protected_after_repeated_preemption():
    state = cluster().node("n1", gpus=4).obj()
    scheduler = Scheduler("gpuwarden")  # protect_after=2 within 6 h
    submit(state, job("victim").gpus(4).priority(PriorityClass.LOW).checkpointable())
    scheduler.schedule(state, now=0)
    for round_, t in enumerate((100, 200)):
        submit(state, job(f"hi{round_}").gpus(4).priority(PriorityClass.HIGH).at(t))
        assert kinds(scheduler.schedule(state, now=t))[f"hi{round_}"] == "bind"
        finish(state, f"hi{round_}")
        assert kinds(scheduler.schedule(state, now=t + 1)) == {"victim": "resume"}
    submit(state, job("hi2").gpus(4).priority(PriorityClass.HIGH).at(300))
    third = kinds(scheduler.schedule(state, now=300))
    assert "victim" not in third and "hi2" not in third  # protected: no third preemption
    assert state.jobs["victim"].state == "running"
    assert "capacity" in state.jobs["hi2"].wait_reason


@pytest.mark.parametrize("a_guarantee, a_gives_back", [(2, True), (3, False)])
def test_las_preemption_across_teams_takes_only_borrowed_gpus(a_guarantee, a_gives_back):
    # a runs two 2-GPU jobs that have had 11 GPU-hours each (lowest LAS level); b borrows too and submits a new job
    state = cluster().node("n1", gpus=8).team("a", a_guarantee).team("b", 3).team("c", 5 - a_guarantee).obj()
    submit(state, *(job(f"a{i}").team("a").gpus(2).checkpointable().at(i) for i in range(2)))
    submit(state, *(job(f"b{i}").team("b").gpus(1).checkpointable().at(10 + i) for i in range(4)))
    scheduler = Scheduler("gpuwarden")
    assert len(scheduler.schedule(state, now=20)) == 6
    for i in range(2):
        state.jobs[f"a{i}"].attained = 11 * 3600.0
    submit(state, job("b-new").team("b").gpus(1).checkpointable().at(30))
    decided = kinds(scheduler.schedule(state, now=30))
    if a_gives_back:  # a borrows 2: one 2-GPU job is suspended, a stays at its guarantee
        assert decided["b-new"] == "bind" and sorted(decided.values()) == ["bind", "suspend"]
        assert state.quotas.used("a", "*") == a_guarantee
    else:  # a borrows 1: suspending a 2-GPU job would push a below its guarantee, so LAS may not
        assert decided == {} and state.jobs["b-new"].state == "pending"
        assert state.quotas.used("a", "*") == 4


def test_gang_is_all_or_nothing_and_rolls_back():
    state = cluster().node("n1", gpus=4).node("n2", gpus=4).obj()
    submit(state, job("filler1").gpus(1), job("filler2").gpus(1))
    scheduler = Scheduler(QueuePolicy("plain"))
    scheduler.schedule(state, now=0)
    submit(state, job("gang").gpus(4, pods=2).at(1))
    assert "gang" not in kinds(scheduler.schedule(state, now=1))
    assert state.jobs["gang"].state == "pending" and not state.jobs["gang"].placements
    assert sum(n.whole_free() for n in state.nodes.values()) == 6  # nothing half-allocated
    assert "gang" in state.jobs["gang"].wait_reason or "capacity" in state.jobs["gang"].wait_reason


def test_statement_checkpoint_and_rollback_restore_state():
    state = cluster().node("n1", gpus=2).obj()
    submit(state, job("a").gpus(1), job("b").gpus(1))
    statement = Statement(state)
    statement.allocate(state.jobs["a"], [("n1", 0, 1000)])
    mark = statement.checkpoint()
    statement.allocate(state.jobs["b"], [("n1", 1, 1000)])
    statement.evict(state.jobs["a"])
    statement.rollback(mark)
    assert state.nodes["n1"].gpu_free == [0, 1000]
    assert state.jobs["a"].state == "running" and state.jobs["b"].state == "pending"


def test_mig_and_fractional_placement():
    state = cluster().node("n1", gpus=2, mig={0: ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")}).obj()
    submit(state, job("svc1").mig("1g.10gb"), job("svc2").mig("1g.10gb"), job("svc3").mig("1g.10gb"),
           job("f1").fraction(300).at(1), job("f2").fraction(600).at(2), job("f3").fraction(200).at(3))
    decisions = Scheduler(QueuePolicy("plain")).schedule(state, now=5)
    placed = {d.job: d.placements for d in decisions}
    assert placed["svc1"][0][1:] == (0, "1g.10gb") and placed["svc2"][0][1:] == (0, "1g.10gb")
    assert "svc3" not in placed and "MIG" in state.jobs["svc3"].wait_reason  # only two 1g slices exist
    assert {placed[f][0][1] for f in ("f1", "f2")} == {1}  # fractions share the non-MIG GPU
    assert "f3" not in placed  # 300 + 600 leaves 100 milli: 200 does not fit
    assert state.nodes["n1"].gpu_free[1] == 100


def test_topology_packs_gang_under_one_leaf_and_single_job_best_fit():
    state = (cluster()
             .node("a1", leaf="leaf-a").node("a2", leaf="leaf-a")
             .node("b1", leaf="leaf-b").node("b2", leaf="leaf-b").node("b3", gpus=4, leaf="leaf-b").obj())
    state.nodes["a1"].gpu_free[:4] = [0] * 4  # leaf-a has 12 free, leaf-b 20
    placements, _ = find_placement(state, job("gang").gpus(8, pods=2).obj())
    assert {p[0] for p in placements} == {"b1", "b2"}  # one leaf; leaf-a lacks two whole free nodes
    single, _ = find_placement(state, job("four").gpus(4).obj())
    assert {p[0] for p in single} in ({"a1"}, {"b3"})  # exactly-fitting node, not a fresh 8-GPU one


def test_inference_stays_off_spot_and_checkpointable_training_may_use_it():
    from gpuwarden.fleet import PriceTier

    state = cluster().node("spot", gpus=4, tier=PriceTier.SPOT).obj()
    svc = job("svc").gpus(1).obj()
    svc.kind = WorkloadKind.INFERENCE
    assert find_placement(state, svc)[0] is None
    assert "spot" in find_placement(state, svc)[1]
    train = job("t").gpus(1).checkpointable().obj()
    assert find_placement(state, train)[0] is not None


def test_bad_input_is_a_clear_error_or_a_recorded_reason():
    with pytest.raises(QuotaError, match="negative quota"):
        QuotaSpec("t", -1, 4)
    state = cluster().node("n1", gpus=8).obj()
    with pytest.raises(UnknownMigProfile, match="9g.99gb"):
        state.add_job(job("x").mig("9g.99gb").obj())
    state.add_job(job("huge").gpus(16).obj())
    assert Scheduler("gpuwarden").schedule(state, now=0) == []
    assert "the largest schedulable node offers 8" in state.jobs["huge"].wait_reason
    frame = pd.DataFrame({"submitted_at": pd.to_datetime(["2017-10-01 10:00", "2017-10-01 09:00"], utc=True)})
    with pytest.raises(TraceOrderError, match="row 3"):
        check_order(frame)


def test_mig_layout_advice_fits_demand_with_little_waste():
    advice = advise_layouts("H100", gpus=4, demand={"1g.10gb": 7, "3g.40gb": 2, "2g.20gb": 3})
    assert not advice.unmet
    assert advice.wasted_compute_slices <= 3
    with pytest.raises(UnknownMigProfile):
        advise_layouts("H100", gpus=1, demand={"1g.18gb": 1})


def test_mig_layout_advice_fills_spare_room_with_asked_profiles_not_unusable_ones():
    """The mixed fleet's H100 demand: 43 of 49 compute slices on 7 GPUs are asked for. The spare room
    goes to more instances of asked profiles (headroom for their next pods), never to a profile no
    pod asked for (a 1g.20gb instance serves no 1g.10gb request)."""
    demand = {"1g.10gb": 12, "2g.20gb": 8, "3g.40gb": 5}
    advice = advise_layouts("H100", gpus=48, demand=demand)
    assert not advice.unmet and sum(count for _, count in advice.layouts) == 7
    offered = {name for layout, _ in advice.layouts for name in layout}
    assert offered <= set(demand), offered


def _snapshot() -> ClusterSnapshot:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    topo = Topology("nvl-0", "leaf-0", "rack-0")
    nodes = (Node("n1", "pool", "cloud", "reserved", topo, H100, 2, 64000, 512 * 2**30),)
    gpus = (Gpu("g0", 0, "n1", H100), Gpu("g1", 1, "n1", H100, mig_enabled=True,
                                         mig_instances=(MigInstance(1, "3g.40gb"), MigInstance(2, "3g.40gb"))))

    def w(name, request, prio=PriorityClass.NORMAL):
        return Workload(name, "ml", WorkloadKind.INFERENCE, "team", "p", prio, request)

    workloads = (
        WorkloadState(w("svc", GpuRequest(mig_profile="3g.40gb")), WorkloadPhase.RUNNING, t0, t0,
                      (Placement("n1", "g1", 1),)),
        WorkloadState(w("new-svc", GpuRequest(mig_profile="3g.40gb")), WorkloadPhase.PENDING, t0, None),
        WorkloadState(w("big", GpuRequest(count=2)), WorkloadPhase.PENDING, t0 + timedelta(seconds=1), None),
    )
    return ClusterSnapshot(t0, nodes, gpus, workloads, (Team("team", 2, 4),))


def test_plan_on_a_cluster_snapshot_returns_actions_and_queue_reasons():
    snapshot = _snapshot()
    result = plan(snapshot)
    binds = {a.target: a for a in result.actions if a.kind == ActionKind.BIND}
    assert set(binds) == {"ml/new-svc"}
    assert binds["ml/new-svc"].params["placements"][0]["gpu_uuid"] == "g1"
    assert result.queue[0]["job"] == "ml/big" and result.queue[0]["position"] == 1
    assert "GPUs" in result.reason("ml/big")
    assert snapshot.workloads[1].phase == WorkloadPhase.PENDING  # the snapshot is untouched


def test_openb_one_seed_default(data_dir):
    from gpuwarden.scheduling.replay_openb import prepare, replay_seed

    data = prepare(data_dir, "default")
    best = replay_seed(data, "bestfit", 42, "default")
    ours = replay_seed(data, "gpuwarden", 42, "default")
    assert best.arrived == ours.arrived and best.arrived_milli <= 1.3 * best.cluster_milli
    assert abs(100 * best.allocation_ratio - 93.08) < 1.0  # the harness reproduces the paper's BestFit
    assert 100 * ours.allocation_ratio > 100 * best.allocation_ratio + 1.5
    assert ours.failed == sum(ours.failure_reasons.values())  # every failure has a reason


def test_cli_simulate_mixed_json(capsys):
    from gpuwarden.cli import main

    assert main(["simulate", "mixed", "--hours", "12", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    naive, ours = rows
    assert ours["useful_utilisation"] > naive["useful_utilisation"]
    assert ours["moves"] > 0 and naive["moves"] == 0  # gpuwarden gathers scattered GPUs; naive cannot


def test_mixed_replay_counts_a_moved_jobs_restore_as_held_not_useful():
    """A moved (or suspended) job holds its GPUs while it restarts, computing nothing: with a longer
    restore time the run is less useful and trains fewer GPU-hours."""
    from dataclasses import replace

    from gpuwarden.cli.simulate_cmd import mixed_rows
    from gpuwarden.scheduling.replay_mixed import MixedSpec

    spec = replace(MixedSpec(), hours=12)
    free = mixed_rows(replace(spec, restore_seconds=0.0))[1]
    slow = mixed_rows(replace(spec, restore_seconds=1800.0))[1]
    assert free["moves"] > 0 and slow["moves"] > 0
    assert slow["useful_utilisation"] < free["useful_utilisation"]
    assert slow["training_gpu_hours_per_hour"] < free["training_gpu_hours_per_hour"]


def test_cli_simulate_queue_rejects_out_of_order_trace(tmp_path, capsys, data_dir):
    from gpuwarden.cli import main

    trace = tmp_path / "jobs.csv"
    trace.write_text("timestamp,duration,num_gpus,cluster\n2017-10-01 10:00:00,60,1,a\n2017-10-01 09:00:00,60,1,a\n")
    assert main(["simulate", "queue", "--trace", str(trace), "--data-dir", str(data_dir)]) == 2
    assert "not in time order" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- enums and scorers


def test_job_states_decision_kinds_and_policy_modes_are_enums():
    from gpuwarden.scheduling import DecisionKind, JobState, PreemptMode, QueueOrder, SchedulingError

    state = ClusterBuilder().node("n1", gpus=1).obj()
    state.add_job(Job("a", "t"))
    decisions = Scheduler("fifo").schedule(state, 0.0)
    assert [d.kind for d in decisions] == [DecisionKind.BIND]
    assert state.jobs["a"].state is JobState.RUNNING
    policy = QueuePolicy("by-hand", order="las", preempt="priority")  # strings from YAML become enums
    assert policy.order is QueueOrder.LAS and policy.preempt is PreemptMode.PRIORITY
    with pytest.raises(SchedulingError, match="preempt 'sometimes' is not one of: none, priority, las"):
        QueuePolicy("bad", preempt="sometimes")


def test_fragmentation_scorer_keeps_room_for_the_expected_pods():
    """FGD inside the engine: tightest fit takes the shared GPU and strands 200 milli that the
    expected 300-milli pods cannot use; the fragmentation scorer keeps that GPU usable."""
    from gpuwarden.scheduling import PlacementOptions
    from gpuwarden.scheduling.state import Shape

    state = ClusterBuilder().node("a", gpus=2).node("b", gpus=2, gpu_free=[700, 1000]).obj()
    state.expect({Shape(1, 300, 0, 0): 1.0})
    job = Job("frac", "t", milli=500)
    assert find_placement(state, job, PlacementOptions())[0] == [("b", 0, 500)]
    assert find_placement(state, job, PlacementOptions(scorer="fgd"))[0] == [("a", 0, 500)]


def test_fgd_ties_go_to_the_node_left_with_the_least_cpu_share_free():
    """gpuwarden's tie rule: two nodes score the same for a whole-GPU pod; node order would take the
    CPU-roomy one, best fit on CPU keeps it for CPU-heavy pods. An unknown tie rule names the allowed ones."""
    from gpuwarden.scheduling import PlacementOptions, SchedulingError

    def chosen(ties: str) -> str:
        state = ClusterBuilder().node("roomy", gpus=1, cpu=96000).node("tight", gpus=1, cpu=16000).obj()
        placements, _ = find_placement(state, Job("p", "t", cpu_milli=8000), PlacementOptions(scorer="fgd", ties=ties))
        assert placements is not None
        return placements[0][0]

    assert chosen("first") == "roomy"
    assert chosen("tightest_cpu") == "tight"
    with pytest.raises(SchedulingError, match="placement ties 'fullest' is not one of: random, first, tightest_cpu"):
        PlacementOptions(scorer="fgd", ties="fullest")
