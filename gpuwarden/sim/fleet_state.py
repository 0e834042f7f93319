"""What ``SimCluster`` reads and changes of a simulated fleet: the engine (:class:`~.engine.Simulation`)
offers it, and the cluster view is written against this, not the engine (which builds the view)."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Protocol

import numpy as np

from gpuwarden.fleet import WorkloadPhase

from .jobs import SimJob


class SimulatedFleet(Protocol):
    lock: threading.RLock
    config: Any  # its SimConfig
    # the fleet
    nodes: list[Any]
    gpus: list[Any]
    teams: Any
    gpu_index_of: dict[str, int]
    # per device (a whole GPU or a MIG instance): its GPU, node, MIG instance and profile, and job (-1: none)
    dev_gpu: np.ndarray
    dev_node: np.ndarray
    dev_mig_id: np.ndarray
    dev_mig_profile: np.ndarray
    dev_is_mig: np.ndarray
    dev_share: np.ndarray  # a MIG instance's share of its GPU (1.0 for a whole GPU)
    dev_mem_total: np.ndarray
    dev_job: np.ndarray
    # per node and GPU: what faults and operators did to them
    node_cordoned: np.ndarray
    node_taints: dict[int, tuple[str, ...]]
    node_down_until: np.ndarray
    gpu_down_until: np.ndarray
    gpu_lost: np.ndarray
    # the jobs
    jobs: list[SimJob]
    job_by_name: dict[str, SimJob]
    queue: list[SimJob]
    suspended: set[int]
    counts: dict[str, int]
    # the clock
    origin: datetime
    now_s: float
    # set by each action: the scheduling round runs again, on changed capacity
    acted: bool
    _capacity_changed: bool

    @property
    def now(self) -> datetime: ...

    def available(self, now: float) -> np.ndarray: ...

    def _bind(self, job: SimJob, devices: np.ndarray, now: float) -> None: ...

    def _stop(self, job: SimJob, keep_checkpoint: bool, graceful: bool,
              to_phase: WorkloadPhase = WorkloadPhase.PENDING) -> None: ...
