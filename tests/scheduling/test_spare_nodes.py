"""Nodes a job should spare (``Job.spare_nodes``, from ``Workload.spare_nodes``: on Kubernetes, the nodes
that serve GPUs only through DRA, spared by pods that may go anywhere) are used only where no other
node fits it, for every scorer; the hard rules (``avoid_nodes``) still hold."""

from __future__ import annotations

import pytest

from gpuwarden.scheduling import Job, NodeState, State, find_placement
from gpuwarden.scheduling.placement import PlacementOptions
from gpuwarden.scheduling.scorers import SCORERS

H100 = "NVIDIA H100 80GB HBM3"


def _state() -> State:
    return State(NodeState(name, H100, 8, cpu_free=190_000, mem_free=2**41) for name in ("dra-0", "dp-0"))


@pytest.mark.parametrize("scorer", sorted(SCORERS))
@pytest.mark.parametrize("pods, gpus", [(1, 8), (1, 2), (2, 4)])
def test_a_job_goes_elsewhere_while_it_fits_elsewhere(scorer, pods, gpus):
    job = Job("flexible", "t", gpus_per_pod=gpus, pods=pods, spare_nodes=frozenset({"dra-0"}))
    placements, reason = find_placement(_state(), job, PlacementOptions(scorer=scorer))
    assert placements is not None, reason
    assert {node for node, _, _ in placements} == {"dp-0"}
    assert job.avoid_nodes == frozenset()  # the preference leaves the job as it was


def test_it_takes_a_spared_node_when_nothing_else_fits():
    state = _state()
    state.add_running(Job("there", "t", gpus_per_pod=8), [("dp-0", g, 1000) for g in range(8)])
    placements, _ = find_placement(state, Job("flexible", "t", gpus_per_pod=8, spare_nodes=frozenset({"dra-0"})))
    assert placements is not None and {node for node, _, _ in placements} == {"dra-0"}


def test_a_node_it_must_avoid_stays_avoided():
    job = Job("flexible", "t", gpus_per_pod=8, spare_nodes=frozenset({"dra-0"}), avoid_nodes=frozenset({"dp-0"}))
    placements, _ = find_placement(_state(), job)
    assert placements is not None and {node for node, _, _ in placements} == {"dra-0"}
    job = Job("never", "t", gpus_per_pod=8, spare_nodes=frozenset({"dra-0"}), avoid_nodes=frozenset({"dp-0", "dra-0"}))
    assert find_placement(_state(), job)[0] is None
