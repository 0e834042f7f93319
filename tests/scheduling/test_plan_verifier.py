"""The plan verifier (``scheduling.verify``) catches each rule a plan can break, and a round whose
plan breaks one carries out nothing of it: logged with the invariant, counted in the metric.

Plans here are written by hand as the live round writes them (fleet ``Action`` s with placements,
``after_stops``, ``reserved`` and ``for``), on snapshots built with ``tests/builders.py``: a plan
the engine would never make, so that the verifier, not the engine, is what is tested."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from builders import node, snapshot, workload

from gpuwarden.scheduler.scheduler_metrics import SchedulerMetrics
from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.fleet import Action, ActionKind, ActionResult, Gpu, GpuRequest, MigInstance, Team, WorkloadPhase
from gpuwarden.scheduling import verify
from gpuwarden.scheduling.ledgers import check_actions

TEAMS = (Team("alpha", 4, 8), Team("beta", 0, 4))


def bind(target: str, *gpus: str, node_name: str = "node-0", **params) -> Action:
    placements = tuple({"node": node_name, "gpu_uuid": g, "milli": 1000} for g in gpus)
    return Action(ActionKind.BIND, target, "test", {"placements": placements, **params})


def stop(target: str, beneficiary: str, kind: ActionKind = ActionKind.SUSPEND) -> Action:
    return Action(kind, target, "test", {"for": beneficiary})


def invariants(found) -> set[str]:
    return {v.invariant for v in found}


def test_a_plan_within_every_rule_passes():
    cluster = snapshot([node("node-0", gpus=4)], [workload("a", on="node-0", gpus=2),
                                                  workload("b", gpus=2, phase=WorkloadPhase.PENDING)], TEAMS)
    assert check_actions(cluster, [bind("alpha/b", "GPU-node-0-2", "GPU-node-0-3")]) == []


def test_a_whole_gpu_taken_twice_is_over_commit():
    cluster = snapshot([node("node-0", gpus=2)], [workload("a", on="node-0", gpus=1),
                                                  workload("b", phase=WorkloadPhase.PENDING)], TEAMS)
    found = check_actions(cluster, [bind("alpha/b", "GPU-node-0-0")])
    assert invariants(found) == {"over-commit"} and "GPU-node-0-0" in str(found[0])


def test_mig_instances_shares_and_cpu_are_each_counted_per_kind():
    mig_node = node("mig-0", gpus=1)
    gpu = Gpu("GPU-mig-0-0", 0, "mig-0", mig_node.gpu_model, mig_enabled=True,
              mig_instances=(MigInstance(1, "3g.40gb"), MigInstance(2, "1g.10gb")))
    mig = GpuRequest(count=1, mig_profile="3g.40gb")
    waiting = [dataclasses.replace(w, workload=dataclasses.replace(w.workload, gpus=mig))
               for w in (workload("one", phase=WorkloadPhase.PENDING), workload("two", phase=WorkloadPhase.PENDING))]
    cluster = dataclasses.replace(snapshot([mig_node], waiting, TEAMS), gpus=(gpu,))
    instance = {"node": "mig-0", "gpu_uuid": "GPU-mig-0-0", "mig_profile": "3g.40gb"}
    plan = [Action(ActionKind.BIND, key, "test", {"placements": (instance,)}) for key in ("alpha/one", "alpha/two")]
    found = check_actions(cluster, plan)
    assert invariants(found) == {"over-commit"} and "3g.40gb" in str(found[0])  # the GPU has one such instance
    assert check_actions(cluster, plan[:1]) == []
    # a whole-GPU placement on a MIG GPU: it has no whole GPU to give
    assert invariants(check_actions(cluster, [bind("alpha/one", "GPU-mig-0-0", node_name="mig-0")])) == {"over-commit"}


def test_a_start_onto_gpus_its_victims_still_hold_must_wait_for_them():
    cluster = snapshot([node("node-0", gpus=2)], [workload("victim", "beta", gpus=2, on="node-0"),
                                                  workload("urgent", gpus=2, phase=WorkloadPhase.PENDING)], TEAMS)
    start = ("GPU-node-0-0", "GPU-node-0-1")
    at_once = check_actions(cluster, [stop("beta/victim", "alpha/urgent"), bind("alpha/urgent", *start)])
    assert invariants(at_once) == {"over-commit"} and "while its victims still stop" in str(at_once[0])
    held = [stop("beta/victim", "alpha/urgent"), bind("alpha/urgent", *start, after_stops=True)]
    assert check_actions(cluster, held) == []  # held for the GPUs until the victim is gone


def test_a_team_at_its_guarantee_is_never_taken_for_another_teams_borrowing():
    teams = (Team("alpha", 2, 8), Team("beta", 0, 8))
    cluster = snapshot([node("node-0", gpus=2)], [workload("owner", gpus=2, on="node-0"),
                                                  workload("borrower", "beta", gpus=2, phase=WorkloadPhase.PENDING)], teams)
    plan = [stop("alpha/owner", "beta/borrower"), bind("beta/borrower", "GPU-node-0-0", "GPU-node-0-1", after_stops=True)]
    found = check_actions(cluster, plan)
    assert invariants(found) == {"guarantee"} and "below its guarantee 2" in str(found[0])
    # the other way round, a team within its guarantee takes back what another borrows
    back = snapshot([node("node-0", gpus=2)], [workload("borrower", "beta", gpus=2, on="node-0"),
                                               workload("owner", gpus=2, phase=WorkloadPhase.PENDING)], teams)
    assert check_actions(back, [stop("beta/borrower", "alpha/owner"),
                                bind("alpha/owner", "GPU-node-0-0", "GPU-node-0-1", after_stops=True)]) == []
    assert check_actions(cluster, plan, quotas=False) == []  # a policy without quotas keeps no guarantee


def test_a_start_past_the_burst_limit_a_split_gang_and_work_outside_the_queue_are_refused():
    cluster = snapshot([node("node-0", gpus=8)], [workload("big", "beta", gpus=6, phase=WorkloadPhase.PENDING),
                                                  workload("gang", gpus=2, phase=WorkloadPhase.PENDING)], TEAMS,
                       queue_namespaces=frozenset({"alpha", "beta"}))
    assert invariants(check_actions(cluster, [bind("beta/big", *(f"GPU-node-0-{g}" for g in range(6)))])) == {"burst"}
    assert invariants(check_actions(cluster, [bind("alpha/gang", "GPU-node-0-0")])) == {"gang"}
    outside = snapshot([node("node-0", gpus=8)], [workload("theirs", "web", gpus=1, on="node-0"),
                                                  workload("gang", gpus=2, phase=WorkloadPhase.PENDING)], TEAMS,
                       queue_namespaces=frozenset({"alpha"}))
    assert invariants(check_actions(outside, [stop("web/theirs", "alpha/gang"),
                                              bind("alpha/gang", "GPU-node-0-1", "GPU-node-0-2")])) == {"scope"}


def test_work_admitted_and_stopped_in_one_plan_is_refused():
    cluster = snapshot([node("node-0", gpus=2)], [workload("fresh", phase=WorkloadPhase.PENDING)], TEAMS)
    found = check_actions(cluster, [bind("alpha/fresh", "GPU-node-0-0"), stop("alpha/fresh", "alpha/other",
                                                                                ActionKind.PREEMPT)])
    assert invariants(found) == {"victim"}


class _Fixed:
    """A cluster that records what it is asked to carry out."""

    def __init__(self, cluster) -> None:
        self.cluster, self.applied = cluster, []

    def snapshot(self):
        return self.cluster

    def apply(self, action: Action) -> ActionResult:
        self.applied.append(action)
        return ActionResult(action, True, "done")


def test_a_round_whose_plan_breaks_a_rule_carries_out_none_of_it(monkeypatch, caplog):
    """The round's plan with one bad action added (a start past its team's burst): refused whole,
    nothing applied, one error naming the invariant, the metric counted; the next good plan runs."""
    cluster = _Fixed(snapshot([node("node-0", gpus=8)], [workload("fine", phase=WorkloadPhase.PENDING),
                                                         workload("big", "beta", gpus=6, phase=WorkloadPhase.PENDING)],
                              TEAMS))
    import gpuwarden.scheduler.scheduling_round as scheduling_round

    real = scheduling_round.actions_for
    bad = bind("beta/big", *(f"GPU-node-0-{g}" for g in range(2, 8)))
    monkeypatch.setattr(scheduling_round, "actions_for", lambda *args: real(*args) + (bad,))
    metrics = SchedulerMetrics()
    loop = SchedulingRound(cluster, on_round=[metrics])
    with caplog.at_level(logging.ERROR, logger="gpuwarden.scheduler"):
        assert loop.run_round() == ()
    assert cluster.applied == [] and loop.plans_refused == 1
    assert "plan refused whole" in caplog.text and "burst: beta/big" in caplog.text
    assert metrics.registry.get_sample_value("gpuwarden_scheduler_plans_refused_total", {"invariant": "burst"}) == 1
    assert metrics.registry.get_sample_value("gpuwarden_scheduler_plans_refused_total", {"invariant": "gang"}) == 0
    monkeypatch.setattr(scheduling_round, "actions_for", real)
    assert [r.action.target for r in loop.run_round()] == ["alpha/fine"]


@pytest.mark.parametrize("name", verify.INVARIANTS)
def test_every_invariant_is_named_in_the_docs(name):
    from pathlib import Path

    assert f"`{name}`" in (Path(__file__).parents[2] / "docs" / "scheduling-live.md").read_text()


def test_a_replay_pass_that_breaks_a_rule_stops_the_replay(monkeypatch):
    """A replay's figures are the shipped policy's only while every pass keeps the rules: a pass whose
    decisions start a job on a GPU another holds stops the replay with the rule named (a bug, exit 1)."""
    from gpuwarden.scheduling import Job, NodeState, Scheduler, State
    from gpuwarden.scheduling.errors import PlanRefused
    from gpuwarden.scheduling.replay import Replay
    from gpuwarden.scheduling.scheduler import Decision, DecisionKind

    real = Scheduler.schedule

    def doubled(self, state, now):  # the real pass, and the second job on the first one's GPU
        decisions = real(self, state, now)
        waiting = [j for j in state.jobs.values() if j.state.value == "pending"]
        return decisions + [Decision(DecisionKind.BIND, j.name, (("n0", 0, 1000),)) for j in waiting[:1]]

    monkeypatch.setattr(Scheduler, "schedule", doubled)
    jobs = [Job(name, "a", submitted=0.0, duration=100.0) for name in ("first", "second")]
    replay = Replay(State([NodeState("n0", "gpu", 1, 10**6, 10**12)]), Scheduler("fifo"), jobs)
    with pytest.raises(PlanRefused, match=r"over-commit: GPU 0 of n0 \(milli-GPU\) would hold 2000 of 1000"):
        replay.run()
