"""The fleet samples table: one row per GPU (or MIG instance) per timestamp.

This is the first seam of ARCHITECTURE.md. Prometheus, the embedded store, the simulator and a
user's CSV or Parquet file all produce exactly these columns; analytics reads nothing else. The
column list lives here, in ``fleet``, so that the simulator and the exporter can speak it without
importing the store; ``gpuwarden.store.schema`` turns it into dtypes, validation and loaders, and
``docs/schema.md`` is generated from it.

Conventions: units in the names; ratios are 0..1; counters end in ``_total`` and are cumulative
(they may reset when a driver reloads or a GPU is replaced); a value the GPU cannot measure is
null, never a fake 0 (SM activity needs NVML GPM, Hopper and newer).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # timestamp | string | int | float
    nullable: bool
    description: str


# XID codes counted in their own column (NVIDIA's catalogue: the ones that decide an action);
# every other code adds to xid_other_total.
TRACKED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 74, 79, 92, 94, 95, 119, 120)

# NVML's nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) values.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu-reset",
    2: "node-reboot",
    3: "drain-p2p",
    4: "drain-and-reset",
}

# NVML clocks event (throttle) reason bits.
THROTTLE_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

_IDENTITY = (
    Column("timestamp", "timestamp", False, "sample time, UTC"),
    Column("cluster", "string", False, "cluster name"),
    Column("node", "string", False, "Kubernetes node name"),
    Column("gpu_uuid", "string", False, "GPU UUID (GPU-...)"),
    Column("gpu_index", "int", False, "NVML device index on the node"),
    Column("model", "string", False, "GPU model name, e.g. NVIDIA H100 80GB HBM3"),
    Column("mig_instance", "string", True, "MIG GPU-instance id and profile, e.g. '1:3g.40gb'; null for a whole GPU"),
    Column("namespace", "string", True, "namespace of the pod holding the GPU; null when unallocated"),
    Column("pod", "string", True, "pod holding the GPU; null when unallocated"),
    Column("dra_claim", "string", True,
           "'<namespace>/<name>' of the ResourceClaim (Dynamic Resource Allocation) holding the GPU or MIG device "
           "(dcgm-exporter's dra_claim_namespace / dra_claim_name labels); null when no claim holds it"),
    Column("team", "string", True, "team the pod is charged to"),
    Column("project", "string", True, "project the pod is charged to"),
    Column("attribution", "string", True,
           "whether the pod columns are known: 'known' (pod attribution on and answered; an empty pod "
           "means no pod holds the GPU), 'off' (no attribution source), 'failed' (attribution on but "
           "it did not answer); empty = not recorded, read as 'known' where pod is set, else 'off'"),
)

_ACTIVITY = (
    Column("gpu_util_ratio", "float", True, "NVML utilisation.gpu / 100: share of time any kernel ran"),
    Column("sm_active_ratio", "float", True, "GPM SM activity 0..1 (null where GPM is unsupported)"),
    Column("tensor_active_ratio", "float", True, "GPM tensor-pipe activity 0..1 (null where unsupported)"),
    Column("dram_active_ratio", "float", True, "GPM DRAM bandwidth utilisation 0..1 (null where unsupported)"),
    Column("mem_used_bytes", "float", True, "framebuffer memory used"),
    Column("mem_total_bytes", "float", False, "framebuffer memory total"),
    Column("mem_reserved_bytes", "float", True, "framebuffer memory reserved by the driver (not in used or free)"),
    Column("power_watts", "float", True, "board power draw"),
    Column("temperature_celsius", "float", True, "GPU core temperature"),
    Column("sm_clock_mhz", "float", True, "SM clock"),
    Column("throttle_reasons_bitmask", "int", True, "NVML clocks event reasons bitmask (see THROTTLE_REASONS)"),
)

_HEALTH = (
    Column("ecc_sbe_volatile_total", "int", True, "single-bit (correctable) ECC errors since driver load"),
    Column("ecc_dbe_volatile_total", "int", True, "double-bit (uncorrectable) ECC errors since driver load"),
    Column("remapped_rows_correctable_total", "int", True, "rows remapped for correctable errors"),
    Column("remapped_rows_uncorrectable_total", "int", True, "rows remapped for uncorrectable errors"),
    Column("remapped_rows_pending", "int", True, "1 when a row remap waits for a GPU reset"),
    Column("remapped_rows_failure", "int", True, "1 when a row remap failed (GPU should be replaced)"),
    Column("pcie_replay_total", "int", True, "PCIe replay counter"),
    Column("nvlink_crc_flit_errors_total", "int", True, "NVLink CRC flit errors, summed over the GPU's links"),
    Column("nvlink_crc_data_errors_total", "int", True, "NVLink CRC data errors, summed over the GPU's links"),
    Column("nvlink_replay_errors_total", "int", True, "NVLink replay errors, summed over the GPU's links"),
    Column("nvlink_recovery_errors_total", "int", True, "NVLink recovery errors, summed over the GPU's links"),
    Column("recovery_action", "int", True, "NVML GPU recovery action (see RECOVERY_ACTIONS)"),
    *(Column(f"xid_{code}_total", "int", True, f"XID {code} events seen") for code in TRACKED_XIDS),
    Column("xid_other_total", "int", True, "XID events of codes not tracked in their own column"),
)

SAMPLE_COLUMNS: tuple[Column, ...] = _IDENTITY + _ACTIVITY + _HEALTH
SAMPLE_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in SAMPLE_COLUMNS)
IDENTITY_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in _IDENTITY)
METRIC_COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in _ACTIVITY + _HEALTH)
# Values of the ``attribution`` column.
ATTRIBUTION_STATES: tuple[str, ...] = ("known", "off", "failed")
XID_COLUMN_NAMES: tuple[str, ...] = tuple(f"xid_{code}_total" for code in TRACKED_XIDS) + ("xid_other_total",)


def xid_column(code: int) -> str:
    """The samples column an XID code is counted in."""
    return f"xid_{code}_total" if code in TRACKED_XIDS else "xid_other_total"
