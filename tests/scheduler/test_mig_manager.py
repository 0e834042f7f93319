"""The scheduler's opt-in MIG manager (issue 21): the named MIG configuration a drained node should
take for the MIG work that waits, set as the node's ``nvidia.com/mig.config`` label (what the GPU
operator's MIG manager applies), never on a node a GPU pod runs on. Kubernetes parts run the
official client over HTTP against ``tests/fake_kube_api.py`` (no kube-apiserver can run here)."""

from __future__ import annotations

import pytest
from fake_kube_api import CORE, FakeKubeAPI
from kube_fleet import connect, gpu_pod

from gpuwarden.scheduler.scheduling_round import SchedulingRound
from gpuwarden.fleet import Action, ActionKind
from gpuwarden.scheduling.mig_configs import MigNode, advise_change, named_configs

H100 = "NVIDIA-H100-80GB-HBM3"


def test_named_configs_follow_nvidias_default_mig_parted_names():
    configs = named_configs(H100)
    assert configs["all-1g.10gb"] == ("1g.10gb",) * 7
    assert configs["all-3g.40gb"] == ("3g.40gb",) * 2
    assert configs["all-7g.80gb"] == ("7g.80gb",)
    assert sorted(configs["all-balanced"]) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]  # the default config's
    assert configs["all-disabled"] == ()
    assert named_configs("Tesla-T4") == {}  # no MIG


def test_advice_serves_unmet_demand_on_a_drained_node_and_only_beyond_free_instances():
    busy = MigNode("m-busy", H100, 8, "all-3g.40gb", drained=False, free={})
    drained = MigNode("m-idle", H100, 8, "all-3g.40gb", drained=True, free={"3g.40gb": 16})
    change = advise_change([busy, drained], {"1g.10gb": 20})
    assert (change.node, change.current, change.wanted) == ("m-idle", "all-3g.40gb", "all-1g.10gb")
    assert change.served_slices == 20 and "20 1g.10gb" in change.reason
    # what free instances elsewhere already cover asks for no change; nor does a node already right
    spare = MigNode("m-spare", H100, 8, "all-1g.10gb", drained=True, free={"1g.10gb": 56})
    assert advise_change([busy, drained, spare], {"1g.10gb": 20}) is None
    assert advise_change([busy], {"1g.10gb": 20}) is None  # never a node in use
    assert advise_change([drained], {"3g.40gb": 4}) is None  # its own instances serve it


def mig_node(api: FakeKubeAPI, name: str, config: str, capacity: dict[str, str]) -> None:
    api.add(CORE, "nodes", {"metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "8", "nvidia.com/mig.config": config,
        "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config.state": "success"}},
        "spec": {}, "status": {"capacity": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "0", **capacity}}})


@pytest.fixture
def api():
    server = FakeKubeAPI().start()
    yield server
    server.stop()


def queue(api: FakeKubeAPI) -> None:
    api.add(CORE, "namespaces", {"metadata": {"name": "ml", "labels": {"gpuwarden.io/queue": "ml"},
                                              "annotations": {"gpuwarden.io/guaranteed-gpus": "16"}}})
    for i in range(10):
        gpu_pod(api, "ml", f"small-{i}", 1, resource="nvidia.com/mig-1g.10gb")


def test_the_round_sets_the_label_of_a_drained_node_once_and_waits_for_it_to_apply(api, tmp_path):
    mig_node(api, "m0", "all-3g.40gb", {"nvidia.com/mig-3g.40gb": "16"})
    queue(api)
    cluster = connect(api, tmp_path)
    assert not [r for r in SchedulingRound(cluster).run_round() if r.action.kind == ActionKind.SET_MIG_CONFIG]  # opt-in
    results = SchedulingRound(cluster, mig_manager=True).run_round()
    (change,) = [r for r in results if r.action.kind == ActionKind.SET_MIG_CONFIG]
    assert change.ok, change.message
    assert (change.action.target, change.action.params["config"]) == ("m0", "all-1g.10gb")
    (patch,) = api.calls("PATCH", "/nodes/m0$")
    assert patch.body["metadata"]["labels"] == {"nvidia.com/mig.config": "all-1g.10gb"}
    assert patch.body["metadata"]["resourceVersion"]  # written on the version read
    assert change.undo.params["config"] == "all-3g.40gb"
    # the MIG manager marks the change in progress: no further change is weighed meanwhile
    node = api.get(CORE, "nodes", "m0")
    node["metadata"]["labels"].update({"nvidia.com/mig.config": "all-3g.40gb", "nvidia.com/mig.config.state": "pending"})
    api.add(CORE, "nodes", node)
    assert not [r for r in SchedulingRound(cluster, mig_manager=True).run_round()
                if r.action.kind == ActionKind.SET_MIG_CONFIG]


def test_a_gpu_pod_bound_since_the_snapshot_stops_the_change(api, tmp_path):
    mig_node(api, "m0", "all-3g.40gb", {"nvidia.com/mig-3g.40gb": "16"})
    cluster = connect(api, tmp_path)
    cluster.snapshot()
    gpu_pod(api, "ml", "late", 1, resource="nvidia.com/mig-3g.40gb", gates=(), node_name="m0", phase="Running")
    result = cluster.apply(Action(ActionKind.SET_MIG_CONFIG, "m0", "test", {"config": "all-1g.10gb"}))
    assert not result.ok and result.temporary and "ml/late" in result.message
    assert not api.calls("PATCH", "/nodes/m0$")
    assert api.get(CORE, "nodes", "m0")["metadata"]["labels"]["nvidia.com/mig.config"] == "all-3g.40gb"
