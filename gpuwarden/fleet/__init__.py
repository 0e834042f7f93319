"""Fleet vocabulary, the fleet-samples columns, the GPU catalogue, the duration parser, and the
protocols rooms meet through. (The numpy rules, :mod:`.semantics` and :mod:`.sampling`, are imported
from their modules: the exporter imports this package and carries no numpy.)"""

from .durations import DurationError, parse_duration_seconds
from .gpu_catalogue import GpuCatalogue, GpuCatalogueError, GpuSpec, MigProfileSpec, gpu_catalogue
from .protocols import (
    ActionResult,
    Cluster,
    ClusterSnapshot,
    DeviceHealthNote,
    GpuBackend,
    GpuReading,
    Placement,
    UnreadableWorkload,
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
    NO_CAP_GPUS,
    NO_WHOLE_GPU_POOL,
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
