"""One placement engine: scorers chosen by policy, FGD on whole / fractional / MIG requests through
``find_placement``, and the openb replay (and ``simulate placement``) driving the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.scheduling import Job, NodeState, PlacementOptions, SchedulingError, State, find_placement
from gpuwarden.scheduling.policy import policy_named
from gpuwarden.scheduling.scorers import Fgd
from gpuwarden.scheduling.state import Shape

H100 = "NVIDIA H100 80GB HBM3"


def _state(*nodes: NodeState) -> State:
    return State(nodes)


def _node(name: str, gpus: int, free: list[int] | None = None, cpu: int = 64000, **kw) -> NodeState:
    return NodeState(name=name, model=H100, gpu_count=gpus, cpu_free=cpu, mem_free=2**40,
                     gpu_free=list(free) if free else [], **kw)


def test_the_policy_names_the_scorer_and_each_scorer_places_its_own_way():
    """gpuwarden places by FGD with the CPU term and tie rule; fifo by first fit; the default by best
    fit. On one state the three choose three different nodes for the same pod."""
    shipped = policy_named("gpuwarden").placement
    assert (shipped.scorer, shipped.cpu_weight, shipped.ties) == ("fgd", 200.0, "tightest_cpu")
    assert policy_named("fifo").placement.scorer == "firstfit"

    def state() -> State:
        # "loose": 4 GPUs, 3 free; "tight": 2 GPUs, 1 free; "fresh": 2 GPUs, both free
        s = _state(_node("loose", 4, [1000, 1000, 1000, 0]), _node("tight", 2, [1000, 0]), _node("fresh", 2))
        s.expect({Shape(2, 1000, 0, 0): 1.0})  # 2-GPU pods are expected
        return s

    job = Job("p", "t")
    chosen = {}
    for name, options in (("firstfit", policy_named("fifo").placement), ("bestfit", PlacementOptions()),
                          ("gpuwarden", shipped)):
        s = state()
        placements, reason = find_placement(s, job, options)
        assert placements is not None, reason
        chosen[name] = placements[0][0]
        if name == "gpuwarden":
            assert any(isinstance(scorer, Fgd) for scorer in s.scorers.values())  # the engine ran the FGD scorer
    # first fit: node order; best fit: the node left with the least GPU share free; FGD: filling
    # "tight" removes a GPU no 2-GPU pod could use (fragmentation falls), "fresh" would lose its pair
    assert chosen == {"firstfit": "loose", "bestfit": "tight", "gpuwarden": "tight"}
    with pytest.raises(SchedulingError, match="placement scorer 'tightest' is not one of: fgd, bestfit, firstfit, random"):
        PlacementOptions(scorer="tightest")


def test_fgd_keeps_a_node_whole_for_the_expected_gang_shape_on_whole_gpu_requests():
    """Whole GPUs: best fit sees two nodes equally full after the pod and takes the first; FGD sees that
    the first loses its only 2-GPU hole (fragmentation grows) and takes the second."""
    def state() -> State:
        s = _state(_node("pair", 2), _node("quad", 4, [1000, 1000, 1000, 0]))
        s.expect({Shape(2, 1000, 0, 0): 1.0})
        return s

    job = Job("one", "t")
    assert find_placement(state(), job, PlacementOptions(scorer="bestfit"))[0] == [("pair", 0, 1000)]
    assert find_placement(state(), job, PlacementOptions(scorer="fgd"))[0] == [("quad", 0, 1000)]


def test_fgd_without_a_known_demand_scores_against_the_pods_own_shape():
    """A state that knows no jobs: the target is the pod's own shape (a 500-milli pod keeps a 500 hole)."""
    s = _state(_node("a", 1, [700]), _node("b", 1, [1000]))
    placements, _ = find_placement(s, Job("half", "t", milli=500), policy_named("gpuwarden").placement)
    assert placements == [("b", 0, 500)]  # 700 -> 200 strands 200; 1000 -> 500 leaves room for another half


def test_fgd_tie_rule_orders_mig_instances_on_equally_full_gpus():
    """MIG: the fullest GPU first (FGD's milli-GPU term does not move on MIG GPUs); among equally full
    ones the shipped tie rule takes the node left with the least CPU share free, best fit by name."""
    layout = {0: ("1g.10gb", "1g.10gb")}

    def state() -> State:
        nodes = [_node("roomy", 1, cpu=96000), _node("tight", 1, cpu=16000)]
        for n in nodes:
            n.mig_layout[0], n.gpu_free[0] = layout[0], 0
        return _state(*nodes)

    job = Job("mig", "t", mig_profile="1g.10gb", cpu_milli=8000)
    assert find_placement(state(), job, policy_named("gpuwarden").placement)[0] == [("tight", 0, "1g.10gb")]
    assert find_placement(state(), job, PlacementOptions())[0] == [("roomy", 0, "1g.10gb")]
    s = state()
    s.nodes["tight"].mig_used[0].append("1g.10gb")  # now "tight" is fuller: fullest first beats the CPU rule
    s.nodes["roomy"].cpu_free = 9000
    assert find_placement(s, job, policy_named("gpuwarden").placement)[0] == [("tight", 0, "1g.10gb")]


def test_a_cpu_only_pod_books_cpu_on_the_node_it_is_placed_on():
    s = _state(_node("a", 1, cpu=4000), _node("b", 1, cpu=32000))
    job = Job("cpu", "t", gpus_per_pod=0, cpu_milli=6000)
    placements, _ = find_placement(s, job, policy_named("gpuwarden").placement)
    assert placements == [("b", 0, 0)]
    s.occupy(job, placements)
    assert s.nodes["b"].cpu_free == 26000 and s.arrays.cpu_free[1] == 26000 and s.nodes["b"].gpu_free == [1000]
    assert find_placement(s, Job("big", "t", gpus_per_pod=0, cpu_milli=30000))[1] == "no node has the CPU and memory free"


# ---------------------------------------------------------------------------------------------- openb through the engine


def _tiny_data(tmp_path: Path, pods: str) -> Path:
    """A data folder with two 2-GPU nodes and the given pod list (openb's format)."""
    (tmp_path / "openb").mkdir()
    (tmp_path / "openb" / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,V100M16\nn1,32000,65536,2,V100M32\n")
    (tmp_path / "openb" / "openb_pod_list_tiny.csv").write_text(pods)
    (tmp_path / "fgd").mkdir()
    (tmp_path / "fgd" / "summary_alloc_ratio_at_130pct.csv").write_text("workload,sc_policy,mean,std\n")
    return tmp_path


HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def test_openb_replay_of_a_small_list_runs_through_the_engine(tmp_path):
    """Whole one-GPU pods on two 2-GPU nodes: the shipped policy fills all four GPUs, every later pod
    fails with the engine's own reason; a pod pinned to V100M32 (openb's gpu_spec) lands on n1 only."""
    from gpuwarden.scheduling.replay_openb import prepare, replay_seed

    data_dir = _tiny_data(tmp_path, HEADER + "p0,1000,1024,1,1000,\np1,2000,1024,1,1000,\n")
    data = prepare(data_dir, "tiny")
    result = replay_seed(data, "gpuwarden", 42, "tiny")
    assert result.allocated_milli == result.cluster_milli == 4000
    assert result.placed == 4 and result.failed == result.arrived - 4
    assert result.failure_reasons == {"capacity: needs 1 whole GPUs, 0 free on allowed nodes": result.failed}
    state = data.state()
    pinned = Job("pin", "t", gpu_models=("V100M32",))
    assert find_placement(state, pinned, policy_named("gpuwarden").placement)[0] == [("n1", 0, 1000)]


def test_simulate_placement_takes_a_pod_list_path_and_names_a_bad_line(tmp_path, capsys):
    from gpuwarden.cli import main

    data_dir = _tiny_data(tmp_path, HEADER + "p0,1000,1024,1,500,\n")
    own = tmp_path / "mine.csv"
    own.write_text(HEADER + "a,1000,1024,1,1000,\nb,2000,2048,1,250,\n")
    args = ["simulate", "placement", "--data-dir", str(data_dir), "--policies", "gpuwarden,bestfit", "--seeds", "2",
            "--workers", "1", "--format", "json"]
    assert main([*args, "--lists", f"tiny,{own}"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["pod_list"], r["policy"]) for r in rows} == {
        (name, policy) for name in ("tiny", str(own)) for policy in ("gpuwarden", "bestfit")}
    assert all(0 < r["alloc_pct"] <= 100 and r["seeds"] == 2 for r in rows)

    broken = tmp_path / "broken.csv"
    broken.write_text(HEADER + "a,1000,1024,1,1000,\nb,1000,lots,1,1000,\n")
    assert main([*args, "--lists", str(broken)]) == 2
    assert f"{broken}:3: column 'memory_mib': 'lots' is not a number" in capsys.readouterr().err
    broken.write_text(HEADER + "a,1000,1024,2,500,\n")
    assert main([*args, "--lists", str(broken)]) == 2
    assert f"{broken}:2: gpu_milli 500 with num_gpu 2" in capsys.readouterr().err
    broken.write_text(HEADER + "a,1000,1024,1,1000,A100\n")
    assert main([*args, "--lists", str(broken)]) == 2
    assert "gpu_spec names unknown GPU model(s) A100" in capsys.readouterr().err
    assert main([*args, "--lists", "nosuchlist"]) == 2
    err = capsys.readouterr().err
    assert "'nosuchlist' is neither an openb pod list" in err and "(tiny)" in err  # names the lists there
