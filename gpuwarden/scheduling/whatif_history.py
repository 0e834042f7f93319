"""What-if, part 1: the workloads and the fleet of a window, rebuilt from fleet samples.

Rules (the samples say who held which device when, and nothing else):

- **Workload** = one pod, ``(namespace, pod)``, over a contiguous stretch of samples. It holds
  ``k`` whole GPUs (the most devices it held at one sample), or ``k`` MIG instances of one profile
  (``mig_instance`` '1:3g.40gb' -> '3g.40gb'), or, when several pods share one device at the same
  sample (time-slicing), ``1/n`` of a GPU. It runs on the GPU model it ran on.
- **Start** = its first sample; **end** = its last sample + the sampling step (clipped to the
  window). **Team** = the ``team`` column, else the namespace, else 'unknown'.
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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

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
        """GPUs it holds while running (a MIG instance counts compute slices / 7)."""
        if self.mig_profile:
            return self.gpus * mig_slices(self.mig_profile) / 7.0
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


def mig_slices(profile: str) -> int:
    """Compute slices of a MIG profile name ('3g.40gb' -> 3)."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 7


def sampling_step(timestamps: pd.Series) -> float:
    """The scrape interval: the median spacing of the distinct sample times (60 s with one sample)."""
    times = np.unique(timestamps.to_numpy(dtype="datetime64[ns]"))
    if len(times) < 2:
        return DEFAULT_STEP_SECONDS
    return float(np.median(np.diff(times)).astype("timedelta64[ns]").astype(np.int64) / 1e9)


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
    for column in ("node", "gpu_uuid", "model", "mig_instance", "namespace", "pod", "team", "attribution"):
        frame[column] = frame[column].astype(object).where(frame[column].notna(), None)
    frame = frame.sort_values("timestamp", kind="stable", ignore_index=True)
    step = sampling_step(frame["timestamp"])
    notes: list[str] = []
    nodes, excluded = _fleet(frame)
    if excluded:
        notes.append(f"{len(excluded)} GPU(s) left out of the fleet: some of their samples have no pod and an unknown "
                     f"owner (attribution off or failed), so their capacity cannot be counted as free "
                     f"({', '.join(sorted(excluded)[:3])}{' ...' if len(excluded) > 3 else ''})")
    workloads, dropped = _workloads(frame, start, end, step, max_gap_seconds)
    if dropped:
        notes.append(f"{dropped} workload(s) left out: their MIG profile is not in the scheduler's MIG tables")
    return History(start, end, step, tuple(workloads), tuple(nodes), tuple(notes))


def _fleet(frame: pd.DataFrame) -> tuple[list[FleetNode], set[str]]:
    unknown_owner = frame["pod"].isna() & ~frame["attribution"].isin(["known"])
    excluded = set(frame.loc[unknown_owner, "gpu_uuid"].astype(str))
    last = frame.groupby("gpu_uuid", sort=False)["timestamp"].transform("max")
    latest = frame[frame["timestamp"] == last]
    per_gpu = []
    for uuid, rows in latest.groupby("gpu_uuid", sort=False):
        if uuid in excluded:
            continue
        profiles = sorted(str(m).split(":", 1)[-1] for m in rows["mig_instance"].dropna().unique())
        index = int(rows["gpu_index"].iloc[0]) if "gpu_index" in rows else 0
        per_gpu.append((str(rows["node"].iloc[0]), str(rows["model"].iloc[0]), index, str(uuid),
                        tuple(profiles) if profiles else None))
    by_node: dict[tuple[str, str], list[tuple[int, str, tuple[str, ...] | None]]] = {}
    for node, model, index, uuid, layout in per_gpu:
        by_node.setdefault((node, model), []).append((index, uuid, layout))
    several = {node for node, _ in by_node if sum(1 for n, _ in by_node if n == node) > 1}
    nodes = []
    for (node, model), gpus in sorted(by_node.items()):
        gpus.sort()
        name = f"{node}/{model}" if node in several else node  # a node with two GPU models: one per model
        nodes.append(FleetNode(name, model, tuple(u for _, u, _ in gpus), tuple(lay for _, _, lay in gpus)))
    return nodes, excluded


def _workloads(frame: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp, step: float,
               max_gap_seconds: float) -> tuple[list[Workload], int]:
    # Each node's own sample times, numbered: a pod's samples that skip a number skipped a sample
    # its node did report (absent), while a stretch the node did not report at all is no gap.
    frame["node_tick"] = frame.groupby("node", sort=False)["timestamp"].rank(method="dense").astype(np.int64)
    held = frame[frame["pod"].notna()].copy()
    if held.empty:
        return [], 0
    held["namespace"] = held["namespace"].fillna("")
    device = held["gpu_uuid"].astype(str) + "|" + held["mig_instance"].fillna("").astype(str)
    held["sharers"] = held.groupby([held["timestamp"], device])["pod"].transform("size")
    held["profile"] = held["mig_instance"].map(lambda m: None if m is None else str(m).split(":", 1)[-1])
    per_sample = held.groupby(["namespace", "pod", "timestamp"], sort=True).agg(
        node=("node", "first"), tick=("node_tick", "first"), devices=("gpu_uuid", "size"),
        profile=("profile", "first"), model=("model", "first"), team=("team", "first"),
        sharers=("sharers", "min")).reset_index()
    same_pod = (per_sample["namespace"].eq(per_sample["namespace"].shift())
                & per_sample["pod"].eq(per_sample["pod"].shift()))
    continuous = same_pod & per_sample["node"].eq(per_sample["node"].shift()) & \
        per_sample["tick"].sub(per_sample["tick"].shift()).eq(1)
    per_sample["run"] = (~continuous).cumsum()
    runs = per_sample.groupby("run", sort=True).agg(
        namespace=("namespace", "first"), pod=("pod", "first"), first=("timestamp", "min"), last=("timestamp", "max"),
        devices=("devices", "max"), profile=("profile", lambda s: s.mode().iloc[0] if s.notna().any() else None),
        model=("model", lambda s: s.mode().iloc[0]), team=("team", lambda s: s.mode().iloc[0] if s.notna().any() else None),
        sharers=("sharers", "min"))
    window_seconds = (end - start).total_seconds()
    out: list[Workload] = []
    dropped = 0
    for (namespace, pod), pod_runs in runs.groupby(["namespace", "pod"], sort=True):
        pieces: list[list[tuple[float, float, pd.Series]]] = []
        previous_end = None
        for run in pod_runs.itertuples(index=False):
            begin = (run.first - start).total_seconds()
            finish = min((run.last - start).total_seconds() + step, window_seconds)
            if previous_end is None or begin - previous_end > max_gap_seconds:
                pieces.append([])
            pieces[-1].append((begin, finish, run))
            previous_end = finish
        for number, piece in enumerate(pieces, start=1):
            rows = [r for _, _, r in piece]
            profile = _most(r.profile for r in rows)
            model = _most(r.model for r in rows) or "unknown"
            if profile is not None and profile not in mig.mig_table(model):
                dropped += 1
                continue
            team = _most(r.team for r in rows) or namespace or "unknown"
            gpus = max(r.devices for r in rows)
            sharers = min(r.sharers for r in rows)
            fraction = 1.0 if (profile is not None or gpus > 1 or sharers <= 1) else round(1.0 / sharers, 3)
            name = f"{namespace}/{pod}" if namespace else str(pod)
            out.append(Workload(
                name=name if number == 1 else f"{name}#{number}", team=str(team), model=str(model), gpus=int(gpus),
                mig_profile=profile, gpu_fraction=fraction, submitted_seconds=piece[0][0],
                runs=tuple((b, f) for b, f, _ in piece)))
    out.sort(key=lambda w: (w.submitted_seconds, w.name))
    return out, dropped


def _most(values: Iterable[Any]) -> str | None:
    """The most common non-null value (ties: the first seen)."""
    counts: dict[str, int] = {}
    for value in values:
        if value is not None and not (isinstance(value, float) and np.isnan(value)):
            counts[str(value)] = counts.get(str(value), 0) + 1
    return max(counts, key=counts.__getitem__) if counts else None
