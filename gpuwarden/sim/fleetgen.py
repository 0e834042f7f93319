"""Builds the simulated fleet: nodes in pools, GPUs (some in MIG mode), topology and teams.

The default 64 x 8 fleet is mixed the way a real one is: reserved and spot H100s and owned
on-prem H200s for training, on-demand A100s (a third of them in MIG mode) and L40Ss for inference.
Other sizes keep the proportions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwarden.fleet import Gpu, Location, MigInstance, Node, PriceTier, Team, Topology

from .catalog import GIB, MIG_LAYOUTS

# (pool, model, location, tier, share of nodes, MIG share of the pool's nodes)
POOLS = (
    ("train-h100", "NVIDIA H100 80GB HBM3", Location.CLOUD, PriceTier.RESERVED, 16 / 64, 0.0),
    ("train-h100-spot", "NVIDIA H100 80GB HBM3", Location.CLOUD, PriceTier.SPOT, 8 / 64, 0.0),
    ("train-h200", "NVIDIA H200", Location.ON_PREM, PriceTier.OWNED, 16 / 64, 0.0),
    ("infer-a100", "NVIDIA A100-SXM4-80GB", Location.CLOUD, PriceTier.ON_DEMAND, 12 / 64, 1 / 3),
    ("infer-l40s", "NVIDIA L40S", Location.CLOUD, PriceTier.ON_DEMAND, 12 / 64, 0.0),
)
TRAINING_POOLS = ("train-h100", "train-h100-spot", "train-h200")
INFERENCE_POOLS = ("infer-a100", "infer-l40s")

TEAM_NAMES = ("llm-pretrain", "vision", "speech", "recsys", "applied-ml", "research")


def _split(total: int, shares: list[float]) -> list[int]:
    """Largest-remainder split of ``total`` nodes by ``shares``, each pool at least one when possible."""
    raw = np.array(shares) * total
    counts = np.floor(raw).astype(int)
    for index in np.argsort(-(raw - counts))[: total - counts.sum()]:
        counts[index] += 1
    if total >= len(shares):
        for index in range(len(counts)):
            while counts[index] == 0:
                donor = int(np.argmax(counts))
                counts[donor] -= 1
                counts[index] += 1
    return counts.tolist()


def gpu_uuid(cluster: str, node: str, index: int) -> str:
    digest = hashlib.sha1(f"{cluster}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


@dataclass(frozen=True)
class SimFleet:
    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]
    teams: tuple[Team, ...]
    team_of_virtual_cluster: dict[str, str]


PoolSpec = tuple[str, str, Location, PriceTier, float, float]


def build_fleet(cluster: str, node_count: int, gpus_per_node: int, philly_vcs: pd.DataFrame | None,
                pools: tuple[PoolSpec, ...] = POOLS, leaf_nodes: int = 8) -> SimFleet:
    """Nodes split over ``pools`` by share (the demo's mix by default), ``leaf_nodes`` nodes per leaf
    switch; teams from Philly's virtual clusters (none without ``philly_vcs``)."""
    counts = _split(node_count, [pool[4] for pool in pools])
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    for (pool, model_name, location, tier, _share, mig_share), count in zip(pools, counts):
        mig_nodes = int(round(count * mig_share))
        for ordinal in range(count):
            position = len(nodes)
            name = f"{pool}-{ordinal:03d}"
            topology = Topology(nvlink_domain=name, leaf_switch=f"leaf-{pool}-{ordinal // leaf_nodes}", rack=f"rack-{position // 4:02d}")
            nodes.append(
                Node(name, pool, location, tier, topology, model_name, gpus_per_node, cpu_milli=192_000,
                     memory_bytes=2048 * GIB, shares_gpus=False)  # a simulated GPU holds one pod
            )
            mig = ordinal < mig_nodes and model_name in MIG_LAYOUTS
            for index in range(gpus_per_node):
                instances = tuple(MigInstance(i + 1, p) for i, p in enumerate(MIG_LAYOUTS[model_name])) if mig else ()
                gpus.append(Gpu(gpu_uuid(cluster, name, index), index, name, model_name, mig, instances))
    if philly_vcs is None:
        return SimFleet(tuple(nodes), tuple(gpus), (), {})
    return SimFleet(tuple(nodes), tuple(gpus), *_teams(philly_vcs, len(gpus)))


def _teams(philly_vcs: pd.DataFrame, fleet_gpus: int) -> tuple[tuple[Team, ...], dict[str, str]]:
    """Teams are Philly's virtual clusters: the five largest by nodes get their own team, the
    rest share ``research``. Guarantees are proportional to the VCs' nodes, 80% of the fleet in all."""
    ordered = philly_vcs.sort_values(["nodes", "virtual_cluster"], ascending=[False, True])
    mapping: dict[str, str] = {}
    nodes_per_team: dict[str, int] = dict.fromkeys(TEAM_NAMES, 0)
    for rank, row in enumerate(ordered.itertuples(index=False)):
        team = TEAM_NAMES[rank] if rank < len(TEAM_NAMES) - 1 else TEAM_NAMES[-1]
        mapping[row.virtual_cluster] = team
        nodes_per_team[team] += int(row.nodes)
    total = sum(nodes_per_team.values()) or 1
    teams = []
    for name in TEAM_NAMES:
        share = nodes_per_team[name] / total
        guaranteed = round(0.8 * fleet_gpus * share)
        teams.append(Team(name, guaranteed, min(fleet_gpus, max(guaranteed * 2, 8)), weight=round(share * 10, 2) or 1.0))
    return tuple(teams), mapping
