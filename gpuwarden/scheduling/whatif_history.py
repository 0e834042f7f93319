"""What-if, part 1: the workloads and the fleet of a window, rebuilt from fleet samples.

Rules (the samples say who held which device when, and nothing else):

- **Workload** = one pod, ``(namespace, pod)``, over a contiguous stretch of samples. It holds
  ``k`` whole GPUs (the most devices it held at one sample), or ``k`` MIG instances of one profile
  (``mig_instance`` '1:3g.40gb' -> '3g.40gb'), or, when several pods share one device at the same
  sample (time-slicing), ``1/n`` of a GPU. It runs on the GPU model it ran on.
- **Start** = its first sample; **end** = its last sample + the sampling step (clipped to the
  window). A pod already running when the window opens, or still running when it closes, is cut
  there: the part the window saw is the workload. **Team** = the ``team`` column, else the namespace, else 'unknown'.
- **Submission time is not in the samples**: a workload is taken as submitted at its first
  sample, so the as-it-ran row has no queueing before the first start (only pauses count as wait).
- **Gaps**: a pod absent from samples its node *did* report (by the node's own sample times), or
  moving node, has stopped. If it comes back within ``max_gap_seconds`` it is the same workload,
  paused (suspended, preempted or restarting: the pause counts as waiting); a later return is a new
  workload (a pod name reused). A stretch where the node reported nothing at all (an exporter or
  scrape outage) is not a gap: the pod is taken to have kept running.
- **Fleet** = the GPUs seen in the window (node, model; a MIG GPU keeps the instances it had at
  its last sample). A GPU with a sample whose owner nobody could see (no pod and ``attribution``
  not 'known') is left out of the fleet and named in a note: unknown is not free.
- Gang membership, priority, kind and checkpointing are not in the samples: every pod is replayed
  on its own, at one priority, as checkpointable training (see :mod:`.whatif`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuwarden.fleet import workload_key
from gpuwarden.fleet.sampling import sampling_step_seconds
from gpuwarden.fleet.semantics import mig_share

from . import mig

NEEDED_COLUMNS = ("timestamp", "node", "gpu_uuid", "gpu_index", "model", "mig_instance", "namespace", "pod", "team",
                  "attribution")
DEFAULT_MAX_GAP_SECONDS = 1800.0
DEFAULT_STEP_SECONDS = 60.0


@dataclass(frozen=True)
class Workload:
    """One pod's stay on GPUs, rebuilt from samples. Times are seconds from the window start."""

    name: str  # namespace/pod, with '#2', '#3' for a pod name that came back after max_gap
    team: str
    model: str
    gpus: int  # whole GPUs held at once (MIG: instances of mig_profile held at once)
    mig_profile: str | None
    gpu_fraction: float  # 1.0, or the share of one time-sliced GPU
    submitted_seconds: float  # = the first sample (submission time is not in the samples)
    runs: tuple[tuple[float, float], ...]  # as it ran: [start, end) running stretches

    @property
    def duration_seconds(self) -> float:
        """Running time as it ran: what a replay has to give it."""
        return sum(end - start for start, end in self.runs)

    @property
    def gpu_equivalents(self) -> float:
        """GPUs it holds while running (a MIG instance by the one MIG-share rule, fleet.semantics)."""
        if self.mig_profile:
            return self.gpus * mig_share(self.mig_profile, self.model)
        return self.gpus * self.gpu_fraction


@dataclass(frozen=True)
class FleetNode:
    name: str
    model: str
    gpu_uuids: tuple[str, ...]
    mig_layouts: tuple[tuple[str, ...] | None, ...]  # per GPU: its MIG instances' profiles, None = whole


@dataclass(frozen=True)
class History:
    """A window of fleet samples as workloads on a fleet."""

    start: pd.Timestamp
    end: pd.Timestamp
    step_seconds: float
    workloads: tuple[Workload, ...]
    nodes: tuple[FleetNode, ...]
    notes: tuple[str, ...] = ()

    @property
    def window_seconds(self) -> float:
        return float((self.end - self.start).total_seconds())

    @property
    def gpus(self) -> int:
        return sum(len(n.gpu_uuids) for n in self.nodes)

    def gpus_by_model(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for node in self.nodes:
            out[node.model] = out.get(node.model, 0) + len(node.gpu_uuids)
        return out

    def node_of_gpu(self) -> dict[str, str]:
        return {uuid: node.name for node in self.nodes for uuid in node.gpu_uuids}


def rebuild(frame: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp,
            max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS) -> History:
    """The workloads and fleet of ``frame`` (fleet samples in ``[start, end)``); rules in the module doc."""
    start, end = pd.Timestamp(start), pd.Timestamp(end)
    if frame.empty:
        return History(start, end, DEFAULT_STEP_SECONDS, (), (), ("no samples in the window",))
    frame = frame.loc[:, [c for c in NEEDED_COLUMNS if c in frame.columns]].copy()
    for column in ("mig_instance", "namespace", "pod", "team", "attribution"):
        if column not in frame.columns:
            frame[column] = None
    if "gpu_index" not in frame.columns:
        frame["gpu_index"] = 0
    for column in ("node", "gpu_uuid", "model", "mig_instance", "namespace", "pod", "team", "attribution"):
        frame[column] = frame[column].astype("category")  # a store's read already is: then free
    stamps = frame["timestamp"].to_numpy("datetime64[ns]")
    if (stamps[1:] >= stamps[:-1]).all():  # a store's read comes in time order: the stable sort would keep it
        frame.index = pd.RangeIndex(len(frame))
    else:
        frame = frame.sort_values("timestamp", kind="stable", ignore_index=True)
        stamps = frame["timestamp"].to_numpy("datetime64[ns]")
    step = sampling_step_seconds(stamps, frame["gpu_uuid"].cat.codes.to_numpy(), DEFAULT_STEP_SECONDS)
    notes: list[str] = []
    nodes, excluded = _fleet(frame)
    if excluded:
        notes.append(f"{len(excluded)} GPU(s) left out of the fleet: some of their samples have no pod and an unknown "
                     f"owner (attribution off or failed), so their capacity cannot be counted as free "
                     f"({', '.join(sorted(excluded)[:3])}{' ...' if len(excluded) > 3 else ''})")
    workloads, dropped = _workloads(frame, stamps.view(np.int64), start, end, step, max_gap_seconds)
    if dropped:
        notes.append(f"{dropped} workload(s) left out: their MIG profile is not in the scheduler's MIG tables")
    return History(start, end, step, tuple(workloads), tuple(nodes), tuple(notes))


def _fleet(frame: pd.DataFrame) -> tuple[list[FleetNode], set[str]]:
    unknown_owner = frame["pod"].isna() & ~frame["attribution"].isin(["known"])
    excluded = set(frame.loc[unknown_owner, "gpu_uuid"].astype(str))
    last = frame.groupby("gpu_uuid", observed=True)["timestamp"].transform("max")
    latest = frame.loc[frame["timestamp"] == last, ["node", "model", "gpu_index", "gpu_uuid", "mig_instance"]]
    gpus: dict[str, tuple[str, str, int, list[str]]] = {}  # uuid -> node, model, index, MIG profiles
    for node, model, index, uuid, instance in latest.itertuples(index=False):
        if str(uuid) in excluded:
            continue
        entry = gpus.setdefault(str(uuid), (str(node), str(model), int(index), []))
        if not pd.isna(instance):
            entry[3].append(str(instance).split(":", 1)[-1])
    by_node: dict[tuple[str, str], list[tuple[int, str, tuple[str, ...] | None]]] = {}
    for uuid, (node, model, index, profiles) in gpus.items():
        by_node.setdefault((node, model), []).append((index, uuid, tuple(sorted(profiles)) if profiles else None))
    several = {node for node, _ in by_node if sum(1 for n, _ in by_node if n == node) > 1}
    nodes = []
    for (node, model), members in sorted(by_node.items()):
        members.sort()
        name = f"{node}/{model}" if node in several else node  # a node with two GPU models: one per model
        nodes.append(FleetNode(name, model, tuple(u for _, u, _ in members), tuple(lay for _, _, lay in members)))
    return nodes, excluded


def _workloads(frame: pd.DataFrame, all_stamps: np.ndarray, start: pd.Timestamp, end: pd.Timestamp, step: float,
               max_gap_seconds: float) -> tuple[list[Workload], int]:
    """The frame's workloads (``all_stamps``: its times, int64 ns, in order), and how many were dropped."""
    # Grouping by integer keys made of the categorical codes (the frame is sorted by time): pandas
    # groupbys over 6 M rows were most of a week's rebuild. Small integer types: this is the peak.
    time_rank = np.zeros(len(all_stamps), np.int64)  # dense, over the whole frame
    np.cumsum(all_stamps[1:] != all_stamps[:-1], out=time_rank[1:])
    all_nodes = frame["node"].cat.codes.to_numpy()
    # Each node's own sample times, numbered: a pod's samples that skip a number skipped a sample
    # its node did report (absent), while a stretch the node did not report at all is no gap.
    tick_all = _dense_rank_within(all_nodes, time_rank)
    mask = frame["pod"].notna().to_numpy()
    if not mask.any():
        return [], 0
    held = frame.loc[mask, ["namespace", "pod", "model", "team", "mig_instance"]]
    tick, node, stamps = tick_all[mask], all_nodes[mask], all_stamps[mask]
    del tick_all, all_nodes
    pod_key = (_codes(held, "namespace") + 1) * len(frame["pod"].cat.categories) + _codes(held, "pod")
    # pods on the device (GPU or MIG instance) at that sample: time-slicing
    device = time_rank[mask]
    del time_rank
    device *= len(frame["gpu_uuid"].cat.categories) + 1
    device += _codes(frame, "gpu_uuid")[mask] + 1
    device *= len(frame["mig_instance"].cat.categories) + 1
    device += _codes(held, "mig_instance") + 1
    sharers = _group_sizes(device)
    del device
    order = np.lexsort((stamps, pod_key))
    key, when = pod_key[order], stamps[order]
    # one entry per (pod, sample time): how many devices it held then, and on how many pods' share
    sample = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | (when[1:] != when[:-1])])
    devices = np.diff(np.r_[sample, len(order)])
    shared = np.minimum.reduceat(sharers[order], sample)
    rows = order[sample]
    s_key, s_node, s_tick = key[sample], node[rows], tick[rows]
    continuous = np.r_[False, (s_key[1:] == s_key[:-1]) & (s_node[1:] == s_node[:-1]) & (np.diff(s_tick) == 1)]
    run = np.flatnonzero(~continuous)
    run_last = np.r_[run[1:], len(sample)] - 1
    window_seconds = (end - start).total_seconds()
    origin = start.value
    begins = (when[sample][run] - origin) / 1e9
    finishes = np.minimum((when[sample][run_last] - origin) / 1e9 + step, window_seconds)
    run_devices = np.maximum.reduceat(devices, run)
    run_sharers = np.minimum.reduceat(shared, run)
    # A pod's namespace, model, team and MIG profile do not change while it lives: its first row's.
    heads = list(held.iloc[rows[run]][["namespace", "pod", "model", "team", "mig_instance"]].astype(object)
                 .itertuples(index=False, name=None))
    pieces: list[list[int]] = []
    for i in range(len(run)):
        # the same pod, back within max_gap: paused, not new
        if i == 0 or s_key[run[i]] != s_key[run[i - 1]] or begins[i] - finishes[i - 1] > max_gap_seconds:
            pieces.append([])
        pieces[-1].append(i)
    out: list[Workload] = []
    dropped = 0
    numbers: dict[int, int] = {}
    for piece in pieces:
        namespace, pod, model, team, instance = heads[piece[0]]
        pod_number = int(s_key[run[piece[0]]])
        numbers[pod_number] = numbers.get(pod_number, 0) + 1
        namespace = "" if pd.isna(namespace) else str(namespace)
        profile = None if pd.isna(instance) else str(instance).split(":", 1)[-1]
        model = str(model)
        if profile is not None and profile not in mig.mig_table(model):
            dropped += 1
            continue
        team = str(team) if not pd.isna(team) else (namespace or "unknown")
        gpus = int(run_devices[piece].max())
        sharers_min = int(run_sharers[piece].min())
        fraction = 1.0 if (profile is not None or gpus > 1 or sharers_min <= 1) else round(1.0 / sharers_min, 3)
        name = workload_key(namespace, str(pod)) if namespace else str(pod)
        out.append(Workload(
            name=name if numbers[pod_number] == 1 else f"{name}#{numbers[pod_number]}", team=team, model=model,
            gpus=gpus, mig_profile=profile, gpu_fraction=fraction, submitted_seconds=float(begins[piece[0]]),
            runs=tuple((float(begins[i]), float(finishes[i])) for i in piece)))
    out.sort(key=lambda w: (w.submitted_seconds, w.name))
    return out, dropped


def _codes(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A categorical column's codes as int64 (-1: missing)."""
    codes: np.ndarray = frame[column].cat.codes.to_numpy().astype(np.int64)
    return codes


def _dense_rank_within(group: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per row, the dense rank (from 1) of its ``rank`` among its group's rows (``rank`` non-decreasing)."""
    order = np.argsort(group, kind="stable")  # each group's rows stay in rank order
    g = group[order]
    group_start = np.r_[True, g[1:] != g[:-1]]
    del g
    r = rank[order]
    new = np.r_[True, r[1:] != r[:-1]]
    del r
    new |= group_start
    distinct = np.cumsum(new, dtype=np.int64)
    del new
    distinct -= distinct[group_start][np.cumsum(group_start) - 1] - 1
    out = np.empty(len(group), np.int64)
    out[order] = distinct
    return out


def _group_sizes(key: np.ndarray) -> np.ndarray:
    """Per row, how many rows share its ``key``."""
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    group = np.cumsum(np.r_[True, sorted_key[1:] != sorted_key[:-1]]) - 1
    del sorted_key
    out = np.empty(len(key), np.int64)
    out[order] = np.bincount(group)[group]
    return out
