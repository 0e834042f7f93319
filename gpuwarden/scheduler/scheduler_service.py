"""The live scheduler process: the scheduling round on the fleet runner, leader-elected, fed with
attained service measured from the metrics source.

:meth:`SchedulerService.register` adds the round to the process's
:class:`~gpuwarden.fleet.runner.Runner` every ``interval_seconds`` (default 10) on its clock, as
the remediation :class:`~gpuwarden.remediation.loop.Reconciler` is: never two rounds at once, missed
rounds coalesce, a failed round is one log line and the next interval tries again. Only the leader
(``leader()`` true: the Lease of :mod:`.kube.lease`) plans and acts; a standby replica keeps its
last queue.

Admission latency: a pod created while the loop waits is admitted at the next round, so the bound
is one interval (plus the round's own time); no round is triggered by a pod's creation.

Attained service (what the LAS order reads): :func:`attained_from_samples` sums, per pod, the
GPU-seconds its GPUs were allocated to it over the window (each fleet-samples row of a pod counts
one sampling step times the GPU share it stands for: 1 for a whole GPU, the compute share of its
MIG profile), and adds its pods up per workload. Any fleet-samples source serves (Prometheus fed by
dcgm-exporter or gpuwarden's exporter, the embedded store); a source that cannot be read leaves the
snapshot's values (0) for that round, logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from gpuwarden.fleet import ClusterSnapshot
from gpuwarden.fleet.runner import Job, Runner
from gpuwarden.fleet.semantics_scalar import request_gpu_equivalents
from gpuwarden.fleet.triggers import every

from .scheduling_round import AttainedSource, SchedulingRound

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("gpuwarden.scheduler")
DEFAULT_INTERVAL_SECONDS = 10.0
ATTAINED_WINDOW_SECONDS = 7 * 86400.0  # LAS's memory: a week of service (the store's default window)
ATTAINED_REFRESH_SECONDS = 300.0  # how often the window is read again
DEFAULT_STEP_SECONDS = 60.0  # a row's seconds where the source's step cannot be told from its timestamps


class SchedulerService:
    def __init__(self, scheduling: SchedulingRound, interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
                 leader: Callable[[], bool] | None = None) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds: {interval_seconds} must be > 0")
        self.round = scheduling
        self.interval_seconds = interval_seconds
        self.leader = leader
        self.failures = 0
        self._lock = threading.Lock()

    def run_once(self) -> bool | None:
        """One round if this replica leads: True when it ran, False when it failed (logged, one
        line), None when another replica leads (a standby's wait is no failure)."""
        with self._lock:
            if self.leader is not None and not self.leader():
                log.info("scheduler: not the leader; this replica waits")
                return None
            try:
                results = self.round.run_round()
            except Exception as error:  # noqa: BLE001 (a failed round never ends the loop)
                self.failures += 1
                log.error("scheduler round failed: %s: %s; retrying next interval", type(error).__name__, error)
                log.debug("scheduler round failed", exc_info=True)
                return False
            applied = sum(1 for r in results if r.ok)
            log.info("scheduler: round %d: %d action(s) applied, %d refused, %d waiting", self.round.rounds,
                     applied, len(results) - applied, len(self.round.queue.get("workloads", ())))
            return True

    def register(self, runner: Runner, *, at_once: bool = True) -> Job:
        return runner.add("schedule", self.run_once, every(self.interval_seconds, runner.clock), at_once=at_once)


def attained_from_frame(frame: pd.DataFrame, snapshot: ClusterSnapshot,
                        step_seconds: float | None = None) -> dict[str, float]:
    """{workload key: GPU-seconds allocated to its pods} over the fleet-samples ``frame``."""
    if frame is None or frame.empty or "pod" not in frame.columns:
        return {}
    rows = frame[frame["pod"].notna() & (frame["pod"].astype(str) != "")]
    if rows.empty:
        return {}
    step = step_seconds or _step_seconds(frame)
    owner: dict[tuple[str, str], str] = {}
    for ws in snapshot.workloads:
        w = ws.workload
        for pod in ws.pods or (w.name, *(f"{w.name}-{k}" for k in range(w.gang_size if w.gang_size > 1 else 0))):
            owner[(w.namespace, pod)] = w.key
    namespaces = rows["namespace"].astype(str) if "namespace" in rows.columns else ""
    keys = [owner.get((ns, pod)) for ns, pod in zip(namespaces, rows["pod"].astype(str), strict=True)]
    mig = rows["mig_instance"] if "mig_instance" in rows.columns else None
    models = rows["model"] if "model" in rows.columns else None
    out: dict[str, float] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        instance = mig.iat[i] if mig is not None else None
        share = 1.0
        if isinstance(instance, str) and ":" in instance:
            share = request_gpu_equivalents(instance.split(":", 1)[1], model=models.iat[i] if models is not None else None)
        out[key] = out.get(key, 0.0) + share * step
    return out


def _step_seconds(frame: pd.DataFrame) -> float:
    """The source's sampling step: the median gap between one GPU's consecutive samples."""
    if "timestamp" not in frame.columns or "gpu_uuid" not in frame.columns:
        return DEFAULT_STEP_SECONDS
    ordered = frame.sort_values(["gpu_uuid", "timestamp"])
    gaps = ordered.groupby("gpu_uuid", observed=True)["timestamp"].diff().dt.total_seconds().dropna()
    gaps = gaps[gaps > 0]
    return float(gaps.median()) if len(gaps) else DEFAULT_STEP_SECONDS


def attained_from_samples(read: Callable[[pd.Timestamp, pd.Timestamp], pd.DataFrame],
                          window_seconds: float = ATTAINED_WINDOW_SECONDS,
                          refresh_seconds: float = ATTAINED_REFRESH_SECONDS) -> AttainedSource:
    """An attained-service source over ``read(start, end)`` (any fleet-samples source's ``read``),
    read again at most every ``refresh_seconds`` of snapshot time (a week of samples is not read
    every 10 s round; a few minutes of service more or less does not move a LAS level)."""
    import pandas as pd

    kept: dict[str, object] = {}

    def attained(snapshot: ClusterSnapshot) -> Mapping[str, float]:
        end = pd.Timestamp(snapshot.taken_at)
        last = kept.get("at")
        if isinstance(last, pd.Timestamp) and (end - last).total_seconds() < refresh_seconds:
            return kept["frame_result"]  # type: ignore[return-value]
        try:
            frame = read(end - pd.Timedelta(timedelta(seconds=window_seconds)), end)
        except Exception as error:  # noqa: BLE001 (no measurement this round: the snapshot's values stand)
            log.warning("scheduler: attained service not measured this round: %s: %s", type(error).__name__, error)
            return {}
        kept["at"], kept["frame_result"] = end, attained_from_frame(frame, snapshot)
        return kept["frame_result"]  # type: ignore[return-value]

    return attained
