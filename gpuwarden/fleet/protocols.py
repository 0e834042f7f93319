"""The two protocols rooms meet through without importing each other.

- ``GpuBackend``: what the exporter reads GPUs from (NVML, the simulated fleet, a replay file).
- ``Cluster``: what the actuator reads a snapshot from and applies actions to (Kubernetes through
  the official client, or the simulated fleet).
- ``SchedulingHook``: what the simulated fleet calls when its scheduler would run; the CLI hands it
  the actuator's round over the simulator's own ``Cluster``.
What a ``Cluster`` may offer beyond these (Events, annotations, node conditions) are small protocols
in :mod:`.capabilities`. The CLI wires implementations to users; planning code never knows which
one it has.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable
from collections.abc import Callable, Mapping, Sequence

from .vocabulary import Action, Gpu, Node, Team, Workload


@dataclass(frozen=True)
class GpuReading:
    """One GPU (or MIG instance) read once. ``values`` is keyed by fleet-samples column names
    (``gpu_util_ratio``, ``power_watts``, ``xid_48_total``...); a key that is absent means the
    GPU could not measure it, and becomes an absent series, never a zero."""

    node: str
    gpu_uuid: str
    gpu_index: int
    model: str
    pci_bus_id: str = ""
    mig_instance_id: int | None = None
    mig_profile: str | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    lost: bool = False  # the GPU stopped answering (XID 79, NVML GpuIsLost)
    values: Mapping[str, float] = field(default_factory=dict)
    mig_uuid: str | None = None  # MIG-... of a MIG instance: the device id the kubelet reports for it
    # Compute processes NVML listed on the GPU in the same collection: (host pid, used bytes, or
    # None where NVML cannot tell). None when they were not read or the call is unsupported.
    processes: tuple[tuple[int, float | None], ...] | None = None


@runtime_checkable
class GpuBackend(Protocol):
    name: str

    def read(self) -> Sequence[GpuReading]:
        """Read every GPU once. Must not raise for one bad GPU: mark it ``lost`` instead."""
        ...

    def driver_version(self) -> str: ...


class WorkloadPhase(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"  # checkpointed and paused; waits for a resume
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class Placement:
    """One pod of a workload bound to one GPU, or one MIG instance of it."""

    node: str
    gpu_uuid: str
    mig_instance_id: int | None = None


@dataclass(frozen=True)
class WorkloadState:
    workload: Workload
    phase: WorkloadPhase
    submitted_at: datetime
    started_at: datetime | None
    placements: tuple[Placement, ...] = ()
    progress_seconds: float = 0.0
    duration_seconds: float | None = None  # known in simulation and replay only
    preemptions: int = 0
    priority_override: str | None = None
    # Where the workload came from in a real cluster: "Job", "JobSet", "Workload" (Kueue), "Pod"
    # (bare) or another controller's kind; "" in the simulation. Names its pods for actions.
    controller: str = ""
    pods: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    # GPU-seconds of service received so far (whole-GPU equivalents x seconds run), what LAS orders
    # the queue by. The simulator counts it; a live cluster reports 0 until it is measured (issue 21).
    attained_gpu_seconds: float = 0.0
    # Its pods are on their way out (a suspend or preemption their controller is carrying out): they
    # hold their GPUs until gone, as kube-scheduler counts them, and cannot be stopped again.
    stopping: bool = False
    # Placements held for pods of this RUNNING workload that still wait to be admitted onto them (a
    # resumed Job's new pods on a live cluster); the scheduling round admits them there. Also in
    # ``placements``, so the GPUs count as taken. Empty in the simulator (a resume binds at once).
    reserved: tuple[Placement, ...] = ()

    def progressed(self, progress_seconds: float, attained_gpu_seconds: float) -> WorkloadState:
        """This state with its progress and attained service moved on, every other field as it is:
        what ``dataclasses.replace`` gives, without the frozen ``__init__`` setting every field one by
        one (a simulated running job's state is renewed each round: that was a third of the snapshot's
        time). Here, beside the fields it copies, so a change to the class changes it too."""
        moved = object.__new__(WorkloadState)
        moved.__dict__.update(self.__dict__, progress_seconds=progress_seconds, attained_gpu_seconds=attained_gpu_seconds)
        return moved


@dataclass(frozen=True)
class UnreadableWorkload:
    """Waiting work whose request cannot be read (an unparseable quantity, a MIG profile no GPU
    catalogue knows): enough to show it in the queue and tell its owner."""

    namespace: str
    name: str
    team: str
    reason: str
    submitted_at: datetime | None = None


@dataclass(frozen=True)
class ClusterSnapshot:
    """An immutable view of the cluster; decisions are made on it, actions applied separately."""

    taken_at: datetime
    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]
    workloads: tuple[WorkloadState, ...]
    teams: tuple[Team, ...]
    cordoned: frozenset[str] = frozenset()
    taints: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unhealthy_gpus: frozenset[str] = frozenset()
    # Labels an operator sets to steer the actuator (``gpuwarden.io/protect``,
    # ``gpuwarden.io/reclaim-idle``); empty where the cluster has none (the simulation).
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # The namespaces gpuwarden's scheduler may act in (on Kubernetes, those labelled
    # ``gpuwarden.io/queue``); None: every namespace (the simulator, replays). Work elsewhere holds
    # capacity and is never touched: no admission, victim, annotation or Event (:meth:`in_queue`).
    queue_namespaces: frozenset[str] | None = None
    # Pods the scheduler leaves alone and says so: {"namespace/pod": why} (the admission gate
    # written by hand in a namespace outside the queue).
    ignored_pods: Mapping[str, str] = field(default_factory=dict)
    # Waiting work the cluster could not read into a workload (its request cannot be read), by
    # workload key: shown in the queue with why, never planned.
    unreadable: Mapping[str, UnreadableWorkload] = field(default_factory=dict)
    # Teams whose quota cannot be read ({team: why}, naming the namespace and annotation): their
    # waiting work is held, their running work never preempted, the rest of the cluster scheduled.
    refused_teams: Mapping[str, str] = field(default_factory=dict)
    # Admitted work kube-scheduler left Pending past the admission timeout: {workload key: its reason}.
    unschedulable: Mapping[str, str] = field(default_factory=dict)
    # CPU (milli) and memory (bytes) requested on each node by pods that are no workload of the
    # snapshot (pods asking no GPU, DaemonSets): capacity the workloads cannot have.
    node_overhead: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Workloads Kueue admits, by key: a team lead's priority override becomes a SET_PRIORITY on these
    # (Kueue runs them at its priority class); elsewhere it only orders gpuwarden's queue.
    kueue_managed: frozenset[str] = frozenset()
    # GPUs the cluster reports unhealthy itself (DRA device taints), for the health rules to act on.
    device_health: tuple[DeviceHealthNote, ...] = ()

    def in_queue(self, namespace: str) -> bool:
        """Whether the scheduler may act on work in ``namespace``: the one scope rule."""
        return self.queue_namespaces is None or namespace in self.queue_namespaces


@dataclass(frozen=True)
class DeviceHealthNote:
    """A GPU the cluster itself reports unhealthy: a device its DRA driver tainted (KEP-5055; NVIDIA's
    ``gpu.nvidia.com/xid=<code>``, ``gpu.nvidia.com/gpu-lost``). ``gpu_uuid``: the snapshot's GPU;
    ``device_uuid``: the UUID the driver published (NVML's, as the samples name the GPU)."""

    node: str
    gpu_uuid: str
    device_uuid: str | None
    taint: str  # "key=value:effect"
    since: datetime | None = None


@dataclass(frozen=True)
class ActionResult:
    """``ok=False`` with ``temporary=True`` is worth retrying later (a PDB's 429, a conflict that
    kept losing, a 5xx or timeout after back-off); otherwise a failure is permanent (403, 422...)."""

    action: Action
    ok: bool
    message: str
    temporary: bool = False
    # What to apply to take the action back (uncordon, untaint, resume...); None: cannot be undone.
    undo: Action | None = None


@runtime_checkable
class Cluster(Protocol):
    def snapshot(self) -> ClusterSnapshot: ...

    def apply(self, action: Action) -> ActionResult:
        """Apply one action; never raise for a refused action, return ``ok=False`` with why."""
        ...


class SchedulingHook(Protocol):
    """One scheduling round on a ``Cluster``: snapshot, plan, apply. A simulated cluster calls it
    where a live cluster's scheduling loop would run (every interval, and right after an action)."""

    def run_round(self) -> object: ...


# What a simulated cluster is given at construction: the round to run on its own ``Cluster`` view
# (the CLI hands it the actuator's round, so the simulator never decides).
SchedulingHookFactory = Callable[[Cluster], SchedulingHook]
