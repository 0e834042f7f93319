"""The openb allocation bound is a bound: on tiny instances built as ``replay_openb.prepare`` builds them,
it is at least what every online placement in arrival order reaches (all of them enumerated), at least
what the shipped replays place, at most the cluster and the arrived demand, and the exact optimum where
that is known by hand."""

from __future__ import annotations

from functools import cache

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.scheduling.openb_bound import allocation_bound, bound_for_seed
from gpuwarden.scheduling.replay_openb import OpenbInput, replay_seed
from gpuwarden.scheduling.state import MILLI, Shape

MIB = 2**20
GIB_MIB = 1024
NodeSpec = tuple[str, int, int, int]  # model, GPUs, CPU milli, memory MiB


def instance(nodes: list[NodeSpec], shapes: list[Shape], pod_shape: list[int]) -> OpenbInput:
    """An ``OpenbInput`` as ``prepare`` makes one: the node frame, distinct shapes, each pod's shape id."""
    frame = pd.DataFrame({"sn": [f"n{i}" for i in range(len(nodes))], "cpu_milli": [n[2] for n in nodes],
                          "memory_mib": [n[3] for n in nodes], "gpu": [n[1] for n in nodes],
                          "model": [n[0] for n in nodes]})
    codes = np.array(pod_shape, dtype=np.int64)
    return OpenbInput(frame, tuple(shapes), codes, np.bincount(codes, minlength=len(shapes)).astype(float))


def best_online(data: OpenbInput, arrived: list[int]) -> int:
    """The most milli-GPU any online policy allocates: every pod that fits some node is placed (each
    choice of node and GPU tried), a pod that fits none is rejected; nothing leaves."""
    rows = list(data.nodes.itertuples())

    @cache
    def go(k: int, state: tuple[tuple[int, int, tuple[int, ...]], ...]) -> int:
        if k == len(arrived):
            return 0
        shape = data.shapes[arrived[k]]
        options: list[tuple[tuple[int, int, tuple[int, ...]], ...]] = []
        for n, (cpu, mem, gpus) in enumerate(state):
            if cpu < shape.cpu_milli or mem < shape.mem_bytes or (shape.models and rows[n].model not in shape.models):
                continue
            frees: list[tuple[int, ...]] = []
            if shape.gpus == 0:
                frees = [gpus]
            elif shape.milli == MILLI and sum(g == MILLI for g in gpus) >= shape.gpus:
                whole = [i for i, g in enumerate(gpus) if g == MILLI][:shape.gpus]
                frees = [tuple(sorted(0 if i in whole else g for i, g in enumerate(gpus)))]
            elif shape.milli < MILLI:
                frees = [tuple(sorted(gpus[:i] + (g - shape.milli,) + gpus[i + 1:]))
                         for i, g in enumerate(gpus) if g >= shape.milli and g not in gpus[:i]]
            for free in frees:
                options.append(state[:n] + ((cpu - shape.cpu_milli, mem - shape.mem_bytes, free),) + state[n + 1:])
        if not options:
            return go(k + 1, state)
        return shape.gpus * shape.milli + max(go(k + 1, option) for option in options)

    start = tuple((int(r.cpu_milli), int(r.memory_mib) * MIB, (MILLI,) * int(r.gpu)) for r in rows)
    return go(0, start)


def bound_milli(data: OpenbInput, arrived: list[int]) -> float:
    return allocation_bound(data, np.array(arrived, dtype=np.int64)).bound_milli


def test_fractions_that_cannot_share_a_gpu_are_bounded_per_gpu() -> None:
    """Five 400-milli pods on two GPUs: two per GPU at most (1,600), though their sum (2,000) fits the node."""
    data = instance([("A", 2, 32_000, 64 * GIB_MIB)], [Shape(1, 400, 1000, GIB_MIB * MIB)], [0] * 5)
    assert best_online(data, [0] * 5) == 1600
    assert abs(bound_milli(data, [0] * 5) - 1600) < 1


def test_fractions_over_half_a_gpu_each_hold_one() -> None:
    data = instance([("A", 2, 32_000, 64 * GIB_MIB)], [Shape(1, 600, 1000, GIB_MIB * MIB)], [0] * 3)
    assert abs(bound_milli(data, [0] * 3) - 1200) < 1


def test_cpu_and_models_limit_what_fits() -> None:
    """Two 1-GPU pods of 5 cores on an 8-core, 2-GPU node: one fits; a pod for model B nowhere (only A)."""
    shapes = [Shape(1, MILLI, 5000, GIB_MIB * MIB), Shape(1, MILLI, 1000, GIB_MIB * MIB, ("B",))]
    data = instance([("A", 2, 8000, 64 * GIB_MIB), ("B", 1, 500, 64 * GIB_MIB)], shapes, [0, 0, 1])
    assert best_online(data, [0, 0, 1]) == 1000
    assert abs(bound_milli(data, [0, 0, 1]) - 1000) < 1


def test_fills_the_cluster_when_the_pods_tile_it() -> None:
    """Whole pods and fractions that pair to 1,000: the bound is the cluster (3 GPUs)."""
    shapes = [Shape(2, MILLI, 1000, GIB_MIB * MIB), Shape(1, 300, 1000, GIB_MIB * MIB), Shape(1, 700, 1000, GIB_MIB * MIB)]
    data = instance([("A", 2, 16_000, 64 * GIB_MIB), ("A", 1, 16_000, 64 * GIB_MIB)], shapes, [0, 1, 2, 1, 2])
    assert abs(bound_milli(data, [0, 1, 2, 1, 2]) - 3000) < 1
    assert best_online(data, [0, 1, 2, 1, 2]) == 3000


MODELS = ("A", "B")
node_specs = st.tuples(st.sampled_from(MODELS), st.sampled_from((1, 2, 4)), st.sampled_from((4000, 8000, 16_000)),
                       st.sampled_from((8 * GIB_MIB, 16 * GIB_MIB, 32 * GIB_MIB)))
shapes_drawn = st.builds(
    lambda gpus, milli, cpu, mem, models: Shape(gpus, milli if gpus == 1 else MILLI, cpu, mem * GIB_MIB * MIB, models),
    st.sampled_from((0, 1, 1, 1, 2)), st.sampled_from((100, 250, 300, 400, 500, 600, 700, 1000)),
    st.sampled_from((500, 1000, 2000, 4000, 6000)), st.sampled_from((1, 2, 4, 8)),
    st.sampled_from(((), (), ("A",), ("B",))))


@st.composite
def tiny(draw: st.DrawFn, pods: int) -> tuple[OpenbInput, list[int]]:
    nodes = draw(st.lists(node_specs, min_size=1, max_size=3))
    shapes = draw(st.lists(shapes_drawn, min_size=1, max_size=4, unique=True))
    arrived = draw(st.lists(st.integers(0, len(shapes) - 1), min_size=1, max_size=pods))
    return instance(nodes, shapes, arrived), arrived


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny(pods=6))
def test_bound_is_at_least_every_online_placement(case: tuple[OpenbInput, list[int]]) -> None:
    data, arrived = case
    bound = bound_milli(data, arrived)
    cluster = int(data.nodes["gpu"].sum()) * MILLI
    demand = sum(data.shapes[s].gpus * data.shapes[s].milli for s in arrived)
    assert best_online(data, arrived) <= bound + 1e-6
    assert bound <= min(cluster, demand) + 1e-6


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tiny(pods=5), st.integers(1, 1000))
def test_bound_is_at_least_what_the_replays_place(case: tuple[OpenbInput, list[int]], seed: int) -> None:
    """FGD's protocol on the drawn pod list (shuffled, then drawn to 130% of the cluster), as the replays run it."""
    data = case[0]
    bound = bound_for_seed(data, seed)
    for policy in ("gpuwarden", "fgd", "bestfit"):
        assert replay_seed(data, policy, seed).allocated_milli <= bound.bound_milli + 1e-6
    assert bound.bound_milli <= bound.cluster_milli + 1e-6
