"""How far an openb replay can be from the best possible: an upper bound on the GPU allocation ratio for
the pods that arrive with a seed under FGD's protocol (``replay_openb``; issue 32 item 5).

**The relaxation.** The configuration LP of offline placement (Gilmore-Gomory), with GPU slots. A
*configuration* of a node type (GPU model, GPUs, CPU, memory) is a multiset of the arrived pod shapes
within the type's CPU, memory and GPUs x 1000 milli-GPU, each pod on a model its ``gpu_spec`` allows,
whole-GPU pods and fractions over 500 milli holding a GPU each. A *slot pattern* of a model is a
multiset of fractions (milli-GPU values) summing to at most 1000: what one GPU holds. The LP chooses
how many nodes of each type take each configuration and how many GPUs of each model take each pattern
(real numbers): at most the type's nodes, at most the arrived pods of each shape, the fractions a model's
configurations hold no more than its patterns' slots, and no more patterns than the GPUs of the model
that whole-GPU pods leave. It maximises the milli-GPU placed.

**Why it bounds every policy.** Whatever a policy does (online, in arrival order, or even knowing the
whole sequence), its final placement gives each node a multiset of whole pods that fits the node: a
configuration of its type; and each GPU of a model the fractions it holds: a pattern. Counting nodes per
configuration and GPUs per pattern is a feasible point of the LP (every row holds with the real
counts), so the allocation is at most the LP's optimum. The LP's optimum is reached by column
generation, and what is reported is the Lagrangian bound at the best iteration, valid whether or not the
generation has converged: for shape, slot and GPU duals ``p >= 0``, every feasible point has
``value <= p . arrived + sum_types nodes x max(0, best configuration's reduced value) + sum_models GPUs x
max(0, best pattern's reduced value)``, each best taken from the pricing MILP's dual bound (an
over-estimate).

**Where it bites, and why it stays loose.** The slot patterns are what make it more than the cluster:
fractions that cannot tile a GPU (gpushare lists: many 810-milli pods, few that fill the 190 they leave) bound
the allocation well below 100%, where the node-level LP (fractions pooled over a node's GPUs) was at
99.998-100% on every list tried (default, cpu250, multigpu40, gpushare100). The protocol's online rules add
nothing to an offline bound whose optimum fills the GPUs: a policy may not refuse a pod that fits somewhere,
and free room never grows, so a rejected pod fits no node at the end; but when every GPU is full every GPU pod
is blocked anyway, and the LP's optimum also places every CPU-only pod (tried: gpushare100, seed 42). Forcing
the first pods every policy must accept was tried too: forcing the whole prefix gpuwarden places before its
first rejection (87% of the cluster's GPUs, more than any policy is forced to accept) left the node-level LP
at 99.998%. And a policy tuned to the seed's known sequence is one of "every policy", so no bound for one
sequence can be below what the best clairvoyant placement reaches, which nothing here shows to be near what
FGD reaches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from .replay_openb import OpenbInput, arrival_sequence
from .state import MILLI

MIB = 2**20
Vector = npt.NDArray[np.float64]
SLACK_MILLI = 250.0  # what a node type's pricing MILP may leave unproven, over all its nodes (a few 0.001 pt)
SMOOTHING = 0.7  # Wentges: price at this mix of the best bound's duals and the master's (fewer iterations)
PRICING_SECONDS = 30.0  # one pricing MILP's limit: its dual bound stays an over-estimate when it stops early


@dataclass(frozen=True)
class NodeType:
    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    nodes: int


@dataclass(frozen=True)
class AllocationBound:
    pod_list: str
    seed: int
    arrived_milli: int
    cluster_milli: int
    bound_milli: float  # the Lagrangian bound: valid at any iteration
    lp_milli: float  # the restricted LP's value: the generation's gap is bound - lp
    iterations: int
    seconds: float

    @property
    def bound_ratio(self) -> float:
        return self.bound_milli / self.cluster_milli


def node_types(data: OpenbInput) -> list[NodeType]:
    grouped = data.nodes.groupby(["model", "gpu", "cpu_milli", "memory_mib"], sort=True).size()
    return [NodeType(str(m), int(g), int(c), int(r), int(n)) for (m, g, c, r), n in grouped.items()]


def _knapsack(gain: Vector, rows: Vector, limits: Vector, upper: Vector, gap: float) -> tuple[float, Vector]:
    """max gain . n over integers 0 <= n <= upper with rows @ n <= limits: (an upper bound on the optimum,
    the best n found, within ``gap`` of it). Only items of positive gain are offered to the MILP."""
    take = np.flatnonzero(gain > 1e-9)
    best = np.zeros(len(gain))
    if len(take) == 0:
        return 0.0, best
    result = milp(-gain[take], integrality=np.ones(len(take)), bounds=Bounds(0, upper[take]),
                  constraints=LinearConstraint(rows[:, take], -np.inf, limits),
                  options={"mip_rel_gap": gap, "time_limit": PRICING_SECONDS})
    if result.x is None or not np.isfinite(result.mip_dual_bound):
        raise RuntimeError(f"openb bound: a pricing MILP did not solve ({result.message})")
    best[take] = np.round(result.x)
    return max(0.0, -float(result.mip_dual_bound)), best


def _one_gpu(milli: list[int], gain: Vector, upper: Vector) -> tuple[float, Vector]:
    """The best pattern of one GPU, exactly: a bounded knapsack of capacity 1000 by dynamic programming,
    each copy of a fraction an item (at most 1000 / milli copies of each)."""
    items = [i for i, g in enumerate(gain) if g > 1e-9 for _ in range(int(upper[i]))]
    best = np.zeros(MILLI + 1)
    taken = np.zeros((len(items), MILLI + 1), dtype=bool)
    for k, i in enumerate(items):
        m = milli[i]
        with_item = np.full(MILLI + 1, -np.inf)
        with_item[m:] = best[:MILLI + 1 - m] + gain[i]
        taken[k] = with_item > best + 1e-12
        best = np.maximum(best, with_item)
    slots = np.zeros(len(milli))
    room = MILLI
    for k in range(len(items) - 1, -1, -1):  # walk back from a full capacity: best is monotone in it
        if taken[k, room]:
            slots[items[k]] += 1
            room -= milli[items[k]]
    return float(best[MILLI]), slots


class _Problem:
    """The rows of the LP, and how a configuration or a pattern becomes a column:
    node types | shapes | (fraction, model) slots | model's free GPUs | model's patterns."""

    def __init__(self, data: OpenbInput, counts: Vector) -> None:
        self.types = node_types(data)
        self.models = sorted({t.model for t in self.types})
        self.counts = counts
        shapes = data.shapes
        self.value = np.array([s.gpus * s.milli for s in shapes], dtype=float)
        self.milli = [s.milli for s in shapes]
        self.whole_gpus = np.array([s.gpus if s.milli == MILLI else 0 for s in shapes], dtype=float)
        self.fraction = np.array([s.gpus == 1 and s.milli < MILLI for s in shapes])
        self.fractions = sorted({s.milli for s, c in zip(shapes, counts) if c > 0 and s.gpus == 1 and s.milli < MILLI})
        slots = [(m, model) for model in self.models for m in self.fractions]
        self.slot = {key: i for i, key in enumerate(slots)}
        self.allowed = np.array([[not s.models or model in s.models for model in self.models] for s in shapes],
                                dtype=bool).reshape(len(shapes), len(self.models))
        alone = [s.gpus if s.milli == MILLI else (1 if s.gpus and s.milli > MILLI // 2 else 0) for s in shapes]
        self.node_rows = np.array([[s.cpu_milli for s in shapes], [s.mem_bytes / MIB for s in shapes],
                                   list(self.value), alone], dtype=float).reshape(4, len(shapes))
        t_, s_, k_ = len(self.types), len(shapes), len(slots)
        self.offsets = (0, t_, t_ + s_, t_ + s_ + k_, t_ + s_ + k_ + len(self.models))
        self.gpus_of_model = np.array([sum(t.nodes * t.gpus for t in self.types if t.model == m) for m in self.models],
                                      dtype=float)
        self.rhs = np.concatenate([[t.nodes for t in self.types], counts, np.zeros(k_ + len(self.models)),
                                   self.gpus_of_model])
        # a pattern's slots of each fraction: at most the arrived pods allowed on the model, at most 1000 / milli
        self.slot_upper = np.array([[min(MILLI // m, sum(c for s, c in enumerate(counts) if self.fraction[s]
                                                         and shapes[s].milli == m and self.allowed[s, j]))
                                     for m in self.fractions] for j in range(len(self.models))], dtype=float)
        self.fits = [np.array([c > 0 and s.gpus <= t.gpus and s.cpu_milli <= t.cpu_milli
                               and s.mem_bytes <= t.memory_mib * MIB and bool(self.allowed[i, self.models.index(t.model)])
                               for i, (s, c) in enumerate(zip(shapes, counts))]) for t in self.types]

    def configuration(self, t: int, pods: Vector) -> tuple[float, Vector]:
        kind = self.types[t]
        model = self.models.index(kind.model)
        column = np.zeros(len(self.rhs))
        column[t] = 1.0
        column[self.offsets[1]:self.offsets[2]] = pods
        for s in np.flatnonzero(pods * self.fraction):
            column[self.offsets[2] + self.slot[(self.milli[s], kind.model)]] += pods[s]
        column[self.offsets[3] + model] = -(kind.gpus - float(pods @ self.whole_gpus))
        return float(pods @ self.value), column

    def pattern(self, model: int, slots: Vector) -> tuple[float, Vector]:
        column = np.zeros(len(self.rhs))
        for m, n in zip(self.fractions, slots):
            column[self.offsets[2] + self.slot[(m, self.models[model])]] = -n
        column[self.offsets[3] + model] = 1.0
        column[self.offsets[4] + model] = 1.0
        return 0.0, column

    def price_configuration(self, t: int, duals: Vector) -> tuple[float, float, Vector]:
        """(an upper bound on the best configuration's reduced value, the value of the one found, its pods),
        both without the node dual."""
        kind = self.types[t]
        model = self.models.index(kind.model)
        shape_duals = duals[self.offsets[1]:self.offsets[2]]
        gpu_dual = duals[self.offsets[3] + model]
        slot_duals = np.array([duals[self.offsets[2] + self.slot[(self.milli[s], kind.model)]]
                               if self.fraction[s] and self.fits[t][s] else 0.0 for s in range(len(shape_duals))])
        gain = np.where(self.fits[t], self.value - shape_duals - slot_duals - gpu_dual * self.whole_gpus, 0.0)
        limits = np.array([kind.cpu_milli, kind.memory_mib, kind.gpus * MILLI, kind.gpus], dtype=float)
        gap = min(0.05, max(1e-4, SLACK_MILLI / (kind.nodes * kind.gpus * MILLI)))
        best, pods = _knapsack(gain, self.node_rows, limits, self.counts, gap)
        free = gpu_dual * kind.gpus  # the GPUs a configuration leaves free earn their dual
        return free + best, free + float(gain @ pods), pods

    def price_pattern(self, model: int, duals: Vector) -> tuple[float, Vector]:
        gain = np.array([duals[self.offsets[2] + self.slot[(m, self.models[model])]] for m in self.fractions])
        best, slots = _one_gpu(self.fractions, gain, self.slot_upper[model])
        return best - duals[self.offsets[3] + model], slots


def _unit(size: int, index: int) -> Vector:
    unit = np.zeros(size)
    unit[index] = 1.0
    return unit


def _price(problem: _Problem, duals: Vector) -> tuple[float, list[tuple[float, Vector]]]:
    """The Lagrangian bound at ``duals`` (see the module docstring) and the best column of each node type
    and model found there."""
    bound = float(duals[problem.offsets[1]:problem.offsets[2]] @ problem.counts)
    found: list[tuple[float, Vector]] = []
    for t, kind in enumerate(problem.types):
        best, _, pods = problem.price_configuration(t, duals)
        bound += kind.nodes * max(0.0, best)
        if pods.any():
            found.append(problem.configuration(t, pods))
    for model in range(len(problem.models)):
        best, slots = problem.price_pattern(model, duals)
        bound += problem.gpus_of_model[model] * max(0.0, best)
        if slots.any():
            found.append(problem.pattern(model, slots))
    return bound, found


def _solve_master(values: list[float], columns: list[Vector], rhs: Vector) -> tuple[float, Vector]:
    result = linprog(-np.array(values), A_ub=np.stack(columns, axis=1), b_ub=rhs, bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"openb bound: the master LP did not solve ({result.message})")
    return -float(result.fun), -np.asarray(result.ineqlin.marginals, dtype=float)  # duals of a max: >= 0


def allocation_bound(data: OpenbInput, arrived: npt.NDArray[np.int64], pod_list: str = "?", seed: int = -1,
                     tolerance_pts: float = 0.01, max_iterations: int = 300) -> AllocationBound:
    """The bound for the pods whose shape ids are ``arrived`` (see the module docstring). Column generation
    stops when the bound is within ``tolerance_pts`` (percentage points of the cluster) of the LP's value."""
    started = time.perf_counter()
    counts = np.bincount(arrived, minlength=len(data.shapes)).astype(float)
    problem = _Problem(data, counts)
    cluster_milli = int(problem.gpus_of_model.sum()) * MILLI
    arrived_milli = int(counts @ problem.value)
    values: list[float] = []
    columns: list[Vector] = []
    for t, fits in enumerate(problem.fits):  # start from one pod of each shape on each type, one slot per pattern
        for s in np.flatnonzero(fits):
            value, column = problem.configuration(t, _unit(len(counts), int(s)))
            values.append(value)
            columns.append(column)
    for model in range(len(problem.models)):
        for i in range(len(problem.fractions)):
            values.append(0.0)
            columns.append(problem.pattern(model, _unit(len(problem.fractions), i))[1])
    biggest_first = arrived[np.argsort(-problem.value[arrived], kind="stable")]
    for t, pods, model, slots in _first_fit(data, arrived, problem) + _first_fit(data, biggest_first, problem):
        if t >= 0:
            value, column = problem.configuration(t, pods)
        else:
            value, column = problem.pattern(model, slots)
        values.append(value)
        columns.append(column)
    bound, lp, iterations = float(min(cluster_milli, arrived_milli)), 0.0, 0
    center, lowest = None, np.inf  # the duals of the lowest Lagrangian bound so far: pricing is smoothed towards them
    while values and iterations < max_iterations:
        iterations += 1
        lp, duals = _solve_master(values, columns, problem.rhs)
        prices = [duals] if center is None else [SMOOTHING * center + (1 - SMOOTHING) * duals, duals]
        for at in prices:  # the master's own duals only when the smoothed ones find no improving column
            lagrangian, found = _price(problem, at)
            if lagrangian < lowest:
                center, lowest = at, lagrangian
            bound = min(bound, lagrangian)
            new = [(value, column) for value, column in found if value - float(duals @ column) > 1e-6]
            if new:
                break
        for value, column in new:
            values.append(value)
            columns.append(column)
        if not new or bound - lp <= tolerance_pts / 100 * cluster_milli:
            break
    return AllocationBound(pod_list, seed, arrived_milli, cluster_milli, bound, lp, iterations,
                           time.perf_counter() - started)


def _first_fit(data: OpenbInput, arrived: npt.NDArray[np.int64], problem: _Problem
              ) -> list[tuple[int, Vector, int, Vector]]:
    """The distinct configurations and patterns of a first-fit placement in arrival order (a fraction on
    the fullest GPU it fits): columns that start the LP near a real placement's value."""
    nodes = data.nodes
    kinds = {(t.model, t.gpus, t.cpu_milli, t.memory_mib): i for i, t in enumerate(problem.types)}
    node_type = np.array([kinds[(str(n.model), int(n.gpu), int(n.cpu_milli), int(n.memory_mib))]
                          for n in nodes.itertuples()])
    model = np.array([problem.models.index(str(m)) for m in nodes["model"]])
    cpu = nodes["cpu_milli"].to_numpy(dtype=np.int64).copy()
    mem = nodes["memory_mib"].to_numpy(dtype=np.int64) * MIB
    width = max(t.gpus for t in problem.types)
    free = np.where(np.arange(width)[None, :] < nodes["gpu"].to_numpy(dtype=np.int64)[:, None], MILLI, -1)
    pods = np.zeros((len(nodes), len(data.shapes)))
    slots = np.zeros((len(nodes), width, len(problem.fractions)))
    for s in arrived.tolist():
        shape = data.shapes[s]
        ok = (cpu >= shape.cpu_milli) & (mem >= shape.mem_bytes) & problem.allowed[s][model]
        if shape.gpus and shape.milli == MILLI:
            ok &= (free == MILLI).sum(axis=1) >= shape.gpus
        elif shape.gpus:
            ok &= (free >= shape.milli).any(axis=1)
        hits = np.flatnonzero(ok)
        if len(hits) == 0:
            continue
        n = int(hits[0])
        cpu[n] -= shape.cpu_milli
        mem[n] -= shape.mem_bytes
        pods[n, s] += 1
        if shape.gpus and shape.milli == MILLI:
            free[n, np.flatnonzero(free[n] == MILLI)[:shape.gpus]] = 0
        elif shape.gpus:
            gpu = int(np.argmin(np.where(free[n] >= shape.milli, free[n], 2 * MILLI)))
            free[n, gpu] -= shape.milli
            slots[n, gpu, problem.fractions.index(shape.milli)] += 1
    found: list[tuple[int, Vector, int, Vector]] = []
    for t in range(len(problem.types)):
        for config in np.unique(pods[node_type == t], axis=0):
            found.append((t, config, -1, np.zeros(0)))
    for m in range(len(problem.models) if problem.fractions else 0):
        for pattern in np.unique(slots[model == m].reshape(-1, len(problem.fractions)), axis=0):
            found.append((-1, np.zeros(0), m, pattern))
    return found


def bound_for_seed(data: OpenbInput, seed: int, pod_list: str = "?") -> AllocationBound:
    """The bound for the pods FGD's protocol brings with ``seed`` (the replays' arrival sequence)."""
    return allocation_bound(data, arrival_sequence(data, seed), pod_list, seed)
