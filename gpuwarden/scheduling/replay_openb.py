"""Placement replay on the Alibaba openb trace with the FGD paper's protocol, through the engine.

Each pod is a one-pod ``Job`` placed by ``find_placement`` on a ``State`` of the trace's nodes with a
policy's ``PlacementOptions``: ``gpuwarden`` is the shipped policy's (``policy.POLICIES``), ``fgd``,
``bestfit`` and ``random`` the paper's baselines as the engine's scorers. The fragmentation target
is the pod list's own shape distribution (``State.expect``), as in the paper.

Protocol (Weng et al., ATC'23, and the issue): nodes from ``openb_node_list_gpu_node.csv``; all pods
of a list in a seed-random order, then pods drawn uniformly with replacement from the same list,
until the next pod would push the arrived milli-GPU (GPUs x gpu_milli) past 130% of the cluster's;
CPU-only pods use CPU and memory; ``gpu_spec`` restricts GPU models; each pod is placed on arrival
or fails (no departures, no preemption). The result is the milli-GPU allocation ratio at the end.
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.fleet.inputs import MAX_SAMPLES_FILE_BYTES, checked_input
from gpuwarden.fleet.traces import BOUNDED_KINDS, TraceError, checked_column

from .packing import TargetWorkload
from .placement import PlacementOptions, find_placement
from .policy import policy_named
from .state import MILLI, Job, NodeState, Shape, State

OPENB_LISTS = (
    "cpu050", "cpu100", "cpu200", "cpu250", "default",
    "gpushare100", "gpushare40", "gpushare60", "gpushare80",
    "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
    "multigpu20", "multigpu30", "multigpu40", "multigpu50",
)
DEFAULT_SEEDS = tuple(range(42, 52))
POLICIES = ("random", "bestfit", "fgd", "gpuwarden")
PUBLISHED_NAMES = {"random": "01-Random", "bestfit": "05-BestFit", "fgd": "06-FGD"}
MIB = 2**20


def placement_options(policy: str) -> PlacementOptions:
    """The engine's placement options for a replay policy: the shipped policy's, or a baseline scorer."""
    if policy == "gpuwarden":
        return policy_named("gpuwarden").placement
    if policy == "fgd":
        return PlacementOptions(scorer="fgd", ties="random")  # plain FGD: random among equal scores
    if policy in ("bestfit", "random"):
        return PlacementOptions(scorer=policy)
    raise ValueError(f"unknown placement policy {policy!r}; choose from {', '.join(POLICIES)}")


@dataclass(frozen=True)
class OpenbInput:
    nodes: pd.DataFrame  # sn, cpu_milli, memory_mib, gpu, model
    shapes: tuple[Shape, ...]  # distinct pod shapes
    pod_shape: np.ndarray  # shape id of each pod of the list
    popularity: np.ndarray  # pods per shape in the list

    @property
    def gpu_milli(self) -> np.ndarray:
        return np.array([s.gpus * s.milli for s in self.shapes], dtype=np.int64)

    def demand(self) -> dict[Shape, float]:
        return {shape: float(count) for shape, count in zip(self.shapes, self.popularity)}

    def state(self) -> State:
        """A fresh engine state of the trace's nodes (nothing placed)."""
        return State(NodeState(name=name, model=model, gpu_count=gpus, cpu_free=cpu, mem_free=mem, gpu_ids=list(ids))
                     for name, model, gpus, cpu, mem, ids in self._node_rows)

    @cached_property
    def _node_rows(self) -> list[tuple[str, str, int, int, int, list[str]]]:
        """Each node's constructor numbers and GPU ids, read from the frame once for every seed's state."""
        return [(str(n.sn), str(n.model), int(n.gpu), int(n.cpu_milli), int(n.memory_mib) * MIB,
                 [f"{n.sn}/gpu{i}" for i in range(int(n.gpu))]) for n in self.nodes.itertuples()]


def _read_csv(path: Path, required: dict[str, str], what: str = "") -> pd.DataFrame:
    """Read a trace CSV, naming the file, line and column of the first bad value: a 'number' column
    holds numbers >= 0; a kind of fleet.traces.BOUNDED_KINDS ('count', 'gpus') whole, finite, bounded
    numbers. ``what``: the flag that named the file (a FIFO or a device is refused unread)."""
    if not path.exists() and not path.is_symlink():
        raise TraceError(f"{path}: trace file not found (set --data-dir or GPUWARDEN_DATA)")
    checked_input(path, what, MAX_SAMPLES_FILE_BYTES, raising=TraceError)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as error:
        raise TraceError(f"{path}: not a readable CSV ({' '.join(str(error).split())})") from None
    missing = [name for name in required if name not in frame.columns]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected: {', '.join(required)}")
    for name, kind in required.items():
        if kind in BOUNDED_KINDS:
            frame[name] = checked_column(path, frame[name], name, kind)
            continue
        if kind != "number":
            continue
        values = pd.to_numeric(frame[name], errors="coerce")
        bad = values.isna().to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise TraceError(f"{path}:{row + 2}: column {name!r}: {frame[name].iloc[row]!r} is not a number")
        if (values < 0).any():
            row = int(np.flatnonzero((values < 0).to_numpy())[0])
            raise TraceError(f"{path}:{row + 2}: column {name!r}: {frame[name].iloc[row]!r} is negative")
        frame[name] = values
    return frame


def available_lists(data_dir: Path) -> list[str]:
    prefix = "openb_pod_list_"
    return sorted(p.stem[len(prefix):] for p in (data_dir / "openb").glob(f"{prefix}*.csv"))


def pod_list_path(data_dir: Path, pod_list: str) -> Path:
    """A list's file: a name under the data folder (``default`` is ``openb/openb_pod_list_default.csv``)
    or a path to a CSV in the openb format."""
    named = data_dir / "openb" / f"openb_pod_list_{pod_list}.csv"
    if named.exists() or not (pod_list.endswith(".csv") or "/" in pod_list):
        if not named.exists():
            found = available_lists(data_dir)
            raise TraceError(f"--lists: {pod_list!r} is neither an openb pod list under {data_dir / 'openb'} "
                             f"({', '.join(found) or 'none there'}) nor a CSV file path")
        return named
    return Path(pod_list)


def load_openb_pods(data_dir: Path, pod_list: str) -> pd.DataFrame:
    """A pod list: GPUs, milli-GPU per GPU, CPU, memory and the optional ``gpu_spec`` model constraint."""
    path = pod_list_path(data_dir, pod_list)
    frame = _read_csv(path, {"name": "text", "cpu_milli": "count", "memory_mib": "count", "num_gpu": "gpus",
                             "gpu_milli": "count"},
                      "--lists" if path.parent != data_dir / "openb" else "the openb pod list")
    return pd.DataFrame({
        "name": frame["name"], "cpu_milli": frame["cpu_milli"].astype("int64"),
        "memory_mib": frame["memory_mib"].astype("int64"), "gpus": frame["num_gpu"].astype("int64"),
        "gpu_milli": frame["gpu_milli"].astype("int64"),
        "gpu_spec": frame["gpu_spec"].astype(str) if "gpu_spec" in frame else "",
    })


def load_openb_nodes(data_dir: Path) -> pd.DataFrame:
    return _read_csv(
        data_dir / "openb" / "openb_node_list_gpu_node.csv",
        {"sn": "text", "cpu_milli": "count", "memory_mib": "count", "gpu": "gpus", "model": "text"},
        "the openb node list",
    )


def prepare(data_dir: Path, pod_list: str) -> OpenbInput:
    nodes = load_openb_nodes(data_dir)
    pods = load_openb_pods(data_dir, pod_list)
    path = pod_list_path(data_dir, pod_list)
    known = set(nodes["model"].astype(str))
    gpus = pods["gpus"].to_numpy()
    milli = np.where(gpus > 0, pods["gpu_milli"].to_numpy(), MILLI)
    bad = (gpus > 0) & ((milli < 1) | (milli > MILLI) | ((gpus > 1) & (milli < MILLI)))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{path}:{row + 2}: gpu_milli {milli[row]} with num_gpu {gpus[row]}: "
                         "gpu_milli is 1..1000 for one GPU and 1000 for several")
    raw = pods["gpu_spec"].fillna("").astype(str)
    parsed = {text: tuple(sorted(set(filter(None, text.split("|"))))) for text in raw.unique()}  # a few distinct
    spec = raw.map(parsed)
    for text, models in parsed.items():
        unknown = [m for m in models if m not in known]
        if unknown:
            row = int(np.flatnonzero((raw == text).to_numpy())[0])
            raise TraceError(f"{path}:{row + 2}: gpu_spec names unknown GPU model(s) {', '.join(unknown)}; "
                             f"the nodes have {', '.join(sorted(known))}")
    key = pd.DataFrame({"g": gpus, "m": milli, "c": pods["cpu_milli"], "r": pods["memory_mib"], "s": spec})
    codes = key.groupby(["g", "m", "c", "r", "s"], sort=True).ngroup().to_numpy()
    uniq = key.drop_duplicates(["g", "m", "c", "r", "s"]).sort_values(["g", "m", "c", "r", "s"])
    shapes = tuple(Shape(int(r.g), int(r.m), int(r.c), int(r.r) * MIB, r.s) for r in uniq.itertuples())
    popularity = np.bincount(codes, minlength=len(shapes)).astype(float)
    return OpenbInput(nodes, shapes, np.asarray(codes), popularity)


def arrival_sequence(data: OpenbInput, seed: int, inflation: float = 1.3) -> np.ndarray:
    """Shape ids in arrival order: the list shuffled, then draws with replacement, stopping before 130%."""
    rng = np.random.default_rng(seed)
    cluster_milli = int(data.nodes["gpu"].astype(int).sum()) * MILLI
    limit = inflation * cluster_milli
    order = data.pod_shape[rng.permutation(len(data.pod_shape))]
    extra = data.pod_shape[rng.integers(0, len(data.pod_shape), size=4 * len(data.pod_shape))]
    sequence = np.concatenate([order, extra])
    demand = np.cumsum(data.gpu_milli[sequence])
    stop = int(np.searchsorted(demand, limit, side="right"))
    return sequence[:stop]


@dataclass
class SeedResult:
    pod_list: str
    policy: str
    seed: int
    arrived: int
    placed: int
    failed: int
    arrived_milli: int
    allocated_milli: int
    cluster_milli: int
    fragmented_milli: float
    failure_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def allocation_ratio(self) -> float:
        return self.allocated_milli / self.cluster_milli


@dataclass
class Played:
    """One seed's pods placed: the final engine state, the arrival sequence (shape ids) and the counts."""

    state: State
    sequence: np.ndarray
    placed: int
    failed: int
    failure_reasons: dict[str, int]


def place_all(data: OpenbInput, policy_name: str, seed: int) -> Played:
    """Every arriving pod placed by the engine (``find_placement``) or failed, with its reason."""
    options = placement_options(policy_name)
    state = data.state()
    state.seed = seed + 7919  # the random scorer's and random ties' draws
    state.expect(data.demand())
    sequence = arrival_sequence(data, seed)
    jobs = [Job(f"shape-{i}", "openb", gpus_per_pod=s.gpus, milli=s.milli, cpu_milli=s.cpu_milli,
                mem_bytes=s.mem_bytes, gpu_models=s.models) for i, s in enumerate(data.shapes)]
    placed = failed = 0
    reasons: dict[str, int] = {}
    for s in sequence.tolist():
        job = jobs[s]
        placements, reason = find_placement(state, job, options)
        if placements is None:
            failed += 1
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        state.occupy(job, placements)  # pods never leave: booked on the nodes, no job record needed
        placed += 1
    return Played(state, sequence, placed, failed, reasons)


def replay_seed(data: OpenbInput, policy_name: str, seed: int, pod_list: str = "?") -> SeedResult:
    """One seed's allocation figures (``place_all``)."""
    started = time.perf_counter()
    played = place_all(data, policy_name, seed)
    arrays, sequence = played.state.arrays, played.sequence
    cluster_milli = int(arrays.gpu_count.sum()) * MILLI
    target = TargetWorkload.shared(data.demand(), arrays.models)  # the scorer's, with its memos
    return SeedResult(
        pod_list=pod_list, policy=policy_name, seed=seed, arrived=len(sequence), placed=played.placed,
        failed=played.failed, arrived_milli=int(data.gpu_milli[sequence].sum()),
        allocated_milli=cluster_milli - int(arrays.free.sum()), cluster_milli=cluster_milli,
        fragmented_milli=float(target.fragmentation(arrays.free, arrays.cpu_free, arrays.mem_free, arrays.model).sum()),
        failure_reasons=played.failure_reasons, seconds=time.perf_counter() - started,
    )


def _run_one(args: tuple[str, str, str, int]) -> SeedResult:
    data_dir, pod_list, policy, seed = args
    return replay_seed(_cached_prepare(data_dir, pod_list), policy, seed, pod_list)


def _run_one_in_worker(args: tuple[str, str, str, int]) -> SeedResult:
    """``_run_one`` in a pool worker, which then freezes what outlived the seed (the scorers' memos, kept for
    the next seeds of the list: a few hundred thousand small objects), so the collector's full passes stop
    walking them again and again. A replay leaves no reference cycle, so nothing frozen is garbage."""
    result = _run_one(args)
    gc.freeze()
    return result


_PREPARED: dict[tuple[str, str], OpenbInput] = {}


def _cached_prepare(data_dir: Path | str, pod_list: str) -> OpenbInput:
    key = (str(Path(data_dir).resolve()), pod_list)  # a relative --data-dir names another folder from another cwd
    if key not in _PREPARED:
        _PREPARED[key] = prepare(Path(data_dir), pod_list)
    return _PREPARED[key]


def replay_openb(data_dir: Path, pod_lists: Sequence[str] = ("default",), policies: Sequence[str] = POLICIES,
                 seeds: Sequence[int] = DEFAULT_SEEDS, workers: int = 1) -> list[SeedResult]:
    """Every (list, policy, seed) replay; ``workers`` > 1 runs seeds in parallel processes."""
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}; choose from {', '.join(POLICIES)}")
    jobs = [(str(data_dir), pod_list, policy, seed) for pod_list in pod_lists for policy in policies for seed in seeds]
    for pod_list in pod_lists:  # fail fast on a bad list, in this process
        _cached_prepare(data_dir, pod_list)
    if workers <= 1:
        return [_run_one(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_run_one_in_worker, jobs, chunksize=1))


def load_published(data_dir: Path) -> pd.DataFrame:
    path = data_dir / "fgd" / "summary_alloc_ratio_at_130pct.csv"
    frame = _read_csv(path, {"workload": "text", "sc_policy": "text", "mean": "number", "std": "number"})
    frame["pod_list"] = frame["workload"].str.replace("openb_pod_list_", "", regex=False)
    return frame


def summarise(results: list[SeedResult], published: pd.DataFrame | None = None) -> pd.DataFrame:
    rows = pd.DataFrame(
        [dict(pod_list=r.pod_list, policy=r.policy, seed=r.seed, ratio=100 * r.allocation_ratio,
              failed=r.failed, arrived=r.arrived, frag=r.fragmented_milli / 1000, seconds=r.seconds) for r in results]
    )
    table = rows.groupby(["pod_list", "policy"], sort=False).agg(
        alloc_pct=("ratio", "mean"), alloc_std=("ratio", "std"), failed=("failed", "mean"),
        arrived=("arrived", "mean"), fragmented_gpus=("frag", "mean"), seeds=("seed", "count"),
        seconds=("seconds", "sum"),
    ).reset_index()
    if published is not None:
        lookup = {(row.pod_list, row.sc_policy): row.mean for row in published.itertuples()}
        table["published_pct"] = [
            lookup.get((row.pod_list, PUBLISHED_NAMES.get(row.policy, "06-FGD")), np.nan)
            for row in table.itertuples()
        ]
        table["published_policy"] = [PUBLISHED_NAMES.get(p, "06-FGD") for p in table["policy"]]
        table["delta_pts"] = table["alloc_pct"] - table["published_pct"]
    return table
