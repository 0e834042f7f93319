"""Fleet vocabulary, the fleet-samples columns, and the protocols rooms meet through."""

from .protocols import (
    ActionResult,
    Cluster,
    ClusterSnapshot,
    GpuBackend,
    GpuReading,
    Placement,
    WorkloadPhase,
    WorkloadState,
)
from .samples import (
    ATTRIBUTION_STATES,
    IDENTITY_COLUMN_NAMES,
    METRIC_COLUMN_NAMES,
    RECOVERY_ACTIONS,
    SAMPLE_COLUMN_NAMES,
    SAMPLE_COLUMNS,
    THROTTLE_REASONS,
    TRACKED_XIDS,
    XID_COLUMN_NAMES,
    Column,
    xid_column,
)
from .vocabulary import (
    Action,
    ActionKind,
    Finding,
    FindingKind,
    FleetValueError,
    Gpu,
    GpuModel,
    GpuRequest,
    Location,
    MigInstance,
    MigProfile,
    Node,
    PriceTier,
    PriorityClass,
    Severity,
    Team,
    Topology,
    Workload,
    WorkloadKind,
    workload_key,
)

__all__ = [name for name in dir() if not name.startswith("_")]
