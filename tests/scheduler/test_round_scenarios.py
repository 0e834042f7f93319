"""Scheduling-round scenarios read as a table (tests/scheduler/round_scenarios.yaml): each is a
cluster, its work and what one round of the shipped policy must do, run through the production
``SchedulingRound`` (plan, the invariant verifier, apply) on the recording cluster of
test_scheduler_loop. A new scenario is a few lines of YAML, not a test function."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from builders import node, workload
from test_scheduler_loop import RecordingCluster

from gpuwarden.fleet import ActionKind, Team, WorkloadPhase
from gpuwarden.scheduler.scheduling_round import SchedulingRound

SCENARIOS = yaml.safe_load((Path(__file__).parent / "round_scenarios.yaml").read_text())
STOPS = (ActionKind.SUSPEND, ActionKind.PREEMPT, ActionKind.EVICT)


def cluster_of(case: dict) -> RecordingCluster:
    teams = tuple(Team(name, float(g), float(b)) for name, (g, b) in case["teams"].items())
    work = []
    for w in case["workloads"]:
        ws = workload(w["name"], w["team"], w["gpus"], WorkloadPhase.RUNNING if "node" in w else WorkloadPhase.PENDING,
                      on=w.get("node"), priority=w.get("priority", "normal"))
        work.append(dataclasses.replace(ws, workload=dataclasses.replace(ws.workload, gang_size=w.get("pods", 1))))
    cluster = RecordingCluster([node(name, gpus=gpus) for name, gpus in case["nodes"].items()], work, teams)
    if "queue" in case:
        cluster.base = dataclasses.replace(cluster.base, queue_namespaces=frozenset(case["queue"]))
    return cluster


@pytest.mark.parametrize("case", SCENARIOS, ids=[case["name"] for case in SCENARIOS])
def test_one_round(case):
    cluster = cluster_of(case)
    scheduling = SchedulingRound(cluster)
    scheduling.run_round()
    assert scheduling.plans_refused == 0, "the verifier refused the round's plan"
    expect = case["expect"]
    admitted = {a.target: sorted({p["node"] for p in a.params["placements"]}) for a in cluster.applied
                if a.kind in (ActionKind.BIND, ActionKind.RESUME)}
    if "admitted" in expect:
        assert admitted == {key: [where] for key, where in expect["admitted"].items()}
    if "stopped" in expect:
        assert sorted(a.target for a in cluster.applied if a.kind in STOPS) == sorted(expect["stopped"])
    reasons = {row["workload"]: row["reason"] for row in scheduling.queue["workloads"]}
    for key, phrase in (expect.get("waiting") or {}).items():
        assert key in reasons and phrase in reasons[key], (key, reasons.get(key))


def test_the_table_has_each_kind_of_outcome():
    """The table checks admissions, stops and reasons, and a case with none of them would check nothing."""
    assert all(set(case["expect"]) & {"admitted", "stopped", "waiting"} for case in SCENARIOS)
    assert any(case["expect"].get("admitted") for case in SCENARIOS)
    assert any(case["expect"].get("stopped") for case in SCENARIOS)
    assert any(case["expect"].get("waiting") for case in SCENARIOS)
