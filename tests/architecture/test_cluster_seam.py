"""The ``Cluster`` seam says what it offers: each implementation keeps an explicit handler table,
complete over ``ActionKind`` (checked at import; a table missing a kind is refused), optional
capabilities are fleet protocols a caller checks with ``isinstance``, and the facts a round reads
are in the snapshot (no caller probes a cluster's attributes)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuwarden
from gpuwarden.fleet import Action, ActionKind
from gpuwarden.fleet.capabilities import (
    ConditionSink,
    EventSink,
    IncompleteHandlerTable,
    TeamNotices,
    WorkloadNotices,
    handler_table,
)
from gpuwarden.kube import cluster as kube_cluster
from gpuwarden.sim import cluster as sim_cluster

PACKAGE = Path(gpuwarden.__file__).parent


@pytest.mark.parametrize("table", [kube_cluster.HANDLERS, sim_cluster.HANDLERS], ids=["kube", "sim"])
def test_every_action_kind_has_a_handler_or_a_reason(table):
    assert set(table) == set(ActionKind)
    for kind, handler in table.items():
        assert callable(handler) or (isinstance(handler, str) and handler), kind


def test_a_table_missing_a_kind_is_refused_at_definition():
    partial = {kind: (lambda cluster, action: None) for kind in ActionKind if kind != ActionKind.NOTIFY}
    with pytest.raises(IncompleteHandlerTable, match="Broken: no handler .*notify"):
        handler_table("Broken", partial)


def test_the_simulated_cluster_refuses_what_it_never_does_with_the_reason(data_dir):
    from gpuwarden.cli.simfleet import simulated_fleet
    from gpuwarden.sim.config import SimConfig

    fleet = simulated_fleet(SimConfig(nodes=1, gpus_per_node=2, warmup_days=0.0, fault_rate_scale=0.0, data_dir=data_dir))
    node = fleet.cluster.snapshot().nodes[0].name
    result = fleet.cluster.apply(Action(ActionKind.SET_MIG_CONFIG, node, "test", {"config": "all-1g.18gb"}))
    assert not result.ok and sim_cluster.HANDLERS[ActionKind.SET_MIG_CONFIG] in result.message


def test_kubernetes_offers_every_capability_and_the_simulator_none():
    kube = kube_cluster.KubeCluster.__new__(kube_cluster.KubeCluster)
    sim = sim_cluster.SimCluster.__new__(sim_cluster.SimCluster)
    capabilities = (EventSink, ConditionSink, WorkloadNotices, TeamNotices)
    assert [isinstance(kube, c) for c in capabilities] == [True] * 4
    assert [isinstance(sim, c) for c in capabilities] == [False] * 4


def _cluster_probes(path: Path) -> list[str]:
    """``getattr``/``hasattr`` calls on a name or attribute called ``cluster`` (or ``self.cluster``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            if target.split(".")[-1] == "cluster" or "cluster," in ast.unparse(node):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_room_probes_a_cluster_for_attributes():
    probes = [p for path in sorted(PACKAGE.rglob("*.py")) for p in _cluster_probes(path)]
    assert probes == []
