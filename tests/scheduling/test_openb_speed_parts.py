"""The parts that make the openb replay fast compute what the plain definitions compute: F summed by
groups of needs equals the per-shape sum written from its definition, the kept-buffer fit equals a
node-by-node check, a replayed state is freed by reference counting alone (so a pool worker may freeze
what outlives a seed), and a shape keeps its hash and equality through pickling."""

from __future__ import annotations

import gc
import pickle
import weakref

import numpy as np

from gpuwarden.scheduling import NodeState, State
from gpuwarden.scheduling.packing import TargetWorkload
from gpuwarden.scheduling.replay_openb import place_all, prepare
from gpuwarden.scheduling.state import MILLI, Shape

MODELS = ("A100", "T4", "V100")


def _random_target(rng: np.random.Generator) -> tuple[dict[Shape, float], TargetWorkload]:
    shapes: dict[Shape, float] = {}
    for _ in range(int(rng.integers(5, 80))):
        gpus = int(rng.choice([0, 1, 1, 1, 2, 4, 8]))
        milli = int(rng.choice([50, 100, 250, 333, 500, 700, 1000])) if gpus == 1 else MILLI
        models = [(), ("A100",), ("V100", "T4")][int(rng.integers(0, 3))]
        shape = Shape(gpus, milli, int(rng.integers(0, 64)) * 500, int(rng.integers(0, 256)) << 28, models)
        shapes[shape] = float(rng.integers(1, 300))
    return shapes, TargetWorkload.from_demand(shapes, MODELS)


def _fragmentation_by_definition(shapes: dict[Shape, float], model: str, cpu: int, mem: int, free: list[int]) -> float:
    """F = sum_m p_m (S - host(m) U(m)) / sum_m p_m, shape by shape (module docstring of packing)."""
    total, weighted, mass = sum(free), 0.0, sum(shapes.values())
    for shape, popularity in shapes.items():
        fits_model = not shape.models or model in shape.models
        host = fits_model and cpu >= shape.cpu_milli and mem >= shape.mem_bytes
        usable_gpus = [f for f in free if f >= shape.milli]
        usable = sum(usable_gpus) if shape.gpus and len(usable_gpus) >= shape.gpus else 0
        weighted += popularity * (total - (usable if host else 0))
    return weighted / mass


def test_fragmentation_by_groups_of_needs_is_the_per_shape_sum():
    rng = np.random.default_rng(11)
    for _ in range(25):
        shapes, target = _random_target(rng)
        for _ in range(120):
            free = [int(x) for x in rng.choice([0, 50, 100, 250, 300, 500, 667, 750, 900, 1000],
                                                size=int(rng.choice([1, 2, 4, 8])))]
            model = int(rng.integers(0, 3))
            cpu, mem = int(rng.integers(0, 40000)), int(rng.integers(0, 2**37))
            got = target.node_fragmentation(model, cpu, mem, free)
            assert np.isclose(got, _fragmentation_by_definition(shapes, MODELS[model], cpu, mem, free), rtol=0, atol=1e-6)


def test_the_kept_buffer_fit_is_the_node_by_node_check():
    rng = np.random.default_rng(5)
    nodes = []
    for i in range(60):
        gpus = int(rng.choice([1, 2, 4, 8]))
        node = NodeState(name=f"n{i}", model="A100", gpu_count=gpus, cpu_free=int(rng.integers(0, 64)) * 1000,
                         mem_free=int(rng.integers(0, 512)) << 30)
        node.gpu_free = [int(x) for x in rng.choice([0, 250, 500, 1000], size=gpus)]
        nodes.append(node)
    arrays = State(nodes).arrays
    allowed = rng.random(len(nodes)) < 0.7
    for k, milli in ((0, MILLI), (1, 250), (1, 1000), (2, 1000), (3, 500), (8, 1000)):
        for cpu, mem in ((0, 0), (16000, 64 << 30), (48000, 300 << 30)):
            for mask in (None, allowed):
                expected = [i for i, n in enumerate(nodes) if n.cpu_free >= cpu and n.mem_free >= mem
                            and (mask is None or mask[i]) and sum(f >= milli for f in n.gpu_free) >= k]
                assert arrays.fitting(k, milli, cpu, mem, mask).tolist() == expected


def test_a_replayed_state_is_freed_without_the_cycle_collector(data_dir):
    """The scorer holds a proxy of its state (the state keeps its scorers): no reference cycle, so what
    ``gc.freeze`` keeps in a pool worker after a seed is never garbage."""
    data = prepare(data_dir, "multigpu50")
    gc.collect()
    gc.disable()
    try:
        played = place_all(data, "gpuwarden", 42)
        state = weakref.ref(played.state)
        del played
        assert state() is None
    finally:
        gc.enable()


def test_a_shape_keeps_its_hash_and_equality_through_pickling():
    shape = Shape(1, 500, 4000, 8 << 30, ("A100", "V100"))
    copy = pickle.loads(pickle.dumps(shape))
    assert copy == shape and hash(copy) == hash(shape) and {shape: 1}[copy] == 1
    assert Shape(1, 500, 4000, 8 << 30) != shape
