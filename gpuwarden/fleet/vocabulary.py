"""The fleet vocabulary: small frozen dataclasses every room shares.

Nothing here knows about Kubernetes, NVML, pandas or the simulator; it only names things.
Validation happens in ``__post_init__`` so a bad value fails where it is made, with the field
name and the allowed values in the message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar
from collections.abc import Mapping

from .errors import UserError
from .gpu_catalogue import gpu_catalogue
from .node_selection import NodeSelection
from .semantics_scalar import request_gpu_equivalents


class FleetValueError(UserError, ValueError):
    """A value that the fleet vocabulary does not allow; the message names field and allowed values."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise FleetValueError(message)


_E = TypeVar("_E", bound=enum.Enum)


def _choice(enum_type: type[_E], value: object, field_name: str) -> _E:
    """Coerce ``value`` to ``enum_type`` or fail naming the field and the allowed values."""
    if isinstance(value, enum_type):
        return value
    try:
        return enum_type(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in enum_type)
        raise FleetValueError(f"{field_name}: {value!r} is not one of: {allowed}") from None


class PriceTier(str, enum.Enum):
    ON_DEMAND = "on-demand"
    RESERVED = "reserved"
    SPOT = "spot"
    OWNED = "owned"


class Location(str, enum.Enum):
    CLOUD = "cloud"
    ON_PREM = "on-prem"


class WorkloadKind(str, enum.Enum):
    TRAINING = "training"
    FINE_TUNING = "fine-tuning"
    INFERENCE = "inference"
    NOTEBOOK = "notebook"


class PriorityClass(str, enum.Enum):
    """Priority classes, lowest first; ``rank`` orders them."""

    BEST_EFFORT = "best-effort"
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(PriorityClass).index(self)


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class ActionKind(str, enum.Enum):
    CORDON = "cordon"
    UNCORDON = "uncordon"
    TAINT = "taint"
    UNTAINT = "untaint"
    DRAIN = "drain"
    EVICT = "evict"
    SUSPEND = "suspend"  # checkpoint (signal + grace period), then pause
    RESUME = "resume"
    SET_PRIORITY = "set-priority"
    PREEMPT = "preempt"
    BIND = "bind"
    NOTIFY = "notify"  # tell the owner (an Event on the pod and an annotation); changes nothing else
    SET_MIG_CONFIG = "set-mig-config"  # a node's nvidia.com/mig.config label (the GPU operator's MIG manager applies it)


class FindingKind(enum.StrEnum):
    """Every rule that can raise a :class:`Finding`, by name (no other kind can be made); what each health
    rule means is in :mod:`gpuwarden.analytics.health.catalogue`; the values are what JSON and the audit carry."""

    # NVIDIA's XID catalogue: the application's own faults (never act on the node)...
    APP_XID_13 = "app-xid-13"
    APP_XID_31 = "app-xid-31"
    APP_XID_43 = "app-xid-43"
    APP_XID_45 = "app-xid-45"
    APP_XID_68 = "app-xid-68"
    XID_STORM = "xid-storm"  # application XIDs over a workload's GPUs, or many nodes at once: one job-level finding
    # ...and the GPU's
    ECC_DBE = "ecc-dbe"
    PMU_BREAKPOINT = "pmu-breakpoint"
    PMU_HALT = "pmu-halt"
    ROW_REMAP_PENDING = "row-remap-pending"
    ROW_REMAP_FAILURE = "row-remap-failure"
    NVLINK_ERROR = "nvlink-error"
    OFF_THE_BUS = "off-the-bus"
    GPU_SERIES_LOST = "gpu-series-lost"  # its series stopped while its node-mates' went on
    OBSERVABILITY_COLLAPSE = "observability-collapse"  # series thin, scrapes slow, up flaps: watch it, never act
    HIGH_SBE_RATE = "high-sbe-rate"
    CONTAINED_ECC = "contained-ecc"
    UNCONTAINED_ECC = "uncontained-ecc"
    GSP_TIMEOUT = "gsp-timeout"
    GSP_ERROR = "gsp-error"
    XID_OTHER = "xid-other"  # an XID code without its own column
    # NVML's GPU recovery action
    RECOVERY_GPU_RESET = "recovery-gpu-reset"
    RECOVERY_NODE_REBOOT = "recovery-node-reboot"
    RECOVERY_DRAIN_P2P = "recovery-drain-p2p"
    RECOVERY_DRAIN_AND_RESET = "recovery-drain-and-reset"
    # ECC counters and the early-warning detectors
    UNCORRECTABLE_ECC = "uncorrectable-ecc"
    HBM_DEGRADING = "hbm-degrading"
    PCIE_DEGRADING = "pcie-degrading"
    PCIE_REPLAY_STORM = "pcie-replay-storm"
    THERMAL_THROTTLE = "thermal-throttle"
    POWER_BRAKE_THROTTLE = "power-brake-throttle"
    HW_SLOWDOWN = "hw-slowdown"
    NVLINK_DEGRADING = "nvlink-degrading"
    # Node conditions: all GPUs of a node changed together (power or clock policy, inlet air, driver reload): gpu_uuid None
    NODE_WIDE_SLOWDOWN = "node-wide-slowdown"
    NODE_WIDE_THERMAL = "node-wide-thermal"
    NODE_WIDE_COUNTER_RESET = "node-wide-counter-reset"
    COOLING_DEGRADING = "cooling-degrading"
    STRAGGLER = "straggler"
    DOMAIN_EVENT = "domain-event"  # many nodes of one rack or NVLink domain at once (power, switch, cooling)
    DRA_DEVICES_GONE = "dra-devices-gone"  # a node's GPUs left its DRA ResourceSlices (the driver down): node, no GPU
    # the idle ledger
    HOARDED = "hoarded"
    # the scheduling planner
    QUOTA_RECLAIM = "quota-reclaim"
    QUEUE_ORDER = "queue-order"


@dataclass(frozen=True)
class MigProfile:
    """A MIG GPU-instance profile such as ``1g.18gb``: compute slices out of the GPU catalogue's, memory in bytes."""

    name: str
    compute_slices: int
    memory_bytes: int
    max_instances: int

    def __post_init__(self) -> None:
        most = gpu_catalogue().max_compute_slices
        _require(1 <= self.compute_slices <= most, f"MigProfile.compute_slices: {self.compute_slices} not in 1..{most}")
        _require(self.memory_bytes > 0, f"MigProfile.memory_bytes: {self.memory_bytes} must be > 0")


@dataclass(frozen=True)
class GpuModel:
    """A GPU product: memory, MIG profiles it offers, power and price per GPU-hour by tier."""

    name: str
    memory_bytes: int
    tdp_watts: float
    max_sm_clock_mhz: int
    gpm_supported: bool  # NVML GPU Performance Monitoring (Hopper and newer): real SM activity
    mig_profiles: tuple[MigProfile, ...] = ()
    price_per_hour: tuple[tuple[PriceTier, float], ...] = ()

    def __post_init__(self) -> None:
        _require(self.memory_bytes > 0, f"GpuModel.memory_bytes: {self.memory_bytes} must be > 0")
        for tier, price in self.price_per_hour:
            _choice(PriceTier, tier, "GpuModel.price_per_hour tier")
            _require(price >= 0, f"GpuModel.price_per_hour[{tier}]: {price} must be >= 0")

    def hourly_price(self, tier: PriceTier | str) -> float:
        tier = _choice(PriceTier, tier, "price tier")
        for known_tier, price in self.price_per_hour:
            if known_tier == tier:
                return price
        raise FleetValueError(f"price tier {tier.value!r} has no price for GPU model {self.name!r}")

    def mig_profile(self, name: str) -> MigProfile:
        for profile in self.mig_profiles:
            if profile.name == name:
                return profile
        allowed = ", ".join(p.name for p in self.mig_profiles) or "none (no MIG)"
        raise FleetValueError(f"MIG profile {name!r} is not offered by {self.name}; allowed: {allowed}")


@dataclass(frozen=True)
class Topology:
    """Where a node sits: GPUs inside one NVLink domain talk fast; nodes under one leaf switch too."""

    nvlink_domain: str
    leaf_switch: str
    rack: str


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    location: Location
    price_tier: PriceTier
    topology: Topology
    gpu_model: str
    gpu_count: int
    cpu_milli: int
    memory_bytes: int
    # Fractional pods may share one of its GPUs (time-slicing or MPS). False: a GPU (or a MIG
    # instance) serves one pod, so a fraction takes the smallest MIG instance that holds it, else a
    # whole GPU. The simulated fleet cannot share; a live cluster is taken to (its device plugin's
    # sharing config is not read yet).
    shares_gpus: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "location", _choice(Location, self.location, "Node.location"))
        object.__setattr__(self, "price_tier", _choice(PriceTier, self.price_tier, "Node.price_tier"))
        _require(self.gpu_count >= 0, f"Node.gpu_count: {self.gpu_count} must be >= 0")


@dataclass(frozen=True)
class MigInstance:
    gpu_instance_id: int
    profile: str


@dataclass(frozen=True)
class Gpu:
    uuid: str
    index: int
    node: str
    model: str
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()

    def __post_init__(self) -> None:
        _require(self.index >= 0, f"Gpu.index: {self.index} must be >= 0")
        _require(self.mig_enabled or not self.mig_instances, f"Gpu {self.uuid}: MIG instances without MIG mode")


@dataclass(frozen=True)
class GpuRequest:
    """What a pod asks for: exactly one of whole GPUs, a fraction (milli-GPU, as in the openb trace)
    or one MIG profile. ``count`` GPUs of ``fraction_milli`` each is how openb writes shared GPUs."""

    count: int = 1
    fraction_milli: int = 1000
    mig_profile: str | None = None
    gpu_model: str | None = None  # constraint: only this GPU model

    def __post_init__(self) -> None:
        _require(self.count >= 0, f"GpuRequest.count: {self.count} must be >= 0 (a negative GPU count)")
        _require(
            1 <= self.fraction_milli <= 1000,
            f"GpuRequest.fraction_milli: {self.fraction_milli} not in 1..1000",
        )
        _require(
            self.fraction_milli == 1000 or self.count <= 1,
            "GpuRequest: a fractional request asks for at most one GPU",
        )
        _require(
            self.mig_profile is None or (self.count == 1 and self.fraction_milli == 1000),
            "GpuRequest: a MIG profile request is one instance, not a count or a fraction",
        )

    @property
    def gpu_equivalents(self) -> float:
        """Whole-GPU equivalents, for quotas and cost (a MIG slice counts by its compute share)."""
        return request_gpu_equivalents(self.mig_profile, self.count, self.fraction_milli)


def workload_key(namespace: str, name: str) -> str:
    """``namespace/name``: how actions, plans, audits and the scheduler name a workload."""
    return f"{namespace}/{name}"


@dataclass(frozen=True)
class Workload:
    name: str
    namespace: str
    kind: WorkloadKind
    team: str
    project: str
    priority_class: PriorityClass
    gpus: GpuRequest
    gang_size: int = 1
    checkpointable: bool = False
    checkpoint_interval_seconds: float | None = None
    pools: tuple[str, ...] = ()  # node pools it may run in (a selector on the pool label); empty: any
    # Taints it tolerates, as ``key=value:Effect``, ``key=value`` (any effect), ``key:Effect`` or
    # ``key`` (any value): see :func:`gpuwarden.fleet.taints.taint_blocks`.
    tolerations: tuple[str, ...] = ()
    # nodeSelector and required node affinity (:mod:`gpuwarden.fleet.node_selection`); empty: any node
    node_selection: NodeSelection = ()
    spare_nodes: NodeSelection = ()  # nodes it takes only where no other fits: other work can go nowhere else
    # What each pod requests besides GPUs (0 where nobody says: the simulator, replays).
    cpu_milli: int = 0
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _choice(WorkloadKind, self.kind, "Workload.kind"))
        object.__setattr__(
            self, "priority_class", _choice(PriorityClass, self.priority_class, "Workload.priority_class")
        )
        _require(self.gang_size >= 1, f"Workload.gang_size: {self.gang_size} must be >= 1")
        _require(
            not self.checkpointable or (self.checkpoint_interval_seconds or 0) > 0,
            f"Workload {self.name}: checkpointable needs checkpoint_interval_seconds > 0",
        )

    @property
    def total_gpu_equivalents(self) -> float:
        return self.gpus.gpu_equivalents * self.gang_size

    @property
    def key(self) -> str:
        """``namespace/name`` (:func:`workload_key`)."""
        return workload_key(self.namespace, self.name)


NO_CAP_GPUS = 1e9  # a team's burst limit when it has none (lists show it as null)
NO_WHOLE_GPU_POOL = "(no whole-GPU pool)"  # whole-GPU work's pool where every GPU node is time-sliced


@dataclass(frozen=True)
class Team:
    name: str
    guaranteed_gpus: float
    burst_limit_gpus: float
    weight: float = 1.0
    budget_per_month: float | None = None

    def __post_init__(self) -> None:
        _require(self.guaranteed_gpus >= 0, f"Team {self.name}: guaranteed_gpus {self.guaranteed_gpus} must be >= 0")
        _require(
            self.burst_limit_gpus >= self.guaranteed_gpus,
            f"Team {self.name}: burst_limit_gpus {self.burst_limit_gpus} must be >= guaranteed_gpus",
        )
        _require(self.weight > 0, f"Team {self.name}: weight {self.weight} must be > 0")


@dataclass(frozen=True)
class Finding:
    """Something analytics noticed. Findings never act; the actuator turns them into actions.

    ``kind`` is a :class:`FindingKind` (a name given as a string is checked against them);
    ``evidence`` holds what was measured and nothing else. ``active``: the signal was still seen
    near the scan's end; ``model`` and ``pool``: the peer group the GPU was compared within.
    """

    kind: FindingKind
    severity: Severity
    node: str
    gpu_uuid: str | None
    evidence: Mapping[str, Any]
    recommended_action: ActionKind | None
    confidence: float
    first_seen: datetime
    last_seen: datetime
    active: bool = True
    model: str | None = None
    pool: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _choice(FindingKind, self.kind, "Finding.kind"))
        object.__setattr__(self, "severity", _choice(Severity, self.severity, "Finding.severity"))
        _require(0.0 <= self.confidence <= 1.0, f"Finding.confidence: {self.confidence} not in 0..1")

    @property
    def key(self) -> tuple[FindingKind, str, str | None]:
        """Identity for de-duplication across scans."""
        return (self.kind, self.node, self.gpu_uuid)


@dataclass(frozen=True)
class Action:
    """One change to the cluster. ``target`` is a node name or ``namespace/workload``."""

    kind: ActionKind
    target: str
    reason: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _choice(ActionKind, self.kind, "Action.kind"))
